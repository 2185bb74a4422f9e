"""Test helpers for strategy files: hypothesis generators of valid configurations and schedule
invariants checked from a `Result`'s event log.

    from hypothesis import given, settings
    from dist_lib import simulate, testing

    @settings(max_examples=25, deadline=None)
    @given(testing.setups("one_f_one_b"))
    def test_my_schedule(setup):
        result = testing.run(setup)          # correctness check on, trace validated
        assert testing.schedule_problems(result) == []

`schedule_problems` returns one line per broken invariant:
* a (layer, samples) forward precedes its backward on the rank;
* the backward of layer l for some samples follows the backwards of layer l + 1 for all of them;
* a weight-gradient half (backward_weight) follows its input-gradient half;
* every send is matched by exactly one recv, in order per (src, dst) pair;
* each update of a layer follows all of that rank's gradient work and gradient collectives for it;
* no two compute events overlap on a rank.
"""

from __future__ import annotations

import tempfile
from bisect import bisect_right
from collections import defaultdict
from itertools import accumulate
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dist_lib.hardware.cluster import Cluster
from dist_lib.memory.tracker import KINDS
from dist_lib.output.result import Result
from dist_lib.run.simulator import simulate
from dist_lib.output.trace import validate_trace

EPS = 1e-12
GRADIENT_OPS = ("backward", "backward_weight")
INPUT_GRADIENT_OPS = ("backward", "backward_input")

CLUSTERS = ("1x2xA100-80GB", "1x4xA100-80GB", "2x2xA100-80GB", "1x2xA100-80GB+1x2xV100-32GB",
            "1x4xA100-80GB+1x4xV100-32GB")


@dataclass(frozen=True)
class Setup:
    """One simulation to run: `simulate(strategy, cluster, workload, batch, **options)`."""

    strategy: str
    cluster: str
    workload: str
    batch: int
    options: dict[str, Any] = field(default_factory=dict)


def run(setup: Setup, trace: bool = True) -> Result:
    """Simulate with the correctness check on; raise AssertionError if the trace is malformed."""
    result = simulate(f"strategies.{setup.strategy}" if "/" not in setup.strategy else setup.strategy,
                      setup.cluster, setup.workload, setup.batch, **setup.options)
    if trace:
        with tempfile.TemporaryDirectory() as tmp:
            problems = validate_trace(result.write_chrome_trace(Path(tmp) / "trace.json"))
        assert not problems, f"{setup}: malformed trace: {problems[:3]}"
    return result


def setups(strategy: str, clusters: tuple[str, ...] = CLUSTERS, max_layers: int = 8):
    """A hypothesis strategy of valid `Setup`s for one of the bundled strategies."""
    from hypothesis import strategies as st

    if strategy == "planned":
        return _plans(clusters, max_layers)

    @st.composite
    def build(draw) -> Setup:
        cluster = draw(st.sampled_from(clusters))
        parsed = Cluster.parse(cluster)
        world, node_sizes = parsed.world_size, [node.gpus for node in parsed.nodes]  # (nodes may differ)
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        mb = draw(st.integers(1, 2))
        options: dict[str, Any] = {"microbatch_size": mb}
        if strategy in ("ddp", "zero"):
            dp, pp, tp, chunks = world, 1, 1, 1
            if strategy == "zero":
                options["stage"] = draw(st.sampled_from([1, 2, 3]))
            else:
                options["bucket_mb"] = draw(st.sampled_from([0, 1, 25]))
        else:
            tp = 1
            if strategy == "hybrid":
                tp = draw(st.sampled_from([t for t in (1, 2) if all(n % t == 0 for n in node_sizes)]))
            pp = draw(st.sampled_from([d for d in divisors if d > 1 and (world // tp) % d == 0] or [1]))
            dp = world // (pp * tp)
            chunks = 2 if strategy == "interleaved" else 1
            if strategy == "hybrid":
                schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "deepspeed"]))
                chunks = 2 if schedule == "interleaved" else 1
                options.update(dp=dp, pp=pp, tp=tp, schedule=schedule,
                               recompute=draw(st.booleans()), tied_embeddings=draw(st.booleans()))
                if schedule == "deepspeed":
                    options["attention_mask_messages"] = draw(st.booleans())
            elif strategy == "hetero":
                options.update(dp=dp, pp=pp)
            else:
                options["pp"] = pp
        unit = pp * chunks
        layers = unit * draw(st.integers(1, max(1, max_layers // unit)))
        m = draw(st.integers(1, 4)) * (pp if chunks > 1 else 1)
        if strategy == "hetero":
            m = max(m, 1)
        batch = dp * mb * m
        return Setup(strategy, cluster, f"toy:layers={layers}", batch, options)

    return build()


def _plans(clusters: tuple[str, ...], max_layers: int):
    """Valid `Setup`s of `planned`: random plans (the nodes in any order, some GPUs idle, stages of their
    own widths, TP degrees and uneven shares, any schedule, recompute mode and ZeRO stage)."""
    from hypothesis import strategies as st

    from dist_lib.planner.plan import RECOMPUTE, SCHEDULES, ZERO_STAGES, Plan, Stage
    from dist_lib.planner.space import tp_options

    def cuts(draw, total: int, parts: int, low: int = 1) -> list[int]:
        """`parts` sizes of at least `low` adding up to `total`."""
        points = sorted(draw(st.lists(st.integers(0, total - parts * low), min_size=parts - 1,
                                      max_size=parts - 1)))
        edges = [0, *points, total - parts * low]
        return [low + b - a for a, b in zip(edges, edges[1:])]

    @st.composite
    def build(draw) -> Setup:
        spec = draw(st.sampled_from(clusters))
        cluster = Cluster.parse(spec)
        nodes = draw(st.permutations(range(len(cluster.nodes))))
        order = [r for n in nodes for r in cluster.ranks_of_node(n)]
        used = draw(st.integers(1, len(order)))  # the rest idle
        pp = draw(st.integers(1, min(used, 4)))
        schedule = draw(st.sampled_from(SCHEDULES if pp > 1 else ("gpipe", "1f1b")))
        chunks = 2 if schedule == "interleaved" else 1
        widths = cuts(draw, used, pp)
        groups, start = [], 0
        for width in widths:
            groups.append(tuple(order[start:start + width]))
            start += width
        tps = [draw(st.sampled_from(tp_options(cluster, ranks))) for ranks in groups]
        dps = [len(ranks) // tp for ranks, tp in zip(groups, tps)]
        microbatch = max(dps) + draw(st.integers(0, 2))
        microbatches = draw(st.integers(1, 3)) * (pp if chunks > 1 else 1)
        layers = draw(st.integers(pp * chunks, max(pp * chunks, max_layers)))
        sizes = cuts(draw, layers, pp * chunks)  # chunk-major: chunk c of stage s is block c * pp + s
        bounds = list(accumulate(sizes, initial=0))
        stages = tuple(Stage(ranks, tp, tuple((bounds[c * pp + i], bounds[c * pp + i + 1]) for c in range(chunks)),
                             tuple(cuts(draw, microbatch, dp)))
                       for i, (ranks, tp, dp) in enumerate(zip(groups, tps, dps)))
        plan = Plan(stages, microbatch, microbatches, schedule, draw(st.sampled_from(RECOMPUTE[:3])),
                    draw(st.sampled_from(ZERO_STAGES[:2])))  # (zero 3, FSDP, and recompute 'op' run through hybrid)
        return Setup("planned", spec, f"toy:layers={layers}", microbatch * microbatches, {"plan": plan.to_dict()})

    return build()


def schedule_problems(result: Result) -> list[str]:
    """Every broken schedule invariant in the event log (empty when the schedule is sound)."""
    events = result.events
    problems: list[str] = []
    by_rank: dict[int, list] = defaultdict(list)
    for e in events:
        by_rank[e.rank].append(e)
    # per layer, the ends of its input-gradient passes (on any rank) in order, and the samples they covered
    # by each end: a stage of other width splits or joins microbatches, so a layer's backward for some
    # samples may follow several backwards of the next layer, each for part of them
    ends: dict[int, list[float]] = defaultdict(list)
    covered: dict[int, list[int]] = defaultdict(lambda: [0])
    for e in sorted((e for e in events if e.stream == "compute" and e.op in INPUT_GRADIENT_OPS), key=lambda e: e.end):
        ends[e.layer].append(e.end)
        covered[e.layer].append(covered[e.layer][-1] | e.samples)
    num_layers = result.workload.num_layers
    for rank, evs in by_rank.items():
        compute = sorted((e for e in evs if e.stream == "compute"), key=lambda e: (e.start, e.end))
        for a, b in zip(compute, compute[1:]):
            if b.start < a.end - EPS:
                problems.append(f"rank {rank}: {a.op}(layer {a.layer}) and {b.op}(layer {b.layer}) overlap")
        forwards: dict[tuple[int, int], float] = {}
        split_done: dict[tuple[int, int], float] = {}
        grad_done: dict[int, float] = defaultdict(float)
        for e in compute:
            key = (e.layer, e.samples)
            if e.op == "forward":
                forwards.setdefault(key, e.end)
            elif e.op in ("backward", "backward_input", "backward_weight"):
                if key not in forwards or forwards[key] > e.start + EPS:
                    problems.append(f"rank {rank}: {e.op}(layer {e.layer}) before its forward")
                if e.op == "backward_input":
                    split_done[key] = e.end
                if e.op == "backward_weight" and (key not in split_done or split_done[key] > e.start + EPS):
                    problems.append(f"rank {rank}: backward_weight(layer {e.layer}) before its backward_input")
                if e.op in INPUT_GRADIENT_OPS and e.layer + 1 < num_layers:
                    done = covered[e.layer + 1][bisect_right(ends[e.layer + 1], e.start + EPS)]
                    if done & e.samples != e.samples:
                        problems.append(f"rank {rank}: {e.op}(layer {e.layer}) before the backward of layer "
                                        f"{e.layer + 1} for all its samples")
                if e.op in GRADIENT_OPS:
                    grad_done[e.layer] = max(grad_done[e.layer], e.end)
        for e in evs:
            if e.stream == "collective" and e.op != "all_gather" and e.detail.startswith("weight_grad"):
                grad_done[e.layer] = max(grad_done[e.layer], e.end)
        for e in compute:
            if e.op == "update" and e.start < grad_done.get(e.layer, 0.0) - EPS:
                problems.append(f"rank {rank}: update(layer {e.layer}) before all its gradient contributions")
    problems.extend(_p2p_problems(events))
    return problems


def _p2p_problems(events) -> list[str]:
    problems: list[str] = []
    ends: dict[int, list] = defaultdict(list)
    sends: dict[tuple, list] = defaultdict(list)
    recvs: dict[tuple, list] = defaultdict(list)
    for e in events:
        if e.stream == "p2p":
            ends[e.op_id].append(e)
            (sends if e.op == "send" else recvs)[tuple(e.peers)].append(e.op_id)
    for op_id, pair in ends.items():
        if sorted(e.op for e in pair) != ["recv", "send"]:
            problems.append(f"message {op_id}: {sorted(e.op for e in pair)} instead of one send and one recv")
    for peers, ids in sends.items():
        if ids != recvs.get(peers):
            problems.append(f"channel {peers}: sends and recvs do not match in order")
    return problems


def peak_in_flight(result: Result, rank: int) -> int:
    """Most microbatches whose forward of the rank's first layer ran but whose gradient for it has not."""
    compute = sorted((e for e in result.events if e.rank == rank and e.stream == "compute"),
                     key=lambda e: (e.start, e.end))
    layers = [e.layer for e in compute if e.op == "forward"]
    if not layers:
        return 0
    first = min(layers)
    live: set[int] = set()
    peak = 0
    for e in compute:
        if e.layer != first:
            continue
        if e.op == "forward" and e.detail != "recompute":
            live.add(e.samples)
            peak = max(peak, len(live))
        elif e.op in GRADIENT_OPS:
            live.discard(e.samples)
    return peak


def live_bytes_before(result: Result, op: str, kind: str, rank: int = 0) -> int:
    """Bytes of `kind` (a `memory.tracker.KINDS` name, e.g. "activation") live on `rank` just before its first
    `op` event starts: what a phase of the step holds, read from the memory log."""
    starts = [e.start for e in result.events if e.rank == rank and e.op == op]
    if not starts:
        raise ValueError(f"live_bytes_before: rank {rank} has no {op!r} event in this step")
    start = min(starts)
    times, _ = result.timelines[rank]
    deltas, _, kinds = result.memory_log[rank]
    return sum(d for t, d, k in zip(times, deltas, kinds) if t < start and KINDS[k] == kind)


def most_alive(result: Result, kind: str, nbytes: int, rank: int = 0) -> int:
    """The most buffers of `kind` and of exactly `nbytes` bytes alive at once on `rank` (e.g. whole layer
    gradients, to see when a sharded step frees them)."""
    deltas, ids, kinds = result.memory_log[rank]
    alive: set = set()
    most = 0
    for delta, buffer, k in zip(deltas, ids, kinds):
        if KINDS[k] != kind or abs(delta) != nbytes:
            continue
        (alive.add if delta > 0 else alive.discard)(buffer)
        most = max(most, len(alive))
    return most


def replays_alike(strategy: str, cluster: str, workload: str, batch: int, **options: Any) -> Result:
    """The step simulated directly, recorded and replayed (the grader's trusted replay, `run/replay.py`): all
    three correct and alike in step time, every rank's time and peak memory. Returns the direct result."""
    from dist_lib.run.recording import record
    from dist_lib.run.replay import replay
    direct = simulate(strategy, cluster, workload, batch, **options)
    recorded, programs = record(strategy, cluster, workload, batch, **options)
    again = replay(programs, cluster, workload, batch)
    for result in (recorded, again):
        assert (result.time_s, result.rank_times, result.memory_bytes, result.correct) == \
            (direct.time_s, direct.rank_times, direct.memory_bytes, True), result.problems
    return direct

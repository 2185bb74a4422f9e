"""Schedule-correctness suite: every bundled strategy on random valid configurations (hypothesis)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dist_lib import Cluster, SpecError, StrategyError, simulate, testing
from dist_lib.errors import OutOfMemoryError
from dist_lib.memory.tracker import KINDS, OPTIMIZER, WEIGHT

STRATEGIES = ["ddp", "zero", "gpipe", "one_f_one_b", "deepspeed_1f1b", "interleaved", "zero_bubble", "hybrid",
              "hetero", "planned"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_random_valid_configurations_are_correct_and_sound(name):
    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(testing.setups(name))
    def check(setup):
        result = testing.run(setup)  # raises on an incorrect step, a deadlock or a malformed trace
        assert result.correct
        assert testing.schedule_problems(result) == [], setup
        assert step_problems(result) == [], setup

    check()


# nodes of different sizes and devices, and nodes whose GPUs share one NIC
UNEVEN = ("1x2xA100-80GB+2x1xT4", "2x2xT4:nics=1x1.25", "1x4xV100-32GB:nics=1x1.25+1x2xA10")


@pytest.mark.parametrize("name", ["hybrid", "hetero", "planned"])
def test_random_configurations_on_uneven_clusters_are_correct_and_sound(name):
    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(testing.setups(name, clusters=UNEVEN))
    def check(setup):
        result = testing.run(setup)
        assert result.correct
        assert testing.schedule_problems(result) == [], setup
        assert step_problems(result) == [], setup

    check()


def test_invariant_checker_catches_a_backward_before_its_forward_order():
    """A hand-broken log: swap one rank's forward and backward times; the checker must notice."""
    result = testing.run(testing.Setup("one_f_one_b", "1x2xA100-80GB", "toy:layers=2", 2, {"pp": 2}))
    events = list(result.raw_events)
    i = next(k for k, e in enumerate(events) if e[1] == "forward" and e[0] == 0)
    j = next(k for k, e in enumerate(events) if e[1] == "backward" and e[0] == 0)
    fwd, bwd = events[i], events[j]
    events[i] = fwd[:3] + (bwd[3] + 1.0, bwd[4] + 1.0) + fwd[5:]  # the forward now runs after its backward
    result.raw_events, result._events = events, None
    problems = testing.schedule_problems(result)
    assert any("before its forward" in p for p in problems)


def test_a_backward_joining_samples_follows_every_backward_of_the_next_layer_for_them():
    """Rank 0 runs layer 0 on both samples of a microbatch; ranks 1 and 2 run layer 1 on one each. Layer 0's
    backward follows both of layer 1's (sound), and the checker says so once either ends later."""
    stages = [{"ranks": [0], "tp": 1, "blocks": [[0, 1]], "shares": [2]},
              {"ranks": [1, 2], "tp": 1, "blocks": [[1, 2]], "shares": [1, 1]}]
    plan = {"stages": stages, "microbatch_size": 2, "microbatches": 1, "schedule": "gpipe"}
    result = testing.run(testing.Setup("planned", "2x2xA100-80GB", "toy:layers=2", 2, {"plan": plan}))
    assert testing.schedule_problems(result) == []
    events = list(result.raw_events)
    joined = next(e for e in events if e[1] == "backward" and e[0] == 0)
    assert joined[6] == 0b11
    k = next(k for k, e in enumerate(events) if e[1] == "backward" and e[0] == 2)
    assert events[k][6] == 0b10
    late = events[k]
    events[k] = late[:3] + (joined[3] + 1e-3, joined[3] + 2e-3) + late[5:]  # rank 2's now ends after rank 0's starts
    result.raw_events, result._events = events, None
    assert "rank 0: backward(layer 0) before the backward of layer 1 for all its samples" in \
        testing.schedule_problems(result)


def test_invariant_checker_catches_overlapping_compute():
    result = testing.run(testing.Setup("ddp", "1x2xA100-80GB", "toy:layers=2", 2, {"microbatch_size": 1}))
    events = list(result.raw_events)
    k = next(k for k, e in enumerate(events) if e[1] == "backward" and e[0] == 0)
    e = events[k]
    events[k] = e[:3] + (e[3] - 1e-3,) + e[4:]  # start 1 ms earlier: overlaps the op before it
    result.raw_events, result._events = events, None
    assert any("overlap" in p for p in testing.schedule_problems(result))


# Any options, valid or not: each draw must either run a correct, sound step or be refused with the
# strategy's own ValueError (a StrategyError naming the rank) or a SpecError, never anything from inside.
ANY_CLUSTERS = ("1xA100-80GB", "1x2xA100-80GB", "1x4xT4:nics=1x1.25", "1x2xA100-80GB+1x2xV100-32GB",
                "2x1xL4+1x2xA10", "1x3xH100")
ANY_PARTITIONS = (None, None, [1, 3], [2, 2], [3, 1], [4, 0], [2.0, 2.0], [1, 1, 1, 1], [range(0, 1), range(1, 4)])


def _any_setup(strategy: str):
    """(cluster, workload, batch, options) a user might pass: mostly ones that fit the cluster, with edge
    and wrong values mixed in."""

    @st.composite
    def build(draw):
        cluster = draw(st.sampled_from(ANY_CLUSTERS))
        world = Cluster.parse(cluster).world_size
        fitting = [d for d in range(1, world + 1) if world % d == 0]
        mb = draw(st.sampled_from([1, 1, 2, 3, 0]))
        pp = draw(st.sampled_from(fitting + [0, 2, 3]))
        layers = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12]))
        workload = draw(st.sampled_from([f"toy:layers={layers}", f"toy:layers={layers},heads=3,hidden=192",
                                         f"gpt-125m:layers={layers},seq=127"]))
        batch = draw(st.one_of(st.integers(1, 3).map(lambda k: k * world * max(mb, 1)), st.integers(1, 9)))
        options = {"microbatch_size": mb}
        optional = {}
        if strategy == "ddp":
            optional["bucket_mb"] = st.sampled_from([0, 0.001, 25, -1, float("nan")])
        elif strategy == "zero":
            optional["stage"] = st.sampled_from([0, 1, 2, 3, 4])
        elif strategy == "hetero":
            options["pp"] = pp
            optional = {"dp": st.sampled_from([None, 1, 2]), "shares": st.sampled_from([None, [1, 1], [2, 1], [1]]),
                        "partition": st.sampled_from(ANY_PARTITIONS + ([[2, 2], [1, 3]],)),
                        "recompute": st.booleans()}
        else:
            options["pp"] = pp
            optional = {"partition": st.sampled_from(ANY_PARTITIONS), "recompute": st.booleans()}
            if strategy == "interleaved":
                optional["chunks"] = st.sampled_from([-1, 0, 1, 2, 3])
            if strategy == "zero_bubble":
                optional["max_in_flight"] = st.sampled_from([None, 0, 1, 2, 5])
            if strategy == "hybrid":
                options["tp"] = draw(st.sampled_from([1, 1, 2, 3, 4]))
                options["pp"] = draw(st.sampled_from([d for d in fitting if world % (d * options["tp"]) == 0] or [1]))
                options["schedule"] = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "deepspeed"]))
                optional.update(dp=st.sampled_from([None, None, 1, 2]), chunks=st.sampled_from([None, 0, 1, 2, 2.5]),
                                selective_recompute=st.booleans(), sequence_parallel=st.booleans(),
                                overlap_grad_reduce=st.booleans(), scatter_gather=st.booleans(),
                                async_tp_allreduce=st.booleans(), tied_embeddings=st.booleans(),
                                attention_mask_messages=st.booleans())
        options.update(draw(st.fixed_dictionaries({}, optional=optional)))
        return cluster, workload, batch, options

    return build()


def step_problems(result) -> list[str]:
    """Invariants of any finished step: no rank computes longer than the step; each rank's compute stream
    and each communicator's stream run one op at a time; no kind of memory goes below zero, the reported
    peak is the timeline's highest point, at least the weights and optimizer state held at any time, and
    within the device."""
    problems = []
    for rank, busy in enumerate(result.compute_busy()):
        if busy > result.time_s * (1 + 1e-9):
            problems.append(f"rank {rank}: compute busy {busy} s in a step of {result.time_s} s")
    streams = defaultdict(list)
    for e in result.events:
        if e.stream in ("compute", "collective"):
            streams[(e.rank, e.stream, e.peers)].append((e.start, e.end))
    for key, spans in streams.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            if start < end - 1e-12 * max(1.0, end):
                problems.append(f"rank {key[0]}: two {key[1]} ops overlap on one stream")
                break
    for rank in range(result.cluster.world_size):
        deltas, _, kinds = result.memory_log[rank]
        live, total, top, held = [0] * len(KINDS), 0, 0, 0
        for delta, kind in zip(deltas, kinds):
            live[kind] += delta
            total += delta
            top, held = max(top, total), max(held, live[WEIGHT] + live[OPTIMIZER])
            if live[kind] < 0:
                problems.append(f"rank {rank}: {KINDS[kind]} memory below zero")
                break
        peak = result.memory_bytes[rank]
        if peak != top or peak < held or peak > result.cluster.device_of(rank).memory_bytes:
            problems.append(f"rank {rank}: peak {peak} B, timeline top {top} B, weights and optimizer {held} B")
    return problems


def _signature(result) -> tuple:
    """What must not depend on the order the ranks start in (the log's order and op ids may)."""
    events = sorted(e[:10] + e[11:] for e in result.raw_events)
    return result.time_s, list(result.memory_bytes), result.rank_times, events


@pytest.mark.parametrize("name", STRATEGIES[:-1])  # (planned draws whole plans: testing.setups above)
def test_any_options_run_soundly_or_are_refused_by_name(name):
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_any_setup(name), st.integers(0, 99))
    def check(setup, seed):
        cluster, workload, batch, options = setup
        try:
            result = simulate(f"strategies.{name}", cluster, workload, batch, **options)
        except StrategyError as error:  # the strategy's own refusal, not a crash inside it
            assert isinstance(error.__cause__, ValueError), error
            event("refused")
            return
        except (SpecError, OutOfMemoryError):
            event("refused")
            return
        event("ran")
        assert result.correct
        assert step_problems(result) == [], (cluster, workload, batch, options)
        assert testing.schedule_problems(result) == []
        again = simulate(f"strategies.{name}", cluster, workload, batch, start_order_seed=seed, **options)
        assert _signature(again) == _signature(result)

    check()

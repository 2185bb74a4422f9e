"""Each built-in strategy's options for `dist-sandbox compare`, chosen by the planner's estimate.

A strategy can express only part of the planner's space (`dist_lib.planner.space`): `ddp` is one stage of
whole-model replicas, the pipeline strategies are pp equal stages of single GPUs (replicated dp times), a
schedule each, `hybrid` adds tensor parallelism, ... (`FAMILIES`). Within that part, every layout is
estimated as the planner estimates its own plans (stage options and the bottleneck-optimal partition,
`dist_lib.planner.partition`; the step, `dist_lib.planner.step`), and the feasible ones are returned
fastest first, each as the strategy's own options (the planner's layer partition included). The
simulator has the last word: the caller runs them in this order until one runs. Where none is feasible
the search says why, in one line: the leanest layout's memory, or that the batch does not split.

The estimate prices a stage's replicas at the planner's speed-proportional shares, while the strategies
other than `planned` and `hetero` split every batch evenly: on a stage that mixes GPU types the estimate
is then optimistic, and the simulator may refuse the first choice (the caller takes the next).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dist_lib import Cluster, Workload
from dist_lib.planner.partition import partition
from dist_lib.planner.search import to_plan
from dist_lib.planner.stage_space import StageSpace
from dist_lib.planner.space import divisors
from dist_lib.planner.step import step_estimate

MAX_STAGES = 16  # as the planner's search (`plan(max_stages=16)`)


@dataclass(frozen=True)
class Family:
    """The part of the plan space a strategy expresses: pipeline schedules as (planner schedule, model
    chunks per stage), TP degrees (None: any the cluster allows), recompute modes, ZeRO-1 or not, and how
    many stages: "one" (data parallel only), "many" (a pipeline) or "any"."""

    schedules: tuple[tuple[str, int], ...]
    tps: tuple[int, ...] | None = (1,)
    recompute: tuple[str, ...] = ("none", "full")
    zero: int = 0
    stages: str = "many"
    what: str = ""  # the family in a few words, for the reason nothing fits


FAMILIES: dict[str, Family] = {
    "ddp": Family((("1f1b", 1),), recompute=("none",), stages="one", what="whole-model data-parallel replica"),
    "zero": Family((("1f1b", 1),), recompute=("none",), zero=1, stages="one", what="ZeRO-1 replica"),
    "gpipe": Family((("gpipe", 1),), what="GPipe pipeline of single-GPU stages"),
    "one_f_one_b": Family((("1f1b", 1),), what="1F1B pipeline of single-GPU stages"),
    "deepspeed_1f1b": Family((("1f1b", 1),), what="1F1B pipeline of single-GPU stages"),
    "interleaved": Family((("interleaved", 2),), what="interleaved pipeline of single-GPU stages"),
    # the planner leaves ZB-H1 out under full recompute (its deferred W passes keep the rebuilt stashes)
    "zero_bubble": Family((("zero-bubble", 1),), recompute=("none",), what="ZB-H1 pipeline of single-GPU stages"),
    "hetero": Family((("1f1b", 1),), what="1F1B pipeline of single-GPU stages"),
    "hybrid": Family((("1f1b", 1), ("interleaved", 2), ("gpipe", 1)), tps=None, recompute=("none", "selective", "full"),
                     stages="any", what="dp x pp x tp layout"),
}


@dataclass
class Choice:
    """One layout of a family: its estimated step, and the strategy options that run it."""

    seconds: float
    memory: float  # the estimate's highest share of a device's memory
    options: dict[str, Any]
    summary: str  # the options in a few words (dp2 pp4 tp4 b1 1f1b recompute)


@dataclass
class Found:
    choices: list[Choice]  # fastest estimate first
    reason: str  # why none, when there are none
    estimated: int


def search(strategy: str, cluster: Cluster, workload: Workload, batch: int) -> Found:
    """The feasible layouts of `strategy`'s family, fastest estimate first, or why there are none."""
    family = FAMILIES[strategy]
    space = StageSpace(cluster, workload)
    choices: list[Choice] = []
    leanest: tuple[float, str] | None = None
    estimated = 0
    for pp, stages, tp, dp, b, recompute in _layouts(family, cluster, workload, batch):
        mb, m = b * dp, batch // (b * dp)
        options = [[o for o in space.options(ranks, mb, recompute, family.zero) if o.tp == tp] for ranks in stages]
        if not all(options):
            continue
        for schedule, chunks in family.schedules:
            if schedule == "interleaved" and (pp == 1 or m % pp or workload.num_layers < pp * chunks):
                continue
            if schedule == "zero-bubble" and pp == 1:
                continue
            estimated += 1
            cut = "gpipe" if schedule == "gpipe" else "1f1b"  # partition's memory model, as the planner's
            found = partition(options, workload.num_layers, m, cut)
            placed = found[1] if found is not None else None
            if placed is None or (schedule == "interleaved" and any(n < chunks for n, _ in placed)):
                loose = partition(options, workload.num_layers, m, cut, memory=False)
                if loose is not None and not (schedule == "interleaved" and any(n < chunks for n, _ in loose[1])):
                    _, share = step_estimate(cluster, workload, loose[1], m, schedule, chunks)
                    summary = _summary(dp, pp, tp, b, schedule, chunks, recompute, family.zero)
                    if leanest is None or share < leanest[0]:
                        leanest = (share, summary)
                continue
            seconds, share = step_estimate(cluster, workload, placed, m, schedule, chunks)
            summary = _summary(dp, pp, tp, b, schedule, chunks, recompute, family.zero)
            if share > 1.0:  # (of each GPU's capacity less its runtime reserve)
                if leanest is None or share < leanest[0]:
                    leanest = (share, summary)
                continue
            plan = to_plan(placed, mb, m, schedule, recompute, family.zero, chunks)
            choices.append(Choice(seconds, share, _options(strategy, plan, dp, pp, tp, b, schedule, chunks, recompute),
                                  summary))
    choices.sort(key=lambda c: c.seconds)
    reason = ""
    if not choices:
        what = family.what or strategy
        if leanest is not None:
            reason = (f"no {what} layout fits in memory: the leanest ({leanest[1]}) needs about "
                      f"{leanest[0]:.1f} times its fullest GPU's memory less the runtime reserve (planner estimate)")
        else:
            reason = (f"no {what} layout: the global batch of {batch} does not split over its replicas, or "
                      f"{workload.num_layers} layers do not fill its stages")
    return Found(choices, reason, estimated)


def _layouts(family: Family, cluster: Cluster, workload: Workload,
             batch: int) -> Iterator[tuple[int, list[tuple[int, ...]], int, int, int, str]]:
    """(pp, stage ranks, tp, dp, per-replica microbatch, recompute) of every layout of the family: equal
    stages over the ranks in cluster order (a strategy's layout, `strategies/_layout.py`: the stage varies
    slowest, TP fastest)."""
    world, layers = cluster.world_size, workload.num_layers
    ranks = tuple(range(world))
    for pp in divisors(world):
        if pp > min(layers, MAX_STAGES) or (family.stages == "one" and pp > 1) or (family.stages == "many" and pp < 2):
            continue
        width = world // pp
        stages = [ranks[i * width:(i + 1) * width] for i in range(pp)]
        for tp in divisors(width):
            if tp & (tp - 1) or (family.tps is not None and tp not in family.tps):
                continue
            dp = width // tp
            if batch % dp:
                continue
            for b in divisors(batch // dp):
                for recompute in family.recompute:
                    yield pp, stages, tp, dp, b, recompute


def _summary(dp: int, pp: int, tp: int, b: int, schedule: str, chunks: int, recompute: str, zero: int = 0) -> str:
    """The layout in a few words: dp8 pp2 tp2 b4 interleaved x2 selective recompute (b: samples a replica's
    microbatch holds)."""
    parts = [f"dp{dp}"] + ([f"pp{pp}"] if pp > 1 else []) + ([f"tp{tp}"] if tp > 1 else []) \
        + (["ZeRO-1"] if zero else []) + [f"b{b}"]
    if pp > 1:
        parts.append(schedule + (f" x{chunks}" if chunks > 1 else ""))
    if recompute != "none":
        parts.append(f"{recompute} recompute")
    return " ".join(parts)


def _options(strategy: str, plan: Any, dp: int, pp: int, tp: int, b: int, schedule: str, chunks: int,
             recompute: str) -> dict[str, Any]:
    """The strategy's own options for a layout; the planner's layer partition where the strategy takes one
    (in Megatron's interleaved block order: chunk c of stage s is block c * pp + s, as `to_plan` cuts)."""
    blocks = [stage.blocks[c] for c in range(chunks) for stage in plan.stages]
    layers = [stop - start for start, stop in blocks]
    if strategy == "ddp":
        return {"microbatch_size": b}
    if strategy == "zero":
        return {"stage": 1, "microbatch_size": b}
    if strategy == "hetero":
        return {"dp": dp, "pp": pp, "microbatch_size": b, "recompute": recompute == "full"}
    options: dict[str, Any] = {"pp": pp, "microbatch_size": b, "partition": layers}
    if recompute == "full":
        options["recompute"] = True
    if strategy == "interleaved":
        options["chunks"] = chunks
    if strategy == "hybrid":
        options.update(dp=dp, tp=tp, schedule={"zero-bubble": "1f1b"}.get(schedule, schedule))
        if schedule == "interleaved":
            options["chunks"] = chunks
        if recompute == "selective":
            options["selective_recompute"] = True
    return options

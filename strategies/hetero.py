"""Heterogeneity-aware hybrid parallelism: stages sized to their devices, batch shares sized to replicas.

On a cluster that mixes GPU types an even plan runs at the pace of its slowest device. This plan
(dp replicas x pp stages, 1F1B inside each replica; Narayanan et al. 2021) fixes both axes:
* each replica's layers are cut where its stage devices balance, within each device's memory, by the
  planner's partition (`dist_lib.planner`, the bottleneck-optimal cut AMP's dynamic program finds;
  Li et al. 2022) over the cost model's per-layer times;
* replicas receive uneven numbers of microbatches in proportion to their speed, as Metis does (Um et al.
  ATC'24): each microbatch goes to the replica whose estimated 1F1B time, sum of stage times +
  (m - 1) x slowest stage, grows least; each layer's gradient is all-reduced among the ranks that hold
  it in each replica.
With stages that balance, each replica idles 1F1B's (p - 1) / (m + p - 1) of its step, and stage s
holds at most p - s microbatches of activations; where the shares do not balance the replicas exactly,
the faster ones wait for the slowest at the gradient all-reduce.
Both choices can be given instead: `partition` (layer counts per stage, or one such list per replica)
and `shares` (microbatches per replica), so a planner or a user can evaluate a given plan. Both cuts
weigh compute and memory only, not links: a slow link between two stages (or under a replica's gradient
all-reduce) is paid as it comes. The planner's own plans (`planned.py`) go further: they cost every
message, and choose per-stage (dp, tp), shares within a microbatch and other schedules.
"""

from __future__ import annotations

from collections.abc import Sequence

from dist_lib import Model
from dist_lib.planner.search import pipeline_partition, pipeline_stage_seconds

from . import one_f_one_b
from ._layout import Layout, check_partition
from dist_lib.schedules.actions import check_schedule
from ._pipeline import StagePlan, run_stage


def plan(model: Model, dp: int | None, pp: int, microbatch_size: int, partition, shares, recompute: bool = False):
    """(layout, blocks per replica, microbatch counts per replica), the same on every rank."""
    layout = Layout.build(model.world_size, dp, pp, 1)
    cluster, workload = model.cluster, model.workload
    if isinstance(microbatch_size, bool) or not isinstance(microbatch_size, int) or microbatch_size < 1:
        raise ValueError(f"microbatch_size must be a whole number >= 1, got {microbatch_size!r}")
    if model.global_batch_size % microbatch_size:
        raise ValueError(f"microbatch_size={microbatch_size} does not divide the global batch "
                         f"{model.global_batch_size}; choose one that does")
    total = model.global_batch_size // microbatch_size
    replicas = [tuple(layout.rank(d, s) for s in range(pp)) for d in range(layout.dp)]
    mode = "full" if recompute else "none"
    if partition is None:
        if workload.num_layers < pp:
            raise ValueError(f"{workload.num_layers} layers cannot fill pp={pp} stages; lower pp")
        counts = [pipeline_partition(cluster, workload, ranks, microbatch_size, total, mode) for ranks in replicas]
        if None in counts:
            raise ValueError(f"no partition of {workload.num_layers} layers over {pp} stages fits in device "
                             f"memory; raise pp or lower microbatch_size")
        blocks = [check_partition(list(c), workload.num_layers, pp) for c in counts]
    elif partition and all(isinstance(p, (list, tuple)) for p in partition):
        if len(partition) != layout.dp:
            raise ValueError(f"partition gives {len(partition)} per-replica lists but dp={layout.dp}")
        blocks = [check_partition(p, workload.num_layers, pp, f"partition[{d}]") for d, p in enumerate(partition)]
    else:
        blocks = [check_partition(partition, workload.num_layers, pp)] * layout.dp
    if shares is None:
        seconds = [pipeline_stage_seconds(cluster, workload, ranks, [len(b) for b in blocks[d]], microbatch_size,
                                          mode) for d, ranks in enumerate(replicas)]
        counts = _shares(seconds, total)
    else:
        counts = list(shares) if isinstance(shares, (list, tuple)) else []
        if len(counts) != layout.dp or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts) \
                or sum(counts) != total:
            raise ValueError(f"shares must give each of dp={layout.dp} replicas a whole number >= 1 of "
                             f"microbatches, {total} in all; got {shares!r}")
    return layout, blocks, counts


def _shares(replica_stage_seconds: Sequence[Sequence[float]], microbatches: int) -> list[int]:
    """Microbatches per replica: each goes to the replica whose estimated step grows least."""
    dp = len(replica_stage_seconds)
    if microbatches < dp:
        raise ValueError(f"{microbatches} microbatches cannot give each of dp={dp} replicas one; lower "
                         f"microbatch_size or dp")
    counts = [1] * dp

    def step(d: int, m: int) -> float:
        times = replica_stage_seconds[d]
        return sum(times) + (m - 1) * max(times)

    for _ in range(microbatches - dp):
        d = min(range(dp), key=lambda r: (step(r, counts[r] + 1), r))
        counts[d] += 1
    return counts


async def train(model: Model, *, dp: int | None = None, pp: int = 2, microbatch_size: int = 1, partition=None,
                shares=None, recompute: bool = False) -> None:
    layout, blocks, counts = plan(model, dp, pp, microbatch_size, partition, shares, recompute)
    replica, stage, _ = layout.coords(model.rank)
    first = sum(counts[:replica]) * microbatch_size
    mbs = [range(first + i * microbatch_size, first + (i + 1) * microbatch_size) for i in range(counts[replica])]
    actions = one_f_one_b.schedule(stage, pp, len(mbs))
    check_schedule(actions, 1, len(mbs))
    owners = {layer: [layout.rank(d, s) for d in range(layout.dp) for s in range(pp) if layer in blocks[d][s]]
              for layer in blocks[replica][stage]}
    await run_stage(model, StagePlan(stage=stage, stage_ranks=[layout.rank(replica, s) for s in range(pp)],
                                     chunks=[blocks[replica][stage]], microbatches=mbs, actions=actions,
                                     dp_group=owners.__getitem__, recompute=recompute))

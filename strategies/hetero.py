"""Heterogeneity-aware hybrid parallelism: stages sized to their devices, batch shares sized to replicas.

On a cluster that mixes GPU types an even plan runs at the pace of its slowest device. This plan
(dp replicas x pp stages, 1F1B inside each replica; Narayanan et al. 2021) fixes both axes:
* each replica's layers are cut where the stage devices balance, by dynamic programming over per-layer
  costs as AMP does (Li et al. 2022), within each device's memory;
* replicas receive uneven numbers of microbatches in proportion to their speed, as Metis does (Um et al.
  ATC'24), and each layer's gradient is all-reduced among the ranks that hold it in each replica.
Step time ~ max over replicas of (sum of stage times + (m_d - 1) x slowest stage); bubble as 1F1B's.
Both choices can be given instead: `partition` (layer counts per stage, or one such list per replica)
and `shares` (microbatches per replica), so a planner or a user can evaluate a given plan.
"""

from __future__ import annotations

from dist_lib import Model

from . import _planner, one_f_one_b
from ._layout import Layout, check_partition
from ._pipeline import StagePlan, check_schedule, run_stage


def plan(model: Model, dp: int | None, pp: int, microbatch_size: int, partition, shares):
    """(layout, blocks per replica, microbatch counts per replica), the same on every rank."""
    layout = Layout.build(model.world_size, dp, pp, 1)
    cluster, workload = model.cluster, model.workload
    devices = [[cluster.device_of(layout.rank(d, s)) for s in range(pp)] for d in range(layout.dp)]
    if partition is None:
        blocks = [_planner.partition(devs, workload, microbatch_size) for devs in devices]
    elif partition and all(isinstance(p, (list, tuple)) for p in partition):
        if len(partition) != layout.dp:
            raise ValueError(f"partition gives {len(partition)} per-replica lists but dp={layout.dp}")
        blocks = [check_partition(p, workload.num_layers, pp) for p in partition]
    else:
        blocks = [check_partition(partition, workload.num_layers, pp)] * layout.dp
    if isinstance(microbatch_size, bool) or not isinstance(microbatch_size, int) or microbatch_size < 1:
        raise ValueError(f"microbatch_size must be a whole number >= 1, got {microbatch_size!r}")
    if model.global_batch_size % microbatch_size:
        raise ValueError(f"microbatch_size={microbatch_size} does not divide the global batch "
                         f"{model.global_batch_size}; choose one that does")
    total = model.global_batch_size // microbatch_size
    if shares is None:
        seconds = [_planner.stage_seconds(devices[d], workload, blocks[d], microbatch_size) for d in range(layout.dp)]
        counts = _planner.shares(seconds, total)
    else:
        counts = list(shares)
        if len(counts) != layout.dp or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts) \
                or sum(counts) != total:
            raise ValueError(f"shares must give each of dp={layout.dp} replicas a whole number >= 1 of "
                             f"microbatches, {total} in all; got {shares!r}")
    return layout, blocks, counts


async def train(model: Model, *, dp: int | None = None, pp: int = 2, microbatch_size: int = 1, partition=None,
                shares=None, recompute: bool = False) -> None:
    layout, blocks, counts = plan(model, dp, pp, microbatch_size, partition, shares)
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

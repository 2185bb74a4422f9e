"""From a layout and a schedule to the `StagePlan` one rank runs (shared by the pipeline strategies)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dist_lib import Model

from ._layout import Layout, check_partition, even_partition, microbatches, replica_samples
from ._pipeline import Action, StagePlan, check_schedule

Schedule = Callable[[int, int, int, int], Sequence[Action]]  # (stage, stages, microbatches, chunks)


def build_plan(model: Model, schedule: Schedule, *, microbatch_size: int, pp: int, tp: int = 1,
               dp: int | None = None, chunks: int = 1, partition: Sequence | None = None,
               recompute: bool = False) -> StagePlan:
    """This rank's part of a dp x pp x tp run with an even (or the given) layer partition."""
    layout = Layout.build(model.world_size, dp, pp, tp)
    if tp > 1:
        layout.check_tp_in_node(model.cluster)
    replica, stage, tp_rank = layout.coords(model.rank)
    first, count = replica_samples(model.global_batch_size, layout.dp, replica)
    mbs = microbatches(first, count, microbatch_size)
    parts = pp * chunks
    if partition is not None:
        blocks = check_partition(partition, model.num_layers, parts)
    else:
        blocks = even_partition(model.num_layers, parts, "pp" if chunks == 1 else "pp x chunks")
    actions = list(schedule(stage, pp, len(mbs), chunks))
    check_schedule(actions, chunks, len(mbs))
    dp_ranks = layout.dp_group(model.rank)
    return StagePlan(stage=stage, stage_ranks=layout.stage_ranks(model.rank),
                     chunks=[blocks[c * pp + stage] for c in range(chunks)], microbatches=mbs,
                     actions=actions, dp_group=lambda layer: dp_ranks, tp_group=layout.tp_group(model.rank),
                     tp_rank=tp_rank, recompute=recompute)

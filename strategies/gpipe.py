"""GPipe: a pipeline over contiguous layer blocks, all forwards then all backwards.

Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism".
With p stages and m microbatches every stage idles (p - 1) x (F + B) of a step of
(m + p - 1) x (F + B): bubble (p - 1) / (m + p - 1). Memory: each stage holds the activations of all
m microbatches before the first backward, m in flight (recompute cuts that to layer inputs).
Ranks beyond `pp` become data-parallel replicas whose gradients are all-reduced at the end.
"""

from __future__ import annotations

from dist_lib import Model

from dist_lib.schedules.actions import Action
from ._pipeline import run_stage
from ._layout import declared_grid
from ._plan import build_plan


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Action]:
    """Every stage: F0 F1 ... F(m-1), then B0 B1 ... B(m-1)."""
    if chunks != 1:
        raise ValueError("gpipe runs one model chunk per rank; use the interleaved schedule for chunks > 1")
    return [Action("F", 0, i) for i in range(microbatches)] + [Action("B", 0, i) for i in range(microbatches)]


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, partition=None,
                recompute: bool = False) -> None:
    plan = build_plan(model, schedule, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      partition=partition, recompute=recompute)
    await run_stage(model, plan)


def replica_grid(world_size: int, global_batch_size: int, **options):
    """Its replicas run one program, each over its share of the batch: they fold (`_layout.declared_grid`)."""
    return declared_grid(train, world_size, options)

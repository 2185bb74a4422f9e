"""Hybrid 3D parallelism: data x pipeline x tensor parallel, as Megatron-LM lays it out.

Shoeybi et al. 2019 (tensor parallelism) and Narayanan et al. 2021 (the PTD-P layout): ranks form a
(pp, dp, tp) grid with TP fastest, so each TP group sits inside a node; each of the `dp` replicas runs a
pipeline of `pp` stages with the chosen `schedule` (gpipe, 1f1b, interleaved, or DeepSpeed's lock-step
`deepspeed`), and layer gradients are all-reduced across replicas as soon as a stage's last microbatch has
passed. Every option, its source and its effect: docs/reference/strategies.md, "hybrid's options".
"""

from __future__ import annotations

from dist_lib import Model

from . import deepspeed_1f1b, gpipe, interleaved, one_f_one_b
from ._pipeline import run_stage
from ._layout import declared_grid
from ._plan import build_plan

SCHEDULES = {"gpipe": gpipe.schedule, "1f1b": one_f_one_b.schedule, "interleaved": interleaved.schedule,
             "deepspeed": deepspeed_1f1b.schedule}


async def train(model: Model, *, dp: int | None = None, pp: int = 2, tp: int = 1, microbatch_size: int = 1,
                schedule: str = "1f1b", chunks: int | None = None, recompute: bool = False,
                selective_recompute: bool = False, sequence_parallel: bool = False, overlap_grad_reduce: bool = True,
                scatter_gather: bool = True, async_tp_allreduce: bool = True, partition=None,
                tied_embeddings: bool = False, attention_mask_messages: bool = False) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if attention_mask_messages and schedule != "deepspeed":
        raise ValueError(f"attention_mask_messages=True needs schedule='deepspeed' (DeepSpeed's engine sends the "
                         f"mask between stages; Megatron-LM's schedules rebuild it on each stage), got "
                         f"schedule={schedule!r}")
    if chunks is None:
        chunks = 2 if schedule == "interleaved" else 1
    plan = build_plan(model, SCHEDULES[schedule], microbatch_size=microbatch_size, pp=pp, tp=tp, dp=dp,
                      chunks=chunks, partition=partition, recompute=recompute,
                      selective_recompute=selective_recompute, sequence_parallel=sequence_parallel,
                      overlap_grad_reduce=overlap_grad_reduce, scatter_gather=scatter_gather,
                      async_tp_allreduce=async_tp_allreduce, tied_embeddings=tied_embeddings,
                      attention_mask_messages=attention_mask_messages)
    await run_stage(model, plan)


def replica_grid(world_size: int, global_batch_size: int, **options):
    """Its replicas run one program, each over its share of the batch: they fold (`_layout.declared_grid`)."""
    return declared_grid(train, world_size, options)

"""Hybrid 3D parallelism: data x pipeline x tensor parallel, as Megatron-LM lays it out.

Shoeybi et al. 2019 (Megatron-LM tensor parallelism) and Narayanan et al. 2021 ("Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", the PTD-P layout). Ranks form a
(pp, dp, tp) grid with TP fastest, so each TP group of `tp` consecutive ranks sits inside a node:
every layer's forward and backward ends in two all-reduces of b*s*h activations in the TP group. Each
of the `dp` replicas runs a pipeline of `pp` stages with the chosen `schedule` (gpipe, 1f1b or
interleaved with `chunks` per rank, or `deepspeed`: DeepSpeed's lock-step 1F1B with blocking messages)
over its share of the batch, and layer gradients are all-reduced
across replicas as soon as a stage's last microbatch has passed. Bubble: the schedule's,
(p - 1) / (m + p - 1) for gpipe and 1f1b, divided by `chunks` for interleaved. Memory per rank: model
state 16 bytes x parameters / (pp x tp) plus the schedule's in-flight activations (the TP stash
formula); `recompute=True` keeps only layer inputs and runs each forward again before its backward;
`selective_recompute=True` keeps everything but the attention core's softmax and dropout, which each
backward re-runs (Korthikanti et al. 2022, sec. 5); `sequence_parallel=True` splits each TP layer's
layernorms, dropouts and residual adds along the sequence, and their stash with them (same paper, sec. 4.2.2).
As in Megatron-LM, the LM head is vocabulary-parallel over the TP group, each backward all-reduces its
input gradient while the weight-gradient GEMMs run, and a recomputed forward repeats its TP all-reduces.
Pipeline messages go as Megatron-LM sends them: each TP rank sends 1/t of the activation (or gradient) and
the next stage's TP group all-gathers the pieces (Narayanan et al. 2021, sec. 4.1); `scatter_gather=False`
sends the whole message from every TP rank. With `schedule="deepspeed"` they go as DeepSpeed 0.3's engine sends
them (`_Stage.message`): an activation as partition metadata plus the 1/t piece, gathered on arrival, a gradient
whole from every TP rank, and the sender re-gathers its own output before each gradient comes in;
`attention_mask_messages=True` adds the 16-bit s x s attention mask to every activation message, as
Megatron-LM v1.1.5's GPT2ModelPipe passes it between DeepSpeed stages. Each backward all-reduces its input
gradient while the weight-gradient GEMMs run (Megatron-LM since September 2021); `async_tp_allreduce=False`
all-reduces it after the backward, as earlier versions did. With sequence parallelism each layer's backward
all-gathers its output gradient twice before the row-parallel GEMMs, exposed (Korthikanti et al. 2022, sec. 4.2.2).
`overlap_grad_reduce=False` all-reduces the gradients only after the pipeline flush (Megatron-LM's local
DDP of 2021, DeepSpeed's pipeline engine) instead of as each layer's last microbatch passes.
`tied_embeddings=True`: the LM head shares the input embedding, so after the schedule the first and last
stage all-reduce its V/t x h gradient before the data-parallel reduction (`Model.tied_embedding_grad`).
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

"""What one rank needs to run its part of a pipeline replica (`StagePlan`), as the strategies' plans lay it
out (`_plan.py`, `planned.py`) and the pipeline stage runs it (`_pipeline.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dist_lib.schedules.actions import Action


@dataclass
class StagePlan:
    """What one rank needs to run its part of a pipeline replica."""

    stage: int  # this rank's pipeline stage
    stage_ranks: Sequence[int]  # rank of each stage of this replica (same TP slice)
    chunks: Sequence[range]  # layers of this rank's chunks; chunk c is virtual stage c * pp + stage
    microbatches: Sequence[range]  # this replica's microbatches (global sample indices)
    actions: Sequence[Action]
    dp_group: Callable[[int], Sequence[int]]  # layer -> ranks that all-reduce its gradient
    tp_group: Sequence[int] = (0,)
    tp_rank: int = 0
    recompute: bool = False
    selective_recompute: bool | str = False  # True: Korthikanti et al. 2022's; "op": torchtitan's per-op policy
    sequence_parallel: bool = False  # TP layers split their elementwise work along the sequence (same paper)
    # all-reduce each layer's gradient as soon as it is complete (PyTorch DDP's buckets), or only after the
    # pipeline flush, as Megatron-LM's local DDP and DeepSpeed's pipeline engine do
    overlap_grad_reduce: bool = True
    # with TP, send 1/t of each pipeline message from each TP rank and all-gather it on arrival (Megatron-LM's
    # scatter-gather optimization, on by default; Narayanan et al. 2021, sec. 4.1), rather than the whole
    # message from every TP rank
    scatter_gather: bool = True
    # with TP, all-reduce each backward's input gradient while the weight-gradient GEMMs run (Megatron-LM's
    # async_tensor_model_parallel_allreduce, on by default since commit 3f65246 of 2 September 2021), or
    # after the whole backward, as Megatron-LM did before (the version Narayanan et al. 2021 measured)
    async_tp_allreduce: bool = True
    # the LM head shares the input embedding: after the schedule the first and last stage all-reduce its
    # gradient (Megatron-LM's embedding group, DeepSpeed's tied-weight reduction) before the data-parallel one
    tied_embeddings: bool = False
    # DeepSpeed's engine with Megatron-LM v1.1.5's GPT2ModelPipe: every activation message carries the
    # stage's 16-bit 1 x 1 x s x s attention mask as well (`Model.pipe_extra`); schedules that place their
    # own messages only
    attention_mask_messages: bool = False
    # the linear layers' GEMMs in FP8 with this scaling recipe ("delayed", "tensorwise", "rowwise"; `costs.fp8`),
    # or ""
    fp8: str = ""
    # context parallelism (`_context.py`): the ranks holding the other sequence parts of this rank's samples
    # (this rank at position `cp_rank`), and how a layer's attention gets their keys and values
    cp_group: Sequence[int] = ()
    cp_rank: int = 0
    kv_exchange: str = "ring"
    # the layer's TP collectives pipelined with the GEMMs they feed and drain, charged what the GEMMs leave exposed
    # (`costs.tp_overlap`): "userbuffers" Megatron-Core's --tp-comm-overlap (Transformer Engine), "micro_pipeline"
    # torchtitan's async TP (Inductor's pass: `comm.tp_overlap.OVERLAPS`), "" none
    tp_comm_overlap: str = ""
    # Megatron-Core's module recompute on MoE layers (`recompute_modules`): "layernorm" the pre-MLP norm, "moe_act"
    # the experts' activation, each run again in the backward instead of kept (`_expert_stage.check_recompute_modules`)
    recompute_modules: tuple[str, ...] = ()

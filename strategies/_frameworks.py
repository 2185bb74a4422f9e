"""Frameworks as named behaviours: what a training stack does by default, as `hybrid`'s option defaults.

A run names the framework it assumes (`hybrid` option `framework`); its record below sets the defaults of
the options the framework decides, and an option the run sets to a value other than hybrid's own default
wins (hybrid cannot tell an option passed at its default from one left out: that one takes the framework's). Each fact cites the code of
that framework; none is a correction fitted to a measurement. What the workload carries instead (which
attention kernel runs, gradient width) is listed under `workload`, for the user to set on the workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Framework:
    name: str
    options: dict  # hybrid's option -> the framework's default
    workload: dict = field(default_factory=dict)  # what the workload should say (not applied: documented)
    source: str = ""


FRAMEWORKS = {f.name: f for f in (
    # Megatron-LM as Narayanan et al. 2021 measured it (NVIDIA/Megatron-LM, 2021): local DDP all-reduces the
    # fp32 gradient buffer after the pipeline flush (megatron/model/distributed.py `allreduce_gradients`,
    # called from training.py after `forward_backward_func`); the backward's TP all-reduce after the backward
    # GEMMs (async_tensor_model_parallel_allreduce arrived in commit 3f65246, September 2021); scatter-gather
    # of pipeline messages on (`--no-scatter-gather-tensors-in-pipeline` defaults to using it).
    Framework("megatron-lm-2021",
              dict(overlap_grad_reduce=False, async_tp_allreduce=False, scatter_gather=True),
              dict(grad_bytes_per_element=4, attention="unfused"),
              "NVIDIA/Megatron-LM v2.x: megatron/model/distributed.py, megatron/training.py"),
    # Megatron-Core r0.8.0 (NVIDIA/Megatron-LM core_r0.8.0) as its published performance runs configure it:
    # --use-distributed-optimizer (megatron/core/optimizer/distrib_optimizer.py), --overlap-grad-reduce
    # (megatron/core/distributed/param_and_grad_buffer.py `start_grad_sync` per bucket), --overlap-param-gather
    # (`finish_param_sync` dispatching the next bucket from the forward pre-hook), sequence parallelism (which
    # --tp-comm-overlap requires), the async TP all-reduce (`LinearWithGradAccumulationAndAsyncCommunication`),
    # bf16 with fp32 gradient accumulation (`accumulate_allreduce_grads_in_fp32`), TE fused attention.
    Framework("megatron-core-2024",
              dict(overlap_grad_reduce=True, async_tp_allreduce=True, scatter_gather=True,
                   distributed_optimizer=True, overlap_param_gather=True),
              dict(grad_bytes_per_element=4, attention="flash3"),
              "NVIDIA/Megatron-LM core_r0.8.0: megatron/core/distributed/, megatron/core/optimizer/distrib_optimizer.py"),
    # DeepSpeed 0.x's pipeline engine (deepspeed/runtime/pipe/engine.py): lock-step 1F1B with blocking
    # messages (`TrainSchedule`), gradients all-reduced after the flush (`_exec_reduce_grads` is the schedule's
    # last instruction), tied embeddings reduced between the first and last stage (`_exec_reduce_tied_grads`).
    Framework("deepspeed-0.x",
              dict(schedule="deepspeed", overlap_grad_reduce=False, tied_embeddings=True),
              dict(attention="unfused"),
              "microsoft/DeepSpeed v0.3-0.9: deepspeed/runtime/pipe/engine.py, deepspeed/runtime/pipe/schedule.py"),
    # torchtitan (pytorch/torchtitan, 2024-2025): FSDP2 `fully_shard` per transformer block over the data-parallel
    # mesh (torchtitan/distributed/fsdp.py; reshard after forward unless pipelining,
    # `get_fsdp_reshard_after_forward_policy`), bf16 parameters with fp32 reduction (`mixed_precision_reduce`),
    # TP via DTensor with sequence parallelism on the norms (parallelize `SequenceParallel`), SDPA attention.
    Framework("torchtitan",
              dict(fsdp=True, overlap_grad_reduce=True, sequence_parallel=True),
              dict(attention="flash2"),
              "pytorch/torchtitan: torchtitan/distributed/fsdp.py, torchtitan/models/llama3/parallelize.py"),
)}


def framework_defaults(name: str | None, given: dict, tp: int) -> dict:
    """The options `given` with the framework's defaults filled in where the run gave none; sequence
    parallelism only where there is a TP group to split."""
    if name is None:
        return given
    if name not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)} (or None), got {name!r}")
    defaults = dict(FRAMEWORKS[name].options)
    if tp == 1:
        defaults.pop("sequence_parallel", None)
    return {**defaults, **given}

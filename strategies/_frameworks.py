"""Frameworks as named behaviours: what a training stack does by default, as `hybrid`'s option defaults.

A run names the framework it assumes (`hybrid` option `framework`); its record below sets the defaults of
the options the framework decides (`DECIDED`). Those options default to None in hybrid's signature, "not
given": an option the run passes always wins, whatever its value, and one it leaves out takes the
framework's default, or without a framework hybrid's own (`DECIDED`'s values). Each fact cites the code of
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
    # The backward's TP reduction is not overlapped with the weight-gradient GEMMs: DTensor reduce-scatters the
    # summed input gradient of Q/K/V (of w1/w3) in the backward of the one redistribute before them
    # (`PrepareModuleInput`), after the autograd nodes of the three (two) matmuls, each computing its input and its
    # weight gradient, and the norm's backward waits for it next; compiled, Inductor keeps the collectives where
    # the graph has them (`reorder_for_compute_comm_overlap = False`, torch/_inductor/config.py), which torchtitan
    # does not change. So `async_tp_allreduce=False`, with or without async TP (whose pass does not fuse these).
    Framework("torchtitan",
              dict(fsdp=True, overlap_grad_reduce=True, sequence_parallel=True, async_tp_allreduce=False),
              dict(attention="flash2", projections="separate"),
              "pytorch/torchtitan: torchtitan/distributed/fsdp.py, torchtitan/models/llama3/parallelize.py, "
              "torchtitan/models/llama3/model.py"),
)}


# What `tp_comm_overlap=True` overlaps under each framework (`comm.tp_overlap.OVERLAPS`); Megatron-Core's userbuffers
# (Transformer Engine) wherever a framework is not listed. torchtitan's async TP is Inductor's micro-pipeline TP pass
# (torchtitan/distributed/tensor_parallel.py `maybe_enable_async_tp`, 2025; torchtitan/parallelisms/parallelize_llama.py
# in 2024: `torch._inductor.config._micro_pipeline_tp = True` and symmetric memory for the TP group), which fuses a
# collective with a matmul only by two pattern rules (pytorch/pytorch torch/_inductor/fx_passes/micro_pipeline_tp.py,
# 2024-2025): an all-gather with the matmuls that take its result as their left operand (`fuse_all_gather_matmul`,
# `_find_consumer_matmuls`), a reduce-scatter whose input is one matmul's output with no other user
# (`fuse_matmul_reduce_scatter`, `_find_producer_matmul`). A Llama layer's forward all-gathers (before Q/K/V and
# before w1/w3) and reduce-scatters (after wo and w2) qualify, and so do the backward's all-gathers of the output
# gradient (the left operand of wo's and w2's input-gradient matmuls) and the recompute's all-gathers (of the
# recomputed projections); the backward's reduce-scatters of the input gradients of Q/K/V and of w1/w3 do not: each
# reduces a sum of matmuls (pytorch/pytorch#149946: "the reduce-scatters are receiving as input the addition of
# various scaled_mms").
TP_OVERLAPS = {"torchtitan": "micro_pipeline"}


def tp_overlap(name: str | None) -> str:
    """What `tp_comm_overlap=True` overlaps under framework `name` (`TP_OVERLAPS`, else Megatron-Core's userbuffers)."""
    return TP_OVERLAPS.get(name or "", "userbuffers")


# the options a framework decides, each with hybrid's own default (used when neither run nor framework sets it)
DECIDED = dict(schedule="1f1b", sequence_parallel=False, overlap_grad_reduce=True, scatter_gather=True,
               async_tp_allreduce=True, tied_embeddings=False, distributed_optimizer=False,
               overlap_param_gather=False, fsdp=False)


def framework_defaults(name: str | None, given: dict, tp: int) -> dict:
    """Every option of `DECIDED`: the run's value where `given` has one (not None), else the framework's default
    (sequence parallelism only where there is a TP group to split), else hybrid's own. A value of the wrong
    type is refused here, since the None default leaves the simulator no type to check it against."""
    if name is not None and name not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)} (or None), got {name!r}")
    defaults = dict(DECIDED)
    if name is not None:
        defaults.update(FRAMEWORKS[name].options)
        if tp == 1:
            defaults["sequence_parallel"] = DECIDED["sequence_parallel"]
    chosen = {key: defaults[key] if given.get(key) is None else given[key] for key in DECIDED}
    for key, value in chosen.items():
        if type(value) is not type(DECIDED[key]):
            kind = "True or False" if isinstance(DECIDED[key], bool) else "a string"
            raise ValueError(f"{key} must be {kind} (or None: the framework's default, else "
                             f"{DECIDED[key]!r}), got {value!r}")
    return chosen

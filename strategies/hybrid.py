"""Hybrid 3D parallelism: data x pipeline x tensor parallel, as Megatron-LM lays it out.

Shoeybi et al. 2019 (tensor parallelism) and Narayanan et al. 2021 (the PTD-P layout): ranks form a
(pp, dp, tp) grid with TP fastest, so each TP group sits inside a node; each of the `dp` replicas runs a
pipeline of `pp` stages with the chosen `schedule` (gpipe, 1f1b, interleaved, or DeepSpeed's lock-step
`deepspeed`), and layer gradients are all-reduced across replicas as soon as a stage's last microbatch has
passed. With `cp` > 1, each replica's stages run context-parallel (`_context.py`: Megatron-Core's ring
attention, Llama 3's all-gather of keys and values with `kv_exchange="all_gather"`, or PyTorch's context-parallel
SDPA as torchtitan runs it with `kv_exchange="torch_all_gather"`); with a
mixture-of-experts workload, `ep` and `etp` lay Megatron-Core's expert grid over the ranks of each stage (EP x
ETP x PP x DP beside TP, `_expert_stage.py`; the distributed optimizer's `_expert_sharded.py`;
`moe_dispatcher` the token dispatch, flat or hierarchical as DeepEP/HybridEP);
`distributed_optimizer` and `fsdp` shard the data-parallel state (`_sharded.py`), `recompute` checkpoints each layer
whole (True) or as torchtitan's per-op selective policy does ("op", `workload/per_op_checkpoint.py`),
`recompute_modules` recomputes an MoE layer's pre-MLP norm and experts' activation as Megatron-Core's
`--recompute-modules layernorm moe_act` does, `fp8` runs the
linear layers' GEMMs in FP8, `tp_comm_overlap` pipelines the TP collectives with the GEMMs (`costs/tp_overlap.py`), and
`framework` takes a framework's defaults (`_frameworks.py`). Every option, its source and its effect:
docs/reference/strategies.md, "hybrid's options".
"""

from __future__ import annotations

import dataclasses
import inspect
import math

from dist_lib import Model

from . import deepspeed_1f1b, gpipe, interleaved, one_f_one_b
from ._context import run_context_stage
from ._expert_sharded import run_sharded_expert_stage
from ._expert_stage import ExpertPlan, check_expert_options, check_recompute_modules
from ._layout import Layout, declared_grid
from ._plan import build_plan, recompute_modes
from ._frameworks import DECIDED, framework_defaults, tp_overlap
from ._sharded import run_sharded_stage

SCHEDULES = {"gpipe": gpipe.schedule, "1f1b": one_f_one_b.schedule, "interleaved": interleaved.schedule,
             "deepspeed": deepspeed_1f1b.schedule}


async def train(model: Model, *, dp: int | None = None, pp: int = 2, tp: int = 1, microbatch_size: int = 1,
                schedule: str | None = None, chunks: int | None = None, recompute: bool | str | None = None,
                selective_recompute: bool = False, sequence_parallel: bool | None = None,
                overlap_grad_reduce: bool | None = None, scatter_gather: bool | None = None,
                async_tp_allreduce: bool | None = None, partition=None, tied_embeddings: bool | None = None,
                attention_mask_messages: bool = False, cp: int = 1, kv_exchange: str = "ring",
                ep: int | None = None, distributed_optimizer: bool | None = None,
                overlap_param_gather: bool | None = None, fsdp: bool | None = None,
                replicate: int = 1, reshard_after_forward: bool | None = None, fp8: str | None = None,
                tp_comm_overlap: bool = False, framework: str | None = None, etp: int | None = None,
                moe_dispatcher: str = "alltoall", recompute_modules: list[str] | tuple[str, ...] = ()) -> None:
    # the options a framework decides default to None, "not given" (`_frameworks.DECIDED`): the run's value,
    # else the framework's, else hybrid's own default
    chosen = framework_defaults(framework, {k: v for k, v in locals().items() if k in DECIDED}, tp)
    (schedule, sequence_parallel, overlap_grad_reduce, scatter_gather, async_tp_allreduce, tied_embeddings,
     distributed_optimizer, overlap_param_gather, fsdp) = (chosen[k] for k in DECIDED)  # DECIDED's order
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if attention_mask_messages and schedule != "deepspeed":
        raise ValueError(f"attention_mask_messages=True needs schedule='deepspeed' (DeepSpeed's engine sends the "
                         f"mask between stages; Megatron-LM's schedules rebuild it on each stage), got "
                         f"schedule={schedule!r}")
    if cp != 1 and schedule == "deepspeed":
        raise ValueError(f"cp={cp} runs with schedule gpipe, 1f1b or interleaved, not {schedule!r}")
    sharding = check_sharding(distributed_optimizer, fsdp, overlap_param_gather, replicate, reshard_after_forward)
    # recompute: None or False nothing, True the whole layer, "op" torchtitan's per-op selective checkpointing (the
    # forwards' selective_recompute mode "op"); None by default, as a bool default would refuse the string
    recompute, selective_recompute = recompute_modes(recompute, selective_recompute)
    if selective_recompute == "op" and (cp != 1 or ep is not None or hasattr(model, "moe")):
        raise ValueError(f"recompute='op' (torchtitan's per-op selective checkpointing) is modelled without context "
                         f"parallelism and experts; got cp={cp}{', a mixture-of-experts workload' * hasattr(model, 'moe')}"
                         f"{f', ep={ep}' if ep is not None else ''}")
    if tp_comm_overlap and tp > 1 and not sequence_parallel:
        raise ValueError(f"tp_comm_overlap=True with tp={tp} needs sequence_parallel=True (Megatron-LM asserts "
                         f"--tp-comm-overlap only with --sequence-parallel)")
    if chunks is None:
        chunks = 2 if schedule == "interleaved" else 1
    plan = build_plan(model, SCHEDULES[schedule], microbatch_size=microbatch_size, pp=pp, tp=tp, dp=dp,
                      chunks=chunks, partition=partition, recompute=recompute,
                      selective_recompute=selective_recompute, sequence_parallel=sequence_parallel,
                      overlap_grad_reduce=overlap_grad_reduce, scatter_gather=scatter_gather,
                      async_tp_allreduce=async_tp_allreduce, tied_embeddings=tied_embeddings,
                      attention_mask_messages=attention_mask_messages, cp=cp, kv_exchange=kv_exchange, fp8=fp8)
    plan.tp_comm_overlap = tp_overlap(framework) if tp_comm_overlap else ""  # which collectives it overlaps
    plan.recompute_modules = check_recompute_modules(recompute_modules, hasattr(model, "moe"), recompute)
    if ep is not None or hasattr(model, "moe"):  # experts over the replicas (EP x PP x DP): _expert_stage.py
        check_expert_options(tp, (("recompute", recompute), ("selective_recompute", selective_recompute),
                                  ("sequence_parallel", sequence_parallel), ("cp", cp != 1 and cp),
                                  ("fsdp", fsdp), ("tp_comm_overlap", tp_comm_overlap)))
        layout = Layout.build(model.world_size, dp, pp, tp)
        await run_sharded_expert_stage(model, plan, ExpertPlan.build(model, layout, 1 if ep is None else ep,
                                                                     microbatch_size, tp if etp is None else etp,
                                                                     moe_dispatcher),
                                       sharding, overlap_param_gather)
        return
    if moe_dispatcher != "alltoall":
        raise ValueError(f"moe_dispatcher={moe_dispatcher!r} says how an MoE layer's tokens reach their experts; "
                         f"workload {model.workload.name} has no experts")
    if etp is not None:
        raise ValueError(f"etp={etp!r} is the experts' tensor-parallel size; workload {model.workload.name} has no "
                         f"experts")
    options = {}
    if sharding == "optimizer":
        options = dict(overlap_param_gather=overlap_param_gather)
    elif sharding == "full":  # (with cp, HSDP's replicate groups are whole replicas: dp x cp / replicate ranks)
        options = dict(replicate=replicate, reshard_after_forward=reshard_after_forward)
    if cp != 1:
        await run_context_stage(model, plan, sharding, **options)
        return
    await run_sharded_stage(model, plan, sharding, **options)


def check_sharding(distributed_optimizer: bool, fsdp: bool, overlap_param_gather: bool, replicate: int,
                   reshard_after_forward: bool | None) -> str:
    """The data-parallel sharding the options ask for (`_sharded.SHARDINGS`), or a ValueError naming the
    option that contradicts another."""
    if distributed_optimizer and fsdp:
        raise ValueError("distributed_optimizer=True and fsdp=True exclude each other (ZeRO-1 keeps the weights "
                         "whole, FSDP shards them); choose one")
    if overlap_param_gather and not distributed_optimizer:
        raise ValueError("overlap_param_gather=True needs distributed_optimizer=True (Megatron-LM gathers the "
                         "updated parameter shards only with --use-distributed-optimizer)")
    if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 1:
        raise ValueError(f"replicate must be a whole number >= 1, got {replicate!r}")
    if (replicate != 1 or reshard_after_forward is not None) and not fsdp:
        raise ValueError("replicate and reshard_after_forward are FSDP's options: set fsdp=True")
    if reshard_after_forward not in (None, True, False):
        raise ValueError(f"reshard_after_forward must be True, False or None (torchtitan's default), "
                         f"got {reshard_after_forward!r}")
    return "optimizer" if distributed_optimizer else "full" if fsdp else "none"


def replica_grid(world_size: int, global_batch_size: int, **options):
    """Its replicas run one program, each over its share of the batch: they fold (`_layout.declared_grid`),
    with the distributed optimizer's and FSDP's shards too (replica j holds block j of each, as `run/folding.py`
    relabels them), and under a framework's defaults. With context parallelism a replica's stage is its cp x tp
    ranks (TP fastest, as `context_plan` lays them out), and its gradients' groups of dp x cp ranks take the
    same positions in every replica. With experts (`ep`), the replicas that exchange tokens fold as one: a folded
    replica is the least run of a stage's ranks that holds whole EP groups (ep x etp ranks) and whole TP groups,
    and the expert-data-parallel groups take the same positions in every such run (`_expert_stage.ExpertPlan`);
    under TP the experts' gradients hold masks over the tp sequence parts of each sample (`ReplicaGrid.parts`).
    With HSDP (`replicate`) a folded replica is a whole shard group, the dp / replicate consecutive replicas
    that shard the weights among them (`_sharded.ShardedStage`): the replicate groups, one rank at the same
    place in every shard group, are what crosses the fold."""
    tp, cp = options.get("tp", 1), options.get("cp", 1)
    replicate = options.get("replicate", 1)
    if replicate != 1:
        if options.get("ep") is not None or not isinstance(replicate, int) or replicate < 1:
            return None
        pp = options.get("pp", inspect.signature(train).parameters["pp"].default)
        dp = options.get("dp") or world_size // (pp * tp * cp)
        if dp % replicate:
            return None
        grid = declared_grid(train, world_size, dict(options, tp=dp // replicate * cp * tp, dp=replicate))
        return dataclasses.replace(grid, shards_inside=True)
    if cp != 1:
        return declared_grid(train, world_size, dict(options, tp=tp * cp))
    ep, etp = options.get("ep"), options.get("etp")  # (experts without `ep`: each replica holds all, ep 1)
    width = math.lcm((ep or 1) * (tp if etp is None else etp), tp)  # ranks of a stage a folded replica holds
    dp = options.get("dp")
    if dp is not None and (dp * tp) % width:
        return None
    grid = declared_grid(train, world_size, dict(options, tp=width, dp=None if dp is None else dp * tp // width))
    return dataclasses.replace(grid, parts=tp)  # (under TP, the experts' gradients hold sequence parts apart)

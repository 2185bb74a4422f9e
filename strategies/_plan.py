"""From a layout and a schedule to the `StagePlan` one rank runs (shared by the pipeline strategies)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

from dist_lib import Model

from dist_lib.costs import compute as costs

from dist_lib.costs import context, network
from dist_lib.costs.fp8 import check_recipe
from dist_lib.errors import SpecError
from dist_lib.workload.per_op_checkpoint import workload_problem as per_op_problem

from ._layout import Layout, check_chunks, check_partition, even_partition, microbatches, replica_samples
from dist_lib.schedules.actions import Action, check_schedule
from ._pipeline import StagePlan

Schedule = Callable[[int, int, int, int], Sequence[Action]]  # (stage, stages, microbatches, chunks)


def build_plan(model: Model, schedule: Schedule, *, microbatch_size: int, pp: int, tp: int = 1,
               dp: int | None = None, chunks: int = 1, partition: Sequence | None = None,
               recompute: bool = False, selective_recompute: bool = False,
               sequence_parallel: bool = False, overlap_grad_reduce: bool = True,
               scatter_gather: bool = True, async_tp_allreduce: bool = True,
               tied_embeddings: bool = False, attention_mask_messages: bool = False, cp: int = 1,
               kv_exchange: str = "ring", fp8: str | None = None) -> StagePlan:
    """This rank's part of a dp x pp x tp run with an even (or the given) layer partition; with `cp` > 1,
    of a dp x pp x cp x tp run (`context_layout`)."""
    if cp != 1:
        return context_plan(model, schedule, microbatch_size=microbatch_size, pp=pp, tp=tp, dp=dp, cp=cp,
                            chunks=chunks, partition=partition, kv_exchange=kv_exchange,
                            overlap_grad_reduce=overlap_grad_reduce, tied_embeddings=tied_embeddings,
                            recompute=recompute, selective_recompute=selective_recompute,
                            sequence_parallel=sequence_parallel, fp8=fp8)
    layout = Layout.build(model.world_size, dp, pp, tp)
    check_chunks(chunks)
    check_modes(model.workload, tp, recompute, selective_recompute, sequence_parallel)
    if tp > 1:
        layout.check_tp_in_node(model.cluster)
    if fp8 is not None:
        check_recipe(model.device, fp8)
    replica, stage, tp_rank = layout.coords(model.rank)
    first, count = replica_samples(model.global_batch_size, layout.dp, replica)
    mbs = microbatches(first, count, microbatch_size)
    parts = pp * chunks
    if partition is not None:
        blocks = check_partition(partition, model.num_layers, parts)
    else:
        blocks = even_partition(model.num_layers, parts, "pp" if chunks == 1 else "pp x chunks")
    stage_ranks = layout.stage_ranks(model.rank)
    extra = {}
    if "times" in inspect.signature(schedule).parameters:  # cost-aware schedules (zero-bubble)
        extra["times"] = [stage_times(model, stage_ranks[s], [blocks[c * pp + s] for c in range(chunks)],
                                      microbatch_size, tp, last=s == pp - 1) for s in range(pp)]
        for s in range(pp - 1 if chunks == 1 else pp):  # "C": the crossing to the next stage
            extra["times"][s]["C"] = crossing_time(model, stage_ranks[s], stage_ranks[(s + 1) % pp],
                                                   microbatch_size, tp if scatter_gather else 1)
    if extra:
        actions: Sequence[Action] = list(schedule(stage, pp, len(mbs), chunks, **extra))
        check_schedule(actions, chunks, len(mbs))
    else:
        actions = checked_schedule(schedule, stage, pp, len(mbs), chunks)
    dp_ranks = layout.dp_group(model.rank)
    return StagePlan(stage=stage, stage_ranks=stage_ranks,
                     chunks=[blocks[c * pp + stage] for c in range(chunks)], microbatches=mbs,
                     actions=actions, dp_group=lambda layer: dp_ranks, tp_group=layout.tp_group(model.rank),
                     tp_rank=tp_rank, recompute=recompute, selective_recompute=selective_recompute,
                     sequence_parallel=sequence_parallel, overlap_grad_reduce=overlap_grad_reduce,
                     scatter_gather=scatter_gather, async_tp_allreduce=async_tp_allreduce,
                     tied_embeddings=tied_embeddings, attention_mask_messages=attention_mask_messages, fp8=fp8 or "")


def context_plan(model: Model, schedule: Schedule, *, microbatch_size: int, pp: int, tp: int, dp: int | None,
                 cp: int, chunks: int, partition: Sequence | None, kv_exchange: str, overlap_grad_reduce: bool,
                 tied_embeddings: bool, recompute: bool = False, selective_recompute: bool = False,
                 sequence_parallel: bool = False, fp8: str | None = None) -> StagePlan:
    """A dp x pp x cp x tp run, ranks laid out as Megatron-Core orders them (TP fastest, then CP, then DP, then
    PP): rank = ((stage * dp + replica) * cp + cp_rank) * tp + tp_rank, so a CP group is the cp ranks of one
    replica and stage with one TP rank. The layout is the 3D one with cp x tp ranks in the place of tp. A
    layer's gradient is reduced over the dp x cp ranks of its stage and TP slice (Megatron-Core's
    data-parallel group with context parallelism, `get_data_parallel_group(with_context_parallel=True)`)."""
    check_context(model.workload, tp, cp, kv_exchange)
    check_modes(model.workload, tp, recompute, selective_recompute, False)
    if sequence_parallel and tp > 1 and (model.workload.seq_len // cp) % tp:
        raise ValueError(f"sequence_parallel=True with cp={cp}, tp={tp}: a CP rank's {model.workload.seq_len // cp} "
                         f"tokens do not split into {tp} equal pieces; choose a tp that divides seq_len / cp")
    if fp8 is not None:
        check_recipe(model.device, fp8)
    if model.world_size % (pp * tp * cp) or (dp is not None and dp * pp * tp * cp != model.world_size):
        raise ValueError(f"layout dp={dp} x pp={pp} x cp={cp} x tp={tp} does not fill the cluster's "
                         f"{model.world_size} ranks; choose degrees whose product is {model.world_size}")
    layout = Layout.build(model.world_size, dp, pp, tp * cp)
    check_chunks(chunks)
    if tp > 1:
        Layout(layout.dp * cp, pp, tp).check_tp_in_node(model.cluster)
    replica, stage, inner = layout.coords(model.rank)
    cp_rank, tp_rank = divmod(inner, tp)
    first, count = replica_samples(model.global_batch_size, layout.dp, replica)
    mbs = microbatches(first, count, microbatch_size)
    parts = pp * chunks
    blocks = check_partition(partition, model.num_layers, parts) if partition is not None else \
        even_partition(model.num_layers, parts, "pp" if chunks == 1 else "pp x chunks")
    grad_ranks = [layout.rank(d, stage, c * tp + tp_rank) for d in range(layout.dp) for c in range(cp)]
    return StagePlan(stage=stage, stage_ranks=layout.stage_ranks(model.rank),
                     chunks=[blocks[c * pp + stage] for c in range(chunks)], microbatches=mbs,
                     actions=checked_schedule(schedule, stage, pp, len(mbs), chunks),
                     dp_group=lambda layer: grad_ranks,
                     tp_group=[layout.rank(replica, stage, cp_rank * tp + t) for t in range(tp)], tp_rank=tp_rank,
                     overlap_grad_reduce=overlap_grad_reduce, scatter_gather=False, tied_embeddings=tied_embeddings,
                     cp_group=[layout.rank(replica, stage, c * tp + tp_rank) for c in range(cp)], cp_rank=cp_rank,
                     kv_exchange=kv_exchange, recompute=recompute, selective_recompute=selective_recompute,
                     sequence_parallel=sequence_parallel, fp8=fp8 or "")


def check_context(workload, tp: int, cp: int, kv_exchange: str) -> None:
    """What context parallelism needs: a whole cp, a known exchange, heads that split over tp, a sequence that
    cuts into 2 cp chunks (Megatron-Core's load-balanced causal split), a dense workload with no profile."""
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be a whole number >= 1, got {cp!r}")
    if kv_exchange not in context.KV_EXCHANGES:
        raise ValueError(f"kv_exchange must be one of {', '.join(map(repr, context.KV_EXCHANGES))}, "
                         f"got {kv_exchange!r}")
    if workload.tp_problem(tp):
        raise ValueError(workload.tp_problem(tp))
    try:
        context.block_workload(workload, cp)
    except SpecError as exc:
        raise ValueError(str(exc)) from None


def check_modes(workload, tp: int, recompute: bool, selective_recompute: bool, sequence_parallel: bool) -> None:
    """What Megatron-LM refuses, refused here by the option to change: full and selective recompute are
    one choice (`--recompute-granularity full|selective`); a TP group splits the attention heads
    (`divide(num_attention_heads, tp)` in ParallelAttention); sequence parallelism splits the sequence
    (`scatter_to_sequence_parallel_region` asserts the sequence divides by tp)."""
    if recompute and selective_recompute:
        raise ValueError("recompute=True and selective_recompute=True exclude each other (full recompute "
                         "already re-runs the attention core); choose one")
    if selective_recompute == "op":
        check_per_op(workload, tp, sequence_parallel)
    if workload.tp_problem(tp):
        raise ValueError(workload.tp_problem(tp))
    if sequence_parallel and tp > 1 and workload.seq_len % tp:
        raise ValueError(f"sequence_parallel=True with tp={tp}: the sequence of {workload.seq_len} tokens does not "
                         f"split into {tp} equal pieces; choose a tp that divides {workload.seq_len}, or "
                         f"sequence_parallel=False")


def recompute_modes(recompute: bool | str | None, selective_recompute: bool) -> tuple[bool, bool | str]:
    """hybrid's `recompute` (None or False: nothing, True: the whole layer, or "op": torchtitan's per-op selective
    checkpointing) and `selective_recompute` as a plan's (full recompute, the forward's `selective_recompute`)."""
    if recompute is None:
        return False, selective_recompute
    if recompute not in (False, True, "op") or recompute.__class__ not in (bool, str):
        raise ValueError(f"recompute must be True, False or 'op' (torchtitan's per-op selective checkpointing), "
                         f"got {recompute!r}")
    if recompute != "op":
        return recompute, selective_recompute
    if selective_recompute:
        raise ValueError("recompute='op' and selective_recompute=True exclude each other (torchtitan's per-op and "
                         "Korthikanti's selective checkpointing are two policies); choose one")
    return False, "op"


def check_per_op(workload, tp: int, sequence_parallel: bool) -> None:
    """What per-op selective checkpointing is modelled for (`workload.per_op_checkpoint`): a dense Llama block as
    torchtitan builds it, its kernels from the cost model (no measured profile), and with TP the sequence
    parallelism torchtitan's TP plan always applies (without it the row-parallel outputs are all-reduced, an op
    the policy would run again, which is not modelled)."""
    why = per_op_problem(workload)
    if why is None and tp > 1 and not sequence_parallel:
        why = f"tp={tp} needs sequence_parallel=True (torchtitan's TP plan always splits the norms' sequence)"
    if why:
        raise ValueError(f"recompute='op' (torchtitan's per-op selective checkpointing) is not modelled for "
                         f"workload {workload.name}: {why}")


@functools.lru_cache(maxsize=256)
def checked_schedule(schedule: Schedule, stage: int, stages: int, microbatches: int, chunks: int) -> tuple[Action, ...]:
    """A stage's actions, checked: built once for the ranks that share a stage (its TP ranks and its
    replicas), which matters at thousands of ranks of long schedules."""
    actions = tuple(schedule(stage, stages, microbatches, chunks))
    check_schedule(actions, chunks, microbatches)
    return actions


def stage_times(model: Model, rank: int, chunks: Sequence[range], microbatch_size: int, tp: int,
                last: bool) -> dict[str, float]:
    """Seconds one microbatch's F, B, I and W take on a stage (from costs/, as a profiler would)."""
    device, workload = model.cluster.device_of(rank), model.workload
    layers = [layer for chunk in chunks for layer in chunk]
    times = {kind: sum(fn(device, workload, layer, microbatch_size, tp) for layer in layers)
             for kind, fn in (("F", costs.forward_time), ("B", costs.backward_time),
                              ("I", costs.backward_input_time), ("W", costs.backward_weight_time))}
    if last:
        times["F"] += costs.loss_time(device, workload, microbatch_size, tp)
    return times


def crossing_time(model: Model, src: int, dst: int, microbatch_size: int, tp: int) -> float:
    """Seconds one microbatch's pipeline message between ranks `src` and `dst` takes alone on their link,
    as the simulator charges it (`network.p2p_time` over `Cluster.p2p_link`): the activation, or with
    scatter-gather (pass its `tp`, else 1) this TP rank's 1/t piece of it; an activation gradient is the
    same size (`network.pipeline_crossing_time` of that one message). 0 for a rank to itself."""
    messages = [] if src == dst else [(microbatch_size, tp, model.cluster.p2p_link(src, dst))]
    return network.pipeline_crossing_time(model.workload, messages)

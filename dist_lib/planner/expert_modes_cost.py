"""What the planner's estimate charges a mixture-of-experts stage with tensor parallelism, expert tensor
parallelism, recompute, FP8 or the distributed optimizer: `strategies/_expert_stage.py` and
`_expert_sharded.py` as `hybrid` runs them (Megatron-Core's layout; see the module docstrings there).

Where `options_cost.moe_layer_costs` prices the TP-1, 16-bit, no-recompute stage, this prices the others, with
the simulator's own cost functions (`costs.moe_ops` with `tp`, `etp` and `fp8`, `costs.compute`,
`costs.other_collectives.all_to_all_cost`, `costs.network.collective_time`). An MoE layer on TP rank t of `tp`
(sequence parallel, so each TP rank routes its s/tp tokens):

    forward:  route (attention slice + router) | reduce-scatter of the attention output in the TP group (an
              all-to-all of b*s*h/tp pieces, then `reduce_routed`) | dispatch copies | all-to-all over the ep x etp
              exchange group and the routing probabilities' (`options_cost.probs_all_to_all`) ||
              shared experts | local experts' grouped GEMM (1/etp of them) | all-to-all back | combine copy |
              all-gather of the parts in the TP group
    backward: combine-backward copies | all-to-all | local experts' grouped GEMM backward | all-to-all and the
              probabilities' gradients' | the dispatch's backward (`moe_ops.unpermute_backward`) | the dense part's backward (attention
              slice, router, shared experts; with selective recompute the attention core again first) |
              all-reduce of the input gradient in the TP group (one: the attention's,
              `comm.collectives.collective_duration`)
    after the last backward: each layer's dense update once its gradient is reduced, then every layer's
              experts' update (`StageOption.expert_updates`)

Full recompute runs the whole forward again (all-to-alls included) before the backward and keeps only the
layer input between. Memory per microbatch in flight: the layer input, the routed part, the dense part's
stash (without the attention core's under selective recompute), the tokens received and the experts' stash.
Model state: 2 + 2 bytes a parameter of weights and gradients, 12 of optimizer state, the dense part's over
dp with the distributed optimizer and the experts' over the expert-data-parallel group (dp x tp / (ep x etp)).

Simplifications: every peer routes as the first microbatch does (as `options_cost`); the TP group's collectives
and the all-to-alls run alone (in the simulation the experts' gradient all-reduce of the layer before shares
their NVLink ports); the dense part's and the experts' ZeRO all-gather after the update are charged on the
dense data-parallel group's topology; a dense layer of a mixed model is charged one TP all-reduce a pass where
the simulator charges two (its backward's beside the weight-gradient GEMMs).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from itertools import accumulate

from dist_lib.costs import compute, moe_ops
from dist_lib.costs.fp8 import persistent_bytes
from dist_lib.costs.network import collective_time
from dist_lib.costs.ops import compute_cost, compute_mode, forward_stash_bytes
from dist_lib.costs.other_collectives import all_to_all_cost
from dist_lib.hardware.cluster import Cluster
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.planner import context_cost, options_cost
from dist_lib.planner.estimate import LayerCosts, with_total
from dist_lib.planner.plan import Plan
from dist_lib.planner.stage_option import StageOption, no_collective
from dist_lib.workload import moe as moe_layers
from dist_lib.workload.routing import expert_loads
from dist_lib.workload.transformer import Workload


def plain(tp: int, recompute: str, zero: int, fp8: str) -> bool:
    """Is this the stage `options_cost.moe_layer_costs` prices (TP 1, no recompute, ZeRO or FP8)?"""
    return tp == 1 and recompute == "none" and not zero and not fp8


def stage_option(space, ranks: tuple[int, ...], tp: int, microbatch: int, ep: int, cp: int, recompute: str, zero: int,
                 fp8: str, reduction, etp: int = 1, pipelined: bool = False,
                 replicate: int = 1) -> StageOption | None:
    """The option of a stage with experts or context parallelism: `context_cost.context_option` for a dense
    stage, `options_cost.stage_option` for an MoE stage of TP 1, 16-bit, without recompute or ZeRO, else
    `expert_option` (expert TP `etp`, dividing tp)."""
    if space.workload.moe is None:
        return context_cost.context_option(space, ranks, tp, microbatch, cp, recompute, zero, fp8, reduction,
                                           pipelined, replicate)
    if replicate != 1:  # (HSDP: FSDP, which an MoE stage does not run)
        return None
    if etp > 1 or not plain(tp, recompute, zero, fp8):
        return expert_option(space, ranks, tp, microbatch, ep, etp, recompute, zero, fp8, reduction)
    return options_cost.stage_option(space, ranks, tp, microbatch, ep, reduction)


def expert_grids(workload: Workload, width: int) -> tuple[tuple[int, int], ...]:
    """The (ep, etp) a stage of `width` ranks may take past (1, 1), expert TP 1 first: etp a power of two
    dividing the experts' width (as TP degrees are powers of two) and ep a divisor of the experts, ep x etp
    dividing the width (Megatron-Core's expert grid, `_expert_stage.ExpertPlan.build`); an option exists only
    where etp divides the stage's TP degree (`expert_option`). None for a dense workload."""
    if workload.moe is None:
        return ()
    etps = [t for t in (2**k for k in range(width.bit_length())) if width % t == 0
            and workload.moe.expert_ffn_hidden % t == 0]
    return tuple((ep, etp) for etp in etps for ep in options_cost.ep_choices(workload, width // etp)
                 if (ep, etp) != (1, 1))


def with_etp(plan: Plan, workload: Workload, etp: int = 1) -> Plan:
    """An MoE plan with TP records its expert TP `etp` (as searched); any other plan is left as it is."""
    return replace(plan, etp=etp) if workload.moe is not None and plan.stages[0].tp > 1 else plan


def tp_ok(workload: Workload, tp: int) -> bool:
    """Can an MoE stage take TP degree `tp`: sequence parallelism cuts the sequence into tp equal parts."""
    return workload.seq_len % tp == 0


def exchange_groups(ranks: tuple[int, ...], block: int) -> tuple[tuple[int, ...], ...]:
    """The ranks that exchange tokens: each `block` = ep x etp consecutive ranks of the stage (TP fastest)."""
    return tuple(ranks[i:i + block] for i in range(0, len(ranks), block))


def _copy(device, nbytes: float) -> float:
    """A dispatch or combine buffer written from another: read and write (`MoEModel._tokens`)."""
    return compute.compute_time(device, 0.0, 2.0 * nbytes)


@lru_cache(maxsize=4096)
def expert_layer_costs(cluster: Cluster, workload: Workload, samples: int, tp: int, ep: int, etp: int,
                       groups: tuple[tuple[int, ...], ...], recompute: str, dp: int, edp: int, fp8: str
                       ) -> tuple[LayerCosts, tuple[float, ...], float]:
    """(per-layer costs of the slowest rank of a stage whose exchange groups are `groups`, each layer's
    routed-expert gradient bytes on one rank, the largest stash a full-recompute backward rebuilds) for
    `samples` samples a replica a microbatch; `dp`, `edp` shard the dense and expert optimizer state (1: not)."""
    device = min((cluster.device_of(r) for g in groups for r in g), key=lambda d: d.peak_flops)
    tp_group = tuple(r for g in groups for r in g)[:tp]  # the stage's first TP group (an exchange group may be smaller)
    tp_topo = cluster.topology(tp_group) if tp > 1 else None
    columns: list[list[float]] = [[] for _ in range(9)]
    expert_grads: list[float] = []
    rerun = 0.0
    cache: dict = {}
    moe = workload.moe
    for layer in range(workload.num_layers):
        key = (moe.is_moe(layer), layer == 0, layer == workload.num_layers - 1,
               -1 if moe.routing == "uniform" else layer)
        if key not in cache:
            cache[key] = _layer(cluster, workload, device, layer, samples, tp, ep, etp, groups, tp_group, tp_topo,
                                recompute, dp, edp, fp8)
        row, expert_grad, stash = cache[key]
        for column, value in zip(columns, row):
            column.append(value)
        expert_grads.append(expert_grad)
        rerun = max(rerun, stash)
    costs = with_total(*(tuple(accumulate(x, initial=0.0)) for x in columns))
    return costs, tuple(expert_grads), rerun if recompute == "full" else 0.0


def _layer(cluster, w, device, layer, n, tp, ep, etp, groups, tp_group, tp_topo, recompute, dp, edp, fp8):
    """(forward, backward, weight, state, activation, grad bytes, update, shard, hidden) of one layer on one
    rank, its routed-expert gradient bytes, and its whole stash (what full recompute rebuilds)."""
    moe, h, e = w.moe, w.hidden, w.bytes_per_element
    act = n * w.activation_bytes()  # the layer input, whole (all-gathered in the TP group)
    selective = recompute == "selective"
    routed_params = moe_layers.routed_expert_params(moe, h, layer)
    dense = (w.layer_params(layer) - routed_params) / tp
    tp_ar = collective_time("all_reduce", act, tp_topo) if tp > 1 else 0.0
    fixed = persistent_bytes(w, tp, fp8)
    if not moe.is_moe(layer):  # a dense layer of a mixed model, as `_Stage` runs it under TP
        mode = compute_mode(selective, tp > 1, fp8)
        f = compute_cost(device, w, "forward", layer, n, tp, mode)[0] + tp_ar
        b = compute_cost(device, w, "backward", layer, n, tp, mode)[0] + tp_ar
        stash = forward_stash_bytes(device, w, layer, n, tp, mode)
        kept = act if recompute == "full" else stash + act
        return (f, b + (f if recompute == "full" else 0.0), 0.0,
                dense * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES / dp) + fixed, kept, dense * WEIGHT_BYTES,
                compute.update_time(device, dense), dense * WEIGHT_BYTES / dp if dp > 1 else 0.0, 0.0), 0.0, stash + act
    block = ep * etp
    tokens = n * w.seq_len // tp  # this TP rank's sequence part of its replica's samples
    loads = expert_loads(moe, layer, 0, tokens)
    cap = moe.capacity(tokens)
    per = moe.experts // ep
    slots = [sum(cap or loads[x] for x in range(j * per, (j + 1) * per)) for j in range(ep)]  # from one peer
    piece = [s * h * e for s in slots]
    sizes = [[piece[j // etp] for j in range(block)] for _ in range(block)]
    a2a = max(all_to_all_cost(cluster, g, sizes)[0] for g in groups) if block > 1 else 0.0
    probs = options_cost.probs_all_to_all(cluster, groups, sizes, w) if block > 1 else 0.0  # (as `options_cost`)
    mine = max(range(ep), key=lambda j: slots[j])
    local = [cap or loads[x] for x in range(mine * per, (mine + 1) * per)]
    received = block * slots[mine]
    route_f = moe_ops.route_cost(device, w, layer, n, False, tp, fp8)[0]
    route_b = moe_ops.route_cost(device, w, layer, n, True, tp, fp8)[0]
    if selective:
        route_b += moe_ops.core_recompute(device, w, n, tp)
    shared_f = shared_b = 0.0
    if moe.shared_experts:
        shared_f = moe_ops.shared_cost(device, w, layer, n, False, tp, fp8)[0]
        shared_b = moe_ops.shared_cost(device, w, layer, n, True, tp, fp8)[0]
    experts_f = moe_ops.experts_cost(device, w, [block * x for x in local], False, etp, fp8)[0]
    experts_b = moe_ops.experts_cost(device, w, [block * x for x in local], True, etp, fp8)[0]
    copies = sum(_copy(device, p) for p in piece)
    tp_in = tp_out = 0.0
    if tp > 1:  # the attention output reduce-scattered (pieces of act / tp), the parts all-gathered after
        tp_in = all_to_all_cost(cluster, tp_group, [[act / tp] * tp for _ in range(tp)])[0] \
            + compute.compute_time(device, 0.0, (tp + 1.0) * (act // tp))  # `reduce_routed`: tp pieces read, one written
        tp_out = collective_time("all_gather", act, tp_topo)
    forward = route_f + tp_in + copies + max(a2a + probs, shared_f) + experts_f + a2a \
        + _copy(device, sum(slots) * h * e) \
        + tp_out
    # the dense part's partial input gradient all-reduced in the TP group: one all-reduce, the attention's (an
    # MoE layer's experts have no TP collective: `comm.collectives.collective_duration`)
    # the dispatch's backward gathers every returned input gradient (one piece from each expert-TP shard)
    backward = copies + a2a + experts_b + a2a + probs + route_b + shared_b + tp_ar \
        + moe_ops.unpermute_backward(device, etp * sum(slots) * h * e)
    per_token = (h + 3 * moe.expert_ffn_hidden // etp) * e  # `MoEModel._expert_stash_per_token(etp)`
    whole_token = (h + 3 * moe.expert_ffn_hidden) * e
    dense_stash = max(0, w.stash_bytes(layer, tp, recompute="selective" if selective else "none",
                                       sequence_parallel=tp > 1) - w.seq_len * moe.top_k * whole_token)
    stash = act / tp + n * dense_stash + received * h * e + received * per_token  # (`_dense_stash`)
    kept = act if recompute == "full" else act + stash
    if recompute == "full":
        backward += forward
    experts = moe.expert_params(h) * per / etp
    grad_ratio = w.grad_bytes_per_element / w.bytes_per_element
    expert_grad = experts * WEIGHT_BYTES * grad_ratio
    state = dense * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES / dp) + experts * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES / edp)
    shard = (dense * WEIGHT_BYTES / dp if dp > 1 else 0.0) + (expert_grad / edp if edp > 1 else 0.0)
    return (forward, backward, 0.0, state + fixed, kept, dense * WEIGHT_BYTES + expert_grad,
            compute.update_time(device, dense / dp + experts / edp), shard, 0.0), expert_grad, stash + act


class _Gather:
    """ZeRO's all-gather of the updated shards after the update: the dense part's over the data-parallel group
    (the experts' too, on that group's topology: a simplification), `share` of the bytes gathered."""

    __slots__ = ("topo", "share")

    def __init__(self, topo, share: float):
        self.topo, self.share = topo, share

    def __call__(self, nbytes: float) -> float:
        return collective_time("all_gather", nbytes * self.share, self.topo)


def expert_option(space, ranks: tuple[int, ...], tp: int, microbatch: int, ep: int, etp: int, recompute: str,
                  zero: int, fp8: str, reduction) -> StageOption | None:
    """The option of an MoE stage of `ranks` (dp x tp, TP fastest) with EP `ep` over ep x etp exchange groups,
    `recompute`, the distributed optimizer (`zero` 1) and `fp8`; None where the layout does not split
    (`ExpertPlan.build`'s rule: ep x etp divides the stage's ranks, ep the experts, etp the expert width; and
    etp divides tp, the layouts the search weighs: Megatron-Core's default etp = tp, and its recommended 1)."""
    cluster, workload = space.cluster, space.workload
    moe, width = workload.moe, len(ranks)
    dp = width // tp
    if width % (ep * etp) or moe.experts % ep or moe.expert_ffn_hidden % etp or tp % etp or not tp_ok(workload, tp):
        return None
    if zero == 3:
        return None
    share = microbatch // dp
    edp = width // (ep * etp)
    groups = exchange_groups(ranks, ep * etp)
    costs, expert_grads, rerun = expert_layer_costs(cluster, workload, share, tp, ep, etp, groups, recompute,
                                                    dp if zero else 1, edp if zero else 1, fp8)
    device = min((cluster.device_of(r) for r in ranks), key=lambda d: (d.peak_flops, d.memory_bytes))
    act = share * workload.activation_bytes()
    tp_topo = space.topology(ranks[:tp]) if tp > 1 else None
    loss = compute.loss_time(device, workload, share, tp) + (collective_time("all_reduce", act, tp_topo)
                                                             if tp > 1 else 0.0)
    capacity = min(cluster.device_of(r).memory_bytes for r in ranks)
    if space.reserve is not None:  # communicators: TP, data-parallel, exchange, expert-DP, two pipeline neighbours
        capacity = space.reserve.usable(capacity, (tp > 1) + (dp > 1) + (ep * etp > 1) + (edp > 1) + 2)
    dp_topo = space.topology(ranks[::tp]) if dp > 1 else None
    op = "reduce_scatter" if zero else "all_reduce"
    reduce = no_collective if dp_topo is None else reduction(op, dp_topo)
    edp_topo = space.topology(ranks[::ep * etp]) if edp > 1 else None
    grads = costs.grad_bytes
    reduced = [0.0]
    for layer, experts in enumerate(expert_grads):
        seconds = reduce(grads[layer + 1] - grads[layer] - experts)
        if edp_topo is not None and experts:
            seconds += collective_time(op, experts, edp_topo)
        reduced.append(reduced[-1] + seconds)
    regather = no_collective
    if zero and dp_topo is not None:
        total = grads[-1] or 1.0
        regather = _Gather(dp_topo, (total - sum(expert_grads) + (sum(expert_grads) if edp > 1 else 0.0)) / total)
    # the experts' optimizer steps, which the stage runs after every dense update (`_expert_stage.update_all`)
    slowest = min((cluster.device_of(r) for r in ranks), key=lambda d: d.peak_flops)  # (`expert_layer_costs`')
    experts = [moe.expert_params(workload.hidden) * (moe.experts // ep) / etp if moe.is_moe(layer) else 0.0
               for layer in range(workload.num_layers)]
    updates = accumulate((compute.update_time(slowest, x / (edp if zero else 1)) if x else 0.0 for x in experts),
                         initial=0.0)
    return StageOption(ranks, tp, (share,) * dp, costs, capacity, loss, act, reduce, rerun, 0.0, regather,
                       tuple(reduced), workload.profile is None, expert_updates=tuple(updates))

"""What the planner's estimate charges for the options beyond DP x PP x TP: expert parallelism (`ep`) of a
mixture-of-experts workload, and FSDP (`fsdp`).

An MoE layer under EP runs as `strategies/_expert_stage.py` runs it (Megatron-Core's layout: `ep` consecutive
replicas of a stage form an EP group, each holding E/ep routed experts; its MoE docs, "expert parallelism"):

    forward:  route (attention + router) | dispatch copies | all-to-all and the routing probabilities' ||
              shared experts | local experts' grouped GEMM | all-to-all back | combine copy
    backward: combine-backward copies | all-to-all | local experts' grouped GEMM backward | all-to-all and the
              probabilities' gradients' (`probs_all_to_all`) |
              the dispatch's backward (the copies' gradients back to their tokens) | the dense part's
              backward (attention, router, shared experts)

Each figure comes from the function the simulator charges the op with (`costs.moe_ops`, `costs.compute`,
`costs.other_collectives.all_to_all_cost`), so the estimate and the simulation share one cost model. The
tokens a rank's experts receive follow the workload's routing (`workload.routing.expert_loads`, padded to the
capacity when one is set); the slowest rank of the group sets the pace, as on a real cluster. Every peer is
charged the routing of the first microbatch (the simulator draws a skewed routing anew per microbatch, so with
`zipf` the estimate is of a typical microbatch, not of each). Memory: the dense part's 16 bytes a parameter,
the local experts' (E/ep of them) likewise, and per microbatch in flight the layer input, the routed copy, the
dense part's stash, the tokens received and the experts' stash (input, gate and up outputs and their product,
per routed token). Gradients: the dense part's all-reduced over the stage's dp replicas, each expert's over
the dp/ep replicas that hold it.
A context-parallel stage is priced in `context_cost`.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from itertools import accumulate

from dist_lib.costs import compute, moe_ops
from dist_lib.costs.network import collective_time
from dist_lib.costs.ops import compute_cost, forward_stash_bytes
from dist_lib.costs.other_collectives import all_to_all_cost, probs_bytes, probs_sizes
from dist_lib.hardware.cluster import Cluster
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.planner.estimate import LayerCosts, with_total
from dist_lib.planner.stage_option import StageOption, no_collective
from dist_lib.workload import moe as moe_layers
from dist_lib.workload.routing import expert_loads
from dist_lib.workload.transformer import Workload


def ep_choices(workload: Workload, ranks: int) -> tuple[int, ...]:
    """The expert-parallel degrees a stage of `ranks` GPUs (dp x tp, expert TP 1) can take: every divisor of
    both and of the number of experts (hybrid's rule, Megatron-Core's expert grid; 1 for a dense workload)."""
    if workload.moe is None:
        return (1,)
    return tuple(e for e in range(1, ranks + 1) if ranks % e == 0 and workload.moe.experts % e == 0)


def ep_groups(ranks: tuple[int, ...], ep: int) -> tuple[tuple[int, ...], ...]:
    """The EP groups of a stage of TP degree 1: each `ep` consecutive replicas."""
    return tuple(ranks[i:i + ep] for i in range(0, len(ranks), ep))


def expert_dp_groups(ranks: tuple[int, ...], ep: int) -> tuple[tuple[int, ...], ...]:
    """The groups that all-reduce one set of experts' gradients: the replicas at one place in every EP group."""
    return tuple(ranks[i::ep] for i in range(ep))


def routed_slots(workload: Workload, layer: int, samples: int, ep: int) -> tuple[int, ...]:
    """Token slots each of the `ep` members' experts receive from ONE peer's microbatch of `samples` samples
    (`routing.expert_loads` of the first microbatch; each expert's load, or its capacity when one is set)."""
    moe = workload.moe
    tokens = samples * workload.seq_len
    loads = expert_loads(moe, layer, 0, tokens)
    cap = moe.capacity(tokens)
    per = moe.experts // ep
    return tuple(sum(cap or loads[e] for e in range(j * per, (j + 1) * per)) for j in range(ep))


def _copy(device, nbytes: float) -> float:
    """A dispatch or combine buffer written from another (`MoEModel._tokens`, `combine`): read and write."""
    return compute.compute_time(device, 0.0, 2.0 * nbytes)


@lru_cache(maxsize=4096)
def moe_layer_costs(cluster: Cluster, workload: Workload, samples: int, groups: tuple[tuple[int, ...], ...]
                    ) -> tuple[LayerCosts, tuple[float, ...]]:
    """(per-layer costs of the slowest replica of a TP-1 stage whose EP groups are `groups`, each layer's
    routed-expert gradient bytes on one rank) for `samples` samples a replica a microbatch."""
    w, moe = workload, workload.moe
    ep = len(groups[0])
    device = min((cluster.device_of(r) for g in groups for r in g), key=lambda d: d.peak_flops)
    h, e = w.hidden, w.bytes_per_element
    act = samples * w.activation_bytes()
    per_token_stash = (h + 3 * moe.expert_ffn_hidden) * e  # `MoEModel._expert_stash_per_token`
    expert_params = moe.expert_params(h) * (moe.experts // ep)
    columns: list[list[float]] = [[] for _ in range(9)]
    expert_grads: list[float] = []
    cache: dict = {}
    for layer in range(w.num_layers):
        key = (moe.is_moe(layer), layer == 0, layer == w.num_layers - 1, -1 if moe.routing == "uniform" else layer)
        if key in cache:
            row, expert_grad = cache[key]
        else:
            row, expert_grad = cache[key] = _layer(cluster, w, device, layer, samples, groups, act, per_token_stash,
                                                   expert_params)
        for column, value in zip(columns, row):
            column.append(value)
        expert_grads.append(expert_grad)
    costs = with_total(*(tuple(accumulate(x, initial=0.0)) for x in columns))
    return costs, tuple(expert_grads)


def _layer(cluster, w, device, layer, samples, groups, act, per_token_stash, expert_params):
    """(forward, backward, weight, state, activation, grad bytes, update, shard, hidden) of one layer, and its
    routed-expert gradient bytes on one rank."""
    moe, h, e = w.moe, w.hidden, w.bytes_per_element
    routed = moe_layers.routed_expert_params(moe, h, layer)
    dense_params = w.layer_params(layer) - routed
    if not moe.is_moe(layer):
        f = compute_cost(device, w, "forward", layer, samples, 1, "none")[0]
        b = compute_cost(device, w, "backward", layer, samples, 1, "none")[0]
        stash = forward_stash_bytes(device, w, layer, samples, 1, "none")
        return (f, b, 0.0, dense_params * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES), stash + act,
                dense_params * WEIGHT_BYTES, compute.update_time(device, dense_params), 0.0, 0.0), 0.0
    ep = len(groups[0])
    slots = routed_slots(w, layer, samples, ep)  # from one peer to each member
    piece = [n * h * e for n in slots]
    # the all-to-all of each EP group, each member sending every other its piece (alone: the groups of a stage
    # sit apart or are one); the slowest group's
    sizes = [list(piece) for _ in range(ep)]
    a2a = max(all_to_all_cost(cluster, g, sizes)[0] for g in groups) if ep > 1 else 0.0
    # the routing probabilities' all-to-all after the dispatch and before the input gradients' return
    # (`other_collective_ops.probs_bytes`, `comm.other_collectives._flat_cost`)
    probs = probs_all_to_all(cluster, groups, sizes, w) if ep > 1 else 0.0
    mine = max(range(ep), key=lambda j: slots[j])  # the member whose experts receive the most
    per = moe.experts // ep
    tokens = samples * w.seq_len
    loads = expert_loads(moe, layer, 0, tokens)
    cap = moe.capacity(tokens)
    local = [cap or loads[x] for x in range(mine * per, (mine + 1) * per)]  # from one peer, per local expert
    received = ep * slots[mine]
    sent = sum(slots)
    route_f = moe_ops.route_cost(device, w, layer, samples, False)[0]
    route_b = moe_ops.route_cost(device, w, layer, samples, True)[0]
    shared_f = shared_b = 0.0
    if moe.shared_experts:
        shared_f = moe_ops.shared_cost(device, w, layer, samples, False)[0]
        shared_b = moe_ops.shared_cost(device, w, layer, samples, True)[0]
    experts_f = moe_ops.experts_cost(device, w, [ep * n for n in local], False)[0]  # one grouped GEMM
    experts_b = moe_ops.experts_cost(device, w, [ep * n for n in local], True)[0]  # one grouped GEMM too
    copies = sum(_copy(device, p) for p in piece)
    forward = route_f + copies + max(a2a + probs, shared_f) + experts_f + a2a + _copy(device, sent * h * e)
    backward = copies + a2a + experts_b + a2a + probs + route_b + shared_b \
        + moe_ops.unpermute_backward(device, sent * h * e)
    dense_stash = max(0, w.stash_bytes(layer) - w.seq_len * moe.top_k * per_token_stash)  # `_dense_stash`
    activation = act + samples * dense_stash + act + received * h * e + received * per_token_stash
    grad_ratio = w.grad_bytes_per_element / w.bytes_per_element
    expert_grad = expert_params * WEIGHT_BYTES * grad_ratio
    params = dense_params + expert_params
    return (forward, backward, 0.0, params * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES), activation,
            dense_params * WEIGHT_BYTES + expert_grad, compute.update_time(device, params), 0.0, 0.0), expert_grad


def expert_reductions(topology, ranks: tuple[int, ...], ep: int, reduce, grad_bytes: tuple[float, ...],
                      expert_grads: tuple[float, ...]) -> tuple[float, ...]:
    """Prefix sums over layers of a TP-1 MoE stage's gradient reductions, layer by layer: the dense part
    (`reduce`, over the stage's replicas) and the local experts' all-reduce over the dp/ep replicas holding
    them (`_ExpertStage._reduce_experts`); `topology(ranks)` is the stage's cached topology lookup."""
    holders = len(ranks) // ep
    expert_topo = topology(ranks[::ep]) if holders > 1 else None
    out = [0.0]
    for layer, experts in enumerate(expert_grads):
        dense = grad_bytes[layer + 1] - grad_bytes[layer] - experts
        seconds = reduce(dense)
        if expert_topo is not None and experts:
            seconds += collective_time("all_reduce", experts, expert_topo)
        out.append(out[-1] + seconds)
    return tuple(out)


# ---- which degrees a stage may take, and its option -------------------------------------------------------

def width_ok(workload: Workload, ranks: int, tp: int, cp: int, microbatch: int, even: bool) -> bool:
    """Does a stage of `ranks` GPUs take TP degree `tp` with `cp`: whole CP x TP blocks, at least a sample a
    replica (the same number each, `even`), and with experts a sequence that splits over the TP ranks (each
    routes its part, sequence-parallel: `expert_modes_cost`)."""
    if ranks % (tp * cp) or (workload.moe is not None and workload.seq_len % tp):
        return False
    dp = ranks // (tp * cp)
    return dp <= microbatch and not (even and microbatch % dp)


def stage_option(space, ranks: tuple[int, ...], tp: int, microbatch: int, ep: int, reduction) -> StageOption:
    """The option of a TP-1 stage whose replicas all take the same share (a framework's layout) with experts
    over EP groups; `space` is the search's `StageSpace` (cluster, workload, reserve and its cached topologies),
    `reduction` its data-parallel collective timer (`stage_option.Reduction`)."""
    cluster, workload = space.cluster, space.workload
    dp = len(ranks) // tp
    share = microbatch // dp
    device = min((cluster.device_of(r) for r in ranks), key=lambda d: (d.peak_flops, d.memory_bytes))
    act = share * workload.activation_bytes()
    costs, expert_grads = moe_layer_costs(cluster, workload, share, ep_groups(ranks, ep))
    loss = compute.loss_time(device, workload, share, 1)
    capacity = min(cluster.device_of(r).memory_bytes for r in ranks)
    if space.reserve is not None:  # communicators: TP, data-parallel, two pipeline neighbours
        capacity = space.reserve.usable(capacity, (tp > 1) + (len(ranks) // tp > 1) + 2)
    dp_topo = space.topology(ranks[::tp]) if len(ranks) // tp > 1 else None
    reduce = no_collective if dp_topo is None else reduction("all_reduce", dp_topo)
    reduced = expert_reductions(space.topology, ranks, ep, reduce, costs.grad_bytes, expert_grads)
    return StageOption(ranks, tp, (share,) * dp, costs, capacity, loss, act, reduce, 0.0, 0.0, no_collective,
                       reduced, workload.profile is None)


def hsdp_choices(cluster: Cluster, ranks: tuple[int, ...], tp: int | None, cp: int = 1) -> tuple[int, ...]:
    """The FSDP groupings a torchtitan search weighs for a stage of `ranks` at TP degree `tp` (and context
    parallelism `cp`): 1 (FSDP over every replica), and HSDP's replicate degrees whose shard groups of whole
    replicas hold one, two, four... whole nodes' GPUs (torchtitan shards within a node or a few and replicates
    across them: `data_parallel_replicate_degree`)."""
    if tp is None:
        return (1,)
    replica = tp * cp  # a replica's ranks
    dp = len(ranks) // replica
    gpus = cluster.nodes[cluster.node_of(ranks[0])].gpus
    out, width = [1], gpus
    while width < len(ranks):
        if width % replica == 0 and dp % (width // replica) == 0:
            out.append(dp // (width // replica))
        width *= 2
    return tuple(out)


def fsdp_option(space, ranks: tuple[int, ...], tp: int, microbatch: int, recompute: str, fp8: str,
                replicate: int = 1, pipelined: bool = False) -> StageOption | None:
    """A stage under FSDP as torchtitan applies it (`fully_shard` per block, hybrid's `fsdp`,
    `strategies/_sharded.py`): `fsdp` of its ZeRO-1 option (with HSDP's `replicate`, sharded inside each group
    of dp / replicate replicas), or `fsdp_kept` in a plan of pipeline stages; None where it shards nothing
    (one replica a shard group)."""
    dp = len(ranks) // tp
    if dp % replicate or dp // replicate == 1:
        return None
    option = space._option(ranks, tp, microbatch, recompute, 1, fp8, replicate)
    return None if option is None else fsdp_kept(option) if pipelined else fsdp(option, dp // replicate)


def fsdp_kept(o: StageOption) -> StageOption:
    """The ZeRO-1 option `o` as FSDP runs it beside pipeline stages: torchtitan keeps each block's gathered
    weights through the step (`get_fsdp_reshard_after_forward_policy`: no reshard with pipelining) and
    reduce-scatters after a layer's last microbatch, ZeRO-1's timing, but the 16-bit weight shards stay beside
    the whole weights (FSDP's sharded parameters), 2/shards bytes a parameter held throughout."""
    c = o.costs
    return replace(o, costs=replace(c, state=tuple(s + w for s, w in zip(c.state, c.shard))))


def fsdp(o: StageOption, shards: int) -> StageOption:
    """The ZeRO-1 option `o` of a stage of one pipeline stage (gradients reduce-scattered over `shards` ranks
    after a layer's last microbatch, 1/shards of the optimizer state) with the 16-bit weights sharded too, each
    layer all-gathered before its forward and, resharded after it (torchtitan's default without pipelining),
    again before its backward, the next layer's gather prefetched, so a pass takes the longer of its compute
    and its gather; the gradient accumulates whole until it is reduce-scattered, and two layers' whole weights
    (the one at hand and the one prefetched) are held at once. (With pipelining torchtitan keeps the gathered
    weights through the step: ZeRO-1's timing and memory, which the search charges as such.)"""
    c = o.costs
    columns: list[list[float]] = [[] for _ in range(9)]
    for layer in range(len(c.forward) - 1):
        grad = c.grad_bytes[layer + 1] - c.grad_bytes[layer]  # the layer's 16-bit bytes on this TP rank
        gather = o.regather(grad)
        row = [b - a for a, b in ((getattr(c, name)[layer], getattr(c, name)[layer + 1])
                                  for name in LayerCosts.__slots__[:-1])]
        row[0], row[1] = max(row[0], gather), max(row[1], gather)
        row[3] -= grad * (1 - 1 / shards)  # weights 2/shards instead of 2 bytes a parameter
        for column, value in zip(columns, row):
            column.append(value)
    costs = with_total(*(tuple(accumulate(x, initial=0.0)) for x in columns))
    held = 2 * max(b - a for a, b in zip(c.grad_bytes, c.grad_bytes[1:]))
    return replace(o, costs=costs, regather=no_collective, rerun=o.rerun + held)


def probs_all_to_all(cluster: Cluster, groups: tuple[tuple[int, ...], ...], sizes: list, w: Workload) -> float:
    """The routing probabilities' all-to-all beside a token exchange of pieces of `sizes` bytes (one
    probability a token copy of h elements), the slowest group's, as `comm.other_collectives._flat_cost` adds it."""
    pieces = probs_sizes(sizes, probs_bytes(w), w.hidden * w.bytes_per_element)
    return max(all_to_all_cost(cluster, g, pieces)[0] for g in groups)

"""What the planner's estimate charges a context-parallel stage, as `strategies/_context.py` runs it.

Ranks are TP fastest, then CP, then DP (Megatron-Core's order, torchtitan's `["dp_shard", "cp", "tp"]` mesh):
each of a CP group's cp ranks holds s/cp tokens of its replica's samples, its GEMMs, stash and hidden states
1/cp of the whole sequence's, in the plan's compute mode (FP8 linear layers, selective recompute), and its
attention runs cp blocks of s/cp tokens' work (`costs.context`). How the blocks meet the other ranks' keys and
values is the framework's:

* Megatron-Core (`kv_exchange="ring"`, TransformerEngine's `AttnFuncWithCPAndKVP2P`): the key/value blocks pass
  around the ring in cp - 1 hops, each overlapped with the block at hand, so a forward step takes the longer of
  a block and a hop; the backward passes the key/value blocks and, on the same link, their gradients (the
  longer of a block and the two), and the last gradient hop home is exposed.
* torchtitan (`kv_exchange="torch_all_gather"`, PyTorch's context-parallel SDPA with its all-gather rotater:
  `costs.torch_context`): the keys and values at the query heads are all-gathered beside the first block and
  waited for after it; each block is followed by its fp32 merge (backward: its fp32 gradient accumulations),
  whose HBM traffic is charged at every step; in backward the running fp32 dK, dV pass to the next rank after
  every block and are waited for after the next one, the last after the loop. The steps of the load-balanced
  halves differ by rank; the slowest rank's sum is charged.

With TP, each layer's output and input gradient are all-reduced in the TP group after the layer (two b*s*h/cp
all-reduces' time each way, as a plain stage's). Memory: PyTorch's all-gather holds a layer's whole keys and values
at the query heads (cp blocks, and its own while it sends), once at a time; the ring's blocks in flight are within
the stage's transient buffers. Full recompute keeps only each layer's input and re-runs its
forward, exchange and TP all-reduce included, before the backward. The weight gradients are reduced over the
dp x cp ranks of a TP slice: all-reduced, or with the distributed optimizer (zero 1) reduce-scattered, the
optimizer state sharded over those ranks and the updated weights all-gathered after the step (Megatron-Core's
`get_data_parallel_group(with_context_parallel=True)`); with FSDP (zero 3, torchtitan's `dp_shard_cp` mesh) the
16-bit weights too (`options_cost.fsdp`).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate

from dist_lib.costs import compute
from dist_lib.costs import context as cp_costs
from dist_lib.costs import torch_context
from dist_lib.costs.fp8 import persistent_bytes
from dist_lib.costs.network import collective_time, p2p_time
from dist_lib.costs.ops import compute_mode
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.planner import options_cost
from dist_lib.planner.estimate import LayerCosts, with_total
from dist_lib.planner.stage_option import StageOption, TwoLevel, no_collective
from dist_lib.workload.transformer import Workload

# the search's frameworks whose context parallelism `hybrid` runs, with the exchange each runs
EXCHANGES = {"megatron": "ring", "torchtitan": "torch_all_gather"}
# recompute settings a context-parallel stage runs (`strategies/_context.py`; torchtitan's per-op policy is not
# one of them)
RECOMPUTES = ("none", "selective", "full")


def cp_choices(workload: Workload, rules, width: int) -> tuple[int, ...]:
    """Context-parallel degrees past 1 a stage of `width` GPUs may take: in a Megatron-LM or torchtitan search
    (`EXCHANGES`), for a dense workload timed by formula, each a divisor of the width that cuts the sequence
    into 2 cp chunks (`costs.context.block_workload`)."""
    if rules is None or rules.framework not in EXCHANGES or workload.moe is not None or workload.profile is not None:
        return ()
    return tuple(c for c in range(2, width + 1) if width % c == 0 and workload.seq_len % (2 * c) == 0)


def exchange(rules) -> str:
    """The key/value exchange the search's framework runs (`EXCHANGES`; the ring where none is named)."""
    return EXCHANGES.get(rules.framework, "ring") if rules is not None else "ring"


def context_option(space, ranks: tuple[int, ...], tp: int, microbatch: int, cp: int, recompute: str, zero: int,
                   fp8: str, reduction, pipelined: bool = False, replicate: int = 1) -> StageOption | None:
    """The option of a dense stage of `ranks` (dp x cp x tp) with context parallelism `cp`, `recompute`, ZeRO
    stage `zero` (0, 1 or 3) and `fp8`; None where the stage does not run it (per-op recompute, FSDP over one
    rank). `space` is the search's `StageSpace` (its `kv_exchange`), `reduction` its collective timer; `pipelined`:
    a plan of pipeline stages, where FSDP keeps its gathered weights through the step; `replicate` > 1 (HSDP, zero
    1 or 3): the sharding inside each of `replicate` groups of whole replicas, the shards all-reduced across them."""
    if recompute not in RECOMPUTES:
        return None
    cluster, workload = space.cluster, space.workload
    dp = len(ranks) // (tp * cp)
    if dp % replicate:
        return None
    shards = dp // replicate * cp  # the ranks a TP slice's gradients are sharded over
    share = microbatch // dp
    device = min((cluster.device_of(r) for r in ranks), key=lambda d: (d.peak_flops, d.memory_bytes))
    act = cp_costs.activation_bytes(workload, share, cp)
    tp_topo = space.topology(ranks[:tp]) if tp > 1 else None
    group = ranks[:tp * cp:tp]  # the first replica's CP group (TP rank 0)
    links = [cluster.p2p_link(a, b) for a, b in zip(group, group[1:] + group[:1])]
    if space.kv_exchange == "torch_all_gather":
        times = (collective_time("all_gather", cp * torch_context.kv_bytes(workload, share, tp, cp),
                                 space.topology(group)),
                 max(p2p_time(torch_context.dkv_bytes(workload, share, tp, cp), link) for link in links))
    else:
        kv = cp_costs.kv_block_bytes(workload, share, tp, cp)
        times = (max(p2p_time(kv, link) for link in links), max(p2p_time(2 * kv, link) for link in links))
    costs = context_layer_costs(device, workload, share, tp, cp, tp_topo, space.kv_exchange, times, recompute,
                                shards if zero else 1, fp8)
    loss = cp_costs.loss_time(device, workload, share, tp, cp) + (
        collective_time("all_reduce", act, tp_topo) if tp > 1 else 0.0)
    capacity = min(cluster.device_of(r).memory_bytes for r in ranks)
    if space.reserve is not None:  # communicators: TP, CP, its ring neighbours, data-parallel, pipeline neighbours
        capacity = space.reserve.usable(capacity, (tp > 1) + (cp > 1) + min(cp - 1, 2) + (dp * cp > 1)
                                        + (replicate > 1) + 2)
    dp_topo = space.topology(ranks[::tp]) if dp * cp > 1 else None  # the dp x cp ranks of a TP slice
    if dp_topo is None:
        reduce = regather = no_collective
    elif zero and replicate > 1:  # HSDP: the shard group's collectives, then the shard's across the groups
        inner, outer = space.topology(ranks[:shards * tp:tp]), space.topology(ranks[::shards * tp])
        reduce = TwoLevel(reduction("reduce_scatter", inner), reduction("all_reduce", outer), shards)
        regather = reduction("all_gather", inner)
    else:
        reduce = reduction("reduce_scatter" if zero else "all_reduce", dp_topo)
        regather = reduction("all_gather", dp_topo) if zero else no_collective
    grads = costs.grad_bytes
    reduced = tuple(accumulate((reduce(b - a) for a, b in zip(grads, grads[1:])), initial=0.0))
    rerun = max(cp_costs.stash_bytes(workload, layer, share, tp, cp) for layer in range(min(2, workload.num_layers))) \
        if recompute == "full" else 0.0
    if space.kv_exchange == "torch_all_gather":  # a layer's gathered keys and values (and its own, being sent)
        rerun += (cp + 1) * torch_context.kv_bytes(workload, share, tp, cp)
    option = StageOption(ranks, tp, (share,) * dp, costs, capacity, loss, act, reduce, rerun, 0.0, regather,
                         reduced, True)
    if zero == 3:  # FSDP over the dp x cp ranks: resharding after the forward, or kept beside pipeline stages
        return None if shards == 1 else options_cost.fsdp_kept(option) if pipelined else options_cost.fsdp(option, shards)
    return option


@lru_cache(maxsize=1024)
def context_layer_costs(device, workload: Workload, samples: int, tp: int, cp: int, tp_topo, kv_exchange: str,
                        times: tuple[float, float], recompute: str = "none", zero_dp: int = 1,
                        fp8: str = "") -> LayerCosts:
    """Per-layer costs of a CP rank running `samples` samples' s/cp tokens. `times`: for the ring, a key/value
    block's hop and a block's and its gradient's together on one link; for PyTorch's all-gather rotater, the
    keys' and values' all-gather and one fp32 dK, dV hop (module docstring)."""
    act = cp_costs.activation_bytes(workload, samples, cp)
    tp_comm = 2 * collective_time("all_reduce", act, tp_topo) if tp > 1 else 0.0
    mode = compute_mode(recompute == "selective", False, fp8)
    columns: list[list[float]] = [[] for _ in range(9)]
    for layer in range(workload.num_layers):
        if 1 < layer < workload.num_layers - 1:  # alike between the first and the last (an untied LM head)
            for column in columns:
                column.append(column[-1])
            continue
        rest_f, block_f = cp_costs.layer_times(device, workload, layer, samples, tp, cp, False, mode)
        rest_b, block_b = cp_costs.layer_times(device, workload, layer, samples, tp, cp, True, mode)
        if kv_exchange == "torch_all_gather":
            ring_f, ring_b = _torch_ring(device, workload, samples, tp, cp, block_f, block_b, times,
                                         recompute == "selective")
        else:
            hop, both = times
            ring_f = block_f + (cp - 1) * max(block_f, hop)
            ring_b = block_b + (cp - 1) * max(block_b, both) + hop
        forward = rest_f + ring_f + tp_comm
        backward = rest_b + ring_b + tp_comm + (forward if recompute == "full" else 0.0)
        params = workload.layer_params(layer) / tp
        stash = 0 if recompute == "full" else cp_costs.stash_bytes(workload, layer, samples, tp, cp, mode)
        row = (forward, backward, 0.0,
               params * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES / zero_dp) + persistent_bytes(workload, tp, fp8),
               stash + act, params * WEIGHT_BYTES, compute.update_time(device, params / zero_dp),
               params * WEIGHT_BYTES / zero_dp if zero_dp > 1 else 0.0, 0.0)
        for column, value in zip(columns, row):
            column.append(value)
    return with_total(*(tuple(accumulate(x, initial=0.0)) for x in columns))


def _torch_ring(device, workload: Workload, samples: int, tp: int, cp: int, block_f: float, block_b: float,
                times: tuple[float, float], selective: bool) -> tuple[float, float]:
    """(forward, backward) seconds of PyTorch's context-parallel SDPA on its slowest CP rank: the blocks, the
    traffic around them (`torch_context.forward_bytes`, `backward_bytes`; after a selective-recompute forward,
    the backward re-runs each step's forward merge too, as `Model.context_backward` charges it) and what the
    all-gather and the dK, dV hops leave exposed."""
    gather, hop = times
    forward = backward = 0.0
    for rank in range(cp):
        f_pro, f_steps, f_epi = torch_context.seconds(device, workload,
                                                      torch_context.forward_bytes(workload, samples, tp, cp, rank))
        b_pro, b_steps, b_epi = torch_context.seconds(device, workload,
                                                      torch_context.backward_bytes(workload, samples, tp, cp, rank))
        if selective:
            b_pro, b_steps = b_pro + f_pro + f_epi, tuple(map(sum, zip(b_steps, f_steps)))
        forward = max(forward, f_pro + cp * block_f + sum(f_steps) + f_epi
                      + max(0.0, gather - block_f - f_steps[0]))
        backward = max(backward, b_pro + cp * block_b + sum(b_steps) + b_epi
                       + max(0.0, gather - block_b - b_steps[0]) + (cp - 1) * max(0.0, hop - block_b) + hop)
    return forward, backward

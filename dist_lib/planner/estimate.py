"""A closed-form estimate of a plan's step time and per-rank memory, from the same cost functions the
simulator charges (costs/ through `op_costs.compute_cost`, `op_costs.forward_stash_bytes`), so that the
search can rank thousands of candidates before the simulator runs the best few.

Time: each stage's time per microbatch is its slowest replica's forward + backward (with TP all-reduces,
recompute, the loss on the last stage and the all-gather of each message that arrives as TP pieces). A
pipeline of p stages and m microbatches takes the sum of the stage times plus (m - 1) x the slowest
(heterogeneous 1F1B, Narayanan et al. 2021; Metis, Um et al. ATC'24, eq. 2); ZB-H1 moves the
weight-gradient half out of the fill (Qi et al. 2023). Interleaved, every chunk pass is played out in the
order the schedule issues it (`playout.py`), or, beyond `step.PLAYOUT_PASSES` passes, the fill is
divided by the chunk count. An activation and a
gradient cross each boundary per microbatch (interleaved: once per chunk, and from the last stage back
to the first between chunks), their messages sharing links (`messages.py`; after the first microbatch,
replicas that cost differently send at different moments, `stagger.py`); a message moves only once
its receiver posts the receive, when its pass needs the input, so each stage's time per microbatch
counts the crossings into it. Under 1F1B and ZB-H1 the round trip of the p - s microbatches stage s
keeps in flight (their passes and crossings) bounds the time per microbatch from below; where GPUs
of two stages share a node's NIC, the crossings of the two boundaries that meet on it are played out
pass by pass (`contention.py`, which under ZB-H1 also catches a receive posted after a W pass). The
data-parallel reduction and the optimizer step follow each stage's last backward (the t reductions of a
stage with TP degree t at once, sharing the links they cross), and under ZeRO-1 the all-gather of the
updated weights follows the optimizer step.
Memory: model state (16 bytes a parameter, the 12 optimizer bytes sharded by ZeRO-1) plus the stashes and
inputs of the microbatches the schedule keeps in flight on that stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from dist_lib.costs import compute as costs

from dist_lib.costs import network

from dist_lib.hardware.topology import Topology
from dist_lib.hardware.devices import Device
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.costs.ops import compute_cost, compute_mode, forward_stash_bytes
from dist_lib.costs.fp8 import persistent_bytes
from dist_lib.workload.transformer import Workload

# Buffers an in-flight microbatch needs beside the stashes: the received input, the output being sent
# and the gradient passing through (in units of one microbatch's b*s*h activation).
TRANSIENT_ACTIVATIONS = 3


@dataclass(frozen=True, slots=True)
class LayerCosts:
    """Prefix sums over layers of one replica's per-microbatch seconds and bytes: entry i covers
    layers 0..i-1, so a block i..j-1 costs `x[j] - x[i]`."""

    forward: tuple[float, ...]  # forward compute + TP all-reduces
    backward: tuple[float, ...]  # backward compute (+ recompute) + the TP all-reduces left exposed
    weight: tuple[float, ...]  # the weight-gradient half of backward (ZB-H1 defers it)
    state: tuple[float, ...]  # model state bytes
    activation: tuple[float, ...]  # stash + input bytes of one microbatch
    grad_bytes: tuple[float, ...]  # 16-bit gradient bytes (what the data-parallel reduction moves)
    update: tuple[float, ...]  # optimizer step seconds
    shard: tuple[float, ...]  # ZeRO-1: reduced gradient shard bytes, held from a layer's last backward on
    hidden: tuple[float, ...]  # TP all-reduce seconds a backward hides behind its weight-gradient GEMMs
    total: list[float]  # forward + backward, for bisection

    @property
    def per_layer(self) -> float:
        """Seconds of a layer past the first (forward + backward): what a lower bound may assume."""
        n = len(self.total) - 1
        return (self.total[n] - self.total[1]) / (n - 1) if n > 1 else self.total[n]


@lru_cache(maxsize=None)
def layer_costs(device: Device, workload: Workload, samples: int, tp: int, tp_topo: Topology | None,
                recompute: str, zero_dp: int, fp8: str = "") -> LayerCosts:
    """Per-layer costs of a replica of `tp` ranks on `device` running `samples` samples a microbatch.
    `tp_topo` is its TP group's topology (None for tp 1); `zero_dp` shards the optimizer state; `fp8` runs
    the linear layers' GEMMs in FP8 with that recipe, as the simulator's compute modes charge them."""
    act = samples * workload.activation_bytes()
    # a layer's TP partial sums are two all-reduces of b*s*h (attention and MLP; Shoeybi et al. 2019), as
    # the simulator charges them
    tp_comm = 2 * network.collective_time("all_reduce", act, tp_topo) if tp > 1 else 0.0
    # torchtitan's per-op checkpointing ("op") runs TP only sequence-parallel (hybrid's rule, torchtitan's TP
    # plan): at tp > 1 its re-run is timed and its stash counted as that runs them (`_per_op_rerun`), the rest of
    # the layer without sequence parallelism, as the estimate times every mode
    split_op = recompute == "op" and tp > 1
    selective = "op" if recompute == "op" else recompute == "selective"
    mode = compute_mode(False if split_op else selective, False, fp8)
    kept = compute_mode(selective, split_op, fp8)  # the mode whose stash the forward keeps
    plain = compute_mode(False, False, fp8)  # the forward's and the weight-gradient pass's mode
    fwd, bwd, wgt, state, acts, grads, upd, shards, hidden = [], [], [], [], [], [], [], [], []
    for layer in range(workload.num_layers):
        if layer > 1 and workload.profile is None:  # the cost model's layers after the first are alike
            for column in (fwd, bwd, wgt, state, acts, grads, upd, shards, hidden):
                column.append(column[-1])
            continue
        f = _cost(device, workload, "forward", layer, samples, tp, plain)
        w = _cost(device, workload, "backward_weight", layer, samples, tp, plain)
        if tp > 1:
            # the input gradient's all-reduces run beside the weight-gradient GEMMs (Megatron-LM's
            # asynchronous TP all-reduce, as strategies/_pipeline.py runs it); ZB-H1's split backward
            # cannot hide them, and adds `hidden` back
            b = _cost(device, workload, "backward_input", layer, samples, tp, mode) + max(w, tp_comm)
            if split_op:
                b += _per_op_rerun(device, workload, layer, samples, tp, tp_topo, fp8)
            hidden.append(min(w, tp_comm))
        else:
            b = _cost(device, workload, "backward", layer, samples, tp, mode)
            hidden.append(0.0)
        if recompute == "full":
            b += f + tp_comm  # the forward runs again, its all-reduces included
        fwd.append(f + tp_comm)
        bwd.append(b)
        wgt.append(w)
        params = workload.layer_params(layer) / tp
        # (with Transformer Engine's FP8 recipe, its FP8 weight copies too: `costs.fp8.persistent_bytes`)
        state.append(params * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES / zero_dp) + persistent_bytes(workload, tp, fp8))
        # ZeRO-1 also holds each layer's reduced gradient shard (2/dp bytes a parameter) until the update
        shards.append(params * WEIGHT_BYTES / zero_dp if zero_dp > 1 else 0.0)
        stash = 0 if recompute == "full" else forward_stash_bytes(device, workload, layer, samples, tp, kept)
        acts.append(stash + act)
        grads.append(params * WEIGHT_BYTES)
        upd.append(costs.update_time(device, params / zero_dp))
    return with_total(*(tuple(accumulate(x, initial=0.0))
                        for x in (fwd, bwd, wgt, state, acts, grads, upd, shards, hidden)))


def _per_op_rerun(device: Device, workload: Workload, layer: int, samples: int, tp: int, tp_topo: Topology | None,
                  fp8: str) -> float:
    """What a sequence-parallel backward after per-op checkpointing runs first, before its gradients
    (`strategies/_pipeline.py`): the unsaved GEMMs and memory-bound kernels (`costs.recompute_time`, "op") and
    the two all-gathers of the norms' sequence-split outputs, b*s*h each, in the TP group."""
    return costs.recompute_time(device, workload, layer, samples, tp, recompute="op", sequence_parallel=True, fp8=fp8) \
        + 2 * network.collective_time("all_gather", samples * workload.activation_bytes(), tp_topo)


@lru_cache(maxsize=None)
def rerun_stash(device: Device, workload: Workload, samples: int, tp: int) -> float:
    """Bytes of the largest stash a full-recompute backward rebuilds: it re-runs one layer's forward,
    keeping its whole stash, then consumes it in that layer's backward before the next."""
    layers = range(workload.num_layers) if workload.profile is not None else range(min(2, workload.num_layers))
    return max(forward_stash_bytes(device, workload, layer, samples, tp, "none") for layer in layers)


def with_total(*prefixes: tuple[float, ...]) -> LayerCosts:
    return LayerCosts(*prefixes, [f + b for f, b in zip(prefixes[0], prefixes[1])])


@lru_cache(maxsize=None)
def _cost(device: Device, workload: Workload, op: str, layer: int, samples: int, tp: int, mode: str) -> float:
    return compute_cost(device, workload, op, layer, samples, tp, mode)[0]


def in_flight(schedule: str, stage: int, stages: int, microbatches: int, chunks: int) -> float:
    """Microbatches whose activations a stage holds at its peak, in units of its whole block's
    activations (1F1B: p - s; GPipe: m; ZB-H1: p, each counted at its whole stash although one past its
    input-gradient pass keeps only what W needs, `costs.split_stash_bytes`: exact where the p are all before
    it, as on stage 0 at the end of the warm-up, an upper bound elsewhere; interleaved: Megatron's warm-up
    of (p - s - 1) x 2 + (v - 1) x p + 1 chunk passes, each 1/v of the block)."""
    if schedule == "gpipe":
        return microbatches
    if schedule == "zero-bubble":
        return min(microbatches, stages)
    if schedule == "interleaved":
        return min(microbatches * chunks, (stages - stage - 1) * 2 + (chunks - 1) * stages + 1) / chunks
    return min(microbatches, stages - stage)

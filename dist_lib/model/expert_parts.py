"""The MoE ops of `MoEModel` under tensor parallelism: each TP rank holds one sequence part of its tokens.

Megatron-Core runs MoE layers with TP only under sequence parallelism (`MoELayer.forward` refuses training
with TP > 1 without it; megatron/core/transformer/moe/moe_layer.py): the attention is split over the TP
group as in a dense layer, its output reduce-scattered along the sequence, and each TP rank routes and
dispatches its own sequence part (the `MoEAlltoAllTokenDispatcher`'s input is the `[S/TP, B, H]` part;
megatron/core/transformer/moe/token_dispatcher.py). Here, on TP rank t of p:

    pieces = route(layer, x, weight_slice)          # attention on 1/p: p partial pieces, one per sequence part
    ... all_to_all in the TP group: piece j to TP rank j (the reduce-scatter) ...
    routed = reduce_routed(received)                # sequence part t, summed over the TP ranks
    ... dispatch, experts, combine as without TP ...
    y = combine(routed, outs)                       # an ActivationSlice: piece t of p of the layer's output
    ... all_gather in the TP group (the next layer's sequence-parallel all-gather) ...

and backward: `combine_backward` takes piece t of the output gradient (`split_tp`); `route_backward` the whole
gradient and returns this TP rank's weight-gradient slice and a partial input gradient (all-reduced in the TP
group, as a dense layer's). Token pieces and expert gradients then hold masks over sample parts
(`spread_mask`): bit s * p + t for sample s's part t, so that the experts' gradient is complete only
with every part of every sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import accumulate
from typing import Any

from dist_lib.costs import moe_ops
from dist_lib.costs.compute import compute_time
from dist_lib.costs.fp8 import RECIPES
from dist_lib.errors import TensorError
from dist_lib.tensors import (Activation, ActivationGradSlice, ActivationSlice, Routed, Stash, describe_mask,
                              full_mask, mask_runs, range_mask)
from dist_lib.workload.routing import expert_loads, tokens_reaching


def spread_mask(mask: int, parts: int, part: int) -> int:
    """The tokens of sequence part `part` of `parts` of the samples of `mask`, as a mask over sample parts:
    bit `s * parts + part` for each sample s (with one part, the mask itself). MoE token pieces under tensor
    parallelism carry such masks: each TP rank holds one sequence part of its microbatch's tokens."""
    if parts == 1:
        return mask
    out = 0
    for first, stop in mask_runs(mask):
        for s in range(first, stop):
            out |= 1 << (s * parts + part)
    return out


def collapse_mask(mask: int, parts: int) -> int:
    """The samples any of whose sequence parts a mask over sample parts holds (`spread_mask` undone)."""
    if parts == 1:
        return mask
    out = 0
    for first, stop in mask_runs(mask):
        for bit in range(first, stop):
            out |= 1 << (bit // parts)
    return out


def run_mask(items: Any, limit: int) -> int:
    """The mask of `items` when they are a non-empty range of step 1 inside 0..limit-1 (how strategies name a
    rank's experts), else 0: the caller then checks them one by one, for the error that names the item."""
    if items.__class__ is range and items.step == 1 and 0 <= items.start < items.stop <= limit:
        return range_mask(items.start, items.stop)
    return 0


@lru_cache(maxsize=1 << 14)
def part_runs(mask: int, parts: int) -> tuple[tuple[int, int, int], ...]:
    """A mask over sample parts as (first sample, stop sample, part) runs: the samples of each run hold the
    same sequence part (with one part, the runs of the mask). Remembered: a microbatch's mask is asked for by
    every op of its round trip."""
    if parts == 1:
        return tuple((a, b, 0) for a, b in mask_runs(mask))
    out = []
    for part in range(parts):
        lane = 0
        for first, stop in mask_runs(mask):
            for bit in range(first, stop):
                if bit % parts == part:
                    lane |= 1 << (bit // parts)
        out += [(a, b, part) for a, b in mask_runs(lane)]
    return tuple(out)


def mode_fp8(mode: str) -> str:
    """The FP8 recipe in an MoE op's mode ("": 16-bit)."""
    last = mode.rpartition("+")[2]
    return last if last in RECIPES else ""


def stash_fp8(stash: Stash) -> str:
    """The FP8 recipe an MoE op's forward ran with, which its stash remembers for the backward."""
    return mode_fp8(stash.recompute)


RECOMPUTED = "recomputed"  # in an MoE op's mode: the module recompute it asked for (`route`'s norm, the activation)


def stash_recomputes(stash: Stash) -> bool:
    """Did the forward that left `stash` drop a module's output for its backward to run again (`route`'s
    `recompute_norm`, `expert_forward`'s `recompute_activation`)?"""
    return RECOMPUTED in stash.recompute.split("+")


class ExpertParts:
    """The sequence-part side of `MoEModel` (which supplies the rank's state, books and `_advance`)."""

    __slots__ = ()
    rank: int
    moe: Any
    workload: Any
    device: Any
    _mem: Any
    _act_bytes: int
    _full_batch: int

    def _fp8(self, op: str, layer: int, fp8: Any) -> str:
        """An MoE op's `fp8`: "" (16-bit) or a known recipe, on a device with FP8 tensor cores."""
        if fp8 == "":
            return ""
        where = f"rank {self.rank} {op}(layer {layer})"
        if fp8.__class__ is not str or fp8 not in RECIPES:
            raise TensorError(f"{where}: fp8 must be one of {', '.join(RECIPES)} or \"\" (16-bit), got {fp8!r}")
        if not self.device.fp8_flops:
            raise TensorError(f"{where}: fp8={fp8!r} on {self.device.name}, which has no FP8 tensor cores")
        return fp8

    def _route_mode(self, layer: int, fp8: Any, stash: Any, selective: Any, norm: Any = False) -> str:
        """The mode a route's stash remembers: "none", or "+"-joined "selective", `RECOMPUTED` (the pre-MLP
        norm dropped, `recompute_norm`) and an FP8 recipe, in that order."""
        fp8 = self._fp8("route", layer, fp8)
        for name, value in (("stash", stash), ("selective_recompute", selective), ("recompute_norm", norm)):
            if value is not True and value is not False:
                raise TensorError(f"rank {self.rank} route(layer {layer}): {name} must be True or False, got "
                                  f"{value!r}")
        return "+".join(m for m in ("selective" if selective else "", RECOMPUTED if norm else "", fp8) if m) or "none"

    def _route(self, layer: int, act: Activation, weight: Any, mode: str, stash: bool) -> Routed | list[Routed]:
        """`route`'s work: the attention (on 1/p of its width on a TP slice of p) and the router (on this
        rank's sequence part); the stash `mode` names. With TP, one partial piece per sequence part, to
        reduce-scatter in the TP group."""
        p, t = weight.tp_size, weight.tp_rank
        n = act.samples.bit_count()
        seconds, flops = self._priced(moe_ops.route_cost, layer, n, False, p, mode_fp8(mode))  # type: ignore[attr-defined]
        self._advance("route", layer, act.samples, seconds, flops)  # type: ignore[attr-defined]
        mem = self._mem
        mem.context = ("route", layer)
        if stash:
            act._stash = Stash(mem, n * self._dense_stash(layer, p, mode.startswith("selective")),  # type: ignore
                               t, p, mode)
        if p == 1:
            return Routed(mem, n * self._act_bytes, self.rank, layer, act.samples)
        return [Routed(mem, n * self._act_bytes // p, self.rank, layer, spread_mask(act.samples, p, j), False,
                       False, 0, 0, p, 1 << t) for j in range(p)]

    def reduce_routed(self, pieces: Sequence[Routed]) -> Routed:
        """Sum the TP ranks' partial pieces of one sequence part (what the reduce-scatter of the attention
        output leaves this rank): the pieces must be of one layer and part, each TP rank's exactly once."""
        where = f"rank {self.rank} reduce_routed"
        try:
            pieces = list(pieces)
        except TypeError:
            pieces = [pieces]
        if not pieces or any(type(x) is not Routed for x in pieces):
            raise TensorError(f"{where}: expected the Routed pieces route() made under TP, got {pieces!r}")
        first = pieces[0]
        where += f"(layer {first.layer})"
        held = 0
        for x in pieces:
            self._check_own(x, where)  # type: ignore[attr-defined]
            if (x.layer, x.samples, x.parts) != (first.layer, first.samples, first.parts) or x.combined \
                    or x.dispatched or x.shared:
                raise TensorError(f"{where}: {x!r} and {first!r} are not pieces of one sequence part, fresh "
                                  f"from route")
            if held & x.tp_parts:
                raise TensorError(f"{where}: the partial sums of TP ranks {describe_mask(held & x.tp_parts)} "
                                  f"are given twice")
            held |= x.tp_parts
        if held != full_mask(first.parts):
            raise TensorError(f"{where}: the partial sums of TP ranks {describe_mask(full_mask(first.parts) & ~held)}"
                              f" are missing; all_to_all the pieces of route() in the TP group first")
        nbytes = first.nbytes
        self._advance("reduce_routed", first.layer, collapse_mask(first.samples, first.parts),  # type: ignore
                      compute_time(self.device, 0.0, (len(pieces) + 1.0) * nbytes), 0.0, nbytes)
        self._mem.context = ("reduce_routed", first.layer)
        return Routed(self._mem, nbytes, self.rank, first.layer, first.samples, False, False, 0, 0, first.parts,
                      full_mask(first.parts))

    def _part_of(self, routed: Routed) -> int:
        """The sequence part a routed tensor holds (one part of each of its samples)."""
        return ((routed.samples & -routed.samples).bit_length() - 1) % routed.parts

    def _combined(self, routed: Routed) -> Activation | ActivationSlice:
        """The layer's output `combine` makes: the whole activation, or under TP this rank's sequence part
        of it, a TP piece that the TP group all-gathers before the next layer."""
        samples, p = collapse_mask(routed.samples, routed.parts), routed.parts
        if p == 1:
            return Activation(self._mem, samples.bit_count() * self._act_bytes, self.rank, routed.layer + 1,
                              samples)
        return ActivationSlice(self._mem, samples.bit_count() * self._act_bytes // p, self.rank, routed.layer + 1,
                               samples, 1 << self._part_of(routed), p)

    def _check_output_grad(self, routed: Routed, grad: Any, where: str) -> None:
        """`combine_backward`'s gradient: the complete one of the layer's output, or under TP the piece of
        this rank's sequence part (`split_tp` of it)."""
        layer, p = routed.layer, routed.parts
        samples = collapse_mask(routed.samples, p)
        if p == 1:
            ok = grad.__class__.__name__ == "ActivationGrad" and not grad.is_partial
            what = f"the complete ActivationGrad of layer {layer + 1}"
        else:
            ok = type(grad) is ActivationGradSlice and grad.tp_size == p and grad.tp_parts == 1 << self._part_of(routed)
            what = (f"piece {self._part_of(routed)} of {p} (split_tp) of layer {layer + 1}'s ActivationGrad, this "
                    f"rank's sequence part")
        if not ok or grad.layer != layer + 1 or grad.samples != samples:
            raise TensorError(f"{where}: expected {what} for samples {describe_mask(samples)}, got {grad!r}")
        self._check_own(grad, where)  # type: ignore[attr-defined]

    def _loads(self, layer: int, first: int, stop: int, parts: int) -> tuple[tuple[int, ...], int]:
        """The expert loads of one sequence part of the microbatch of samples first..stop - 1, and its tokens."""
        tokens = (stop - first) * self.workload.seq_len // parts
        return self._routing(layer, first, tokens)[0], tokens

    def _routing(self, layer: int, first: int, tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(`routing.expert_loads`, their running sums: entry e the tokens of experts 0..e-1, so that a run of
        experts' load is one subtraction). Only zipf's depend on the layer and the microbatch; the others are
        remembered for the step by microbatch size, for every rank (`ExpertBooks.routing`)."""
        remembered = self._books.routing  # type: ignore[attr-defined]
        if remembered is None:
            loads = expert_loads(self.moe, layer, first, tokens)
            return loads, tuple(accumulate(loads, initial=0))
        found = remembered.get(tokens)
        if found is None:
            loads = expert_loads(self.moe, layer, first, tokens)
            found = remembered[tokens] = (loads, tuple(accumulate(loads, initial=0)))
        return found

    def _slots(self, layer: int, samples: int, experts: int, parts: int = 1) -> int:
        """Token slots of the dispatch buffer of `samples`' tokens for `experts`, microbatch by microbatch
        (each run of samples is one microbatch of the routing; under TP, each sequence part its own): the
        experts' loads, summed run by run of the mask (`routing.load_prefix`), or with a capacity factor each
        expert padded to the capacity (the padding moves and computes like tokens; Fedus et al. 2022)."""
        moe, seq, runs = self.moe, self.workload.seq_len, mask_runs(experts)
        total = 0
        for first, stop, _ in part_runs(samples, parts):
            tokens = (stop - first) * seq // parts  # (as `_loads` counts them)
            cap = moe.capacity(tokens)
            if cap:
                total += cap * experts.bit_count()
                continue
            prefix = self._routing(layer, first, tokens)[1]
            for start, end in runs:
                total += prefix[end] - prefix[start]
        return total

    def _distinct_bytes(self, layer: int, samples: int, experts: int, parts: int = 1) -> int:
        """Bytes of the tokens of `samples` that use at least one of `experts`, each counted once
        (`routing.tokens_reaching`): what a hierarchical dispatch sends across to the node holding them."""
        chosen = [e for e in range(self.moe.experts) if experts >> e & 1]
        total = 0
        for first, stop, _ in part_runs(samples, parts):
            loads, tokens = self._loads(layer, first, stop, parts)
            total += tokens_reaching(self.moe, loads, chosen, tokens)
        return total * self.workload.hidden * self.workload.bytes_per_element

    def _local_tokens(self, layer: int, pieces: Sequence[Any], experts: int) -> list[int]:
        """Token slots each local expert computes over these pieces (padded to the capacity when one is set)."""
        counts = [0] * experts.bit_count()
        chosen = [e for e in range(self.moe.experts) if experts >> e & 1]
        for t in pieces:
            for first, stop, _ in part_runs(t.samples, t.parts):
                loads, tokens = self._loads(layer, first, stop, t.parts)
                cap = self.moe.capacity(tokens)
                for i, e in enumerate(chosen):
                    counts[i] += cap or loads[e]
        return counts

    def _expert_grad_complete(self, samples: int) -> tuple[bool, int, int]:
        """Does an expert gradient of `samples` (a mask over sample parts) hold every part of every sample of
        the batch? With its part count and the missing parts."""
        batch = self._full_batch.bit_length()
        parts = max(1, -(-samples.bit_length() // batch))
        want = full_mask(batch * parts)
        return samples == want, parts, want & ~samples

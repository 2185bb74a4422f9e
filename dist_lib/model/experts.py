"""`MoEModel`: the handle of a rank training a mixture-of-experts workload, with the ops of an MoE layer's token
round trip, each checked at once (the books the end-of-step check of the experts reads: `expert_books.py`).

An MoE layer runs as the textbook (and Megatron-Core, DeepSeek-V3) runs it under expert parallelism:

    routed = route(layer, x, weight)                 # attention + router on the tokens' own rank
    tokens = dispatch(routed, experts)               # the tokens bound for these experts (a dispatch buffer)
    ... all-to-all: each piece to the rank that holds its experts ...
    outs = expert_forward(layer, [tokens...], expert_weight)   # the local experts' grouped GEMM
    ... all-to-all back ...
    y = combine(routed, [outs...])                   # every expert's output, exactly once -> layer's output

and backward the other way: `combine_backward` cuts the output gradient into pieces for the experts,
`expert_backward` gives the pieces' input gradients and the experts' weight gradient (`ExpertGrad`, of the
samples whose tokens it saw; one grouped GEMM over every piece the forward took, or one piece at a time:
`expert_backward.py`), and `route_backward` takes every expert's input gradient back, once each, and
runs the dense part's backward. `load_weights` of an MoE layer holds its dense part (attention, norms, router,
shared experts); `load_experts` the routed experts of a range. The whole-layer ops (`forward`, `backward`)
refuse MoE layers: their tokens must go to their experts.

What is checked where: a token piece computed by a rank whose experts are not the piece's is sent to the
wrong rank (`expert_forward`); a combine that misses an expert's output, takes one twice, or has not run the
shared experts is refused at the combine; the layer's output exists only after it (a skipped combine leaves
the next layer without an input); an expert gradient summed twice fails at the sum or the all-reduce; at the
end, every expert of every MoE layer is handed in once, updated with the gradients of every sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dist_lib.costs import moe_ops
from dist_lib.engine.core import Engine
from dist_lib.model.expert_books import ExpertBooks
from dist_lib.errors import TensorError
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.model.expert_backward import ExpertBackward, expert_counts
from dist_lib.model.expert_parts import ExpertParts, RECOMPUTED, collapse_mask, run_mask, stash_fp8, stash_recomputes
from dist_lib.model.handle import Model
from dist_lib.tensors import (Activation, ActivationGrad, ExpertGrad, ExpertOptState, ExpertWeight, Routed, Stash,
                              Tokens, WeightGrad, describe_mask, full_mask)
from dist_lib.workload.routing import expert_loads


class MoEModel(ExpertParts, ExpertBackward, Model):
    """`Model` for a mixture-of-experts workload: the ops of the module docstring beside `Model`'s (under
    tensor parallelism, with those of `ExpertParts`; the experts' backward in `ExpertBackward`)."""

    __slots__ = ("_books", "moe", "_groups")

    def __init__(self, engine: Engine, rank: int, books: ExpertBooks):
        super().__init__(engine, rank)
        self._books = books
        self.moe = books.moe
        self._params = books.dense_params  # `load_weights` and `update` of a layer: its dense part
        self._groups: dict[int, dict[int, int]] = {}  # `ExpertBackward`: the pieces of each expert_forward

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe.is_moe(layer)

    # ---- the whole-layer ops, for the dense layers only -------------------------------------------

    def _dense_only(self, op: str, layer: Any) -> None:
        if layer.__class__ is int and 0 <= layer < self.num_layers and self.moe.is_moe(layer):
            raise TensorError(f"rank {self.rank} {op}(layer {layer}): layer {layer} is a mixture-of-experts layer; "
                              f"its tokens go to their experts: route, dispatch, expert_forward, combine "
                              f"(backward: combine_backward, expert_backward, route_backward; strategies/moe.py)")

    def forward(self, layer: int, act: Activation, weight: Any, **modes: Any) -> Activation:
        self._dense_only("forward", layer)
        return super().forward(layer, act, weight, **modes)

    def backward(self, layer: int, act: Activation, grad: ActivationGrad, weight: Any) -> Any:
        self._dense_only("backward", layer)
        return super().backward(layer, act, grad, weight)

    def backward_input(self, layer: int, act: Activation, grad: ActivationGrad, weight: Any) -> Any:
        self._dense_only("backward_input", layer)
        return super().backward_input(layer, act, grad, weight)

    def backward_weight(self, layer: int, act: Activation, grad: ActivationGrad, weight: Any) -> Any:
        self._dense_only("backward_weight", layer)
        return super().backward_weight(layer, act, grad, weight)

    # ---- experts' weights -----------------------------------------------------------------------

    def load_experts(self, layer: int, experts: range | Iterable[int], *, tp_rank: int = 0, tp_size: int = 1,
                     shard: int = 0, num_shards: int = 1) -> tuple[ExpertWeight, ExpertOptState]:
        """Weights and optimizer state of the routed experts `experts` of MoE layer `layer`; with `tp_size` > 1,
        expert-TP shard `tp_rank` of each (1/tp_size of its width, `ExpertParts`); with `num_shards` > 1, ZeRO
        shard `shard` of that (the distributed optimizer's, over the expert-data-parallel group)."""
        where = f"rank {self.rank} load_experts(layer {layer})"
        self._moe_layer(layer, where)
        mask = self._experts_mask(experts, where)
        self._check_expert_shard(tp_rank, tp_size, where)
        if shard.__class__ is not int or num_shards.__class__ is not int or not 0 <= shard < num_shards:
            raise TensorError(f"{where}: shard={shard!r}, num_shards={num_shards!r} is not a ZeRO shard")
        mem = self._mem
        mem.context = ("load_experts", layer)
        params = mask.bit_count() * self._books.expert_params / tp_size / num_shards
        self._books.loaded.setdefault((self.rank, layer), set()).add(mask)
        place = (1 << shard, num_shards, tp_rank, tp_size, 0, mask)
        return (ExpertWeight(mem, int(params * WEIGHT_BYTES), self.rank, layer, 0, *place),
                ExpertOptState(mem, int(params * OPTIMIZER_BYTES), self.rank, layer, 0, *place))

    def update_experts(self, layer: int, grad: ExpertGrad, weight: ExpertWeight,
                       opt_state: ExpertOptState) -> tuple[ExpertWeight, ExpertOptState]:
        """Adam step of these experts; the gradient must hold the tokens of every sample of the batch."""
        where = f"rank {self.rank} update_experts(layer {layer})"
        for name, t, cls in (("grad", grad, ExpertGrad), ("weight", weight, ExpertWeight),
                             ("opt_state", opt_state, ExpertOptState)):
            if type(t) is not cls:
                raise TensorError(f"{where}: {name} must be an {cls.__name__}, got {t!r}")
            self._check_own(t, where)
            if t.layer != layer or t.experts != opt_state.experts \
                    or (t.tp_rank, t.tp_size) != (opt_state.tp_rank, opt_state.tp_size):
                raise TensorError(f"{where}: {name} {t!r} is not layer {layer}'s experts "
                                  f"{describe_mask(opt_state.experts)} (expert-TP shard {opt_state.tp_rank} of "
                                  f"{opt_state.tp_size})")
        complete, parts, missing = self._expert_grad_complete(grad.samples)
        if not complete:
            held = "samples" if parts == 1 else f"sample parts (sample s part j is s * {parts} + j)"
            raise TensorError(f"{where}: the gradient holds the tokens of {held} {describe_mask(grad.samples)} "
                              f"but not {describe_mask(missing)}; all_reduce it over the "
                              f"ranks that hold the same experts (the expert-data-parallel group) first")
        shards, num = opt_state.shards, opt_state.num_shards
        for name, t in (("grad", grad), ("weight", weight)):  # whole, or holding the optimizer state's shard
            if t.num_shards != 1 and (t.num_shards != num or t.shards & shards != shards):
                raise TensorError(f"{where}: {name} {t!r} does not hold the optimizer state's shard "
                                  f"{describe_mask(shards)} of {num}; reduce_scatter the gradient over the "
                                  f"expert-data-parallel group")
        key = (self.rank, layer, opt_state.experts, shards)
        if key in self._books.updated or weight.step:
            raise TensorError(f"{where}: experts {describe_mask(opt_state.experts)} were already updated")
        self._books.updated.add(key)
        params = opt_state.experts.bit_count() * self._books.expert_params / opt_state.tp_size * shards.bit_count() \
            / num
        from dist_lib.costs.compute import ADAM_BYTES_PER_PARAM, update_time
        self._advance("update_experts", layer, self._full_batch, update_time(self.device, params), 0.0,
                      int(params * ADAM_BYTES_PER_PARAM))
        place = (shards, num, opt_state.tp_rank, opt_state.tp_size, self._full_batch, opt_state.experts)
        if (weight.shards, weight.num_shards) == (shards, num):
            buffer, nbytes = weight, 0  # updated in place
        else:  # the updated shard of a whole 16-bit weight, to all_gather (the distributed optimizer)
            buffer, nbytes = self._mem, int(params * WEIGHT_BYTES)
            buffer.context = ("update_experts", layer)
        return (ExpertWeight(buffer, nbytes, self.rank, layer, 1, *place),
                ExpertOptState(opt_state, 0, self.rank, layer, 1, *place))

    def set_final_experts(self, layer: int, weight: ExpertWeight) -> None:
        """Hand in this rank's updated experts of `layer` for the end-of-step check: whole, or the ZeRO shard
        the distributed optimizer updated (with `overlap_param_gather` the next step's forward gathers it),
        every shard then handed in by some rank of the expert-data-parallel group."""
        where = f"rank {self.rank} set_final_experts(layer {layer})"
        if type(weight) is not ExpertWeight or weight.layer != layer:
            raise TensorError(f"{where}: expected layer {layer}'s ExpertWeight, got {weight!r}")
        self._check_own(weight, where)
        self._books.finals.append((self.rank, layer, weight.experts, weight.step, weight.samples, weight.tp_rank,
                                   weight.tp_size, weight.shards, weight.num_shards))

    # ---- forward: route, dispatch, experts, combine ------------------------------------------

    def expert_loads(self, layer: int, samples: range) -> tuple[int, ...]:
        """Tokens each expert of `layer` receives from the microbatch `samples` (`workload.routing`)."""
        return expert_loads(self.moe, layer, samples.start if isinstance(samples, range) else min(samples),
                            len(samples) * self.workload.seq_len)

    def route(self, layer: int, act: Activation, weight: Any, *, fp8: str = "", stash: bool = True,
              selective_recompute: bool = False, recompute_norm: bool = False) -> Routed | list[Routed]:
        """An MoE layer's attention and router on `act` (its stash kept on `act`, as `forward` keeps it).
        With a TP slice of the weight: one partial piece per sequence part (`ExpertParts`). `fp8`: the
        attention's linear layers in FP8 with that recipe (`costs.fp8`), backward too. `stash=False` (full
        recompute): no stash, and the backward needs the layer's forward run again first;
        `selective_recompute`: the stash without the attention core's, which `route_backward` re-runs;
        `recompute_norm`: Megatron-Core's `recompute_modules=["layernorm"]`, the pre-MLP norm's output dropped
        and the norm run again in `route_backward` (`moe_ops.norm_recompute`). That output is the router's
        input, which the stash's count (Korthikanti et al.'s attention and norms, then the experts' inputs)
        does not hold, so the stash is the same size."""
        where = f"rank {self.rank} route(layer {layer})"
        self._moe_layer(layer, where)
        self._check_compute("route", layer, act, weight, layer)
        if act.has_stash:
            raise TensorError(f"{where}: {act!r} already carries layer {layer}'s stash; route each input once")
        mode = self._route_mode(layer, fp8, stash, selective_recompute, recompute_norm)
        return self._route(layer, act, weight, mode, stash)

    def shared_experts(self, layer: int, routed: Routed, weight: Any, *, fp8: str = "") -> None:
        """The shared experts on every token of `routed` (DeepSeek runs them while the dispatch is in flight);
        in FP8 with `fp8` (their backward runs in `route_backward`, in the mode `route` was given)."""
        where = f"rank {self.rank} shared_experts(layer {layer})"
        fp8 = self._fp8("shared_experts", layer, fp8)
        self._check_routed(routed, layer, where)
        if not self.moe.shared_experts:
            raise TensorError(f"{where}: workload {self.workload.name} has no shared experts")
        if routed.shared:
            raise TensorError(f"{where}: the shared experts already ran on samples {describe_mask(routed.samples)}")
        seconds, flops = self._priced(moe_ops.shared_cost, layer, routed.samples.bit_count(), False, routed.parts, fp8)
        self._advance("shared_experts", layer, collapse_mask(routed.samples, routed.parts), seconds, flops)
        routed.shared = True

    def dispatch(self, routed: Routed, experts: range | Iterable[int]) -> Tokens:
        """The dispatch buffer of the tokens of `routed` bound for `experts` (a permutation: an HBM copy)."""
        layer = routed.layer if isinstance(routed, Routed) else "?"
        where = f"rank {self.rank} dispatch(layer {layer})"
        self._check_routed(routed, layer, where)
        mask = self._experts_mask(experts, where)
        if routed.dispatched & mask:
            raise TensorError(f"{where}: the tokens of samples {describe_mask(routed.samples)} for experts "
                              f"{describe_mask(routed.dispatched & mask)} were already dispatched; each token goes "
                              f"to each of its experts once")
        routed.dispatched |= mask
        return self._tokens("dispatch", routed.layer, routed.samples, mask, "dispatched", routed.parts)

    def expert_forward(self, layer: int, pieces: Sequence[Tokens], weight: ExpertWeight, *,
                       fp8: str = "", stash: bool = True, recompute_activation: bool = False) -> list[Tokens]:
        """The local experts on the tokens dispatched to them (one grouped GEMM over every piece), the stash
        kept on each piece (not with `stash=False`: full recompute runs the layer again before its
        backward); returns each piece's expert output, in order. `fp8`: the grouped GEMM in FP8 with that
        recipe, its backward too. `recompute_activation`: Megatron-Core's `recompute_modules=["moe_act"]`,
        the activation's output (the down projection's input, f a routed token) left out of the stash and the
        activation run again in `expert_backward` (`moe_ops.activation_recompute`)."""
        where = f"rank {self.rank} expert_forward(layer {layer})"
        fp8 = self._fp8("expert_forward", layer, fp8)
        for name, value in (("stash", stash), ("recompute_activation", recompute_activation)):
            if value is not True and value is not False:
                raise TensorError(f"{where}: {name} must be True or False, got {value!r}")
        self._check_experts_weight(weight, layer, where)
        pieces = list(pieces)
        seen = 0
        parts = pieces[0].parts if pieces and type(pieces[0]) is Tokens else 1
        for t in pieces:
            self._check_tokens(t, layer, "dispatched", where)
            if t.parts != parts:
                raise TensorError(f"{where}: {t!r} and {pieces[0]!r} split their samples into different sequence parts")
            if t.experts != weight.experts:
                raise TensorError(f"{where}: {t!r} holds tokens for experts {describe_mask(t.experts)}, but this "
                                  f"rank holds experts {describe_mask(weight.experts)}: they were dispatched to the "
                                  f"wrong rank")
            if t._stash is not None:
                raise TensorError(f"{where}: {t!r} already went through its experts")
            if seen & t.samples:
                raise TensorError(f"{where}: samples {describe_mask(seen & t.samples)} appear in two pieces")
            seen |= t.samples
        if not pieces:
            raise TensorError(f"{where}: no token pieces given")
        tokens = self._local_tokens(layer, pieces, weight.experts)
        seconds, flops = self._priced(moe_ops.experts_cost, tuple(tokens), False, weight.tp_size, fp8)
        self._advance("expert_forward", layer, collapse_mask(seen, parts), seconds, flops,
                      detail=expert_counts(weight.experts, tokens))
        mem = self._mem
        mem.context = ("expert_forward", layer)
        per_token = self._expert_stash_per_token(weight.tp_size, recompute_activation)
        mode = "+".join(m for m in (RECOMPUTED if recompute_activation else "", fp8) if m) or "none"
        shard = (1 << weight.tp_rank, weight.tp_size)  # an expert-TP shard's output: a partial sum
        outs = []
        for t in pieces:
            if stash:
                t._stash = Stash(mem, self._slots(layer, t.samples, t.experts, parts) * per_token, weight.tp_rank,
                                 weight.tp_size, mode)
            outs.append(Tokens(mem, t.nbytes, self.rank, layer, t.samples, t.experts, "expert output", parts, *shard))
        if stash:
            self._remember_group(pieces)
        return outs

    def combine(self, routed: Routed, pieces: Sequence[Tokens]) -> Activation:
        """The layer's output for the samples of `routed`: every expert's output for its tokens, exactly once
        each (and the shared experts' output), weighted by the router and summed with the residual (under
        TP, this rank's sequence part of it: a TP piece, `ExpertParts._combined`)."""
        layer = routed.layer if isinstance(routed, Routed) else "?"
        where = f"rank {self.rank} combine(layer {layer})"
        self._check_routed(routed, layer, where)
        back = self._cover(pieces, routed, "expert output", where, "output")
        if back != routed.dispatched:
            raise TensorError(f"{where}: experts {describe_mask(routed.dispatched & ~back)}'s outputs for samples "
                              f"{describe_mask(routed.samples)} were dispatched but did not come back")
        if self.moe.shared_experts and not routed.shared:
            raise TensorError(f"{where}: the shared experts have not run on samples {describe_mask(routed.samples)} "
                              f"(shared_experts)")
        routed.combined = True
        nbytes = sum(t.nbytes for t in pieces)
        from dist_lib.costs.compute import compute_time
        self._advance("combine", layer, collapse_mask(routed.samples, routed.parts),
                      compute_time(self.device, 0.0, 2.0 * nbytes), 0.0, nbytes)
        self._mem.context = ("combine", layer)
        return self._combined(routed)

    # ---- backward ------------------------------------------------------------------------------

    def combine_backward(self, routed: Routed, grad: ActivationGrad, experts: range | Iterable[int]) -> Tokens:
        """The gradient of the expert outputs of `experts` for the tokens of `routed`, to send to them."""
        layer = routed.layer if isinstance(routed, Routed) else "?"
        where = f"rank {self.rank} combine_backward(layer {layer})"
        self._check_routed(routed, layer, where, combined=True)
        self._check_output_grad(routed, grad, where)
        mask = self._experts_mask(experts, where)
        if routed.grads_sent & mask or mask & ~routed.dispatched:
            raise TensorError(f"{where}: experts {describe_mask(mask)}: their output gradient was already cut, or "
                              f"their tokens were never dispatched")
        routed.grads_sent |= mask
        return self._tokens("combine_backward", layer, routed.samples, mask, "output grad", routed.parts)

    def route_backward(self, layer: int, act: Activation, grad: ActivationGrad, routed: Routed,
                       pieces: Sequence[Tokens], weight: Any) -> tuple[WeightGrad, ActivationGrad]:
        """The dense part's backward (router, attention, shared experts) once every expert's input gradient
        for these tokens is back, exactly once each, after the dispatch's own backward gathers those gradients
        back to their tokens (`moe_ops.unpermute_backward`); consumes the stash `route` left on `act`."""
        where = f"rank {self.rank} route_backward(layer {layer})"
        self._check_routed(routed, layer, where, combined=True)
        self._check_compute("route_backward", layer, act, weight, layer)
        samples, p = collapse_mask(routed.samples, routed.parts), routed.parts
        if act.samples != samples or act._stash is None:
            raise TensorError(f"{where}: {act!r} is not the routed input of samples {describe_mask(samples)} "
                              f"with its stash")
        if type(grad) is not ActivationGrad or grad.layer != layer + 1 or grad.samples != act.samples \
                or grad.is_partial:
            raise TensorError(f"{where}: expected layer {layer + 1}'s complete ActivationGrad of samples "
                              f"{describe_mask(act.samples)}, got {grad!r}")
        if (weight.tp_size, weight.tp_rank) != (p, self._part_of(routed) if p > 1 else 0):
            raise TensorError(f"{where}: {weight!r} is not the TP slice that routed sequence part "
                              f"{self._part_of(routed) if p > 1 else 0} of {p}")
        back = self._cover(pieces, routed, "input grad", where, "input gradient")
        if back != routed.dispatched:
            raise TensorError(f"{where}: experts {describe_mask(routed.dispatched & ~back)} have not returned the "
                              f"input gradient of samples {describe_mask(routed.samples)}")
        n = act.samples.bit_count()
        fp8 = stash_fp8(act._stash)
        seconds, flops = self._priced(moe_ops.route_cost, layer, n, True, p, fp8)
        if act._stash.recompute.startswith("selective"):  # the attention core again first
            seconds, flops = seconds + moe_ops.core_recompute(self.device, self.workload, n, p), \
                flops + self.workload.attention_core_flops() * n / p
        if stash_recomputes(act._stash):  # the pre-MLP norm again, before the router's backward
            seconds += moe_ops.norm_recompute(self.device, self.workload, n, p)
        if self.moe.shared_experts:
            more = self._priced(moe_ops.shared_cost, layer, n, True, p, fp8)
            seconds, flops = seconds + more[0], flops + more[1]
        seconds += moe_ops.unpermute_backward(self.device, sum(t.nbytes for t in pieces))
        self._advance("route_backward", layer, act.samples, seconds, flops)
        act._stash = None
        self._mem.context = ("route_backward", layer)
        return self._weight_grad(layer, act, weight), self._activation_grad(act, weight)

    # ---- internals ----------------------------------------------------------------------------

    def _moe_layer(self, layer: Any, where: str) -> None:
        self._check_layer(layer, where)
        if not self.moe.is_moe(layer):
            raise TensorError(f"{where}: layer {layer} is a dense layer; forward and backward it")

    def _priced(self, cost: Any, *args: Any) -> tuple[float, float]:
        """`cost(device, workload, *args)` of a `costs.moe_ops` function, remembered for the step: a pure
        function of its arguments, asked for by every rank for every microbatch."""
        key = (cost, id(self.device), args)
        found = self._books.costs.get(key)
        if found is None:
            found = self._books.costs[key] = cost(self.device, self.workload, *args)
        return found

    def _experts_mask(self, experts: Any, where: str) -> int:
        mask = run_mask(experts, self.moe.experts)
        if mask:
            return mask
        try:
            items = list(experts)
        except TypeError:
            items = [None]
        mask = 0
        for e in items:
            if e.__class__ is not int or not 0 <= e < self.moe.experts or mask >> e & 1:
                raise TensorError(f"{where}: experts must be distinct expert numbers in 0..{self.moe.experts - 1}, "
                                  f"got {experts!r}")
            mask |= 1 << e
        if not mask:
            raise TensorError(f"{where}: no experts given")
        return mask

    def _check_routed(self, routed: Any, layer: Any, where: str, *, combined: bool = False) -> None:
        if type(routed) is not Routed:
            raise TensorError(f"{where}: expected the Routed tensor route() returned, got {routed!r}")
        self._check_own(routed, where)
        if routed.tp_parts != full_mask(routed.parts):
            raise TensorError(f"{where}: {routed!r} holds TP partial sums of the attention output; all_to_all "
                              f"route()'s pieces in the TP group and reduce_routed them first")
        if routed.combined and not combined:
            raise TensorError(f"{where}: the tokens of samples {describe_mask(routed.samples)} were already combined")
        if combined and not routed.combined:
            raise TensorError(f"{where}: layer {layer}'s output for samples {describe_mask(routed.samples)} was "
                              f"never combined")

    def _check_expert_shard(self, tp_rank: Any, tp_size: Any, where: str) -> None:
        """An expert-TP shard: the experts' width splits into `tp_size` equal parts (Megatron-Core splits
        each expert's fc1 by columns and fc2 by rows over the expert tensor-parallel group)."""
        if tp_size.__class__ is not int or tp_rank.__class__ is not int or tp_size < 1 or not 0 <= tp_rank < tp_size:
            raise TensorError(f"{where}: tp_rank={tp_rank!r}, tp_size={tp_size!r} is not an expert-TP shard; need "
                              f"whole numbers with 0 <= tp_rank < tp_size")
        if self.moe.expert_ffn_hidden % tp_size:
            raise TensorError(f"{where}: the experts' width {self.moe.expert_ffn_hidden} does not split into "
                              f"tp_size={tp_size} equal parts")

    def _check_tokens(self, t: Any, layer: int, stage: str, where: str) -> None:
        if type(t) is not Tokens or t.stage != stage or t.layer != layer:
            raise TensorError(f"{where}: expected layer {layer}'s {stage} tokens, got {t!r}")
        self._check_own(t, where)

    def _check_experts_weight(self, weight: Any, layer: int, where: str) -> None:
        self._moe_layer(layer, where)
        if type(weight) is not ExpertWeight or weight.layer != layer:
            raise TensorError(f"{where}: expected layer {layer}'s ExpertWeight (load_experts), got {weight!r}")
        self._check_own(weight, where)

    def _cover(self, pieces: Sequence[Tokens], routed: Routed, stage: str, where: str, what: str) -> int:
        """The experts whose `stage` pieces for the samples of `routed` are given, each exactly once (under
        expert TP, the partial sum of each of its shards exactly once)."""
        back = 0
        shards: dict[int, int] = {}  # experts -> the expert-TP shards whose partial sums came back
        for t in pieces:
            self._check_tokens(t, routed.layer, stage, where)
            if t.samples != routed.samples:
                raise TensorError(f"{where}: {t!r} is not of samples {describe_mask(routed.samples)}")
            held = shards.get(t.experts, 0)
            if back & t.experts or held & t.tp_parts:
                raise TensorError(f"{where}: the {what} of experts {describe_mask(t.experts)} for samples "
                                  f"{describe_mask(routed.samples)} came back twice")
            if t.tp_size == 1:
                back |= t.experts
                continue
            shards[t.experts] = held = held | t.tp_parts
            if held == full_mask(t.tp_size):
                back |= t.experts
        for experts, held in shards.items():
            if not back & experts:
                raise TensorError(f"{where}: the {what} of experts {describe_mask(experts)} for samples "
                                  f"{describe_mask(routed.samples)} came back from expert-TP shards "
                                  f"{describe_mask(held)} only; every shard's partial sum is needed")
        return back

    def _tokens(self, op: str, layer: int, samples: int, experts: int, stage: str, parts: int) -> Tokens:
        nbytes = self._slots(layer, samples, experts, parts) * self.workload.hidden * self.workload.bytes_per_element
        from dist_lib.costs.compute import compute_time
        self._advance(op, layer, collapse_mask(samples, parts), compute_time(self.device, 0.0, 2.0 * nbytes), 0.0,
                      nbytes)
        self._mem.context = (op, layer)
        return Tokens(self._mem, nbytes, self.rank, layer, samples, experts, stage, parts)

    def _dense_stash(self, layer: int, tp: int = 1, selective: bool = False) -> int:
        """One sample's stash of the dense part on one of `tp` (sequence-parallel) TP ranks: the layer's
        stash without the routed experts' (which the expert ranks keep with the tokens they computed), and
        without the attention core's under selective recompute."""
        w = self.workload
        experts = w.seq_len * self.moe.top_k * self._expert_stash_per_token()
        return max(0, w.stash_bytes(layer, tp, recompute="selective" if selective else "none",
                                    sequence_parallel=tp > 1) - experts)

    def _expert_stash_per_token(self, etp: int = 1, recompute_activation: bool = False) -> int:
        """A routed token's stash in one expert: its input (h), gate and up outputs (2f) and their product (f,
        not kept when the activation is recomputed); on an expert-TP shard, 1/etp of the last three."""
        kept = 2 if recompute_activation else 3
        return (self.workload.hidden + kept * self.moe.expert_ffn_hidden // etp) * self.workload.bytes_per_element

    def _advance(self, op: str, layer: int, samples: int, seconds: float, flops: float, nbytes: int = 0,
                 detail: str = "") -> None:
        state = self._state
        start = state.clock
        state.clock = end = start + seconds
        state.flops += flops
        self._events.append((self.rank, op, "compute", start, end, layer, samples, nbytes, flops, None, 0, detail))


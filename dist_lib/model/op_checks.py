"""The checks behind every `Model` op: one combined fast test on the hot path, and, only when it fails, the
itemised checks that raise a `TensorError` naming the rank, the op, the layer and the fix."""

from __future__ import annotations

from typing import Any

from dist_lib.engine.core import Engine
from dist_lib.errors import TensorError
from dist_lib.costs.ops import FP8_RECIPES, SEQUENCE_PARALLEL_MODES
from dist_lib.workload.per_op_checkpoint import problem as per_op_problem
from dist_lib.tensors import Activation, ActivationGrad, ActivationGradSlice, ActivationSlice, ContextWeightGrad, OptState, Stash, Tensor, Weight, WeightGrad, describe_mask


class OpChecks:
    """Validation shared by the ops of `Model` (which provides `rank` and `num_layers`)."""

    __slots__ = ()
    rank: int
    num_layers: int
    _engine: Engine
    _mem: Any  # the rank's memory log of this step

    def _explain_load(self, layer: Any, shard: Any, num_shards: Any, tp_rank: Any, tp_size: Any,
                      op: str = "load_weights") -> None:
        where = f"rank {self.rank} {op}(layer {layer})"
        self._check_layer(layer, where)
        for name, index, count in (("shard", shard, num_shards), ("tp_rank", tp_rank, tp_size)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise TensorError(f"{where}: {'num_shards' if name == 'shard' else 'tp_size'} must be an int >= 1, "
                                  f"got {count!r}")
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
                raise TensorError(f"{where}: {name} must be in 0..{count - 1}, got {index!r}")

    def _explain_update(self, layer: Any, grad: Any, weight: Any, opt_state: Any) -> None:
        where = f"rank {self.rank} update(layer {layer})"
        self._check_layer(layer, where)
        if isinstance(grad, ContextWeightGrad):
            raise TensorError(f"{where}: the gradient {grad!r} holds only sequence parts "
                              f"{describe_mask(grad.seq_parts)} of {grad.cp_size}; all_reduce it over the "
                              f"context-parallel ranks of each replica too (the dp x cp group) before the update")
        given = (("grad", grad, WeightGrad), ("weight", weight, Weight), ("opt_state", opt_state, OptState))
        for name, t, cls in given:  # every kind first: the checks below read the optimizer state's fields
            if type(t) is not cls:
                raise TensorError(f"{where}: {name} must be a {cls.__name__}, got {t!r}")
        for name, t, cls in given:
            self._check_own(t, where)
            if t.layer != layer:
                raise TensorError(f"{where}: {name} is {t!r}, not layer {layer}")
            if (t.tp_rank, t.tp_size) != (opt_state.tp_rank, opt_state.tp_size):
                raise TensorError(f"{where}: {name} is TP slice {t.tp_rank}/{t.tp_size} but opt_state is "
                                  f"{opt_state.tp_rank}/{opt_state.tp_size}")
            if not _covers(t, opt_state):
                raise TensorError(f"{where}: {name} {t!r} does not hold the shard(s) the optimizer state "
                                  f"{opt_state!r} updates")
        raise TensorError(f"{where}: layer {layer} was already updated this step "
                          f"(step {max(weight.step, opt_state.step)})")

    def _check_layer(self, layer: Any, where: str) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise TensorError(f"{where}: layer must be in 0..{self.num_layers - 1}, got {layer!r}")

    def _check_own(self, t: Any, where: str) -> None:
        """t is this rank's tensor of this step: on the rank's memory log (`Model._mem`), which is the step's."""
        self._check_step(t, where)
        if t.rank != self.rank:
            raise TensorError(f"{where}: {t!r} lives on rank {t.rank}; send it here first")
        log = buffer_log(t)
        if log is not self._mem:  # this step's, on another rank's log (its fields were changed)
            raise TensorError(f"{where}: {t!r} lives on rank {log.rank}; send it here first")

    def _check_given(self, x: Any, where: str) -> None:
        """`x`, handed to a collective or a send, is not a tensor of an earlier step (other misuse is the
        op's to report)."""
        if isinstance(x, Tensor) and buffer_log(x) is not self._mem:
            self._check_step(x, where)

    def _check_step(self, t: Any, where: str) -> None:
        """t is a tensor of this step (on any rank): not one kept from an earlier `simulate()`."""
        log = buffer_log(t)
        if log is self._mem:
            return
        ranks = self._engine.ranks
        rank = getattr(log, "rank", None)
        if rank.__class__ is int and 0 <= rank < len(ranks) and ranks[rank].memory is log:
            return
        raise TensorError(f"{where}: {t!r} is a tensor of an earlier step; tensors belong to the step that made them: "
                          f"start each step from load_weights and get_input_activation, and keep no tensor "
                          f"between simulate() calls")

    def _check_compute(self, op: str, layer: int, act: Any, weight: Any, act_layer: int) -> None:
        mem = self._mem
        if type(act) is not Activation or type(weight) is not Weight or act.rank != self.rank \
                or weight.rank != self.rank or act.layer != act_layer or weight.layer != layer \
                or act.tp_size != 1 or weight.shards != (1 << weight.num_shards) - 1 \
                or (act._base or act)._mem is not mem or (weight._base or weight)._mem is not mem:
            self._explain_compute(op, layer, act, weight, act_layer)

    def _explain_compute(self, op: str, layer: int, act: Any, weight: Any, act_layer: int) -> None:
        where = f"rank {self.rank} {op}(layer {layer})"
        self._check_layer(layer, where)
        if type(act) is not Activation:
            fix = "; all_gather the pieces in the TP group first" if type(act) is ActivationSlice else ""
            raise TensorError(f"{where}: expected an Activation, got {act!r}{fix}")
        if type(weight) is not Weight:
            raise TensorError(f"{where}: expected a Weight, got {weight!r}")
        self._check_own(act, where)
        self._check_own(weight, where)
        if act.layer != act_layer:
            raise TensorError(f"{where}: {act!r} is the input of layer {act.layer}, not {act_layer}")
        if weight.layer != layer:
            raise TensorError(f"{where}: {weight!r} belongs to layer {weight.layer}")
        if act.is_partial:
            raise TensorError(f"{where}: {act!r} is a tensor-parallel partial sum; all_reduce it in the TP group first")
        if not weight.is_complete:
            raise TensorError(f"{where}: {weight!r} holds only ZeRO shards {describe_mask(weight.shards)} of "
                              f"{weight.num_shards}; all_gather it before compute")

    def _check_backward(self, op: str, layer: int, act: Any, grad: Any, weight: Any, need_input_done: bool) -> Stash:
        """The stash of a valid backward's input; a `TensorError` naming what is wrong otherwise."""
        rank, mem = self.rank, self._mem
        stash = act._stash if act.__class__ is Activation else None
        if stash is None or weight.__class__ is not Weight or grad.__class__ is not ActivationGrad \
                or act.rank != rank or weight.rank != rank or grad.rank != rank or act.layer != layer \
                or weight.layer != layer or grad.layer != layer + 1 or act.tp_size != 1 or grad.tp_size != 1 \
                or weight.shards != (1 << weight.num_shards) - 1 or grad.samples != act.samples \
                or stash.tp_rank != weight.tp_rank or stash.tp_size != weight.tp_size \
                or stash.input_done is not need_input_done or (act._base or act)._mem is not mem \
                or (grad._base or grad)._mem is not mem or (weight._base or weight)._mem is not mem:
            stash = self._explain_backward(op, layer, act, grad, weight, need_input_done)
        if stash.recompute in SEQUENCE_PARALLEL_MODES and not need_input_done and stash.tp_size > 1:
            self._check_sequence_parallel_grad(op, layer, grad, stash.tp_size)
        return stash

    def _check_modes(self, layer: int, selective_recompute: Any, sequence_parallel: Any, fp8: Any,
                     op: str = "forward") -> None:
        """A forward's modes: switches True or False; `fp8` a known scaling recipe (`costs.fp8`), or "" (16-bit),
        on a device with FP8 tensor cores. A plain forward also takes `selective_recompute="op"`, torchtitan's
        per-op selective checkpointing, on a Llama block as torchtitan builds it (`workload.per_op_checkpoint`)."""
        where = f"rank {self.rank} {op}(layer {layer})"
        if selective_recompute == "op" and selective_recompute.__class__ is str:
            why = "it is modelled for a plain forward only" if op != "forward" else \
                "the workload has a measured profile, which does not split out the layer's kernels" \
                if self.workload.profile is not None else \
                "the layers are mixture-of-experts layers" if self.workload.moe is not None else \
                per_op_problem(self.workload)  # type: ignore[attr-defined]
            if why:
                raise TensorError(f"{where}: selective_recompute='op' (torchtitan's per-op selective "
                                  f"checkpointing) is not modelled here: {why}")
            selective_recompute = False
        for name, value in (("selective_recompute", selective_recompute), ("sequence_parallel", sequence_parallel)):
            if value is not False and value is not True:
                extra = ' or "op"' if name == "selective_recompute" and op == "forward" else ""
                raise TensorError(f"{where}: {name} must be True or False{extra}, got {value!r}")
        if fp8 == "":
            return
        if fp8.__class__ is not str or fp8 not in FP8_RECIPES:
            raise TensorError(f"{where}: fp8 must be one of {', '.join(FP8_RECIPES)} or \"\" (16-bit), got {fp8!r}")
        if not self.device.fp8_flops:
            raise TensorError(f"{where}: fp8={fp8!r} on {self.device.name}, which has no FP8 tensor cores")

    def _check_sequence_parallel_grad(self, op: str, layer: int, grad: ActivationGrad, tp: int) -> None:
        """A layer that ran sequence-parallel over `tp` TP ranks holds 1/tp of its output gradient's sequence;
        each of its two row-parallel GEMMs (the MLP's second, then the attention's output projection) needs
        that gradient whole, so its input-gradient pass (`backward`, `backward_input`) takes only a gradient
        whose last two all-gathers were in TP groups of `tp` (Korthikanti et al. 2022, sec. 4.2.2: the
        all-gathers in the backward of the sequence-parallel regions). The gather of a pipeline message's
        TP pieces counts as the first (Megatron-LM's first layer gathers the pieces in its own all-gather)."""
        if grad.gathers[-2:] == (tp, tp):
            return
        done = 1 if grad.gathers[-1:] == (tp,) else 0  # (two would have passed)
        raise TensorError(f"rank {self.rank} {op}(layer {layer}): layer {layer} ran sequence-parallel over {tp} "
                          f"TP ranks, so its backward needs the output gradient all-gathered in the TP group "
                          f"before each of its two row-parallel GEMMs; {grad!r} comes out of {done} such "
                          f"all-gather{'' if done == 1 else 's'}, not 2: split_tp it and all_gather the pieces in "
                          f"the TP group of {tp}, {'once more' if done else 'twice'}")

    def _explain_backward(self, op: str, layer: int, act: Any, grad: Any, weight: Any, need_input_done: bool) -> Stash:
        self._check_compute(op, layer, act, weight, layer)
        where = f"rank {self.rank} {op}(layer {layer})"
        if type(grad) is not ActivationGrad:
            fix = "; all_gather the pieces in the TP group first" if type(grad) is ActivationGradSlice else ""
            raise TensorError(f"{where}: expected the ActivationGrad of layer {layer + 1}, got {grad!r}{fix}")
        self._check_own(grad, where)
        if grad.layer != layer + 1:
            raise TensorError(f"{where}: {grad!r} is the gradient entering layer {grad.layer}; "
                              f"backward of layer {layer} needs the one from layer {layer + 1}")
        if grad.samples != act.samples:
            raise TensorError(f"{where}: gradient of samples {describe_mask(grad.samples)} but activation of "
                              f"samples {describe_mask(act.samples)}")
        if grad.is_partial:
            raise TensorError(f"{where}: {grad!r} is a tensor-parallel partial sum; all_reduce it first")
        stash = act._stash
        if stash is None:
            raise TensorError(f"{where}: {act!r} carries no stash for layer {layer}: forward ran with "
                              f"stash=False or backward already consumed it; run forward(layer {layer}) "
                              f"again to recompute")
        if (stash.tp_rank, stash.tp_size) != (weight.tp_rank, weight.tp_size):
            raise TensorError(f"{where}: the stash came from TP slice {stash.tp_rank}/{stash.tp_size}, "
                              f"the weight is slice {weight.tp_rank}/{weight.tp_size}")
        if stash.input_done and not need_input_done:
            raise TensorError(f"{where}: backward_input already ran for these samples; call backward_weight")
        if need_input_done and not stash.input_done:
            raise TensorError(f"{where}: backward_weight before backward_input for samples "
                              f"{describe_mask(act.samples)}; compute the input gradient first")
        return stash


def buffer_log(t: Any) -> Any:
    """The memory log a tensor's bytes are on (its owner's, for a view): one rank's of one step."""
    return (t._base or t)._mem


def _shard_key(shards: int, num_shards: int, tp_rank: int) -> int:
    """One int naming a (ZeRO shards, TP slice) part of a layer; a small cached int when unsharded."""
    return tp_rank if num_shards == 1 else (shards << 16 | num_shards) << 16 | tp_rank


def _first_time(seen: list[Any], layer: int, key: int) -> bool:
    """Record `key` under `layer` in `seen` (per layer: None, one key, or a set of keys); False if it
    was there already. Most layers only ever see one key, which then costs no set."""
    before = seen[layer]
    if before is None:
        seen[layer] = key
        return True
    if before.__class__ is set:
        if key in before:
            return False
        before.add(key)
        return True
    if before == key:
        return False
    seen[layer] = {before, key}
    return True


def _covers(t: Any, opt: OptState) -> bool:
    """Does t hold every parameter of the optimizer state's shard(s)?"""
    if t.is_complete:
        return True
    return t.num_shards == opt.num_shards and t.shards & opt.shards == opt.shards

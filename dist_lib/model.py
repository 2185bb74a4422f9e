"""`Model`: the per-rank handle a strategy drives. Compute ops run at once on the rank's clock;
communication ops return a `Work` to await.

Every op checks its tensors and raises `TensorError` naming the rank, the op and the layer, so a wrong
schedule fails where it goes wrong rather than at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import costs
from .comm import Group, Work, get_group, issue_collective, issue_recv, issue_send
from .devices import Device
from .engine import Engine, RankState
from .errors import TensorError
from .hardware import Cluster
from .memory import Storage
from .tensors import (Activation, ActivationGrad, OptState, Stash, Weight, WeightGrad, describe_mask,
                      samples_mask)
from .workload import Workload

WEIGHT_BYTES = 2  # 16-bit weights and gradients
OPTIMIZER_BYTES = 12  # fp32 master weights, momentum and variance (ZeRO paper, sec. 3.1)


class Model:
    """What one rank sees: its identity, its device, the model shape, and the ops."""

    __slots__ = ("_engine", "_state", "_mem", "_events", "_cache", "rank", "world_size", "num_layers",
                 "global_batch_size", "device", "node", "cluster", "workload", "_world", "_params")

    def __init__(self, engine: Engine, rank: int):
        self._engine = engine
        self._state: RankState = engine.ranks[rank]
        self._mem = self._state.memory
        self._events = engine.events
        # durations by (op, layer, samples, tp), shared by the ranks of one device type
        self._cache: dict[tuple, tuple[float, float]] = engine.cost_cache.setdefault(self._state.device.name, {})
        self.rank = rank
        self.world_size = engine.world_size
        self.num_layers = engine.workload.num_layers
        self.global_batch_size = engine.global_batch_size
        self.device: Device = self._state.device
        self.node: int = self._state.node
        self.cluster: Cluster = engine.cluster
        self.workload: Workload = engine.workload
        self._world: Group | None = None
        self._params = engine.layer_params  # parameters of each layer

    def __repr__(self) -> str:
        return f"Model(rank {self.rank} of {self.world_size}, {self.device.name}, node {self.node})"

    @property
    def time(self) -> float:
        """This rank's compute-stream clock, in seconds."""
        return self._state.clock

    @property
    def memory_bytes(self) -> int:
        """Bytes of tensors this rank holds alive now."""
        return self._mem.live

    # ---- weights and inputs -------------------------------------------------------------------

    def load_weights(self, layer: int, shard: int = 0, num_shards: int = 1, *, tp_rank: int = 0,
                     tp_size: int = 1) -> tuple[Weight, OptState]:
        """Weights and optimizer state of ZeRO shard `shard` of `num_shards`, TP slice `tp_rank` of `tp_size`."""
        where = f"rank {self.rank} load_weights(layer {layer})"
        self._check_layer(layer, where)
        for name, index, count in (("shard", shard, num_shards), ("tp_rank", tp_rank, tp_size)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise TensorError(f"{where}: {'num_shards' if name == 'shard' else 'tp_size'} must be an int >= 1, "
                                  f"got {count!r}")
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
                raise TensorError(f"{where}: {name} must be in 0..{count - 1}, got {index!r}")
        params = self._params[layer] / (tp_size * num_shards)
        mem = self._mem
        mem.context = ("load_weights", layer)
        weight = Weight(self.rank, layer, 0, 1 << shard, num_shards, tp_rank, tp_size, 0,
                        Storage(mem, int(params * WEIGHT_BYTES), "weight"))
        opt = OptState(self.rank, layer, 0, 1 << shard, num_shards, tp_rank, tp_size, 0,
                       Storage(mem, int(params * OPTIMIZER_BYTES), "optimizer"))
        return weight, opt

    def get_input_activation(self, samples: Iterable[int] | range) -> Activation:
        """Embedded inputs for these sample indices of the global batch (a `range` or any iterable)."""
        try:
            mask = samples_mask(samples, self.global_batch_size)
        except (TypeError, ValueError) as exc:
            raise TensorError(f"rank {self.rank} get_input_activation: {exc}") from None
        nbytes = mask.bit_count() * self.workload.activation_bytes()
        self._mem.context = ("get_input_activation", None)
        return Activation(self.rank, 0, mask, Storage(self._mem, nbytes, "activation"))

    # ---- compute ------------------------------------------------------------------------------

    def forward(self, layer: int, act: Activation, weight: Weight, *, stash: bool = True) -> Activation:
        """Run `layer` on `act`; keeps the stash backward needs on `act` unless `stash=False`
        (activation checkpointing: backward will need this forward run again first)."""
        self._check_compute("forward", layer, act, weight, layer)
        state = self._state
        samples = act.samples
        n = samples.bit_count()
        tp_rank, tp = weight.tp_rank, weight.tp_size
        key = (layer, samples, tp_rank)
        recompute = key in state.forwards
        if not recompute:
            state.forwards.add(key)
        self._compute("forward", layer, samples, n, tp, "recompute" if recompute else "")
        mem = self._mem
        mem.context = ("forward", layer)
        if stash:
            act._stash = Stash(mem, n * self.workload.stash_bytes(layer, tp), tp_rank, tp)
        out = Activation(self.rank, layer + 1, samples, Storage(mem, n * self.workload.activation_bytes(),
                                                                "activation"))
        if tp > 1:
            out.tp_parts, out.tp_size = 1 << tp_rank, tp
        return out

    def backward(self, layer: int, act: Activation, grad: ActivationGrad,
                 weight: Weight) -> tuple[WeightGrad, ActivationGrad]:
        """Gradients of `layer` for the samples of `act`; consumes the stash `forward` left on `act`."""
        stash = self._check_backward("backward", layer, act, grad, weight, need_input_done=False)
        self._compute("backward", layer, act.samples, act.samples.bit_count(), weight.tp_size, "")
        act._stash = None
        del stash
        self._mem.context = ("backward", layer)
        return self._weight_grad(layer, act, weight), self._activation_grad(layer, act, weight)

    def backward_input(self, layer: int, act: Activation, grad: ActivationGrad, weight: Weight) -> ActivationGrad:
        """First half of a split backward (zero-bubble): the input gradient only; keeps the stash
        for `backward_weight` (Qi et al. 2023)."""
        stash = self._check_backward("backward_input", layer, act, grad, weight, need_input_done=False)
        self._compute("backward_input", layer, act.samples, act.samples.bit_count(), weight.tp_size, "")
        stash.input_done = True
        self._mem.context = ("backward_input", layer)
        return self._activation_grad(layer, act, weight)

    def backward_weight(self, layer: int, act: Activation, grad: ActivationGrad, weight: Weight) -> WeightGrad:
        """Second half of a split backward: the weight gradient; consumes the stash."""
        self._check_backward("backward_weight", layer, act, grad, weight, need_input_done=True)
        self._compute("backward_weight", layer, act.samples, act.samples.bit_count(), weight.tp_size, "")
        act._stash = None
        self._mem.context = ("backward_weight", layer)
        return self._weight_grad(layer, act, weight)

    def loss(self, act: Activation) -> ActivationGrad:
        """LM head, loss and its gradient for the final activations of some samples."""
        where = f"rank {self.rank} loss"
        if type(act) is not Activation:
            raise TensorError(f"{where}: expected the Activation after the last layer, got {act!r}")
        self._check_own(act, where)
        if act.layer != self.num_layers:
            raise TensorError(f"{where}: {act!r} has only passed {act.layer} of {self.num_layers} layers")
        if act.is_partial:
            raise TensorError(f"{where}: {act!r} is a tensor-parallel partial sum; all_reduce it first")
        n = act.samples.bit_count()
        self._compute("loss", self.num_layers, act.samples, n, 1, "")
        self._mem.context = ("loss", None)
        return ActivationGrad(self.rank, self.num_layers, act.samples,
                              Storage(self._mem, n * self.workload.activation_bytes(), "activation_grad"))

    def update(self, layer: int, grad: WeightGrad, weight: Weight, opt_state: OptState) -> tuple[Weight, OptState]:
        """Adam step on the shard `opt_state` holds; the gradient must cover the whole global batch."""
        where = f"rank {self.rank} update(layer {layer})"
        self._check_layer(layer, where)
        for name, t, cls in (("grad", grad, WeightGrad), ("weight", weight, Weight), ("opt_state", opt_state, OptState)):
            if type(t) is not cls:
                raise TensorError(f"{where}: {name} must be a {cls.__name__}, got {t!r}")
            self._check_own(t, where)
            if t.layer != layer:
                raise TensorError(f"{where}: {name} is {t!r}, not layer {layer}")
            if (t.tp_rank, t.tp_size) != (opt_state.tp_rank, opt_state.tp_size):
                raise TensorError(f"{where}: {name} is TP slice {t.tp_rank}/{t.tp_size} but opt_state is "
                                  f"{opt_state.tp_rank}/{opt_state.tp_size}")
            if not _covers(t, opt_state):
                raise TensorError(f"{where}: {name} {t!r} does not hold the shard(s) the optimizer state "
                                  f"{opt_state!r} updates")
        if weight.step != 0 or opt_state.step != 0:
            raise TensorError(f"{where}: layer {layer} was already updated this step (step {max(weight.step, opt_state.step)})")
        key = (layer, opt_state.shards, opt_state.num_shards, opt_state.tp_rank)
        state = self._state
        if key in state.updated:
            raise TensorError(f"{where}: this shard of layer {layer} was already updated on rank {self.rank}")
        full = (1 << self.global_batch_size) - 1
        if grad.samples != full:
            missing = describe_mask(full & ~grad.samples)
            raise TensorError(f"{where}: the gradient covers samples {describe_mask(grad.samples)} but not "
                              f"{missing}; accumulate microbatches and all_reduce/reduce_scatter across "
                              f"data-parallel ranks first")
        state.updated.add(key)
        params = self._params[layer] / opt_state.tp_size * \
            opt_state.shards.bit_count() / opt_state.num_shards
        duration = costs.update_time(self.device, params)
        start = state.clock
        state.clock = end = start + duration
        self._events.append((self.rank, "update", "compute", start, end, layer, grad.samples,
                             int(params * costs.ADAM_BYTES_PER_PARAM), 0.0, None, 0, ""))
        same = weight.shards == opt_state.shards and weight.num_shards == opt_state.num_shards
        self._mem.context = ("update", layer)
        storage = weight._storage if same else Storage(self._mem, int(params * WEIGHT_BYTES), "weight")
        new_weight = Weight(self.rank, layer, 1, opt_state.shards, opt_state.num_shards, opt_state.tp_rank,
                            opt_state.tp_size, grad.samples, storage)
        new_opt = OptState(self.rank, layer, 1, opt_state.shards, opt_state.num_shards, opt_state.tp_rank,
                           opt_state.tp_size, grad.samples, opt_state._storage)
        return new_weight, new_opt

    def set_final_weight(self, layer: int, weight: Weight) -> None:
        """Hand in this rank's updated weights (or shard of them) for the end-of-step check."""
        where = f"rank {self.rank} set_final_weight(layer {layer})"
        self._check_layer(layer, where)
        if type(weight) is not Weight:
            raise TensorError(f"{where}: expected a Weight, got {weight!r}")
        self._check_own(weight, where)
        if weight.layer != layer:
            raise TensorError(f"{where}: {weight!r} is not layer {layer}")
        finals = self._state.final_weights.setdefault(layer, [])
        if any(w.shards == weight.shards and w.num_shards == weight.num_shards and w.tp_rank == weight.tp_rank
               for w in finals):
            raise TensorError(f"{where}: this shard of layer {layer} was already handed in")
        finals.append(weight)

    # ---- communication ------------------------------------------------------------------------

    def group(self, ranks: Iterable[int]) -> Group:
        """The group of these ranks (the same object for the same set, whoever asks)."""
        return get_group(self._engine, ranks)

    def _resolve_group(self, group: Group | Iterable[int] | None) -> Group:
        if group is None:
            if self._world is None:  # built once per engine, not once per rank (its key is O(ranks))
                engine = self._engine
                if engine.world_group is None:
                    engine.world_group = get_group(engine, range(self.world_size))
                self._world = engine.world_group
            return self._world
        if isinstance(group, Group):
            return group
        return get_group(self._engine, group)

    def all_reduce(self, x: Any, group: Group | Iterable[int] | None = None) -> Work:
        """Sum gradients of disjoint samples, or TP partial sums, over `group` (default: all ranks)."""
        return issue_collective(self._engine, self._state, "all_reduce", x, self._resolve_group(group))

    def all_gather(self, x: Any, group: Group | Iterable[int] | None = None) -> Work:
        """Gather the ZeRO shards the members hold into the complete tensor on every member."""
        return issue_collective(self._engine, self._state, "all_gather", x, self._resolve_group(group))

    def reduce_scatter(self, x: Any, group: Group | Iterable[int] | None = None) -> Work:
        """Sum complete gradients over `group`; member i keeps shard i of len(group)."""
        return issue_collective(self._engine, self._state, "reduce_scatter", x, self._resolve_group(group))

    def send(self, x: Any, dst: int) -> Work:
        return issue_send(self._engine, self._state, x, dst)

    def recv(self, src: int) -> Work:
        return issue_recv(self._engine, self._state, src)

    # ---- internals ----------------------------------------------------------------------------

    def _compute(self, op: str, layer: int, samples: int, n: int, tp: int, detail: str) -> None:
        """Advance the compute stream by the op's duration and record it."""
        key = (op, layer, n, tp)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = _compute_cost(self.device, self.workload, op, layer, n, tp)
        duration, flops = cached
        state = self._state
        start = state.clock
        state.clock = end = start + duration
        state.flops += flops
        self._events.append((self.rank, op, "compute", start, end, layer, samples, 0, flops, None, 0, detail))

    def _weight_grad(self, layer: int, act: Activation, weight: Weight) -> WeightGrad:
        nbytes = int(self._params[layer] / weight.tp_size * WEIGHT_BYTES)
        return WeightGrad(self.rank, layer, act.samples, 1, 1, weight.tp_rank, weight.tp_size,
                          Storage(self._mem, nbytes, "weight_grad"))

    def _activation_grad(self, layer: int, act: Activation, weight: Weight) -> ActivationGrad:
        n = act.samples.bit_count()
        out = ActivationGrad(self.rank, layer, act.samples,
                             Storage(self._mem, n * self.workload.activation_bytes(), "activation_grad"))
        if weight.tp_size > 1:
            out.tp_parts, out.tp_size = 1 << weight.tp_rank, weight.tp_size
        return out

    def _check_layer(self, layer: Any, where: str) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise TensorError(f"{where}: layer must be in 0..{self.num_layers - 1}, got {layer!r}")

    def _check_own(self, t: Any, where: str) -> None:
        if t.rank != self.rank:
            raise TensorError(f"{where}: {t!r} lives on rank {t.rank}; send it here first")

    def _check_compute(self, op: str, layer: int, act: Any, weight: Any, act_layer: int) -> None:
        if type(act) is not Activation or type(weight) is not Weight or act.rank != self.rank \
                or weight.rank != self.rank or act.layer != act_layer or weight.layer != layer \
                or act.tp_size != 1 or weight.shards != (1 << weight.num_shards) - 1:
            self._explain_compute(op, layer, act, weight, act_layer)

    def _explain_compute(self, op: str, layer: int, act: Any, weight: Any, act_layer: int) -> None:
        where = f"rank {self.rank} {op}(layer {layer})"
        self._check_layer(layer, where)
        if type(act) is not Activation:
            raise TensorError(f"{where}: expected an Activation, got {act!r}")
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
        self._check_compute(op, layer, act, weight, layer)
        where = f"rank {self.rank} {op}(layer {layer})"
        if type(grad) is not ActivationGrad:
            raise TensorError(f"{where}: expected the ActivationGrad of layer {layer + 1}, got {grad!r}")
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


def _covers(t: Any, opt: OptState) -> bool:
    """Does t hold every parameter of the optimizer state's shard(s)?"""
    if t.is_complete:
        return True
    return t.num_shards == opt.num_shards and t.shards & opt.shards == opt.shards


def _compute_cost(device: Device, workload: Workload, op: str, layer: int, n: int, tp: int) -> tuple[float, float]:
    if op == "forward":
        duration = costs.forward_time(device, workload, layer, n, tp)
    elif op == "backward":
        duration = costs.backward_time(device, workload, layer, n, tp)
    elif op == "backward_input":
        duration = costs.backward_input_time(device, workload, layer, n, tp)
    elif op == "backward_weight":
        duration = costs.backward_weight_time(device, workload, layer, n, tp)
    else:
        duration = costs.loss_time(device, workload, n)
    return duration, costs.compute_flops(workload, op, layer, n, tp)

"""The course lab's `lib.py` (the LLM-Training-Puzzles extension with a calculon-style cost model).

Same names, signatures and semantics: `Dist(world_size)` with its collectives and one-message
mailboxes per (source, destination), `Model(rank, dist, num_layers, global_batch_size)` with five
storage dicts whose tensors every op must take from them, `log_event`, `runtime_predictor`, async
`all_reduce`/`all_gather`/`reduce_scatter`/`send`/`receive`, tensors with `samples`/`total_samples`
and `num_shards`, memory in the lab's element units. Durations are the lab's own
(`lab_costs.RuntimePredictor`) by default, so `get_training_stats` and the MFU match the course's;
`timing='real'` uses this simulator's device costs on any cluster instead (`dist_lib.compat.configure`).
The helpers of the lab's `utils.py` are in `dist_lib.compat.lab_utils`.

Where it differs: nothing polls or sleeps; a deadlock raises `CompatDeadlockError` naming each
rank's wait instead of hanging; assertion messages say what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Optional, Protocol, Sequence, Tuple

from dist_lib.compat._base import ToyModel
from dist_lib.compat._runtime import Mailbox, World, brief, default_dist, require
from dist_lib.compat._storage import Storage
from dist_lib.compat._tensor_rules import Combinable, Message, Sharded, WorldCollectives, united
from dist_lib.compat.lab_costs import BLOCK_SIZE, BYTES_PER_ELEMENT, DATATYPE, HIDDEN_SIZE, RuntimePredictor
from dist_lib.compat.puzzles import TO, Barrier, O, Reduceable, T  # the same as the puzzles'

__all__ = ["BLOCK_SIZE", "BYTES_PER_ELEMENT", "DATATYPE", "HIDDEN_SIZE", "O", "T", "TO", "Activation",
           "ActivationGrad", "Barrier", "Dist", "Event", "Gatherable", "Model", "OptState", "Reduceable",
           "ReduceableGatherable", "RuntimePredictor", "Weight", "WeightGrad"]


class Gatherable(Protocol[O]):
    """A type that can be sharded."""

    def shard(self, shard: int, num_shards: int) -> O: ...

    def is_complete(self) -> bool: ...

    def combine(self, other: O) -> O: ...


class ReduceableGatherable(Reduceable[TO], Gatherable[TO]):  # Gatherable's shard count is `num_shards` here
    pass


class Dist(WorldCollectives):
    """`world_size` ranks; collectives involve all of them; one mailbox per (source, destination)."""

    _NAMES = {"gather": "all_gather", "scatter": "reduce_scatter"}

    def __init__(self, world_size: int) -> None:
        self.reduce: Optional[Any] = None
        self.gather: Optional[Any] = None
        self.world_size = world_size
        self._world = World(world_size, "lab")
        self.barrier = Barrier(world_size)
        self.queue: Dict[Tuple[int, int], Mailbox] = {
            (i, j): Mailbox(self._world, f"the mailbox from rank {i} to rank {j}")
            for i in range(world_size) for j in range(world_size) if i != j}
        self.mtime = 0

    async def all_reduce(self, rank: int, inp: T, time: int) -> Tuple[T, int]:
        return await self._reduce(rank, inp, time, "all_reduce", None)

    async def all_gather(self, rank: int, inp: O, time: int) -> Tuple[O, int]:
        return await self._gather(rank, inp, time, None)

    async def reduce_scatter(self, rank: int, inp: TO, time: int) -> Tuple[TO, int]:
        return await self._scatter(rank, inp, time, None)

    async def receive(self, rank_source: int, rank_dest: int) -> Any:
        return await self.queue[(rank_source, rank_dest)].get()

    async def send(self, rank_source: int, rank_dest: int, v: Any) -> None:
        await self.queue[(rank_source, rank_dest)].put(v)


@dataclass
class Weight(Sharded, Gatherable["Weight"]):
    """The weights for a specific layer. Can be sharded. Required for forward and backward passes."""

    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1
    _COUNT = "num_shards"

    def memory(self) -> float:
        return (len(self.shards) / self.num_shards) * HIDDEN_SIZE * HIDDEN_SIZE

    def shard(self, shard: int, num_shards: int) -> Weight:
        return self._sharded(shard, num_shards)


@dataclass
class Activation:
    """The activations entering layer `layer` for a set of samples."""

    layer: int
    layers: int
    samples: FrozenSet[int]
    total_samples: int

    def memory(self) -> int:
        return len(self.samples) * HIDDEN_SIZE * BLOCK_SIZE


@dataclass
class WeightGrad(Sharded, Reduceable["WeightGrad"], Gatherable["WeightGrad"]):
    """The gradient of one layer's weights over `samples`; may hold only some shards. `+` unites
    the sample sets, as the lab does (see `_tensor_rules`)."""

    layer: int
    layers: int
    samples: FrozenSet[int]
    total_samples: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1
    _COUNT = "num_shards"

    def __add__(self, other: WeightGrad) -> WeightGrad:
        samples = united(self, other, "samples", "lab")
        return WeightGrad(self.layer, self.layers, samples, self.total_samples, self.shards, self.num_shards)

    def memory(self) -> float:
        return (len(self.shards) / self.num_shards) * HIDDEN_SIZE * HIDDEN_SIZE

    def shard(self, shard: int, num_shards: int) -> WeightGrad:
        return self._sharded(shard, num_shards)


@dataclass
class OptState(Combinable, Gatherable["OptState"]):
    """The optimizer state (Adam moments) of one layer. Can be sharded. Required for updates."""

    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1

    def memory(self) -> float:
        return HIDDEN_SIZE * HIDDEN_SIZE * (len(self.shards) / self.num_shards)


@dataclass
class ActivationGrad:
    """The gradient of the loss with respect to the output of layer `layer`, for a set of samples."""

    layer: int
    layers: int
    samples: FrozenSet[int]
    total_samples: int

    def memory(self) -> int:
        return len(self.samples) * HIDDEN_SIZE * BLOCK_SIZE


@dataclass
class Event:
    """One logged op: type, layer, rank, start, duration (s), memory held (elements), samples."""

    typ: str
    layer: Optional[int]
    rank: int
    time: int
    duration: int
    memory: int
    samples: FrozenSet[int] = frozenset()

    def __str__(self) -> str:
        return f"({self.typ}" + (f", S={list(self.samples)}" if self.samples else "") + ")"


def _samples(v: Any) -> FrozenSet[int]:
    return getattr(v, "samples", frozenset())


_DEFAULT = Dist(1)  # Model's default argument, as in the signature of the original


class Model(ToyModel):
    """One rank's view: storage dicts, compute ops, communication, and a log of events."""

    def __init__(self, rank: int = 1, dist: Dist = _DEFAULT, num_layers: int = 2, global_batch_size: int = 1):
        if dist is _DEFAULT:  # the original's shared default Dist(1), one per run here (default_dist)
            dist = default_dist("lab", Dist)
        self._setup(rank, dist, num_layers, global_batch_size)
        self.world_size = dist.world_size
        self.num_layers = num_layers
        self.global_batch_size = global_batch_size
        self.runtime_predictor = RuntimePredictor(dist.world_size)
        self._every_sample = frozenset(range(global_batch_size))

    def log_event(self, typ: str, layer: Optional[int] = None, samples: FrozenSet[int] = frozenset({}),
                  input: Optional[Any] = None, num_shards_on_device: Optional[int] = None,  # noqa: A002
                  num_shards: Optional[int] = None) -> None:
        self._log(typ, layer, samples, input, num_shards_on_device, num_shards)

    def _original_duration(self, typ: str, samples: FrozenSet[int], input: Any,  # noqa: A002
                           on: Any, total: Any) -> float:
        """The lab's `log_event` durations, from this model's `runtime_predictor`."""
        predictor = self.runtime_predictor
        if typ in ("forward", "backward"):
            return predictor.get_forward_backward_time(len(samples))
        if typ == "update":
            return predictor.get_update_step_time(on, total)
        if typ in ("all_reduce", "reduce_scatter", "all_gather"):
            return predictor.get_collective_time(typ, input)
        if typ in ("send", "recv"):
            return predictor.get_send_recv_time(input)
        if typ == "load_weights":
            return predictor.get_weight_load_time(on, total)
        return 0

    def _log(self, typ: str, layer: Optional[int], samples: FrozenSet[int], input: Any = None,  # noqa: A002
             on: Any = None, total: Any = None, *, length: Optional[float] = None, value: Any = None,
             peers: Any = None, op_id: int = 0) -> None:
        real, flops = self._real, 0.0
        if real is None:
            duration = self._original_duration(typ, samples, input, on, total)
        elif length is not None:
            duration = length
        elif typ in ("forward", "backward", "loss"):
            duration, flops = real.compute(self.rank, typ, layer, len(samples))
        elif typ == "update":
            duration = real.update(self.rank, layer, (on or 1) / (total or 1))
        else:
            duration = 0.0
        if self._event_hook is not None:
            self._event_hook(self)
        units = self.memory()
        self.log.append(Event(typ, layer, self.rank, self.time, duration, units, samples))
        self._record(typ, layer, frozenset(samples), self.time, duration, units,
                     value=input if value is None else value, flops=flops, peers=peers, op_id=op_id)
        self.time += duration

    def load_weights(self, layer: int, shard: int = 0, num_shards: int = 1) -> Tuple[Weight, OptState]:
        self._world.enter(self.rank)
        weight = Weight(layer, self.num_layers, 0, frozenset([shard]), num_shards)
        opt_state = OptState(layer, self.num_layers, 0, frozenset([shard]), num_shards)
        self._log("load_weights", layer, frozenset({}), weight, 1, num_shards, length=0.0)
        return weight, opt_state

    def set_final_weight(self, layer: int, weight: Weight) -> None:
        self.final_weights[layer] = weight

    def get_input_activation(self, samples: Sequence[int]) -> Activation:
        self._world.enter(self.rank)
        return Activation(0, self.num_layers, frozenset(samples), self.global_batch_size)

    def _held(self, value: Any, store: dict, what: str, op: str) -> None:
        require(store.holds(value) if isinstance(store, Storage) else value in store.values(),
                lambda: f"{op}: the {what[:-1].replace('_', ' ')} passed in is not in model.{what}; every op takes "
                f"its tensors from the storage dicts")

    def forward(self, layer: int, inp: Activation, weight: Weight) -> Activation:
        self._log("forward", layer, inp.samples)
        where = f"forward(layer {layer})"
        require(weight.is_complete(), lambda: f"{where}: the weight holds shards {set(weight.shards)} of "
                                      f"{weight.num_shards}; all_gather it first")
        require(weight.layer == layer, lambda: f"Weight should be layer {layer}, but is {weight.layer}")
        self._held(inp, self.activations, "activations", where)
        self._held(weight, self.weights, "weights", where)
        require(inp.layer == layer, lambda: f"Input should be layer {layer}, but is {inp.layer}")
        return Activation(layer + 1, self.num_layers, inp.samples, self.global_batch_size)

    def backward(self, layer: int, inp: Activation, grad: ActivationGrad,
                 weight: Weight) -> Tuple[WeightGrad, ActivationGrad]:
        self._log("backward", layer, inp.samples)
        where = f"backward(layer {layer})"
        require(weight.is_complete(),
                lambda: f"{where}: the weight holds shards {set(weight.shards)}; all_gather it first")
        require(weight.layer == layer, lambda: f"Weight should be layer {layer}, but is {weight.layer}")
        require(inp.layer == layer, lambda: f"Input should be layer {layer}, but is {inp.layer}")
        self._held(inp, self.activations, "activations", where)
        self._held(weight, self.weights, "weights", where)
        self._held(grad, self.grad_activations, "grad_activations", where)
        require(set(inp.samples) == set(grad.samples),
                lambda: f"Batch mismatch {set(inp.samples)} vs {set(grad.samples)}")
        require(grad.layer == layer, lambda: f"Activation Grad should be layer {layer}, but is {grad.layer}")
        return (WeightGrad(layer, self.num_layers, inp.samples, self.global_batch_size),
                ActivationGrad(layer - 1, self.num_layers, inp.samples, self.global_batch_size))

    def loss(self, inp: Activation) -> ActivationGrad:
        self._log("loss", self.num_layers, inp.samples)
        self._held(inp, self.activations, "activations", "loss")
        require(inp.layer == self.num_layers,
                lambda: f"Input should be final layer {self.num_layers}, but is {inp.layer}")
        return ActivationGrad(self.num_layers - 1, self.num_layers, inp.samples, self.global_batch_size)

    def update(self, layer: int, weight_grad: WeightGrad, weight: Weight,
               opt_state: OptState) -> Tuple[Weight, OptState]:
        where = f"update(layer {layer})"
        self._held(weight, self.weights, "weights", where)
        self._held(weight_grad, self.grad_weights, "grad_weights", where)
        self._held(opt_state, self.opt_states, "opt_states", where)
        require(weight.layer == layer, lambda: f"Weight should be layer {layer}")
        require(weight_grad.layer == layer, lambda: f"Grad weight should be layer {layer}")
        if set(weight_grad.samples) != self._every_sample:
            missing = self._every_sample - set(weight_grad.samples)
            require(False, lambda: f"{where}: the gradient covers samples {brief(weight_grad.samples)}, missing "
                           f"{brief(missing)}")
        require(opt_state.layer == layer, lambda: f"OptState should be layer {layer}")
        if weight_grad.num_shards > 1:
            require(weight.shards.issubset(weight_grad.shards), lambda: f"Weight {weight.shards}")
            require(opt_state.shards.issubset(weight_grad.shards), lambda: f"Opt {opt_state.shards}")
        require(weight.step == opt_state.step, lambda: f"{where}: weight and optimizer state steps differ")
        new_opt = OptState(layer, self.num_layers, opt_state.step + 1, opt_state.shards, opt_state.num_shards)
        new_weight = Weight(layer, self.num_layers, weight.step + 1, weight.shards, weight.num_shards)
        self._log("update", layer, weight_grad.samples, None, len(weight.shards), weight.num_shards)
        return new_weight, new_opt

    # ---- communication: world-wide, matched by call position ----------------------------------

    async def _collective(self, typ: str, v: Any, layer: int) -> Any:
        if typ == "all_gather":
            out, self.time = await self.dist._gather(self.rank, v, self.time, layer)
        elif typ == "reduce_scatter":
            out, self.time = await self.dist._scatter(self.rank, v, self.time, layer)
        else:
            out, self.time = await self.dist._reduce(self.rank, v, self.time, "all_reduce", layer)
        real = self._real
        self._log(typ, layer, _samples(out), out, length=None if real is None else real.collective(typ, v, out),
                  value=v, peers=tuple(range(self.world_size)), op_id=-self._world.seq[self.rank])
        return out

    async def all_reduce(self, v: T, layer: int) -> T:
        return await self._collective("all_reduce", v, layer)

    async def reduce_scatter(self, v: TO, layer: int) -> TO:
        return await self._collective("reduce_scatter", v, layer)

    async def all_gather(self, v: O, layer: int) -> O:
        return await self._collective("all_gather", v, layer)

    async def send(self, dest: int, v: Any) -> None:
        world = self._world
        world.enter(self.rank)
        op_id = world.op_id()
        await self.dist.send(self.rank, dest, Message(v, self.time, self.rank, op_id))
        real = self._real
        self._log("send", v.layer, _samples(v), v, length=None if real is None else real.p2p(self.rank, dest, v),
                  peers=(self.rank, dest), op_id=op_id)

    async def receive(self, source: int) -> Any:
        self._world.enter(self.rank)
        message = await self.dist.receive(source, self.rank)
        v, time = message
        self.time = max(time, self.time)
        real = self._real
        self._log("recv", v.layer, _samples(v), v, length=None if real is None else real.p2p(source, self.rank, v),
                  peers=(source, self.rank), op_id=getattr(message, "op_id", 0))
        return v

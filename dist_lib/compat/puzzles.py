"""The LLM-Training-Puzzles API (srush/LLM-Training-Puzzles `lib.py`), on this simulator's runtime.

Same names, signatures and semantics: `Dist(total)` with its collectives and one-message mailboxes,
`Model(rank, dist, layers, batches)` with five storage dicts, `load_weights`, `get_activation`,
`forward`, `backward`, `loss`, `update`, `fake_grad`, async `allreduce`/`allgather`/`scatterreduce`
(world-wide, matched by call position), `pass_to`/`receive`, `Model.check`, and the tensor types with
their `memory()` (a layer's weight is HIDDEN*HIDDEN units, a batch of activations HIDDEN*LENGTH) and
`draw()`. Timing is the puzzles' own unit costs (forward/backward 1 per batch, update 0.5, collective
0.3, pass 0.2), or this simulator's device costs with `timing='real'` (`dist_lib.compat.configure`).

Where it differs: nothing polls or sleeps (a collective completes when its last rank arrives); a
deadlock raises `CompatDeadlockError` naming each rank's wait instead of hanging; assertion messages
say what is wrong; pictures are SVG without a plotting dependency. With `strict=True` a gradient sum
that counts a batch twice, which the original accepts, also warns.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, FrozenSet, List, Optional, Protocol, Sequence, Tuple, TypeVar

from dist_lib.costs import compute as costs
from dist_lib.compat._base import ToyModel, problems
from dist_lib.compat._runtime import CompatAssertionError, Mailbox, World, brief, default_dist, require
from dist_lib.compat._tensor_rules import Combinable, Message, Sharded, WorldCollectives, drawable, united

HIDDEN = 512
LENGTH = 256


class Barrier:
    """Sync across n ranks: `wait(rank)` returns once `target` ranks are waiting (no polling)."""

    def __init__(self, target: int):
        self.counter = 0
        self.target = target
        self.lock = asyncio.Lock()
        self.round = 0
        self.done = 0
        self._release: asyncio.Future | None = None

    async def wait(self, rank: int) -> None:
        self.counter += 1
        if self.counter >= self.target:
            release, self._release = self._release, None
            await self.reset()
            self.round += 1
            if release is not None and not release.done():
                release.set_result(None)
            return
        if self._release is None:
            self._release = asyncio.get_running_loop().create_future()
        await self._release

    async def reset(self) -> None:
        self.counter = 0
        self.done = 0


T = TypeVar("T")


class Reduceable(Protocol[T]):
    """A type that can be reduced."""

    def __add__(self, other: T) -> T: ...


O = TypeVar("O")  # noqa: E741  (the original's name)


class Gatherable(Protocol[O]):
    """A type that can be sharded."""

    def shard(self, shard: int, total: int) -> O: ...

    def is_complete(self) -> bool: ...

    def combine(self, other: O) -> O: ...


TO = TypeVar("TO")


class ReduceableGatherable(Reduceable[TO], Gatherable[TO]):
    pass


class Dist(WorldCollectives):
    """`total` ranks that communicate; collectives involve all of them, mailboxes hold one message."""

    _NAMES = {"gather": "allgather", "scatter": "scatterreduce"}

    def __init__(self, total: int) -> None:
        self.reduce: Optional[Any] = None
        self.gather: Optional[Any] = None
        self.ranks = total
        self._world = World(total, "puzzles")
        self.barrier = Barrier(total)
        self.queue: Sequence[Mailbox] = [Mailbox(self._world, f"rank {i}'s mailbox", "pass_to") for i in range(total)]
        self.mtime = 0

    async def allreduce(self, rank: int, inp: T, time: int) -> Tuple[T, int]:
        return await self._reduce(rank, inp, time, "allreduce", None)

    async def allgather(self, rank: int, inp: O, time: int) -> Tuple[O, int]:
        return await self._gather(rank, inp, time, None)

    async def scatterreduce(self, rank: int, inp: TO, time: int) -> Tuple[TO, int]:
        return await self._scatter(rank, inp, time, None)

    async def receive(self, rank: int) -> Any:
        return await self.queue[rank].get()

    async def pass_to(self, rank: int, v: Any) -> None:
        await self.queue[rank].put(v)


@drawable(weight="layer", shards=True)
@dataclass
class Weight(Sharded, Gatherable["Weight"]):
    """The weights for a specific layer. Can be sharded. Required for forward and backward passes."""

    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def memory(self) -> float:
        return (len(self.shards) / self.total) * HIDDEN * HIDDEN

    def shard(self, shard: int, total: int) -> Weight:
        return self._sharded(shard, total)


@drawable(before="layer", batches=True)
@dataclass
class Activation:
    """The activations entering layer `layer` for a set of batches."""

    layer: int
    layers: int
    batches: FrozenSet[int]
    total_batches: int

    def memory(self) -> int:
        return len(self.batches) * HIDDEN * LENGTH


@drawable(weight="layer", shards=True, batches=True, is_grad=True)
@dataclass
class WeightGrad(Sharded, Reduceable["WeightGrad"], Gatherable["WeightGrad"]):
    """The gradient of one layer's weights, summed over `batches`; may hold only some shards.

    `+` unites the batch sets, as the original does (so adding a gradient to its own all-reduce
    passes); in strict mode a batch counted twice warns."""

    layer: int
    layers: int
    batches: FrozenSet[int]
    total_batches: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def __add__(self, other: WeightGrad) -> WeightGrad:
        samples = united(self, other, "batches", "puzzles")
        return WeightGrad(self.layer, self.layers, samples, self.total_batches, self.shards, self.total)

    def memory(self) -> float:
        return (len(self.shards) / self.total) * HIDDEN * HIDDEN

    def shard(self, shard: int, total: int) -> WeightGrad:
        return self._sharded(shard, total)


@drawable(before="layer", shards=True)
@dataclass
class OptState(Combinable, Gatherable["OptState"]):
    """The optimizer state (Adam moments) of one layer. Can be sharded. Required for updates."""

    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def memory(self) -> float:
        return HIDDEN * HIDDEN * (len(self.shards) / self.total)


@drawable(after="layer", batches=True)
@dataclass
class ActivationGrad:
    """The gradient of the loss with respect to the output of layer `layer`, for a set of batches."""

    layer: int
    layers: int
    batches: FrozenSet[int]
    total_batches: int

    def memory(self) -> int:
        return len(self.batches) * HIDDEN * LENGTH


@dataclass
class Event:
    """One logged op: its type, layer, rank, start time, length and the memory held when it ran."""

    typ: str
    layer: Optional[int]
    rank: int
    time: int
    length: int
    memory: int
    batches: FrozenSet[int] = frozenset()


_COMM_LENGTH = {"allreduce": costs.PUZZLE_COLLECTIVE_STEPS, "scatterreduce": costs.PUZZLE_COLLECTIVE_STEPS,
                "allgather": costs.PUZZLE_COLLECTIVE_STEPS, "pass": costs.PUZZLE_MESSAGE_STEPS,
                "update": costs.PUZZLE_UPDATE_STEPS}


def _steps(typ: str, batches: FrozenSet[int]) -> float:
    """The puzzles' unit cost of an op (lib.py `Model.event`)."""
    per = costs.PUZZLE_STEPS_PER_BATCH.get(typ)
    if per is not None:
        steps = per * len(batches)
        return int(steps) if float(steps).is_integer() else steps  # the original's lengths are ints here
    return _COMM_LENGTH.get(typ, 0)


_DEFAULT = Dist(1)  # Model's default argument, as in the signature of the original


class Model(ToyModel):
    """One rank's view: storage dicts, compute ops, communication, and a log of events."""

    def __init__(self, rank: int = 1, dist: Dist = _DEFAULT, layers: int = 2, batches: int = 1):
        if dist is _DEFAULT:  # the original's shared default Dist(1), one per run here (default_dist)
            dist = default_dist("puzzles", Dist)
        self._setup(rank, dist, layers, batches)
        self.RANKS = dist.ranks
        self.LAYERS = layers
        self.BATCHES = batches

    def event(self, typ: str, layer: Optional[int] = None, batches: FrozenSet[int] = frozenset({})) -> None:
        self._event(typ, layer, batches)

    def _event(self, typ: str, layer: Optional[int], batches: FrozenSet[int], *, length: Optional[float] = None,
               at: Any = None, n: int = 0, fraction: float = 1.0, value: Any = None, peers: Any = None,
               op_id: int = 0, trace_op: Optional[str] = None) -> None:
        """Log `typ` as the original does (Event with its layer and batches) and record it for the
        trace, where `at` names the layer and `n` the samples the original's event leaves out."""
        real, flops = self._real, 0.0
        at = layer if at is None else at
        if length is None:
            if real is None:
                length = _steps(typ, batches)
            elif typ in ("forward", "backward", "loss"):
                length, flops = real.compute(self.rank, typ, at, n or len(batches))
            elif typ == "update":
                length = real.update(self.rank, at, fraction)
            else:
                length = 0.0
        if self._event_hook is not None:
            self._event_hook(self)
        units = self.memory()
        self.log.append(Event(typ, layer, self.rank, self.time, length, units, batches))
        samples = frozenset(batches) or frozenset(getattr(value, "batches", ()))
        self._record(trace_op or typ, at, samples, self.time, length,
                     units, value=value, flops=flops, peers=peers, op_id=op_id)
        self.time += length

    def load_weights(self, layer: int, shard: int = 0, total: int = 1) -> Tuple[Weight, OptState]:
        self._world.enter(self.rank)
        return (Weight(layer, self.LAYERS, 0, frozenset([shard]), total),
                OptState(layer, self.LAYERS, 0, frozenset([shard]), total))

    def set_final_weight(self, layer: int, weight: Weight) -> None:
        self.final_weights[layer] = weight

    def get_activation(self, batches: Sequence[int]) -> Activation:
        self._world.enter(self.rank)
        return Activation(0, self.LAYERS, frozenset(batches), self.BATCHES)

    def forward(self, layer: int, inp: Activation, weight: Weight) -> Activation:
        """Take the activation entering layer `layer` and return the one entering layer + 1."""
        self._event("forward", layer, inp.batches)
        require(weight.is_complete(), lambda: f"forward(layer {layer}): the weight holds shards {set(weight.shards)} "
                                      f"of {weight.total}; allgather it first")
        require(weight.layer == layer, lambda: f"Weight should be layer {layer}, got layer {weight.layer}")
        require(inp.layer == layer, lambda: f"Input should be layer {layer}, got layer {inp.layer}")
        return Activation(layer + 1, self.LAYERS, inp.batches, self.BATCHES)

    def backward(self, layer: int, inp: Activation, grad: ActivationGrad,
                 weight: Weight) -> Tuple[WeightGrad, ActivationGrad]:
        self._event("backward", layer, inp.batches)
        require(weight.is_complete(), lambda: f"backward(layer {layer}): the weight holds shards {set(weight.shards)} "
                                      f"of {weight.total}; allgather it first")
        require(weight.layer == layer, lambda: f"Weight should be layer {layer}, got layer {weight.layer}")
        require(inp.layer == layer, lambda: f"Input should be layer {layer}, got layer {inp.layer}")
        require(set(inp.batches) == set(grad.batches),
                lambda: f"Batch mismatch {set(inp.batches)} (activation) vs {set(grad.batches)} (gradient)")
        require(grad.layer == layer, lambda: f"Activation Grad should be layer {layer}, got layer {grad.layer}")
        return (WeightGrad(layer, self.LAYERS, inp.batches, self.BATCHES),
                ActivationGrad(layer - 1, self.LAYERS, inp.batches, self.BATCHES))

    def loss(self, inp: Activation) -> ActivationGrad:
        self._event("loss", self.LAYERS, frozenset(), n=len(inp.batches))
        require(inp.layer == self.LAYERS, lambda: f"Input should be final layer {self.LAYERS}, got layer {inp.layer}")
        return ActivationGrad(self.LAYERS - 1, self.LAYERS, inp.batches, self.BATCHES)

    def update(self, layer: int, weight_grad: WeightGrad, weight: Weight, opt_state: OptState,
               shard: int = 0) -> Tuple[Weight, OptState]:
        require(weight.layer == layer, lambda: f"Weight should be layer {layer}, got layer {weight.layer}")
        require(weight_grad.layer == layer,
                lambda: f"Grad weight should be layer {layer}, got layer {weight_grad.layer}")
        if set(weight_grad.batches) != set(range(self.BATCHES)):
            missing = set(range(self.BATCHES)) - set(weight_grad.batches)
            require(False, lambda: f"update(layer {layer}): the gradient covers batches {brief(weight_grad.batches)}, "
                           f"missing {brief(missing)}")
        require(opt_state.layer == layer, lambda: f"OptState should be layer {layer}, got layer {opt_state.layer}")
        if weight_grad.total > 1:
            require(weight.shards.issubset(weight_grad.shards), lambda: f"Weight {weight.shards}")
            require(opt_state.shards.issubset(weight_grad.shards), lambda: f"Opt {opt_state.shards}")
        require(weight.step == opt_state.step, lambda: f"weight step {weight.step} != optimizer step {opt_state.step}")
        new_opt = OptState(layer, self.LAYERS, opt_state.step + 1, opt_state.shards, opt_state.total)
        new_weight = Weight(layer, self.LAYERS, weight.step + 1, weight.shards, weight.total)
        self._event("update", None, frozenset(), at=layer, fraction=len(opt_state.shards) / opt_state.total)
        return new_weight, new_opt

    def fake_grad(self, layer: int, batches=List[int]) -> WeightGrad:  # the original's default, kept as is
        return WeightGrad(layer, self.LAYERS, frozenset(batches), self.BATCHES)

    # ---- communication: world-wide, matched by call position ----------------------------------

    def _comm_length(self, typ: str, v: Any, out: Any) -> Optional[float]:
        return None if self._real is None else self._real.collective(typ, v, out)

    async def allreduce(self, v: T, layer: int) -> T:
        out, self.time = await self.dist._reduce(self.rank, v, self.time, "allreduce", layer)
        self._event("allreduce", layer, frozenset(), length=self._comm_length("allreduce", v, out), value=v,
                    peers=tuple(range(self.RANKS)), op_id=-self._world.seq[self.rank])
        return out

    async def scatterreduce(self, v: TO, layer: int) -> TO:
        out, self.time = await self.dist._scatter(self.rank, v, self.time, layer)
        self._event("scatterreduce", layer, frozenset(), length=self._comm_length("scatterreduce", v, out),
                    value=v, peers=tuple(range(self.RANKS)), op_id=-self._world.seq[self.rank])
        return out

    async def allgather(self, v: O, layer: int) -> O:
        out, self.time = await self.dist._gather(self.rank, v, self.time, layer)
        self._event("allgather", layer, frozenset(), length=self._comm_length("allgather", v, out), value=v,
                    peers=tuple(range(self.RANKS)), op_id=-self._world.seq[self.rank])
        return out

    async def pass_to(self, rank: int, v: Any) -> None:
        world = self._world
        world.enter(self.rank)
        require(isinstance(rank, int) and 0 <= rank < world.n,
                lambda: f"pass_to({rank!r}): no such rank (0..{world.n - 1})")
        real, op_id = self._real, world.op_id()
        self._event("pass", None, frozenset(), at=getattr(v, "layer", None), value=v, peers=(self.rank, rank),
                    length=None if real is None else real.p2p(self.rank, rank, v), op_id=op_id, trace_op="send")
        await self.dist.pass_to(rank, Message(v, self.time, self.rank, op_id))

    async def receive(self) -> Any:
        self._world.enter(self.rank)
        message = await self.dist.receive(self.rank)
        v, time = message
        src, op_id = getattr(message, "source", -1), getattr(message, "op_id", 0)
        self.time = max(time, self.time)
        real = self._real
        self._event("pass", None, frozenset(), at=getattr(v, "layer", None), value=v, peers=(src, self.rank),
                    length=None if real is None else real.p2p(src, self.rank, v), op_id=op_id, trace_op="recv")
        return v

    @staticmethod
    def check(models: Sequence[Model]) -> None:
        """Every layer's final weight, combined over the ranks, is complete and at step 1."""
        for line in problems(models):
            raise CompatAssertionError(line)
        print("Correct!")


def stats(models: Sequence[Model]) -> tuple[float, float, float]:
    """(steps, time, memory): the time axis of the puzzles' diagram (the latest start of any rank's
    last event, which the published targets read off), when the last op ends, and the peak memory."""
    models = [m for m in models if m.log]
    steps = max(m.log[-1].time for m in models)
    end = max(float(m.time) for m in models)
    return steps, end, max(e.memory for m in models for e in m.log)

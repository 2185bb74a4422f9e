"""The LLM-Training-Puzzles API (srush/LLM-Training-Puzzles `lib.py`), on this simulator's runtime.

Same names, fields and semantics: `Dist(ranks)`, `Model(rank, dist, layers, batches)` with five storage
dicts, `load_weights`, `get_activation`, `forward`, `backward`, `loss`, `update`, `fake_grad`, async
`allreduce`/`allgather`/`scatterreduce` (world-wide, matched by call position), `pass_to`/`receive`,
and `Model.check`. Memory is what the storage dicts hold, in the puzzles' units (a full layer's weight
is HIDDEN*HIDDEN, a batch of activations HIDDEN*LENGTH). Timing is the puzzles' unit costs by default
(so the published step and memory targets compare), or real costs: see `dist_lib.compat.configure`.

Differences: nothing polls or sleeps (a collective completes when its last rank arrives); a deadlock
raises instead of hanging; sends never block (the original's mailbox holds one message); assertion
messages say what is wrong; gradient sums refuse to count a batch twice; no plotting dependency.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, FrozenSet, Optional, Sequence

from ._base import ToyModel
from ._runtime import World, require

HIDDEN = 512
LENGTH = 256

__all__ = ["HIDDEN", "LENGTH", "Activation", "ActivationGrad", "Dist", "Event", "Model", "OptState", "Weight",
           "WeightGrad"]


def _frac(shards: Any, total: int) -> float:
    return len(shards) / total


@dataclass
class _LayerState:
    """Per-layer state at optimizer step `step`; may hold only some shards of `total`."""

    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def combine(self, other: Any) -> Any:
        require(type(other) is type(self) and other.layer == self.layer and other.total == self.total,
                f"cannot combine {other} into {self}: layer and total must match")
        return type(self)(self.layer, self.layers, self.step, frozenset(self.shards) | other.shards, self.total)

    def memory(self) -> float:
        return _frac(self.shards, self.total) * HIDDEN * HIDDEN

    def shard(self, shard: int, total: int) -> Any:
        require(self.is_complete(), f"only a complete {type(self).__name__} can be sharded, got shards "
                                    f"{set(self.shards)} of {self.total}")
        require(shard < total, f"shard {shard} is not below total {total}")
        return type(self)(self.layer, self.layers, self.step, frozenset([shard]), total)

    def is_complete(self) -> bool:
        return len(self.shards) == self.total


@dataclass
class Weight(_LayerState):
    """The weights of one layer."""


@dataclass
class OptState(_LayerState):
    """The optimizer state (Adam moments) of one layer."""


@dataclass
class _Hidden:
    """Hidden states of a set of batches at a layer boundary, or their gradient."""

    layer: int
    layers: int
    batches: FrozenSet[int]
    total_batches: int

    def memory(self) -> int:
        return len(self.batches) * HIDDEN * LENGTH


@dataclass
class Activation(_Hidden):
    """The activations entering layer `layer` for a set of batches."""


@dataclass
class ActivationGrad(_Hidden):
    """The gradient of the loss with respect to the output of layer `layer`, for a set of batches."""


@dataclass
class WeightGrad:
    """The gradient of one layer's weights, summed over `batches`; may hold only some shards."""

    layer: int
    layers: int
    batches: FrozenSet[int]
    total_batches: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def __add__(self, other: WeightGrad) -> WeightGrad:
        require(isinstance(other, WeightGrad), f"cannot add {other!r} to a WeightGrad")
        require(self.layer == other.layer, f"Only add same layer weight grads (layers {self.layer} and {other.layer})")
        require(set(self.shards) == set(other.shards), f"shards differ: {set(self.shards)} and {set(other.shards)}")
        twice = set(self.batches) & set(other.batches)
        require(not twice, f"layer {self.layer}: the gradient of batches {sorted(twice)} would be counted twice")
        return WeightGrad(self.layer, self.layers, frozenset(self.batches) | other.batches, self.total_batches,
                          self.shards, self.total)

    def combine(self, other: WeightGrad) -> WeightGrad:
        require(isinstance(other, WeightGrad) and other.layer == self.layer, f"cannot combine {other} into {self}")
        return WeightGrad(self.layer, self.layers, self.batches, self.total_batches,
                          frozenset(self.shards) | other.shards, self.total)

    def memory(self) -> float:
        return _frac(self.shards, self.total) * HIDDEN * HIDDEN

    def shard(self, shard: int, total: int) -> WeightGrad:
        require(self.is_complete(), f"{set(self.shards)} out of {self.total}")
        require(shard < total, f"shard {shard} is not below total {total}")
        return WeightGrad(self.layer, self.layers, self.batches, self.total_batches, frozenset([shard]), total)

    def is_complete(self) -> bool:
        return len(self.shards) == self.total


@dataclass
class Event:
    """One logged op: its type, layer, rank, start time, length and the memory held when it ran."""

    typ: str
    layer: Optional[int]
    rank: int
    time: float
    length: float
    memory: float
    batches: FrozenSet[int] = frozenset()


class Dist:
    """`total` ranks that communicate; collectives involve all of them."""

    def __init__(self, total: int) -> None:
        self.ranks = total
        self._world = World(total, "puzzles")


def _sum(values: list) -> list:
    total = functools.reduce(operator.add, values)
    return [total] * len(values)


def _gather(values: list) -> list:
    first = values[0]
    for v in values[1:]:
        require(type(v) is type(first), f"allgather of mixed types {type(first).__name__} and {type(v).__name__}")
    total = functools.reduce(lambda a, b: a.combine(b), values)
    return [total] * len(values)


def _scatter(values: list) -> list:
    total = functools.reduce(operator.add, values)
    return [total.shard(r, len(values)) for r in range(len(values))]


class Model(ToyModel):
    """One rank's view: storage dicts, compute ops, communication, and a log of events."""

    def __init__(self, rank: int = 1, dist: Dist | None = None, layers: int = 2, batches: int = 1):
        dist = dist if dist is not None else Dist(1)
        self._setup(rank, dist, layers, batches)
        self.RANKS = dist.ranks
        self.LAYERS = layers
        self.BATCHES = batches

    def event(self, typ: str, layer: Optional[int] = None, batches: FrozenSet[int] = frozenset(), *,
              value: Any = None, length: Optional[float] = None, **extra: Any) -> None:
        costs = self._costs
        flops = 0.0
        if length is None:
            if typ in ("forward", "backward", "loss"):
                length, flops = costs.compute(self.rank, typ, layer, len(batches))
            elif typ == "update":
                length = costs.update(self.rank, layer, extra.pop("fraction", 1.0))
            else:
                length = 0.0
        record = {"pass_send": "send", "pass_recv": "recv"}.get(typ, typ)
        units = self._record(record, layer, frozenset(batches), length, value=value, flops=flops, **extra)
        shown = "pass" if typ in ("pass_send", "pass_recv") else typ
        self.log.append(Event(shown, layer, self.rank, self.time, length, units, frozenset(batches)))
        self.time += length

    def load_weights(self, layer: int, shard: int = 0, total: int = 1) -> tuple[Weight, OptState]:
        self._world.enter(self.rank)
        require(0 <= shard < total, f"load_weights(layer {layer}): shard {shard} is not in 0..{total - 1}")
        return (Weight(layer, self.LAYERS, 0, frozenset([shard]), total),
                OptState(layer, self.LAYERS, 0, frozenset([shard]), total))

    def set_final_weight(self, layer: int, weight: Weight) -> None:
        self.final_weights[layer] = weight

    def get_activation(self, batches: Sequence[int]) -> Activation:
        self._world.enter(self.rank)
        return Activation(0, self.LAYERS, frozenset(batches), self.BATCHES)

    def forward(self, layer: int, inp: Activation, weight: Weight) -> Activation:
        """Take the activation entering layer `layer` and return the one entering layer + 1."""
        self.event("forward", layer, inp.batches)
        require(weight.is_complete(), f"forward(layer {layer}): the weight holds shards {set(weight.shards)} "
                                      f"of {weight.total}; allgather it first")
        require(weight.layer == layer, f"Weight should be layer {layer}, got layer {weight.layer}")
        require(inp.layer == layer, f"Input should be layer {layer}, got layer {inp.layer}")
        return Activation(layer + 1, self.LAYERS, inp.batches, self.BATCHES)

    def backward(self, layer: int, inp: Activation, grad: ActivationGrad,
                 weight: Weight) -> tuple[WeightGrad, ActivationGrad]:
        self.event("backward", layer, inp.batches)
        require(weight.is_complete(), f"backward(layer {layer}): the weight holds shards {set(weight.shards)} "
                                      f"of {weight.total}; allgather it first")
        require(weight.layer == layer, f"Weight should be layer {layer}, got layer {weight.layer}")
        require(inp.layer == layer, f"Input should be layer {layer}, got layer {inp.layer}")
        require(set(inp.batches) == set(grad.batches),
                f"Batch mismatch {set(inp.batches)} (activation) vs {set(grad.batches)} (gradient)")
        require(grad.layer == layer, f"Activation Grad should be layer {layer}, got layer {grad.layer}")
        return (WeightGrad(layer, self.LAYERS, inp.batches, self.BATCHES),
                ActivationGrad(layer - 1, self.LAYERS, inp.batches, self.BATCHES))

    def loss(self, inp: Activation) -> ActivationGrad:
        self.event("loss", self.LAYERS, inp.batches)
        require(inp.layer == self.LAYERS, f"Input should be final layer {self.LAYERS}, got layer {inp.layer}")
        return ActivationGrad(self.LAYERS - 1, self.LAYERS, inp.batches, self.BATCHES)

    def update(self, layer: int, weight_grad: WeightGrad, weight: Weight, opt_state: OptState,
               shard: int = 0) -> tuple[Weight, OptState]:
        require(weight.layer == layer, f"Weight should be layer {layer}, got layer {weight.layer}")
        require(weight_grad.layer == layer, f"Grad weight should be layer {layer}, got layer {weight_grad.layer}")
        missing = set(range(self.BATCHES)) - set(weight_grad.batches)
        require(set(weight_grad.batches) == set(range(self.BATCHES)),
                f"update(layer {layer}): the gradient covers batches {sorted(weight_grad.batches)}, missing "
                f"{sorted(missing)}")
        require(opt_state.layer == layer, f"OptState should be layer {layer}, got layer {opt_state.layer}")
        if weight_grad.total > 1:
            require(set(weight.shards) <= set(weight_grad.shards), f"Weight {set(weight.shards)}")
            require(set(opt_state.shards) <= set(weight_grad.shards), f"Opt {set(opt_state.shards)}")
        require(weight.step == opt_state.step, f"weight step {weight.step} != optimizer step {opt_state.step}")
        new_opt = OptState(layer, self.LAYERS, opt_state.step + 1, opt_state.shards, opt_state.total)
        new_weight = Weight(layer, self.LAYERS, weight.step + 1, weight.shards, weight.total)
        self.event("update", layer, fraction=_frac(opt_state.shards, opt_state.total))
        return new_weight, new_opt

    def fake_grad(self, layer: int, batches: Sequence[int]) -> WeightGrad:
        return WeightGrad(layer, self.LAYERS, frozenset(batches), self.BATCHES)

    # ---- communication: world-wide, matched by call position ----------------------------------

    async def _collective(self, op: str, v: Any, layer: int, combine) -> Any:
        world = self._world
        out, self.time = await world.collective(self.rank, op, v, self.time, layer, combine)
        self.event(op, layer, value=v, length=self._costs.collective(op, v, out),
                   peers=tuple(range(world.n)), op_id=-world.seq[self.rank])
        return out

    async def allreduce(self, v: Any, layer: int) -> Any:
        return await self._collective("allreduce", v, layer, _sum)

    async def scatterreduce(self, v: Any, layer: int) -> Any:
        return await self._collective("scatterreduce", v, layer, _scatter)

    async def allgather(self, v: Any, layer: int) -> Any:
        return await self._collective("allgather", v, layer, _gather)

    async def pass_to(self, rank: int, v: Any) -> None:
        world = self._world
        world.enter(self.rank)
        require(isinstance(rank, int) and 0 <= rank < world.n, f"pass_to({rank!r}): no such rank")
        op_id = world.op_id()
        self.event("pass_send", getattr(v, "layer", None), _batches(v), value=v,
                   length=self._costs.p2p(self.rank, rank, v), peers=(self.rank, rank), op_id=op_id)
        world.post(rank, (v, self.time, self.rank, op_id))

    async def receive(self) -> Any:
        v, time, src, op_id = await self._world.take(self.rank, self.rank, "receive(): no rank passed to it")
        self.time = max(time, self.time)
        self.event("pass_recv", getattr(v, "layer", None), _batches(v), value=v,
                   length=self._costs.p2p(src, self.rank, v), peers=(src, self.rank), op_id=op_id)
        return v

    @staticmethod
    def check(models: Sequence[Model]) -> None:
        """Every layer's final weight, combined over the ranks, is complete and at step 1."""
        for line in problems(models):
            raise CompatAssertionError(line)
        print("Correct!")


def problems(models: Sequence[Model]) -> list[str]:
    """What `Model.check` would complain about (empty when the step is correct)."""
    out: list[str] = []
    for layer in range(models[0].LAYERS):
        weight = None
        for m in models:
            w = m.final_weights.get(layer)
            if w is None:
                continue
            if w.step != 1:
                out.append(f"layer {layer}: rank {m.rank}'s final weight is at step {w.step}, not 1")
            weight = w if weight is None else weight.combine(w)
        if weight is None:
            out.append(f"Missing weight {layer}")
        elif not weight.is_complete():
            out.append(f"Weight not complete {weight}")
    return out


def _batches(v: Any) -> frozenset:
    return frozenset(getattr(v, "batches", ()) or ())


from ._runtime import CompatAssertionError  # noqa: E402  (re-exported for users catching it)


def stats(models: Sequence[Model]) -> tuple[float, float, float]:
    """(steps, time, memory): the time axis of the puzzles' diagram (the latest start of any rank's
    last event, which the published targets read off), when the last op ends, and the peak memory."""
    from .drawing import draw
    numbers = draw(models)
    return numbers["steps"], numbers["time"], numbers["memory"]

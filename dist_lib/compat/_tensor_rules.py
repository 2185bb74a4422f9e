"""The rules the toy tensors of both APIs share: how gradients add, how shards combine, how a
collective folds its members' values, what a message carries, and how a tensor draws itself.

The originals' rules are permissive: `WeightGrad + WeightGrad` unites the sample sets (so a rank that
adds its own gradient to the all-reduced one, as the course's DDP example does, still holds every
sample once), and `combine` unites shards without looking at layers. Those are the verdicts kept
here; `strict=True` in the settings adds a warning where a sample is counted twice or tensors of
different layers or kinds are combined.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

from dist_lib.compat._runtime import brief, current, require


class CompatStrictWarning(UserWarning):
    """Something the original API accepts silently but that is probably a mistake."""


def united(a: Any, b: Any, field: str, api: str) -> frozenset:
    """The sample set of gradient `a + b`: same layer and shards required, samples united."""
    require(a.layer == b.layer, f"Only add same layer weight grads (layers {a.layer} and {b.layer})")
    require(a.shards == b.shards, f"gradient shards differ: {set(a.shards)} and {set(b.shards)}")
    mine, theirs = getattr(a, field), getattr(b, field)
    if current(api).strict:
        twice = set(mine) & set(theirs)
        if twice:
            warnings.warn(f"layer {a.layer}: the gradient of {field} {brief(twice)} is counted twice in a sum "
                          f"(the original keeps one copy of each)", CompatStrictWarning, stacklevel=3)
    return mine | theirs


def combine_parts(a: Any, b: Any) -> frozenset:
    """The shard set of `a.combine(b)`: the union, as the originals (which do not compare layers)."""
    api = "lab" if hasattr(a, "num_shards") else "puzzles"
    if current(api).strict and (type(a) is not type(b) or a.layer != b.layer):
        warnings.warn(f"combining {type(b).__name__} of layer {b.layer} into {type(a).__name__} of layer "
                      f"{a.layer}", CompatStrictWarning, stacklevel=3)
    return a.shards | b.shards


class Combinable:
    """`combine` for a tensor dataclass with `shards`: the same tensor with both shard sets."""

    def combine(self, other: Any) -> Any:
        return replace(self, shards=combine_parts(self, other))


class Sharded(Combinable):
    """`combine`, `is_complete` and a checked `_sharded` for a tensor dataclass with `shards` and a
    shard count whose field `_COUNT` names ('total' in the puzzles, 'num_shards' in the lab)."""

    _COUNT = "total"

    def is_complete(self) -> bool:
        return len(self.shards) == getattr(self, self._COUNT)

    def _sharded(self, shard: int, count: int) -> Any:
        require(self.is_complete(), lambda: f"only a complete {type(self).__name__} can be sharded, got shards "
                                            f"{set(self.shards)} of {getattr(self, self._COUNT)}")
        require(shard < count, lambda: f"shard {shard} is not below {count}")
        return replace(self, shards=frozenset([shard]), **{self._COUNT: count})


def add_grads(total: Any, value: Any) -> Any:
    """An all-reduce's fold: the running sum plus the next member's value, in arrival order."""
    return total + value


def gather_fold(total: Any, value: Any) -> Any:
    """An all-gather's fold: values of one type, combined in arrival order."""
    require(type(total) is type(value), f"all-gather of a {type(value).__name__} into a {type(total).__name__}")
    return total.combine(value)


class WorldCollectives:
    """The collectives of both APIs' `Dist` on its world: an all-reduce folds with `+`, an all-gather
    with `combine`, a reduce-scatter is an all-reduce then each rank's own shard (as the originals).
    `op` and `layer` name the call in a deadlock report."""

    _world: Any
    _NAMES: dict[str, str]  # kind -> the API's name of the op

    async def _reduce(self, rank: int, inp: Any, time: float, op: str, layer: Any) -> tuple[Any, float]:
        return await self._world.collective(rank, op, inp, time, layer, add_grads, kind="reduce")

    async def _gather(self, rank: int, inp: Any, time: float, layer: Any) -> tuple[Any, float]:
        return await self._world.collective(rank, self._NAMES["gather"], inp, time, layer, gather_fold, kind="gather")

    async def _scatter(self, rank: int, inp: Any, time: float, layer: Any) -> tuple[Any, float]:
        total, time = await self._reduce(rank, inp, time, self._NAMES["scatter"], layer)
        return total.shard(rank, self._world.n), time


class Message(tuple):
    """What a send puts in a mailbox: `(value, sender's clock)`, as the originals, plus the sender
    and op id (attributes) so the trace can pair the two ends."""

    source: int
    op_id: int

    def __new__(cls, value: Any, time: float, source: int, op_id: int) -> Message:
        message = super().__new__(cls, (value, time))
        message.source, message.op_id = source, op_id
        return message


def drawable(**spec: Any):
    """Give a puzzles tensor class the original's `draw()` (the network with this tensor shaded,
    as a pair (base, overlay) of pictures) and `_repr_svg_` (so a notebook shows it)."""

    def decorate(cls: type) -> type:
        def draw(self: Any) -> Any:
            from dist_lib.compat.drawing import draw_network
            kwargs: dict[str, Any] = {}
            for key in ("weight", "before", "after"):
                if key in spec:
                    kwargs[key] = self.layer
            if spec.get("shards"):
                kwargs.update(shards=self.shards, total=self.total)
            if spec.get("batches"):
                kwargs.update(batches=self.batches, total_batches=self.total_batches)
            if spec.get("is_grad"):
                kwargs["is_grad"] = True
            return draw_network(self.layers, **kwargs)

        def _repr_svg_(self: Any) -> str:
            base, overlay = self.draw()
            return (base + overlay)._repr_svg_()

        cls.draw = draw
        cls._repr_svg_ = _repr_svg_
        return cls

    return decorate

"""Oracle: the puzzles' `lib.py` semantics (unit costs, storage-dict memory, shared-state collectives
behind a barrier, per-rank queues of one message), in the fewest lines that keep them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, FrozenSet, Optional

from ._common import PROGRESS, SharedStateDist, check_final_weights

HIDDEN, LENGTH = 512, 256


class Dist(SharedStateDist):
    def __init__(self, total: int) -> None:
        self.reduce: Any = None
        self.gather: Any = None
        self.ranks = total
        self.barrier = asyncio.Barrier(total)
        self.queue = [asyncio.Queue(maxsize=1) for _ in range(total)]
        self.mtime = 0

    async def allreduce(self, rank, inp, time):
        return await self._reduce(rank, inp, time)

    async def allgather(self, rank, inp, time):
        return await self._gather(rank, inp, time)

    async def scatterreduce(self, rank, inp, time):
        x, time = await self.allreduce(rank, inp, time)
        return x.shard(rank, self.ranks), time

    async def receive(self, rank):
        out = await self.queue[rank].get()
        PROGRESS[0] += 1
        return out

    async def pass_to(self, rank, v):
        await self.queue[rank].put(v)
        PROGRESS[0] += 1


@dataclass
class Weight:
    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def combine(self, other):
        return Weight(self.layer, self.layers, self.step, self.shards | other.shards, self.total)

    def memory(self):
        return (len(self.shards) / self.total) * HIDDEN * HIDDEN

    def shard(self, shard, total):
        assert self.is_complete() and shard < total
        return Weight(self.layer, self.layers, self.step, frozenset([shard]), total)

    def is_complete(self):
        return len(self.shards) == self.total


@dataclass
class Activation:
    layer: int
    layers: int
    batches: FrozenSet[int]
    total_batches: int

    def memory(self):
        return len(self.batches) * HIDDEN * LENGTH


@dataclass
class ActivationGrad(Activation):
    pass


@dataclass
class WeightGrad:
    layer: int
    layers: int
    batches: FrozenSet[int]
    total_batches: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def __add__(self, other):
        assert self.layer == other.layer and self.shards == other.shards
        return WeightGrad(self.layer, self.layers, self.batches | other.batches, self.total_batches, self.shards,
                          self.total)

    def combine(self, other):
        return WeightGrad(self.layer, self.layers, self.batches, self.total_batches, self.shards | other.shards,
                          self.total)

    def memory(self):
        return (len(self.shards) / self.total) * HIDDEN * HIDDEN

    def shard(self, shard, total):
        assert self.is_complete() and shard < total
        return WeightGrad(self.layer, self.layers, self.batches, self.total_batches, frozenset([shard]), total)

    def is_complete(self):
        return len(self.shards) == self.total


@dataclass
class OptState:
    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    total: int = 1

    def combine(self, other):
        return OptState(self.layer, self.layers, self.step, self.shards | other.shards, self.total)

    def memory(self):
        return HIDDEN * HIDDEN * (len(self.shards) / self.total)


@dataclass
class Event:
    typ: str
    layer: Optional[int]
    rank: int
    time: float
    length: float
    memory: float
    batches: FrozenSet[int] = frozenset()


LENGTHS = {"update": 0.5, "allreduce": 0.3, "scatterreduce": 0.3, "allgather": 0.3, "pass": 0.2}


class Model:
    def __init__(self, rank=1, dist=None, layers=2, batches=1):
        self.rank, self.dist, self.log, self.time = rank, dist, [], 0
        self.RANKS, self.LAYERS, self.BATCHES = dist.ranks, layers, batches
        self.final_weights = {}
        self.weights, self.opt_states, self.activations = {}, {}, {}
        self.grad_activations, self.grad_weights = {}, {}

    def storage(self):
        return self.weights, self.opt_states, self.activations, self.grad_activations, self.grad_weights

    def memory(self):
        return sum((v.memory() for d in self.storage() for v in d.values()), 0)

    def event(self, typ, layer=None, batches=frozenset()):
        PROGRESS[0] += 1
        length = len(batches) if typ in ("forward", "backward") else LENGTHS.get(typ, 0)
        self.log.append(Event(typ, layer, self.rank, self.time, length, self.memory(), batches))
        self.time += length

    def load_weights(self, layer, shard=0, total=1):
        return (Weight(layer, self.LAYERS, 0, frozenset([shard]), total),
                OptState(layer, self.LAYERS, 0, frozenset([shard]), total))

    def set_final_weight(self, layer, weight):
        self.final_weights[layer] = weight

    def get_activation(self, batches):
        return Activation(0, self.LAYERS, frozenset(batches), self.BATCHES)

    def forward(self, layer, inp, weight):
        self.event("forward", layer, inp.batches)
        assert weight.is_complete() and weight.layer == layer and inp.layer == layer
        return Activation(layer + 1, self.LAYERS, inp.batches, self.BATCHES)

    def backward(self, layer, inp, grad, weight):
        self.event("backward", layer, inp.batches)
        assert weight.is_complete() and weight.layer == layer and inp.layer == layer
        assert set(inp.batches) == set(grad.batches) and grad.layer == layer
        return (WeightGrad(layer, self.LAYERS, inp.batches, self.BATCHES),
                ActivationGrad(layer - 1, self.LAYERS, inp.batches, self.BATCHES))

    def loss(self, inp):
        self.event("loss", self.LAYERS)
        assert inp.layer == self.LAYERS
        return ActivationGrad(self.LAYERS - 1, self.LAYERS, inp.batches, self.BATCHES)

    def update(self, layer, weight_grad, weight, opt_state, shard=0):
        assert weight.layer == layer and weight_grad.layer == layer and opt_state.layer == layer
        assert set(weight_grad.batches) == set(range(self.BATCHES))
        if weight_grad.total > 1:
            assert weight.shards <= weight_grad.shards and opt_state.shards <= weight_grad.shards
        assert weight.step == opt_state.step
        self.event("update", None)
        return (Weight(layer, self.LAYERS, weight.step + 1, weight.shards, weight.total),
                OptState(layer, self.LAYERS, opt_state.step + 1, opt_state.shards, opt_state.total))

    def fake_grad(self, layer, batches):
        return WeightGrad(layer, self.LAYERS, frozenset(batches), self.BATCHES)

    async def allreduce(self, v, layer):
        v, self.time = await self.dist.allreduce(self.rank, v, self.time)
        self.event("allreduce", layer)
        return v

    async def scatterreduce(self, v, layer):
        v, self.time = await self.dist.scatterreduce(self.rank, v, self.time)
        self.event("scatterreduce", layer)
        return v

    async def allgather(self, v, layer):
        v, self.time = await self.dist.allgather(self.rank, v, self.time)
        self.event("allgather", layer)
        return v

    async def pass_to(self, rank, v):
        self.event("pass", None)
        await self.dist.pass_to(rank, (v, self.time))

    async def receive(self):
        v, time = await self.dist.receive(self.rank)
        self.time = max(time, self.time)
        self.event("pass", None)
        return v

    @staticmethod
    def check(models):
        check_final_weights(models, models[0].LAYERS)

"""Oracle: the course lab's `lib.py` semantics: the puzzles' machinery with per-pair queues, ops that
must take their tensors from the storage dicts, and the lab's calculon-based durations (figures of
calculon's systems/h100_80g_nvl8.json, computed here from scratch)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import FrozenSet, Optional

from ._common import PROGRESS, SharedStateDist

HIDDEN_SIZE, BLOCK_SIZE, BYTES_PER_ELEMENT = 4096, 1024, 2


def _efficiency(table, amount):
    return next(eff for threshold, eff in table if amount >= threshold)


MATRIX = (1000e12, [(128e9, 0.95), (16e9, 0.9), (1e9, 0.6), (0, 0.1)])
HBM = (3072e9, [(100e6, 0.90), (10e6, 0.75), (1e6, 0.6), (0, 0.3)])
PCIE = (450e9, [(100e6, 0.95), (10e6, 0.9), (1e6, 0.7), (0, 0.3)])
# (size, bytes/s, efficiency, latency, all-reduce offset)
NETWORKS = [(8, 450e9, 0.65, 1e-5, 1), (65536, 50e9, 0.9, 2e-5, 0)]


class Predictor:
    def __init__(self, world_size):
        self.world_size = world_size
        self.net = next(n for n in NETWORKS if n[0] >= world_size)

    def _process(self, flops, nbytes):
        return max(flops / (MATRIX[0] * _efficiency(MATRIX[1], flops)), nbytes / (HBM[0] * _efficiency(HBM[1], nbytes)))

    def fwd_bwd(self, n):
        tokens = n * BLOCK_SIZE
        return self._process(2 * HIDDEN_SIZE ** 2 * tokens,
                             (HIDDEN_SIZE ** 2 + 2 * tokens * HIDDEN_SIZE) * BYTES_PER_ELEMENT)

    def update(self, on, total):
        cols = HIDDEN_SIZE * on // total
        return self._process(HIDDEN_SIZE * cols, 3 * HIDDEN_SIZE * cols * BYTES_PER_ELEMENT)

    def nbytes(self, v):
        name = type(v).__name__
        if name in ("Weight", "WeightGrad"):
            n = HIDDEN_SIZE ** 2
        elif name in ("Activation", "ActivationGrad"):
            n = HIDDEN_SIZE * BLOCK_SIZE * len(v.samples)
        elif name == "OptState":
            n = HIDDEN_SIZE ** 2 // v.num_shards
        else:
            raise ValueError(name)
        return n * BYTES_PER_ELEMENT

    def network(self, op, nbytes, members):
        assert members >= 2
        _, bw, eff, latency, offset = self.net
        size = nbytes * 1.0
        size += (1 / members * size) * (offset if op == "all_reduce" else 0)
        return latency + size / (bw * eff)

    def load(self, on, total):
        nbytes = HIDDEN_SIZE ** 2 * on // total * BYTES_PER_ELEMENT
        return nbytes / (PCIE[0] * _efficiency(PCIE[1], nbytes))


class Dist(SharedStateDist):
    def __init__(self, world_size):
        self.reduce = self.gather = None
        self.world_size = world_size
        self.barrier = asyncio.Barrier(world_size)
        self.queue = {(i, j): asyncio.Queue(maxsize=1) for i in range(world_size) for j in range(world_size)
                      if i != j}
        self.mtime = 0

    async def all_reduce(self, rank, inp, time):
        return await self._reduce(rank, inp, time)

    async def all_gather(self, rank, inp, time):
        return await self._gather(rank, inp, time)

    async def reduce_scatter(self, rank, inp, time):
        x, time = await self.all_reduce(rank, inp, time)
        return x.shard(rank, self.world_size), time

    async def receive(self, src, dst):
        out = await self.queue[(src, dst)].get()
        PROGRESS[0] += 1
        return out

    async def send(self, src, dst, v):
        await self.queue[(src, dst)].put(v)
        PROGRESS[0] += 1


@dataclass
class Weight:
    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1

    def combine(self, other):
        return Weight(self.layer, self.layers, self.step, self.shards | other.shards, self.num_shards)

    def memory(self):
        return (len(self.shards) / self.num_shards) * HIDDEN_SIZE * HIDDEN_SIZE

    def shard(self, shard, num_shards):
        assert self.is_complete() and shard < num_shards
        return Weight(self.layer, self.layers, self.step, frozenset([shard]), num_shards)

    def is_complete(self):
        return len(self.shards) == self.num_shards


@dataclass
class Activation:
    layer: int
    layers: int
    samples: FrozenSet[int]
    total_samples: int

    def memory(self):
        return len(self.samples) * HIDDEN_SIZE * BLOCK_SIZE


@dataclass
class ActivationGrad(Activation):
    pass


@dataclass
class WeightGrad:
    layer: int
    layers: int
    samples: FrozenSet[int]
    total_samples: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1

    def __add__(self, other):
        assert self.layer == other.layer and self.shards == other.shards
        return WeightGrad(self.layer, self.layers, self.samples | other.samples, self.total_samples, self.shards,
                          self.num_shards)

    def combine(self, other):
        return WeightGrad(self.layer, self.layers, self.samples, self.total_samples, self.shards | other.shards,
                          self.num_shards)

    def memory(self):
        return (len(self.shards) / self.num_shards) * HIDDEN_SIZE * HIDDEN_SIZE

    def shard(self, shard, num_shards):
        assert self.is_complete() and shard < num_shards
        return WeightGrad(self.layer, self.layers, self.samples, self.total_samples, frozenset([shard]), num_shards)

    def is_complete(self):
        return len(self.shards) == self.num_shards


@dataclass
class OptState:
    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1

    def combine(self, other):
        return OptState(self.layer, self.layers, self.step, self.shards | other.shards, self.num_shards)

    def memory(self):
        return HIDDEN_SIZE * HIDDEN_SIZE * (len(self.shards) / self.num_shards)


@dataclass
class Event:
    typ: str
    layer: Optional[int]
    rank: int
    time: float
    duration: float
    memory: float
    samples: FrozenSet[int] = frozenset()


class Model:
    def __init__(self, rank=1, dist=None, num_layers=2, global_batch_size=1):
        self.rank, self.dist, self.log, self.time = rank, dist, [], 0
        self.world_size, self.num_layers, self.global_batch_size = dist.world_size, num_layers, global_batch_size
        self.final_weights = {}
        self.weights, self.opt_states, self.activations = {}, {}, {}
        self.grad_activations, self.grad_weights = {}, {}
        self.predictor = Predictor(dist.world_size)

    def storage(self):
        return self.weights, self.opt_states, self.activations, self.grad_activations, self.grad_weights

    def memory(self):
        return sum((v.memory() for d in self.storage() for v in d.values()), 0)

    def log_event(self, typ, layer=None, samples=frozenset(), input=None, on=None, total=None):
        PROGRESS[0] += 1
        p = self.predictor
        duration = 0
        if typ in ("forward", "backward"):
            duration = p.fwd_bwd(len(samples))
        elif typ == "update":
            duration = p.update(on, total)
        elif typ in ("all_reduce", "reduce_scatter", "all_gather"):
            duration = p.network(typ, p.nbytes(input), self.world_size)
        elif typ in ("send", "recv"):
            duration = p.network("p2p", p.nbytes(input), 2)
        elif typ == "load_weights":
            duration = p.load(on, total)
        self.log.append(Event(typ, layer, self.rank, self.time, duration, self.memory(), samples))
        self.time += duration

    def load_weights(self, layer, shard=0, num_shards=1):
        w = Weight(layer, self.num_layers, 0, frozenset([shard]), num_shards)
        o = OptState(layer, self.num_layers, 0, frozenset([shard]), num_shards)
        self.log_event("load_weights", layer, input=w, on=1, total=num_shards)
        return w, o

    def set_final_weight(self, layer, weight):
        self.final_weights[layer] = weight

    def get_input_activation(self, samples):
        return Activation(0, self.num_layers, frozenset(samples), self.global_batch_size)

    def forward(self, layer, inp, weight):
        self.log_event("forward", layer, inp.samples)
        assert weight.is_complete() and weight.layer == layer
        assert inp in self.activations.values() and weight in self.weights.values() and inp.layer == layer
        return Activation(layer + 1, self.num_layers, inp.samples, self.global_batch_size)

    def backward(self, layer, inp, grad, weight):
        self.log_event("backward", layer, inp.samples)
        assert weight.is_complete() and weight.layer == layer and inp.layer == layer
        assert inp in self.activations.values() and weight in self.weights.values()
        assert grad in self.grad_activations.values()
        assert set(inp.samples) == set(grad.samples) and grad.layer == layer
        return (WeightGrad(layer, self.num_layers, inp.samples, self.global_batch_size),
                ActivationGrad(layer - 1, self.num_layers, inp.samples, self.global_batch_size))

    def loss(self, inp):
        self.log_event("loss", self.num_layers, inp.samples)
        assert inp in self.activations.values() and inp.layer == self.num_layers
        return ActivationGrad(self.num_layers - 1, self.num_layers, inp.samples, self.global_batch_size)

    def update(self, layer, weight_grad, weight, opt_state):
        assert weight in self.weights.values() and weight_grad in self.grad_weights.values()
        assert opt_state in self.opt_states.values()
        assert weight.layer == layer and weight_grad.layer == layer and opt_state.layer == layer
        assert set(weight_grad.samples) == set(range(self.global_batch_size))
        if weight_grad.num_shards > 1:
            assert weight.shards <= weight_grad.shards and opt_state.shards <= weight_grad.shards
        assert weight.step == opt_state.step
        self.log_event("update", layer, weight_grad.samples, on=len(weight.shards), total=weight.num_shards)
        return (Weight(layer, self.num_layers, weight.step + 1, weight.shards, weight.num_shards),
                OptState(layer, self.num_layers, opt_state.step + 1, opt_state.shards, opt_state.num_shards))

    async def all_reduce(self, v, layer):
        v, self.time = await self.dist.all_reduce(self.rank, v, self.time)
        self.log_event("all_reduce", layer, getattr(v, "samples", frozenset()), v)
        return v

    async def reduce_scatter(self, v, layer):
        v, self.time = await self.dist.reduce_scatter(self.rank, v, self.time)
        self.log_event("reduce_scatter", layer, getattr(v, "samples", frozenset()), v)
        return v

    async def all_gather(self, v, layer):
        v, self.time = await self.dist.all_gather(self.rank, v, self.time)
        self.log_event("all_gather", layer, getattr(v, "samples", frozenset()), v)
        return v

    async def send(self, dest, v):
        await self.dist.send(self.rank, dest, (v, self.time))
        self.log_event("send", v.layer, getattr(v, "samples", frozenset()), v)

    async def receive(self, source):
        v, time = await self.dist.receive(source, self.rank)
        self.time = max(time, self.time)
        self.log_event("recv", v.layer, getattr(v, "samples", frozenset()), v)
        return v

"""The course-lab API (the LLM-Training-Puzzles extension used in courses: its `lib.py` and `utils.py`).

Names follow the lab: `Dist(world_size)`, `Model(rank, dist, num_layers, global_batch_size)`, tensors with
`samples`/`total_samples` and `num_shards`, async `all_reduce`/`all_gather`/`reduce_scatter`/`send`/
`receive`, and the helpers of `utils.py`. As in the lab, compute ops take only tensors held in the
storage dicts, and memory is what those dicts hold, in the lab's element units (`Model.memory()`,
`get_training_stats`). Durations come from this simulator's cost model (seconds) on a cluster of H100s
in nodes of eight by default, with the lab's shape (hidden 4096, 1024 tokens per sample, 16-bit); a
heterogeneous cluster or other workload can be set with `dist_lib.compat.configure('lab', ...)`.

Differences: nothing polls or sleeps; a deadlock raises; sends never block; `load_weights` costs no
time (weights are resident, as in dist_lib); `write_chrome_trace` writes dist_lib's trace (separate
compute, collective and per-peer threads, memory counters in bytes).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, FrozenSet, Generator, List, Optional, Sequence, Tuple

from ._base import ToyModel, build_result
from ._runtime import CompatAssertionError, World, require

HIDDEN_SIZE = 4096
BLOCK_SIZE = 1024
DATATYPE = "float16"
BYTES_PER_ELEMENT = 2


def _frac(shards: Any, num_shards: int) -> float:
    return len(shards) / num_shards


@dataclass
class _LayerState:
    """Weights or optimizer state of one layer at optimizer step `step`; may hold some shards of `num_shards`."""

    layer: int
    layers: int
    step: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1

    def combine(self, other: Any) -> Any:
        require(type(other) is type(self) and other.layer == self.layer, f"cannot combine {other} into {self}")
        return type(self)(self.layer, self.layers, self.step, frozenset(self.shards) | other.shards, self.num_shards)

    def memory(self) -> float:
        return _frac(self.shards, self.num_shards) * HIDDEN_SIZE * HIDDEN_SIZE

    def shard(self, shard: int, num_shards: int) -> Any:
        require(self.is_complete() and shard < num_shards, f"cannot take shard {shard} of {num_shards} from {self}")
        return type(self)(self.layer, self.layers, self.step, frozenset([shard]), num_shards)

    def is_complete(self) -> bool:
        return len(self.shards) == self.num_shards


@dataclass
class Weight(_LayerState):
    pass


@dataclass
class OptState(_LayerState):
    pass


@dataclass
class _Hidden:
    """Hidden states of some samples at a layer boundary, or their gradient."""

    layer: int
    layers: int
    samples: FrozenSet[int]
    total_samples: int

    def memory(self) -> int:
        return len(self.samples) * HIDDEN_SIZE * BLOCK_SIZE


@dataclass
class Activation(_Hidden):
    pass


@dataclass
class ActivationGrad(_Hidden):
    pass


@dataclass
class WeightGrad:
    layer: int
    layers: int
    samples: FrozenSet[int]
    total_samples: int
    shards: FrozenSet[int] = frozenset([0])
    num_shards: int = 1

    def __add__(self, other: WeightGrad) -> WeightGrad:
        require(isinstance(other, WeightGrad) and self.layer == other.layer, "Only add same layer weight grads")
        require(set(self.shards) == set(other.shards), f"shards differ: {set(self.shards)} and {set(other.shards)}")
        twice = set(self.samples) & set(other.samples)
        require(not twice, f"layer {self.layer}: the gradient of samples {sorted(twice)} would be counted twice")
        return WeightGrad(self.layer, self.layers, frozenset(self.samples) | other.samples, self.total_samples,
                          self.shards, self.num_shards)

    def combine(self, other: WeightGrad) -> WeightGrad:
        require(isinstance(other, WeightGrad) and other.layer == self.layer, f"cannot combine {other} into {self}")
        return WeightGrad(self.layer, self.layers, self.samples, self.total_samples,
                          frozenset(self.shards) | other.shards, self.num_shards)

    def memory(self) -> float:
        return _frac(self.shards, self.num_shards) * HIDDEN_SIZE * HIDDEN_SIZE

    def shard(self, shard: int, num_shards: int) -> WeightGrad:
        require(self.is_complete(), f"{set(self.shards)} out of {self.num_shards}")
        require(shard < num_shards, f"shard {shard} is not below {num_shards}")
        return WeightGrad(self.layer, self.layers, self.samples, self.total_samples, frozenset([shard]), num_shards)

    def is_complete(self) -> bool:
        return len(self.shards) == self.num_shards


@dataclass
class Event:
    typ: str
    layer: Optional[int]
    rank: int
    time: float
    duration: float
    memory: float
    samples: FrozenSet[int] = frozenset()

    def __str__(self) -> str:
        return f"({self.typ}" + (f", S={list(self.samples)}" if self.samples else "") + ")"


class Dist:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._world = World(world_size, "lab")


def _sum(values: list) -> list:
    return [functools.reduce(operator.add, values)] * len(values)


def _gather(values: list) -> list:
    require(len({type(v) for v in values}) == 1, "all_gather of mixed tensor types")
    return [functools.reduce(lambda a, b: a.combine(b), values)] * len(values)


def _scatter(values: list) -> list:
    total = functools.reduce(operator.add, values)
    return [total.shard(r, len(values)) for r in range(len(values))]


def _held(value: Any, store: dict, what: str, op: str) -> None:
    require(any(value is v or value == v for v in store.values()),
            f"{op}: the {what} passed in is not in model.{what}; keep every tensor in its storage dict")


class Model(ToyModel):
    _api = "lab"

    def __init__(self, rank: int = 1, dist: Dist | None = None, num_layers: int = 2, global_batch_size: int = 1):
        dist = dist if dist is not None else Dist(1)
        self._setup(rank, dist, num_layers, global_batch_size)
        self.world_size = dist.world_size
        self.num_layers = num_layers
        self.global_batch_size = global_batch_size

    def log_event(self, typ: str, layer: Optional[int] = None, samples: FrozenSet[int] = frozenset(),
                  input: Any = None, num_shards_on_device: Optional[int] = None, num_shards: Optional[int] = None,
                  *, duration: Optional[float] = None, **extra: Any) -> None:
        costs, flops = self._costs, 0.0
        fraction = (num_shards_on_device or 1) / (num_shards or 1)
        if duration is None:
            if typ in ("forward", "backward", "loss"):
                duration, flops = costs.compute(self.rank, typ, layer, len(samples))
            elif typ == "update":
                duration = costs.update(self.rank, layer, fraction)
            elif typ == "load_weights":
                duration = costs.load(self.rank, layer, fraction)
            else:
                duration = 0.0
        units = self._record(typ, layer, frozenset(samples), duration, value=input, flops=flops, **extra)
        self.log.append(Event(typ, layer, self.rank, self.time, duration, units, frozenset(samples)))
        self.time += duration

    def load_weights(self, layer: int, shard: int = 0, num_shards: int = 1) -> Tuple[Weight, OptState]:
        self._world.enter(self.rank)
        require(0 <= shard < num_shards, f"load_weights(layer {layer}): shard {shard} not in 0..{num_shards - 1}")
        weight = Weight(layer, self.num_layers, 0, frozenset([shard]), num_shards)
        opt_state = OptState(layer, self.num_layers, 0, frozenset([shard]), num_shards)
        self.log_event("load_weights", layer, input=weight, num_shards_on_device=1, num_shards=num_shards)
        return weight, opt_state

    def set_final_weight(self, layer: int, weight: Weight) -> None:
        self.final_weights[layer] = weight

    def get_input_activation(self, samples: Sequence[int]) -> Activation:
        self._world.enter(self.rank)
        return Activation(0, self.num_layers, frozenset(samples), self.global_batch_size)

    def forward(self, layer: int, inp: Activation, weight: Weight) -> Activation:
        self.log_event("forward", layer, inp.samples)
        require(weight.is_complete(), f"forward(layer {layer}): weight holds shards {set(weight.shards)} of "
                                      f"{weight.num_shards}; all_gather it first")
        require(weight.layer == layer, f"Weight should be layer {layer}, but is {weight.layer}")
        _held(inp, self.activations, "activations", f"forward(layer {layer})")
        _held(weight, self.weights, "weights", f"forward(layer {layer})")
        require(inp.layer == layer, f"Input should be layer {layer}, but is {inp.layer}")
        return Activation(layer + 1, self.num_layers, inp.samples, self.global_batch_size)

    def backward(self, layer: int, inp: Activation, grad: ActivationGrad,
                 weight: Weight) -> Tuple[WeightGrad, ActivationGrad]:
        self.log_event("backward", layer, inp.samples)
        where = f"backward(layer {layer})"
        require(weight.is_complete(), f"{where}: weight holds shards {set(weight.shards)}; all_gather it first")
        require(weight.layer == layer, f"Weight should be layer {layer}, but is {weight.layer}")
        require(inp.layer == layer, f"Input should be layer {layer}, but is {inp.layer}")
        _held(inp, self.activations, "activations", where)
        _held(weight, self.weights, "weights", where)
        _held(grad, self.grad_activations, "grad_activations", where)
        require(set(inp.samples) == set(grad.samples), f"Batch mismatch {set(inp.samples)} vs {set(grad.samples)}")
        require(grad.layer == layer, f"Activation Grad should be layer {layer}, but is {grad.layer}")
        return (WeightGrad(layer, self.num_layers, inp.samples, self.global_batch_size),
                ActivationGrad(layer - 1, self.num_layers, inp.samples, self.global_batch_size))

    def loss(self, inp: Activation) -> ActivationGrad:
        self.log_event("loss", self.num_layers, inp.samples)
        _held(inp, self.activations, "activations", "loss")
        require(inp.layer == self.num_layers, f"Input should be final layer {self.num_layers}, but is {inp.layer}")
        return ActivationGrad(self.num_layers - 1, self.num_layers, inp.samples, self.global_batch_size)

    def update(self, layer: int, weight_grad: WeightGrad, weight: Weight, opt_state: OptState) -> Tuple[Weight, OptState]:
        where = f"update(layer {layer})"
        _held(weight, self.weights, "weights", where)
        _held(weight_grad, self.grad_weights, "grad_weights", where)
        _held(opt_state, self.opt_states, "opt_states", where)
        require(weight.layer == layer and weight_grad.layer == layer and opt_state.layer == layer,
                f"{where}: weight, gradient and optimizer state must all be layer {layer}")
        missing = set(range(self.global_batch_size)) - set(weight_grad.samples)
        require(not missing, f"{where}: the gradient is missing samples {sorted(missing)}")
        if weight_grad.num_shards > 1:
            require(set(weight.shards) <= set(weight_grad.shards), f"Weight {set(weight.shards)}")
            require(set(opt_state.shards) <= set(weight_grad.shards), f"Opt {set(opt_state.shards)}")
        require(weight.step == opt_state.step, f"{where}: weight and optimizer state steps differ")
        new_opt = OptState(layer, self.num_layers, opt_state.step + 1, opt_state.shards, opt_state.num_shards)
        new_weight = Weight(layer, self.num_layers, weight.step + 1, weight.shards, weight.num_shards)
        self.log_event("update", layer, weight_grad.samples, num_shards_on_device=len(weight.shards),
                       num_shards=weight.num_shards)
        return new_weight, new_opt

    async def _collective(self, op: str, v: Any, layer: int, combine) -> Any:
        world = self._world
        out, self.time = await world.collective(self.rank, op, v, self.time, layer, combine)
        self.log_event(op, layer, getattr(out, "samples", frozenset()), v,
                       duration=self._costs.collective(op, v, out), peers=tuple(range(world.n)),
                       op_id=-world.seq[self.rank])
        return out

    async def all_reduce(self, v: Any, layer: int) -> Any:
        return await self._collective("all_reduce", v, layer, _sum)

    async def reduce_scatter(self, v: Any, layer: int) -> Any:
        return await self._collective("reduce_scatter", v, layer, _scatter)

    async def all_gather(self, v: Any, layer: int) -> Any:
        return await self._collective("all_gather", v, layer, _gather)

    async def send(self, dest: int, v: Any) -> None:
        world = self._world
        world.enter(self.rank)
        require(isinstance(dest, int) and 0 <= dest < world.n and dest != self.rank, f"send({dest!r}): no such peer")
        op_id = world.op_id()
        world.post((self.rank, dest), (v, self.time, self.rank, op_id))
        self.log_event("send", getattr(v, "layer", None), getattr(v, "samples", frozenset()), v,
                       duration=self._costs.p2p(self.rank, dest, v), peers=(self.rank, dest), op_id=op_id)

    async def receive(self, source: int) -> Any:
        world = self._world
        require(isinstance(source, int) and 0 <= source < world.n and source != self.rank,
                f"receive({source!r}): no such peer")
        v, time, src, op_id = await world.take(self.rank, (source, self.rank),
                                               f"receive({source}): rank {source} has not sent to it")
        self.time = max(time, self.time)
        self.log_event("recv", getattr(v, "layer", None), getattr(v, "samples", frozenset()), v,
                       duration=self._costs.p2p(source, self.rank, v), peers=(source, self.rank), op_id=op_id)
        return v


# ---- utils.py ------------------------------------------------------------------------------------

def get_next_microbatch(global_batch_size: int, world_size: int, batch_size: int,
                        rank: int) -> Generator[List[int], None, None]:
    """Rank `rank`'s contiguous share of the global batch, in chunks of `batch_size` samples."""
    per_rank = global_batch_size // world_size
    mine = list(range(per_rank * rank, per_rank * (rank + 1)))
    for i in range(0, len(mine), batch_size):
        yield mine[i:i + batch_size]


def get_global_batch_list(global_batch_size: int, batch_size: int) -> List[List[int]]:
    return [list(range(i * batch_size, (i + 1) * batch_size)) for i in range(global_batch_size // batch_size)]


def problems(models: Sequence[Model]) -> List[str]:
    out: List[str] = []
    for layer in range(models[0].num_layers):
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


def check(models: Sequence[Model]) -> None:
    for line in problems(models):
        raise CompatAssertionError(line)


def get_training_stats(models: Sequence[Model]) -> Tuple[float, float, int]:
    """(execution time: latest start of a rank's last event, as the lab measures it; the largest memory
    any event recorded, in the lab's units; the rank that recorded it)."""
    check(models)
    execution_time = max(m.log[-1].time for m in models)
    best, where = 0, (0, 0.0)
    for i, m in enumerate(models):
        for e in m.log:
            if e.memory > best:
                best, where = e.memory, (i, e.time)
    print(f"Execution time: {execution_time} \nMaximum Memory: {best} at GPU: {where[0]} time: {where[1]}")
    return execution_time, best, where[0]


def to_chrome_trace(models: Sequence[Model], global_batch_list: Optional[List[List[int]]] = None) -> dict:
    from ..trace import chrome_trace
    return chrome_trace(build_result(models[0]._world, "lab", problems(models)))


def write_chrome_trace(models: Sequence[Model], path: str, global_batch_list: Optional[List[List[int]]] = None) -> None:
    build_result(models[0]._world, "lab", problems(models)).write_chrome_trace(path)


def get_model_theoretical_best_time(model: Model) -> float:
    """Model FLOPs of the step over the summed peak FLOP/s of the cluster's devices (seconds), so that
    best / time is the MFU dist_lib reports."""
    costs = model._costs
    peak = sum(costs.cluster.device_of(r).peak_flops for r in range(costs.cluster.world_size))
    return costs.workload.model_flops_per_sample() * model.global_batch_size / peak if costs.timing == "real" else 0.0

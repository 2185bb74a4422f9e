"""What the two toy APIs share: settings, cost models, rendezvous without polling, deadlock detection.

The toy APIs (LLM-Training-Puzzles and the course lab built on it) keep one clock per rank as the
attribute `model.time` and give collectives a simple rule: every rank's clock jumps to the latest
clock among the ranks, then advances by the op's cost. Point-to-point messages carry the sender's
clock; the receiver's clock becomes max(own, sender's). Here those rules run on futures: a collective
completes the moment its last rank arrives, and nothing sleeps or polls.

Collectives are world-wide and matched by position: the k-th collective call of every rank forms one
operation. Deadlock (every rank either blocked in a collective or receive, or finished) raises
`CompatDeadlockError` in every blocked rank instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from .. import costs
from ..errors import DeadlockError, TensorError
from ..hardware import Cluster
from ..memory import OPTIMIZER_BYTES, WEIGHT_BYTES  # noqa: F401  (re-exported to the API modules)
from ..workload import Workload


class CompatAssertionError(AssertionError, TensorError):
    """A toy-API assertion: still an AssertionError (as the originals raise), and a SimulationError."""


class CompatDeadlockError(DeadlockError):
    """Every rank is blocked or finished: the original would hang here."""


def require(condition: Any, message: str) -> None:
    if not condition:
        raise CompatAssertionError(message)


# ---- settings ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """How a `Dist` created while these settings are active prices its ops.

    timing: 'unit' (the puzzles' own costs: forward/backward 1 per sample, update 0.5, collectives 0.3,
    point-to-point 0.2) or 'real' (dist_lib.costs on `cluster` with `workload`, in seconds).
    cluster: a Cluster or spec; None builds one of `default_device` nodes of 8 for the world size.
    workload: a Workload or spec, or None for the API's default shape; its layer count is replaced by
    the Model's."""

    timing: str = "unit"
    cluster: Any = None
    workload: Any = None
    default_device: str = "H100-80GB"


_STACK: dict[str, list[Settings]] = {"puzzles": [Settings("unit")],
                                     "lab": [Settings("real")]}


def current(api: str) -> Settings:
    return _STACK[api][-1]


@contextlib.contextmanager
def configure(api: str, **changes: Any) -> Iterator[Settings]:
    """Within the block, new `Dist` objects of `api` use these settings."""
    settings = replace(current(api), **{k: v for k, v in changes.items() if v is not None})
    if settings.timing not in ("unit", "real"):
        raise ValueError(f"timing must be 'unit' or 'real', got {settings.timing!r}")
    _STACK[api].append(settings)
    try:
        yield settings
    finally:
        _STACK[api].pop()


def default_cluster(world_size: int, device: str) -> Cluster:
    """`world_size` GPUs of one kind, in nodes of eight."""
    full, rest = divmod(world_size, 8)
    terms = ([f"{full}x8x{device}"] if full else []) + ([f"{rest}x{device}"] if rest else [])
    return Cluster.parse("+".join(terms))


# ---- what a toy tensor is ------------------------------------------------------------------------

def samples_of(v: Any) -> frozenset:
    s = getattr(v, "batches", None)
    if s is None:
        s = getattr(v, "samples", frozenset())
    return frozenset(s)


def shard_fraction(v: Any) -> float:
    total = getattr(v, "total", None) or getattr(v, "num_shards", 1)
    return len(getattr(v, "shards", (0,))) / total


def samples_mask(samples: frozenset) -> int:
    mask = 0
    for i in samples:
        if isinstance(i, int) and i >= 0:
            mask |= 1 << i
    return mask


KIND = {"Weight": "weight", "OptState": "optimizer", "WeightGrad": "weight_grad", "Activation": "activation",
        "ActivationGrad": "activation_grad"}


# ---- cost models ---------------------------------------------------------------------------------

class UnitCosts:
    """The puzzles' own costs (lib.py `Model.event`); memory in the toy's own units."""

    timing = "unit"

    def __init__(self, world_size: int, num_layers: int, memory_units):
        self.world_size = world_size
        self.memory_units = memory_units
        self.cluster = default_cluster(world_size, "H100-80GB")  # nominal: units are not seconds
        self.workload = Workload("toy-units", max(num_layers, 1), 512, 8, 256, 0)

    def compute(self, rank: int, op: str, layer: int, n: int) -> tuple[float, float]:
        return costs.PUZZLE_STEPS_PER_BATCH.get(op, 0.0) * n, 0.0

    def update(self, rank: int, layer: int, fraction: float) -> float:
        return costs.PUZZLE_UPDATE_STEPS

    def collective(self, op: str, value: Any, result: Any) -> float:
        return costs.PUZZLE_COLLECTIVE_STEPS

    def p2p(self, src: int, dst: int, value: Any) -> float:
        return costs.PUZZLE_MESSAGE_STEPS

    def load(self, rank: int, layer: int, fraction: float) -> float:
        return 0.0

    def nbytes(self, value: Any) -> float:
        return self.memory_units(value)


class RealCosts:
    """dist_lib.costs on a (possibly heterogeneous) cluster; sizes from a transformer workload."""

    timing = "real"

    def __init__(self, cluster: Cluster, workload: Workload):
        self.cluster = cluster
        self.workload = workload
        self.world_size = cluster.world_size
        self.ring = cluster.ring_link(range(cluster.world_size))
        self._cache: dict[tuple, tuple[float, float]] = {}

    def _params(self, layer: Any) -> int:
        layer = layer if isinstance(layer, int) and 0 <= layer < self.workload.num_layers else 0
        return self.workload.layer_params(layer)

    def compute(self, rank: int, op: str, layer: int, n: int) -> tuple[float, float]:
        key = (rank, op, layer, n)
        hit = self._cache.get(key)
        if hit is None:
            device, w = self.cluster.device_of(rank), self.workload
            if op == "loss" or not isinstance(layer, int) or not 0 <= layer < w.num_layers:
                hit = (costs.loss_time(device, w, n), costs.compute_flops(w, "loss", 0, n)) if n else (0.0, 0.0)
            elif op == "forward":
                hit = (costs.forward_time(device, w, layer, n), costs.compute_flops(w, op, layer, n))
            else:
                hit = (costs.backward_time(device, w, layer, n), costs.compute_flops(w, op, layer, n))
            self._cache[key] = hit
        return hit

    def update(self, rank: int, layer: int, fraction: float) -> float:
        return costs.update_time(self.cluster.device_of(rank), self._params(layer) * fraction)

    def collective(self, op: str, value: Any, result: Any) -> float:
        p = self.world_size
        if op in ("allgather", "all_gather"):
            return costs.all_gather_time(self.nbytes(result), p, self.ring)
        if op in ("scatterreduce", "reduce_scatter"):
            return costs.reduce_scatter_time(self.nbytes(value), p, self.ring)
        return costs.all_reduce_time(self.nbytes(value), p, self.ring)

    def p2p(self, src: int, dst: int, value: Any) -> float:
        if not 0 <= dst < self.world_size or src == dst:
            return 0.0
        return costs.p2p_time(self.nbytes(value), self.cluster.p2p_link(src, dst))

    def load(self, rank: int, layer: int, fraction: float) -> float:
        return 0.0  # as in dist_lib: weights are resident when the step starts

    def nbytes(self, value: Any) -> float:
        """Bytes a toy tensor stands for: 2/12/2 bytes per parameter for weights/optimizer/gradients;
        a stored activation is what backward of its layer needs (the layer's whole stash)."""
        kind = KIND.get(type(value).__name__)
        w = self.workload
        if kind in ("weight", "weight_grad", "optimizer"):
            per = OPTIMIZER_BYTES if kind == "optimizer" else WEIGHT_BYTES
            return self._params(value.layer) * per * shard_fraction(value)
        n = len(samples_of(value))
        if kind == "activation" and isinstance(value.layer, int) and 0 <= value.layer < w.num_layers:
            return n * (w.activation_bytes() + w.stash_bytes(value.layer))
        if kind in ("activation", "activation_grad"):
            return n * w.activation_bytes()
        return 0.0


# ---- rendezvous ----------------------------------------------------------------------------------

class _Slot:
    __slots__ = ("op", "entries", "future", "results", "time", "seq")

    def __init__(self, op: str, seq: int):
        self.op, self.seq = op, seq
        self.entries: dict[int, tuple[Any, float, Any]] = {}
        self.future: asyncio.Future | None = None
        self.results: dict[int, Any] = {}
        self.time = 0.0


WORLDS: list = []  # every World created, so a file's main() can be run and its models found afterwards


class World:
    """The ranks of one `Dist`: collective slots, mailboxes, and who is blocked or finished."""

    def __init__(self, world_size: int, api: str):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise CompatAssertionError(f"Dist needs a whole number of ranks >= 1, got {world_size!r}")
        self.n = world_size
        self.api = api
        self.settings = current(api)
        self.costs: UnitCosts | RealCosts | None = None
        self.models: list[Any] = []
        self.seq = [0] * world_size
        self.slots: dict[int, _Slot] = {}
        self.mail: dict[Any, deque] = {}
        self.mail_waiters: dict[Any, tuple[int, asyncio.Future]] = {}
        self.blocked: dict[int, str] = {}
        self.tasks: dict[int, asyncio.Task] = {}
        self.finished: set[int] = set()
        self.next_op_id = 0
        self.collectives = 0
        WORLDS.append(self)
        del WORLDS[:-64]  # keep the list short

    # -- cost model, built when the first Model tells us the layer count
    def cost_model(self, num_layers: int, memory_units) -> UnitCosts | RealCosts:
        if self.costs is None:
            s = self.settings
            if s.timing == "unit":
                self.costs = UnitCosts(self.n, num_layers, memory_units)
            else:
                cluster = Cluster.load(s.cluster) if s.cluster is not None else default_cluster(self.n, s.default_device)
                if cluster.world_size != self.n:
                    raise CompatAssertionError(f"cluster {cluster.name} has {cluster.world_size} GPUs but "
                                               f"Dist has {self.n} ranks")
                workload = Workload.load(s.workload) if s.workload is not None else _default_workload(self.api)
                self.costs = RealCosts(cluster, replace(workload, num_layers=max(num_layers, 1)))
        return self.costs

    def op_id(self) -> int:
        self.next_op_id += 1
        return self.next_op_id

    # -- which task runs which rank (for deadlock detection)
    def enter(self, rank: int) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
        if task is None or self.tasks.get(rank) is task:
            return
        self.tasks[rank] = task
        self.finished.discard(rank)
        task.add_done_callback(functools.partial(self._task_done, rank))

    def _task_done(self, rank: int, task: asyncio.Task) -> None:
        if self.tasks.get(rank) is task:
            self.finished.add(rank)
            if self.blocked:
                self._check_deadlock()

    async def _block(self, rank: int, future: asyncio.Future, what: str) -> Any:
        self.blocked[rank] = what
        self._check_deadlock()
        try:
            return await future
        finally:
            self.blocked.pop(rank, None)

    def _check_deadlock(self) -> None:
        if any(r not in self.blocked and r not in self.finished for r in range(self.n)):
            return
        lines = ["deadlock: every rank is blocked or finished; the original API would hang here"]
        for r in range(self.n):
            lines.append(f"  rank {r} " + (f"waits in {self.blocked[r]}" if r in self.blocked else "finished"))
        error = CompatDeadlockError("\n".join(lines))
        self.blocked.clear()
        futures = [s.future for s in self.slots.values()] + [f for _, f in self.mail_waiters.values()]
        self.slots.clear()
        self.mail_waiters.clear()
        for f in futures:
            if f is not None and not f.done():
                f.set_exception(error)

    # -- collectives: the k-th call of every rank is one op
    async def collective(self, rank: int, op: str, value: Any, time: float, layer: Any, combine) -> tuple[Any, float]:
        require(isinstance(rank, int) and 0 <= rank < self.n,
                f"rank {rank!r} called {op} but the Dist has ranks 0..{self.n - 1}")
        self.enter(rank)
        k = self.seq[rank]
        self.seq[rank] = k + 1
        slot = self.slots.get(k)
        if slot is None:
            slot = self.slots[k] = _Slot(op, k)
        elif slot.op != op:
            first = next(iter(slot.entries))
            raise CompatAssertionError(f"collective #{k}: rank {first} called {slot.op} but rank {rank} "
                                       f"called {op}; every rank must call the same collectives in the same order")
        if rank in slot.entries:
            raise CompatAssertionError(f"collective #{k}: two models with rank {rank} joined it")
        slot.entries[rank] = (value, time, layer)
        if len(slot.entries) == self.n:
            del self.slots[k]
            self.collectives += 1
            try:
                ordered = [slot.entries[r][0] for r in range(self.n)]
                slot.results = combine(ordered)
                slot.time = max(t for _, t, _ in slot.entries.values())
            except Exception as error:
                if slot.future is not None and not slot.future.done():
                    slot.future.set_exception(error)
                raise
            for r in slot.entries:
                self.blocked.pop(r, None)
            if slot.future is not None and not slot.future.done():
                slot.future.set_result(None)
        else:
            if slot.future is None:
                slot.future = asyncio.get_running_loop().create_future()
            missing = [r for r in range(self.n) if r not in slot.entries]
            await self._block(rank, slot.future, f"{op}(layer {layer}) #{k}, waiting for ranks {missing}")
        return slot.results[rank], slot.time

    # -- point to point: FIFO mailboxes keyed by destination (puzzles) or (source, destination) (lab)
    def post(self, key: Any, message: tuple) -> None:
        waiter = self.mail_waiters.pop(key, None)
        if waiter is not None:
            self.blocked.pop(waiter[0], None)
            if not waiter[1].done():
                waiter[1].set_result(message)
            return
        self.mail.setdefault(key, deque()).append(message)

    async def take(self, rank: int, key: Any, what: str) -> tuple:
        self.enter(rank)
        box = self.mail.get(key)
        if box:
            return box.popleft()
        require(key not in self.mail_waiters, f"rank {rank}: two receives wait on the same mailbox {key!r}")
        future = asyncio.get_running_loop().create_future()
        self.mail_waiters[key] = (rank, future)
        return await self._block(rank, future, what)


def _default_workload(api: str) -> Workload:
    if api == "lab":  # the lab's H100 class: hidden 4096, 1024 tokens per sample, 16-bit
        return Workload("lab-h4096", 1, 4096, 32, 1024, 0)
    return Workload("puzzles-h512", 1, 512, 8, 256, 0)  # the puzzles' HIDDEN=512, LENGTH=256

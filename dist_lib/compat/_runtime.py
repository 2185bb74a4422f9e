"""What the two toy APIs share: settings, rendezvous without polling, one-message mailboxes, deadlocks.

The toy APIs (LLM-Training-Puzzles and the course lab built on it) keep one clock per rank as the
attribute `model.time` and give collectives a simple rule: every rank's clock jumps to the latest
clock among the ranks, then advances by the op's cost. Point-to-point messages carry the sender's
clock; the receiver's clock becomes max(own, sender's). Here those rules run on futures: a collective
completes the moment its last rank arrives, and nothing sleeps or polls.

Collectives are world-wide and matched by position: the k-th collective call of every rank forms one
operation. A mailbox holds one message, as the originals' `asyncio.Queue(maxsize=1)` does, so a second
send to a full mailbox waits until the first is received. Deadlock (every rank blocked in a
collective, a receive or a send, or finished) raises `CompatDeadlockError` in every blocked rank,
naming what each waits for at that moment, where the originals would hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from dist_lib.errors import DeadlockError, TensorError
from dist_lib.engine.waits import waiting_line


class CompatAssertionError(AssertionError, TensorError):
    """A toy-API assertion: still an AssertionError (as the originals raise), and a SimulationError."""


class CompatDeadlockError(DeadlockError):
    """Every rank is blocked or finished: the original would hang here."""


def brief(values: Any, shown: int = 12) -> str:
    """A sorted list for a message, cut after `shown` items: '[0, 1, ..., 11, ... 256 in all]'."""
    items = sorted(values)
    if len(items) <= shown:
        return str(items)
    return "[" + ", ".join(map(str, items[:shown])) + f", ... {len(items)} in all]"


def require(condition: Any, message: str | Callable[[], str]) -> None:
    """Raise `CompatAssertionError(message)` unless `condition`; a callable message is built only then
    (the hot ops check on every call, and their messages format sample sets)."""
    if not condition:
        raise CompatAssertionError(message() if callable(message) else message)


# ---- settings ------------------------------------------------------------------------------------

TIMINGS = ("original", "real")


@dataclass(frozen=True)
class Settings:
    """How a `Dist` created while these settings are active prices its ops.

    timing: 'original' (the original library's own cost model: the puzzles' unit steps, the lab's
    calculon-style formulas; 'unit' is accepted as another name for it) or 'real' (dist_lib.costs.compute on
    `cluster` with `workload`, in seconds and bytes).
    cluster: a Cluster or spec; None builds one of `default_device` nodes of 8 for the world size.
    workload: a Workload or spec, or None for the API's default shape; its layer count is replaced by
    the Model's.
    strict: warn where the original silently accepts something suspicious (a gradient sum that counts
    a sample twice, combining tensors of different layers); the verdict stays the original's.
    exact_memory: price memory at every event by summing every stored tensor's `memory()`, as the
    originals do, instead of keeping a running total (`_storage.Ledger`). Same figures for any file
    that stores through `d[k] = v`, `del d[k]` and the other dict methods and leaves stored tensors
    as they are; the sum also counts what the running total cannot follow (a stored tensor widened
    in place, a value stored with `dict.__setitem__`). The grader runs `--api` files so."""

    timing: str = "original"
    cluster: Any = None
    workload: Any = None
    default_device: str = "H100-80GB"
    strict: bool = False
    exact_memory: bool = False


_STACK: dict[str, list[Settings]] = {"puzzles": [Settings()], "lab": [Settings()]}
_DEFAULT_DISTS: dict[str, list[Any]] = {"puzzles": [None], "lab": [None]}  # per `configure` block


def default_dist(api: str, make: Callable[[int], Any]) -> Any:
    """The `Dist(1)` a `Model` built without a `dist` runs on. The originals' default argument is one
    `Dist(1)` made at import, shared by every such model; here it is one per `configure` block (one run
    of a file), made at first use, so it has the run's settings and a run's `main()` or notebook that
    builds its models this way (`Model(layers=2, batches=4)`, the puzzles notebook's first example)
    reports them, and not another run's."""
    slots = _DEFAULT_DISTS[api]
    if slots[-1] is None:
        slots[-1] = make(1)
    return slots[-1]


def current(api: str) -> Settings:
    return _STACK[api][-1]


@contextlib.contextmanager
def configure(api: str, **changes: Any) -> Iterator[Settings]:
    """Within the block, new `Dist` objects of `api` use these settings."""
    if changes.get("timing") == "unit":
        changes["timing"] = "original"
    settings = replace(current(api), **{k: v for k, v in changes.items() if v is not None})
    if settings.timing not in TIMINGS:
        raise ValueError(f"timing must be 'original' (or 'unit') or 'real', got {settings.timing!r}")
    _STACK[api].append(settings)
    _DEFAULT_DISTS[api].append(None)
    try:
        yield settings
    finally:
        _STACK[api].pop()
        _DEFAULT_DISTS[api].pop()


# ---- rendezvous ----------------------------------------------------------------------------------

class _Slot:
    __slots__ = ("op", "entries", "future", "results", "time", "seq")

    def __init__(self, op: str, seq: int):
        self.op, self.seq = op, seq
        self.entries: dict[int, tuple[Any, float, Any, str]] = {}
        self.future: asyncio.Future | None = None
        self.results: dict[int, Any] = {}
        self.time = 0.0


class Mailbox:
    """A queue of capacity one with the methods of the originals' `asyncio.Queue(maxsize=1)`, whose
    waits the world sees (so a wait nobody can end is reported instead of hanging)."""

    maxsize = 1

    def __init__(self, world: World, name: str, put_op: str = "send", get_op: str = "receive"):
        self.world, self.name, self.put_op, self.get_op = world, name, put_op, get_op
        self.items: deque = deque()
        self.getters: deque[tuple[int, asyncio.Future]] = deque()
        self.putters: deque[tuple[int, asyncio.Future]] = deque()

    def qsize(self) -> int:
        return len(self.items)

    def empty(self) -> bool:
        return not self.items

    def full(self) -> bool:
        return len(self.items) >= self.maxsize

    async def put(self, item: Any) -> None:
        world = self.world
        rank = world.current_rank()
        while self.full():
            future = asyncio.get_running_loop().create_future()
            self.putters.append((rank, future))
            await world.block(rank, future, lambda: f"{self.put_op}(): {self.name} still holds a message "
                                                                   f"nobody has received")
        self.items.append(item)
        self._wake(self.getters)

    async def get(self) -> Any:
        world = self.world
        rank = world.current_rank()
        while not self.items:
            future = asyncio.get_running_loop().create_future()
            self.getters.append((rank, future))
            await world.block(rank, future, lambda: f"{self.get_op}(): {self.name} is empty")
        item = self.items.popleft()
        self._wake(self.putters)
        return item

    def _wake(self, waiters: deque) -> None:
        while waiters:
            rank, future = waiters.popleft()
            if not future.done():
                self.world.wake(rank, future)
                return


CONFIRM_TURNS = 8  # event-loop turns a suspected deadlock must last before it is reported
WORLDS: list = []  # every World created, so a file's main() can be run and its models found afterwards


class World:
    """The ranks of one `Dist`: collective slots, mailboxes, and who is blocked or finished."""

    created = 0  # how many worlds were ever made; each has its serial number

    def __init__(self, world_size: int, api: str):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise CompatAssertionError(f"Dist needs a whole number of ranks >= 1, got {world_size!r}")
        self.n = world_size
        self.api = api
        self.settings = current(api)
        self.costs: Any = None
        self.models: list[Any] = []
        self.seq = [0] * world_size
        self.slots: dict[int, _Slot] = {}
        self.blocked: dict[int, tuple[asyncio.Future, Callable[[], str]]] = {}
        self.tasks: dict[int, asyncio.Task] = {}
        self.rank_of_task: dict[asyncio.Task, int] = {}
        self.finished: set[int] = set()
        self.next_op_id = 0
        self.collectives = 0
        self.masks: dict[frozenset, int] = {}  # sample sets as bit masks, for the event records
        self.progress = 0  # bumped whenever a rank blocks, wakes or starts a task
        self._confirming = False
        World.created += 1
        self.serial = World.created
        WORLDS.append(self)
        del WORLDS[:-64]  # keep the list short

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
        self.rank_of_task[task] = rank
        self.finished.discard(rank)
        self.progress += 1
        task.add_done_callback(functools.partial(self._task_done, rank))

    def current_rank(self) -> int | None:
        """The rank the running task plays (known from its first call into the API), or None."""
        return self.rank_of_task.get(asyncio.current_task())

    def _task_done(self, rank: int, task: asyncio.Task) -> None:
        if self.tasks.get(rank) is task:
            self.finished.add(rank)
            if self.blocked:
                self._check_deadlock()

    async def block(self, rank: int | None, future: asyncio.Future, describe: Callable[[], str]) -> Any:
        """Wait on `future`; `describe()` says, when asked, what the rank waits for."""
        if rank is None:
            return await future
        self.blocked[rank] = (future, describe)
        self.progress += 1
        self._check_deadlock()
        try:
            return await future
        finally:
            if self.blocked.get(rank, (None,))[0] is future:
                del self.blocked[rank]

    def wake(self, rank: int | None, future: asyncio.Future, value: Any = None) -> None:
        """Resolve a blocked rank's future; from now on it counts as running."""
        if rank is not None and self.blocked.get(rank, (None,))[0] is future:
            del self.blocked[rank]
        self.progress += 1
        if not future.done():
            future.set_result(value)

    def _stalled(self) -> bool:
        # a finished rank is never blocked (a new task for it leaves `finished` when it enters)
        return len(self.blocked) + len(self.finished) >= self.n

    def _check_deadlock(self) -> None:
        """When every rank looks blocked or finished, confirm it after the tasks already scheduled
        have run (a rank whose earlier task finished may have a new one about to start), then fail
        every blocked rank with the report. No clock is involved: a few turns of the event loop."""
        if self._stalled() and not self._confirming:
            self._confirming = True
            asyncio.get_running_loop().call_soon(self._confirm, self.progress, CONFIRM_TURNS)

    def _confirm(self, progress: int, turns: int) -> None:
        if self.progress != progress or not self._stalled():
            self._confirming = False
            if self._stalled():  # moved on, then stalled again
                self._check_deadlock()
            return
        if turns > 0:
            asyncio.get_running_loop().call_soon(self._confirm, progress, turns - 1)
            return
        self._confirming = False
        self._fail_blocked()

    def describe_waits(self, headline: str) -> str:
        """`headline`, then each rank's state: blocked in an op of the API, finished, or awaiting something
        else of asyncio's (at the strategy's line)."""
        lines = [headline]
        for r in range(self.n):
            task = self.tasks.get(r)
            if r in self.blocked:
                lines.append(f"  rank {r} waits in {self.blocked[r][1]()}")
            elif r in self.finished or task is None:
                lines.append(f"  rank {r} finished")
            else:
                lines.append(f"  rank {r} waits on an asyncio future{waiting_line(task.get_coro())}")
        return "\n".join(lines)

    def _fail_blocked(self) -> None:
        error = CompatDeadlockError(self.describe_waits(
            "deadlock: every rank is blocked or finished; the original API would hang here"))
        blocked = list(self.blocked.values())
        self.blocked.clear()
        self.slots.clear()
        for future, _ in blocked:
            if not future.done():
                future.set_exception(error)

    # -- collectives: the k-th call of every rank is one op
    async def collective(self, rank: int, op: str, value: Any, time: float, layer: Any,
                         fold: Callable[[Any, Any], Any], kind: str | None = None) -> tuple[Any, float]:
        """Join the rank's next collective; returns (every member's value folded in arrival order, as
        the originals accumulate it, and the latest member clock). A fold that fails raises in the
        rank whose arrival made it fail, as in the originals. Calls of the same `kind` (default: `op`)
        match: the originals' reduce-scatter is an all-reduce on every rank, then a local shard."""
        kind = kind or op
        require(isinstance(rank, int) and 0 <= rank < self.n,
                f"rank {rank!r} called {op} but the Dist has ranks 0..{self.n - 1}")
        self.enter(rank)
        k = self.seq[rank]
        self.seq[rank] = k + 1
        slot = self.slots.get(k)
        if slot is None:
            slot = self.slots[k] = _Slot(kind, k)
            slot.results = value
        elif slot.op != kind:
            first = next(iter(slot.entries))
            raise CompatAssertionError(f"collective #{k}: rank {first} called {slot.entries[first][3]} but rank "
                                       f"{rank} called {op}; every rank must call the same collectives in the "
                                       f"same order")
        elif rank in slot.entries:
            raise CompatAssertionError(f"collective #{k}: two models with rank {rank} joined it")
        else:
            slot.results = fold(slot.results, value)
        slot.entries[rank] = (value, time, layer, op)
        slot.time = max(slot.time, time)
        if len(slot.entries) == self.n:
            del self.slots[k]
            self.collectives += 1
            self.progress += 1
            for r in slot.entries:
                if r in self.blocked:
                    del self.blocked[r]
            if slot.future is not None and not slot.future.done():
                slot.future.set_result(None)
        else:
            if slot.future is None:
                slot.future = asyncio.get_running_loop().create_future()
            await self.block(rank, slot.future, lambda: f"{op}(layer {layer}) #{k}, waiting for ranks "
                                                        f"{[r for r in range(self.n) if r not in slot.entries]}")
        return slot.results, slot.time

"""Virtual clocks, rank coroutines, blocking on Work handles, quiescence, deadlock detection and the
event log.

Time is virtual: a rank's `clock` (its compute stream) only moves by the cost of what it does or by
waiting for a `Work`. Nothing sleeps and nothing polls. Transfers (collectives, messages) share links,
so a transfer's end depends on the transfers that overlap it, some of which ranks may not have issued
yet; an end is therefore final only at *quiescence*, when every unfinished rank is blocked: then the
transfer scheduler (`transfers.py`) runs the links up to the earliest end, the transfers that end then
complete (events, wake-ups, buffers their streams release), and the ranks they wake run on from there.
Quiescence with nothing in flight is a deadlock: a `DeadlockError` lists each blocked rank and the op
it waits on. Results never depend on the order the ranks run in: between two quiescences every
rank runs to its next wait whatever the order, and ends are decided in virtual-time order.

The engine drives the ranks' coroutines itself (`Engine._drive`): a rank that awaits one of its own
`Work`s yields `WAKE_ME` straight to the engine, which resumes it when the work completes, without a
future or an event-loop round trip per wait. Anything else a strategy awaits (an `asyncio.gather` of
works, `asyncio.sleep`) is an asyncio future, which resumes the rank through the event loop as a task
would; works awaited inside such tasks block on a future (each task is noted with the rank that made it,
so that a rank awaiting another rank's work is refused there too). Such a future may be one nothing will ever
complete (an `asyncio.Event` no rank sets): a watchdog (`waits.HangWatch`) looks, once a wall-clock second,
whether the event loop still has anything that could (a callback, a timer, a thread, a file) and fails
the step as a deadlock, naming each rank's wait, when it has not. The tasks a rank starts belong to its
step (`rank_tasks.py`).

`Engine._drive`, `Engine.wake` and `comm.Work.__await__` (with `block_direct` and `_register`) have C twins
(`_drive.c`) when the extension was built; the Python below stays their specification and fallback.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from asyncio import Future
from collections import deque
from collections.abc import Callable, Coroutine
from itertools import islice
from operator import attrgetter
from typing import Any

from dist_lib.errors import DeadlockError, ResourceError, SimulationError, StrategyError
from dist_lib.engine.eventlog import EventLog
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.replicas import Fold
from dist_lib.engine.transfers import Scheduler, Transfer
from dist_lib.engine import rank_tasks
from dist_lib.engine.rank_state import SHOWN, WAKE_ME, FinalClock, RankState, _Waits, more  # noqa: F401
from dist_lib.engine.waits import HangWatch, describe_future, said, user_frame, waiting_line
from dist_lib.workload.transformer import Workload


class Engine:
    """Owns every rank's state, the groups and channels, and the event log of one simulated step."""

    # (slots, so that the C twin of the block/wake path, `_drive.c`, reads its fields where they lie)
    __slots__ = ("cluster", "workload", "global_batch_size", "world_size", "ranks", "events", "groups",
                 "world_group", "channels", "channels_from", "blocked", "finished", "next_op_id", "cost_cache",
                 "layer_params", "shard_bytes", "full_batch", "loop", "transfers", "coroutines", "ready",
                 "driving", "throw_into", "awaiting", "task_ranks", "running", "stepping", "stopped",
                 "first_error", "watchdog", "thread", "parked", "last_look", "cancel_is_strategys", "partition",
                 "instant_transfers", "fold", "memory_reserve")

    def __init__(self, cluster: Cluster, workload: Workload, global_batch_size: int, enforce_memory: bool = True,
                 fold: Fold | None = None, memory_reserve: Any = None):
        self.cluster = cluster
        self.workload = workload
        self.global_batch_size = global_batch_size
        self.world_size = cluster.world_size
        # the runtime reserve (`hardware.reserve`) without communicators: their buffers are counted at the
        # end of the step, once each rank's communicators are known (`run.simulator`)
        self.memory_reserve = memory_reserve
        self.ranks = [RankState(r, cluster, workload.num_layers, enforce_memory, memory_reserve)
                      for r in range(self.world_size)]
        self.events = EventLog()
        self.groups: dict[tuple[int, ...], Any] = {}
        self.world_group: Any = None  # the group of all ranks, once a rank asks for it
        self.channels: dict[tuple[int, int], Any] = {}
        self.channels_from: list[dict[int, Any]] = [{} for _ in range(self.world_size)]  # src -> dst -> channel
        self.blocked = 0  # ranks with at least one wait in progress
        self.finished = 0
        self.next_op_id = 0
        self.cost_cache: dict[str, dict[tuple, tuple]] = {}  # device name -> op key -> (seconds, ...)
        self.layer_params = [workload.layer_params(layer) for layer in range(workload.num_layers)]
        self.shard_bytes: dict[tuple[int, int], tuple[int, int]] = {}  # (layer, parts) -> (weight, optimizer)
        self.full_batch = (1 << global_batch_size) - 1  # the samples mask of a whole step's gradient
        self.loop: asyncio.AbstractEventLoop | None = None
        # folded identical replicas (`hardware/replicas.py`): only the representatives run, on folded links
        self.fold = fold
        self.transfers = Scheduler(cluster.link_capacities() if fold is None else fold.capacities())
        # the driver (`run`): each rank's coroutine, the ranks to resume in order, the rank being run now
        self.coroutines: list[Any] = []
        self.ready: deque[int] = deque()
        self.driving = -1
        self.throw_into: dict[int, BaseException] = {}  # a rank to resume with an error (a deadlock)
        self.awaiting: dict[int, Any] = {}  # rank -> the asyncio future its coroutine waits on
        # asyncio task (a `gather`'s) -> the rank whose coroutine made it, directly or through its tasks
        self.task_ranks: weakref.WeakKeyDictionary[asyncio.Task, int] = weakref.WeakKeyDictionary()
        self.running = 0  # coroutines not finished
        self.stepping = False
        self.stopped: asyncio.Future | None = None  # set when every rank returned or one failed
        self.first_error: BaseException | None = None
        self.watchdog: HangWatch | None = None  # looks for a wait nothing will end (`_hung`, `_livelocked`)
        self.thread = threading.get_ident()  # the thread the step runs in (`run`): works are awaited there only
        self.parked: set[int] = set()  # ranks that yielded to the event loop bare (`asyncio.sleep(0)`)
        self.last_look: tuple | None = None  # the step's progress at the watchdog's last look, all ranks idle
        self.cancel_is_strategys = False  # whether a cancel of the step's task can only be the strategy's
        # one of the two processes of a split step (`run/split.py`), whose quiescences are the two processes' own
        self.partition: Any = None
        # a transfer of zero duration was scheduled: it ends alone, at the instant it starts, in the order its
        # rank issued it, so the step's op ids are numbered again after it (`EventLog.renumber`)
        self.instant_transfers = False

    # ---- blocking and waking ------------------------------------------------------------------

    def block(self, state: RankState, work: Any) -> asyncio.Future:
        """Register that `state` waits on an unresolved `work`, awaited inside an asyncio task (each waiter
        its own future, so that cancelling one wait leaves the others); raise at once if that is a
        deadlock."""
        future = Future(loop=self.loop)
        self._wait(state, work, future)
        if self.ready:
            # The quiescence this wait reached woke ranks that wait on their own works (`WAKE_ME`). Their
            # coroutines resume in `_drive`, and none runs under an asyncio task: run one on the loop's
            # next turn, or those ranks would never resume (and the watchdog would call it a hang).
            self.loop.call_soon(self._drive)
        return future

    def block_direct(self, state: RankState, work: Any) -> None:
        """Register that the rank's own coroutine waits on an unresolved `work` (it then yields `WAKE_ME`);
        raise at once if that is a deadlock. The quiescence this may reach can complete `work` at once."""
        self._wait(state, work, WAKE_ME)

    def _wait(self, state: RankState, work: Any, waiter: Any) -> None:
        """`work.future` gains `waiter`; the rank's first wait on it registers it."""
        current = work.future
        if current is None:
            work.future = waiter
            self._register(state, work)
        elif type(current) is _Waits:  # the rank waits on it already (its coroutine, or another of its tasks)
            current.append(waiter)
        else:
            work.future = _Waits((current, waiter))

    def unblock(self, state: RankState, work: Any, future: asyncio.Future) -> None:
        """A task's wait on `work` ended without it (the task was cancelled: a `wait_for`'s timeout, a
        cancelled `gather`): the rank no longer waits on `work` through `future`, nor at all if that was
        its only wait on it."""
        current = work.future
        if work.end is not None:  # (completed meanwhile: `wake` did the books)
            return
        if type(current) is _Waits:
            current.remove(future)
            if len(current) == 1:
                work.future = current[0]
        elif current is future:
            work.future = None
            state.waiting.remove(work)
            if not state.waiting:
                self.blocked -= 1

    def _register(self, state: RankState, work: Any) -> None:
        if not state.waiting:
            self.blocked += 1
        state.waiting.append(work)
        self.events.maybe_pack()
        if self.blocked + self.finished == self.world_size:
            self.advance()

    def advance(self) -> None:
        """Quiescence: complete the earliest transfers until one wakes a rank; none left is a deadlock."""
        if self.partition is not None:
            self.partition.advance()
            return
        while self.blocked + self.finished == self.world_size:
            done = self.transfers.next_completions()
            if not done:
                raise DeadlockError(self.describe_deadlock())
            self.complete(done)

    def complete(self, done: list[Transfer]) -> None:
        """Finish transfers that end at one instant, in an order fixed by what they are (op ids follow it)."""
        if len(done) > 1:
            done.sort(key=_TRANSFER_KEY)
        for transfer in done:
            transfer.finish(self, transfer)

    def schedule(self, transfer: Transfer) -> None:
        """Hand `transfer` to the scheduler; one of zero duration has the step's op ids numbered again at the end
        (`instant_transfers`). Its C twin is in `_drive.c`."""
        if transfer.end == transfer.start:
            self.instant_transfers = True
        self.transfers.add(transfer)

    def drain(self) -> None:
        """After the last rank returned: run the transfers still in flight to their ends."""
        if self.partition is not None:
            self.partition.drain()
            return
        while True:
            done = self.transfers.next_completions()
            if not done:
                return
            self.complete(done)

    def wake(self, work: Any) -> None:
        """`work` just resolved: its waiting rank (if any) can run again."""
        future = work.future
        if future is None:
            return
        state = self.ranks[work.rank]
        state.waiting.remove(work)
        if not state.waiting:
            self.blocked -= 1
        for waiter in future if type(future) is _Waits else (future,):
            if waiter is WAKE_ME:
                if work.rank != self.driving:  # (the rank that reached this quiescence runs on by itself)
                    self.ready.append(work.rank)
            elif not waiter.done():
                waiter.set_result(None)

    def rank_finished(self, state: RankState) -> None:
        self.events.maybe_pack()
        state.finished = True
        self.finished += 1
        if self.blocked and self.blocked + self.finished == self.world_size:
            try:
                self.advance()
                return
            except DeadlockError as raised:
                error = raised
            for other in self.ranks:
                for work in other.waiting:
                    future = work.future
                    for future in future if type(future) is _Waits else (future,):
                        if future is WAKE_ME:
                            self.throw_into[work.rank] = error
                            self.ready.append(work.rank)
                        elif not future.done():
                            future.set_exception(error)

    def describe_deadlock(self) -> str:
        return self._describe_waits("deadlock: every unfinished rank waits on communication no rank will complete")

    def describe_hang(self) -> str:
        split = "" if self.partition is None else (
            "; with workers=2 the ranks of the other process share no Python objects with these, so they set "
            "and fill nothing here")
        return self._describe_waits("deadlock: the strategy awaits something of asyncio's that nothing in the step "
                                    f"will ever complete (an asyncio.Event no rank sets, a queue no rank fills...{split})")

    def _describe_waits(self, headline: str) -> str:
        """`headline`, then what each rank waits on (its works, or else the asyncio future it awaits) and the
        line of the strategy it waits at.
        The first `SHOWN` waits are described, then one line counts the rest (describing a work scans its
        channel or group: every one of thousands would take time quadratic in them)."""
        lines = [headline]
        extra = 0
        for state in self.ranks:
            rank = state.rank
            room = SHOWN + 1 - len(lines)
            if state.waiting:  # (works awaited in a `gather` too)
                extra += max(0, len(state.waiting) - room)
                at = waiting_line(self.coroutines[rank]) if room > 0 else ""
                for work in islice(state.waiting, max(0, room)):
                    lines.append(f"  rank {rank} (t={state.clock * 1e3:.3f} ms) waits on {work.describe()}{at}")
            elif room <= 0 and (rank in self.awaiting or rank in self.parked or state.finished):
                extra += 1
            elif rank in self.parked:
                lines.append(f"  rank {rank} (t={state.clock * 1e3:.3f} ms) yields to the event loop and "
                             f"waits on nothing{waiting_line(self.coroutines[rank])}")
            elif rank in self.awaiting:
                lines.append(f"  rank {rank} (t={state.clock * 1e3:.3f} ms) waits on "
                             f"{describe_future(self.awaiting[rank])}{waiting_line(self.coroutines[rank])}")
            elif state.finished:
                lines.append(f"  rank {rank} finished")
        if extra:
            lines.append(f"  {more(extra)}")
        return "\n".join(lines)

    def release(self) -> None:
        """End of the step: each rank's memory log stops referring to the rank (stamping any later free
        with the rank's final time), so that the step's objects are freed by reference counting as soon
        as the caller drops them, not by a full pass of the cycle collector."""
        for state in self.ranks:
            state.memory.owner = FinalClock(state.clock)
            state.final_weights = []

    def new_op_id(self) -> int:
        self.next_op_id += 1
        return self.next_op_id

    # ---- running ------------------------------------------------------------------------------

    async def run(self, make_coroutine: Callable[[int], Coroutine], order: list[int]) -> None:
        """Run one coroutine per rank, starting them in `order`; the first failure closes the rest and
        is re-raised."""
        self.loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()
        self.first_error = None
        self.coroutines = [None] * self.world_size
        for rank in order:
            self.coroutines[rank] = make_coroutine(rank)
        self.running = len(order)
        self.stopped = self.loop.create_future()
        self.ready.extend(order)
        self.watchdog = HangWatch(self._hung, self._livelocked)
        factory, handler = self.loop.get_task_factory(), self.loop.get_exception_handler()
        self.loop.set_task_factory(rank_tasks.task_factory(self, factory))
        self.loop.set_exception_handler(rank_tasks.exception_handler(self, handler))
        try:
            self._drive()
            await self.stopped
            task = asyncio.current_task()
            if self.cancel_is_strategys and task is not None and task.cancelling():
                raise asyncio.CancelledError  # (a cancel the step's ranks made without awaiting after it)
            if self.first_error is None:
                rank_tasks.check_tasks(self)
        except asyncio.CancelledError:
            if not self.cancel_is_strategys:
                raise
            # (under `simulate` nothing but the strategy can cancel the step's task)
            self._fail(StrategyError(self._describe_waits(
                "the strategy cancelled the simulation: every rank runs in the simulator's one asyncio task, so "
                "`asyncio.timeout(...)` or `asyncio.current_task().cancel()` in a rank cancels the whole step; "
                "bound a wait with `asyncio.wait_for(work, seconds)` instead. The ranks then:")))
        finally:
            self._close_all()
            rank_tasks.cancel_tasks(self)
            self.watchdog.cancel()
            self.loop.set_task_factory(factory)
            self.loop.set_exception_handler(handler)
        if self.first_error is not None:
            raise self.first_error
        self.drain()

    def _drive(self) -> None:
        """Resume ready ranks, in the order they became ready, until none is."""
        if self.stepping:  # already resuming ranks further up the stack: that loop takes this one too
            return
        self.stepping = True
        ready, step = self.ready, self._step
        try:
            while ready:
                step(ready.popleft())
        finally:
            self.stepping = False

    def _step(self, rank: int) -> None:
        """Run rank `rank`'s coroutine to its next wait (or its end)."""
        coroutine = self.coroutines[rank]
        if coroutine is None:  # closed after a failure
            return
        self.driving = rank
        try:
            if self.throw_into and rank in self.throw_into:
                yielded = coroutine.throw(self.throw_into.pop(rank))
            else:
                yielded = coroutine.send(None)
        except StopIteration:
            self._rank_returned(rank)
            return
        except BaseException as error:
            self._rank_failed(rank, error)
            return
        finally:
            self.driving = -1
        if yielded is not WAKE_ME:
            self._await_foreign(rank, yielded)

    def _await_foreign(self, rank: int, yielded: Any) -> None:
        """The rank awaits something of asyncio's: resume it through the event loop, as a task would."""
        if yielded is None:  # a bare yield (`asyncio.sleep(0)`): run again on the loop's next turn
            self.parked.add(rank)
            self.loop.call_soon(self._resume, rank)
        elif getattr(yielded, "_asyncio_future_blocking", None):
            yielded._asyncio_future_blocking = False
            self.awaiting[rank] = yielded
            yielded.add_done_callback(lambda _, rank=rank: self._resume(rank))
        else:
            self.throw_into[rank] = RuntimeError(f"the strategy yielded {yielded!r}, which is not awaitable by the "
                                                 f"simulator (await works and asyncio futures)")
            self.loop.call_soon(self._resume, rank)

    def _resume(self, rank: int) -> None:
        self.awaiting.pop(rank, None)
        self.parked.discard(rank)
        self.ready.append(rank)
        self._drive()

    def _rank_returned(self, rank: int) -> None:
        self.coroutines[rank] = None
        state = self.ranks[rank]
        if not state.finished:
            try:
                self.rank_finished(state)
            except BaseException as error:  # pragma: no cover - the engine's own failure
                self._fail(error)
        self._stop_one()

    def _rank_failed(self, rank: int, error: BaseException) -> None:
        """A rank raised: name the rank and the strategy's line, and stop the step."""
        self.coroutines[rank] = None
        if isinstance(error, SimulationError):
            wrapped: BaseException = error
        elif isinstance(error, KeyboardInterrupt):  # Ctrl-C: the user's, not the strategy's; say where it was
            error.add_note(f"simulate() was interrupted while rank {rank} ran, at t="
                           f"{self.ranks[rank].clock * 1e3:.3f} ms of its step{user_frame(error)}")
            wrapped = error
        elif isinstance(error, MemoryError):  # the host ran out, not the simulated GPU: not the strategy's bug
            wrapped = ResourceError(
                f"rank {rank}: MemoryError: the simulation ran out of real memory{user_frame(error)}; this "
                f"step is too large to simulate within this process's memory limit")
            wrapped.__cause__ = error
        else:  # the strategy's own bug (CancelledError, SystemExit... included): which rank, which line
            said_ = said(error)
            wrapped = StrategyError(f"rank {rank}: {type(error).__name__}{said_}{user_frame(error)}")
            wrapped.__cause__ = error
        self._abort(wrapped)

    def _stop_one(self) -> None:
        self.running -= 1
        if self.running == 0 and not self.stopped.done():
            self.stopped.set_result(None)

    def _close_all(self) -> None:
        """After a failure (or a cancelled run): close every coroutine still suspended, and cancel what
        they awaited of asyncio's (the tasks of a `gather`)."""
        for future in self.awaiting.values():
            future.cancel()
            # a cancelled gather ends with its children's CancelledError as its exception: retrieve it, or
            # asyncio logs "exception was never retrieved" with a traceback beside the step's own error
            future.add_done_callback(_retrieve)
        self.awaiting.clear()
        for rank, coroutine in enumerate(self.coroutines):
            if coroutine is not None:
                self.coroutines[rank] = None
                try:
                    coroutine.close()
                except BaseException:  # a strategy that awaits again while closed: it stops anyway
                    pass

    def _hung(self) -> None:
        """The watchdog found nothing that could ever resume a waiting rank (a rank awaits something of
        asyncio's no one completes, e.g. an `asyncio.Event` no rank sets): fail the step as a deadlock.
        (The engine's own waits never need this: a quiescence with nothing in flight is reported at once.)"""
        if self.stopped is None or self.stopped.done():
            return
        self._abort(DeadlockError(self.describe_hang()))

    def _livelocked(self) -> bool:
        """The watchdog's look, once a wall-clock second, for ranks that poll: every unfinished rank waits,
        some only yield to the event loop (`while not work.done: await asyncio.sleep(0)`), and nothing
        changed since the last look. In virtual time a transfer ends only when every rank waits on
        something, so such a loop never sees its work end: fail the step as a deadlock, naming the ranks
        and lines. True when it did."""
        idle = bool(self.parked) and \
            self.blocked + self.finished + len(self.parked | self.awaiting.keys()) == self.world_size
        look = (len(self.events), self.next_op_id, self.transfers.count, self.blocked, self.finished) if idle else None
        stuck, self.last_look = look is not None and look == self.last_look, look
        if stuck and self.stopped is not None and not self.stopped.done():
            self._abort(DeadlockError(self._describe_waits(
                "deadlock: every unfinished rank waits, and the ranks that yield to the event loop "
                "(`await asyncio.sleep(0)` in a loop) issue nothing: in virtual time a transfer ends only when "
                "every rank waits on it or on another, so a rank that polls `work.done` never sees it end; "
                "await the work (or `asyncio.wait_for` it) instead")))
        return stuck

    def _abort(self, error: BaseException) -> None:
        """End the step with `error` (the first one stays): no rank is resumed again."""
        self._fail(error)
        self.ready.clear()
        if self.stopped is not None and not self.stopped.done():
            self.stopped.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.first_error is None:
            self.first_error = error


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


# a transfer's `key`, read in C by `sort` (a Python function of one line would be a frame per transfer)
_TRANSFER_KEY = attrgetter("key")


# The Python twins of what the C accelerator replaces on the block/wake path (`_drive.c`: `Engine.wake`,
# `Engine._drive`, and `comm.Work.__await__` with `block_direct` and `_register`), kept as the
# specification and the fallback; filled when the C is installed, so that tests can run either.
PYTHON_TWINS: dict[str, Callable] = {}

"""Virtual clocks, rank coroutines, blocking on Work handles, quiescence, deadlock detection and the
event log.

Time is virtual: a rank's `clock` (its compute stream) only moves by the cost of what it does or by
waiting for a `Work`. Nothing sleeps and nothing polls. Transfers (collectives, messages) share links,
so a transfer's end depends on the transfers that overlap it, some of which ranks may not have issued
yet; an end is therefore final only at *quiescence*, when every unfinished rank is blocked: then the
transfer scheduler (`transfers.py`) runs the links up to the earliest end, the transfers that end then
complete (events, wake-ups, buffers their streams release), and the ranks they wake run on from there.
Quiescence with nothing in flight is a deadlock: a `DeadlockError` lists each blocked rank and the op
it waits on. Results never depend on the order asyncio runs ranks in: between two quiescences every
rank runs to its next wait whatever the order, and ends are decided in virtual-time order.
"""

from __future__ import annotations

import asyncio
import os
from asyncio import Future
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

from .errors import DeadlockError, ResourceError, SimulationError, StrategyError
from .eventlog import PACK_AT, EventLog
from .hardware import Cluster
from .memory import MemoryTracker
from .transfers import Scheduler, Transfer
from .workload import Workload


class FinalClock(NamedTuple):
    """A rank's clock once its step is over."""

    clock: float


class RankState:
    """Per-rank simulator state: clocks, memory, the works it waits on."""

    __slots__ = ("rank", "device", "clock", "comm_end", "p2p_end", "memory", "waiting",
                 "finished", "flops", "final_weights", "handed", "updated", "forwarded", "node")

    def __init__(self, rank: int, cluster: Cluster, num_layers: int, enforce_memory: bool):
        self.rank = rank
        self.device = cluster.device_of(rank)
        self.node = cluster.node_of(rank)
        self.clock = 0.0  # compute stream
        self.comm_end = 0.0  # the latest end of a collective (awaited or not); each group has its stream
        self.p2p_end = 0.0  # the latest end of a send or recv (awaited or not)
        self.memory = MemoryTracker(rank, self.device.name, self.device.memory_bytes, self, enforce_memory)
        self.waiting: list[Any] = []  # works this rank is blocked on
        self.finished = False
        self.flops = 0.0  # executed, including recompute (HFU)
        self.final_weights: list[Any] = []  # the Weights handed in
        # per layer, the shards handed in and the shards updated (see `op_checks._first_time`)
        self.handed: list[Any] = [None] * num_layers
        self.updated: list[Any] = [None] * num_layers
        # per layer, a mask of (TP slice, sample) pairs forwarded so far: a repeat is a recompute
        self.forwarded: list[int] = [0] * num_layers


class Engine:
    """Owns every rank's state, the groups and channels, and the event log of one simulated step."""

    def __init__(self, cluster: Cluster, workload: Workload, global_batch_size: int, enforce_memory: bool = True):
        self.cluster = cluster
        self.workload = workload
        self.global_batch_size = global_batch_size
        self.world_size = cluster.world_size
        self.ranks = [RankState(r, cluster, workload.num_layers, enforce_memory) for r in range(self.world_size)]
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
        self.transfers = Scheduler(cluster.link_capacities())

    # ---- blocking and waking ------------------------------------------------------------------

    def block(self, state: RankState, work: Any) -> asyncio.Future:
        """Register that `state` waits on an unresolved `work`; raise at once if that is a deadlock."""
        future = Future(loop=self.loop)
        work.future = future
        if not state.waiting:
            self.blocked += 1
        state.waiting.append(work)
        if len(self.events.recent) >= PACK_AT:
            self.events.pack()
        if self.blocked + self.finished == self.world_size:
            self.advance()
        return future

    def advance(self) -> None:
        """Quiescence: complete the earliest transfers until one wakes a rank; none left is a deadlock."""
        while self.blocked + self.finished == self.world_size:
            done = self.transfers.next_completions()
            if not done:
                raise DeadlockError(self.describe_deadlock())
            self.complete(done)

    def complete(self, done: list[Transfer]) -> None:
        """Finish transfers that end at one instant, in an order fixed by what they are (op ids follow it)."""
        if len(done) > 1:
            done.sort(key=_transfer_key)
        for transfer in done:
            transfer.finish(self, transfer)

    def schedule(self, transfer: Transfer) -> None:
        self.transfers.add(transfer)

    def drain(self) -> None:
        """After the last rank returned: run the transfers still in flight to their ends."""
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
        if not future.done():
            future.set_result(None)

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
                    if not work.future.done():
                        work.future.set_exception(error)

    def describe_deadlock(self) -> str:
        lines = ["deadlock: every unfinished rank waits on communication no rank will complete"]
        for state in self.ranks:
            if state.waiting:
                for work in state.waiting:
                    lines.append(f"  rank {state.rank} (t={state.clock * 1e3:.3f} ms) waits on {work.describe()}")
            elif state.finished:
                lines.append(f"  rank {state.rank} finished")
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
        """Run one coroutine per rank; the first failure cancels the rest and is re-raised."""
        self.loop = asyncio.get_running_loop()
        self.first_error: BaseException | None = None
        tasks = [asyncio.ensure_future(self._run_rank(make_coroutine, rank)) for rank in order]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if self.first_error is None:
                self.drain()
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.first_error is not None:
            raise self.first_error

    async def _run_rank(self, make_coroutine: Callable[[int], Coroutine], rank: int) -> None:
        state = self.ranks[rank]
        try:
            await make_coroutine(rank)
        except SimulationError as error:
            self._fail(error)
            raise
        except BaseException as error:
            task = asyncio.current_task()
            if isinstance(error, asyncio.CancelledError) and task is not None and task.cancelling():
                raise  # the engine stops this rank because another one failed
            if isinstance(error, MemoryError):  # the host ran out, not the simulated GPU: not the strategy's bug
                wrapped: SimulationError = ResourceError(
                    f"rank {rank}: MemoryError: the simulation ran out of real memory{user_frame(error)}; this "
                    f"step is too large to simulate within this process's memory limit")
            else:  # the strategy's own bug (CancelledError, SystemExit... included): which rank, which line
                said = f": {error}" if str(error) else ""
                wrapped = StrategyError(f"rank {rank}: {type(error).__name__}{said}{user_frame(error)}")
            wrapped.__cause__ = error
            self._fail(wrapped)
            raise wrapped from error
        finally:
            if not state.finished:
                self.rank_finished(state)

    def _fail(self, error: BaseException) -> None:
        if self.first_error is None:
            self.first_error = error


def _transfer_key(transfer: Transfer) -> tuple:
    return transfer.key


def user_frame(error: BaseException) -> str:
    """' (at strategy.py:42 in train)': the innermost traceback frame outside the simulator."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = ""
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(here) and "asyncio" not in filename \
                and not filename.startswith("<frozen"):  # the import machinery is not the user's line
            found = f" (at {os.path.basename(filename)}:{lineno} in {frame.f_code.co_name})"
    return found

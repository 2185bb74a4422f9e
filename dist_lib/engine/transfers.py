"""Transfers in flight and the links they share, in virtual time.

Every collective and every point-to-point message is a `Transfer`: it becomes ready at a known start
(its members have issued it and its communicator's stream is free), needs `duration` seconds of
transfer when it has its links to itself (costs/), and crosses a set of links (its `usage`: a GPU's
NVLink/PCIe port each way, a GPU's or a node's NICs each way), wanting some bytes/s of each (the rate it
moves at alone, `Cluster.collective_usage`, `Cluster.p2p_usage`). Concurrent transfers share a link: a
link of capacity c whose transfers want u_1, u_2, ... bytes/s in all more than c gives each the share
c / sum(u) of what it wants, so a transfer progresses at min(1, c / load) over the most loaded of its
links (`network.shared_speed`), a
flow-level model of the kind SimGrid uses (Velho et al. 2013, "On the validity of flow-level TCP network
models for grid and cloud simulations"), here with proportional rather than max-min shares. Rates are
recomputed whenever a transfer starts or ends on one of the links.

A transfer's end is provisional until no rank can still start a transfer that would share its links
before that end. The engine asks for completions only at quiescence (every unfinished rank blocked):
then no rank can issue anything before the earliest completion, as every rank's next issue comes after
a completion it waits for. `Scheduler.next_completions` runs the fluid model up to the earliest end and
returns the transfers that end then; their waiters wake with clocks at or after it. Loads are whole
bytes/s, so their sums are exact and the shares, and hence every time, are the same whatever order
the ranks ran in.

`Transfer` and `Scheduler` are the C twins (`_transfers.c`) when the extension was built, with the same
ends to the bit; the classes below stay the specification, and `DIST_SANDBOX_PURE_PYTHON=1` uses them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


from dist_lib.costs import network
from dist_lib.native import twin


class Transfer:
    """One collective or message: when it may start, its time alone, the links it uses."""

    __slots__ = ("start", "usage", "finish", "owner", "key", "left", "speed", "since", "end", "version", "seq")

    def __init__(self, start: float, duration: float, usage: tuple[tuple[int, int], ...],
                 finish: Callable[[Any, Transfer], None], owner: Any, key: tuple):
        self.start = start
        self.usage = usage  # ((link id, bytes/s wanted), ...)
        self.finish = finish  # finish(engine, transfer), once its end is final
        self.owner = owner  # the collective or the message
        # orders transfers that end at the same instant by what they are, not by when their ranks
        # ran: (0, group, seq) or (1, (src, dst), message number)
        self.key = key
        self.left = duration  # seconds of transfer still to do at full speed, as of `since`
        self.speed = 1.0
        self.since = start
        self.end = start + duration  # projected while in flight
        self.version = 0
        self.seq = 0


class Scheduler:
    """Transfers waiting to start and in flight, advanced in virtual time order."""

    def __init__(self, capacity: list[int]):
        self.capacity = capacity  # bytes/s each link carries (a port, a GPU's NIC, a node's NICs together)
        self.load = [0] * len(capacity)  # bytes/s wanted by the transfers in flight on each link
        self.on_link: list[list[Transfer]] = [[] for _ in capacity]
        self.waiting: list[tuple[float, int, Transfer]] = []  # not started: (start, seq, transfer)
        self.ends: list[tuple[float, int, int, Transfer]] = []  # in flight: (end, seq, version, transfer)
        self.now = 0.0  # (set back only by a split step's handover: `run/split.py`)
        self.count = 0

    def add(self, transfer: Transfer) -> None:
        """A transfer whose start is known (never before `now`, see the module docstring)."""
        self.count += 1
        transfer.seq = self.count
        if transfer.start < self.now:
            transfer.start = transfer.since = self.now
        heapq.heappush(self.waiting, (transfer.start, transfer.seq, transfer))

    def pending(self) -> list[Transfer]:
        """Every transfer not ended, waiting (version 0) or in flight, in the order they were added: what
        one half of a split step hands to the other's scheduler (`run/split.py`)."""
        flying = [t for _, _, version, t in self.ends if version == t.version]
        return sorted(flying + [t for _, _, t in self.waiting], key=_seq)

    def adopt(self, transfer: Transfer) -> None:
        """A transfer in flight on another scheduler, with its progress (`left` as of `since`, `speed`,
        projected `end`, `version`): it adds its loads and keeps its projection. Exact when no transfer here
        shares its links before its `since` (the halves of a split step share none)."""
        self.count += 1
        transfer.seq = self.count
        for link, rate in transfer.usage:
            self.load[link] += rate
            self.on_link[link].append(transfer)
        heapq.heappush(self.ends, (transfer.end, transfer.seq, transfer.version, transfer))

    def next_completions(self) -> list[Transfer]:
        """Advance to the earliest end of a transfer and return every transfer that ends then (empty when
        nothing is left). Starts at that same instant are taken after the ends."""
        waiting, ends = self.waiting, self.ends
        while True:
            while ends and ends[0][2] != ends[0][3].version:  # superseded projections
                heapq.heappop(ends)
            if not ends and not waiting:
                return []
            if waiting and (not ends or waiting[0][0] < ends[0][0]):
                start, _, transfer = heapq.heappop(waiting)
                self.now = start
                self._begin(transfer)
                continue
            return self._end_first()

    def completions_until(self, horizon: float, barred: bytes = b"") -> list[Transfer]:
        """`next_completions`, but never past `horizon` nor onto a barred link (`barred[link]` nonzero): the
        starts before `horizon` are begun, unless one wants a barred link (then it and everything after it
        stay as they are), and the transfers that end first are returned if they end at or before
        `horizon`; else nothing (`now` stays at or before both). What one half of a split step completes
        on its own while the transfers between the halves are held apart (`run/split_parting.py`): those in
        flight on the barred links end at `horizon` at the earliest, the others start there at the
        earliest, and until then this half's links carry its own transfers only. `next_completions` is this
        with an infinite horizon and nothing barred (the C twin runs both so)."""
        if barred and len(barred) != len(self.capacity):
            raise ValueError(f"completions_until: barred has {len(barred)} bytes for {len(self.capacity)} links")
        waiting, ends = self.waiting, self.ends
        while True:
            while ends and ends[0][2] != ends[0][3].version:  # superseded projections
                heapq.heappop(ends)
            if waiting and waiting[0][0] < horizon and (not ends or waiting[0][0] < ends[0][0]):
                if barred and any(barred[link] for link, _ in waiting[0][2].usage):
                    return []
                start, _, transfer = heapq.heappop(waiting)
                self.now = start
                self._begin(transfer)
                continue
            if not ends or ends[0][0] > horizon:
                return []
            return self._end_first()

    def _end_first(self) -> list[Transfer]:
        """End the transfers whose (current) projected end is the earliest; now moves to it."""
        ends = self.ends
        end = ends[0][0]
        self.now = end
        done: list[Transfer] = []
        while ends and ends[0][0] == end:
            _, _, version, transfer = heapq.heappop(ends)
            if version == transfer.version:
                transfer.end = end
                transfer.version = -1  # ended: not to be projected again
                done.append(transfer)
        for transfer in done:
            self._leave(transfer)
        return done

    def _begin(self, transfer: Transfer) -> None:
        load, on_link = self.load, self.on_link
        touched: list[Transfer] = []
        for link, rate in transfer.usage:
            load[link] += rate
            peers = on_link[link]
            if peers:
                touched += peers
            peers.append(transfer)
        # its first projection (`_reproject` for a transfer that has done nothing yet)
        now = transfer.since = self.now
        speed = transfer.speed = network.shared_speed(transfer.usage, self.capacity, load)
        transfer.version = 1
        transfer.end = now + transfer.left / speed
        heapq.heappush(self.ends, (transfer.end, transfer.seq, 1, transfer))
        if touched:
            self._reproject_all(touched)

    def _leave(self, transfer: Transfer) -> None:
        load, on_link = self.load, self.on_link
        touched: list[Transfer] = []
        for link, rate in transfer.usage:
            load[link] -= rate
            peers = on_link[link]
            peers.remove(transfer)
            if peers:
                touched += peers
        if touched:
            self._reproject_all(touched)

    def _reproject_all(self, transfers: list[Transfer]) -> None:
        seen: set[int] = set()
        for t in transfers:
            if t.version >= 0 and id(t) not in seen:
                seen.add(id(t))
                self._reproject(t)

    def _reproject(self, transfer: Transfer) -> None:
        """Settle the work done since the last change at the old speed, then project the end at the new."""
        now = self.now
        if now > transfer.since:
            transfer.left -= (now - transfer.since) * transfer.speed
            if transfer.left < 0.0:
                transfer.left = 0.0
            transfer.since = now
        speed = network.shared_speed(transfer.usage, self.capacity, self.load)
        if speed == transfer.speed and transfer.version:
            return  # nothing changed for it: its projected end stands
        transfer.speed = speed
        transfer.version += 1
        transfer.end = now + transfer.left / speed
        heapq.heappush(self.ends, (transfer.end, transfer.seq, transfer.version, transfer))


def _seq(transfer: Transfer) -> int:
    return transfer.seq


PythonTransfer, PythonScheduler = Transfer, Scheduler  # the specification, whichever twin runs
_C = twin("transfers")
if _C is not None:  # else (not built, stale, switched off, or DIST_SANDBOX_PURE_PYTHON): the classes above
    Scheduler, Transfer = _C.Scheduler, _C.Transfer  # type: ignore[misc]  # noqa: F811

"""Conservative look-ahead for a step in two processes (`split.py`): when the two halves may part again
after running in lock step, each completing its own transfers on its own until a given instant.

In lock step every completion that holds one of the second process's transfers costs a round trip. But
the halves share no link, and only what joins them (a collective or message between the halves) couples
their transfers. When nothing joining them is in flight or waiting to be resolved, every transfer between
the halves that has been resolved waits for a start already known, the earliest of them `horizon`, and
the transfers each half holds move on links that only its own transfers share until then. So at such a
quiescence (both halves blocked, everything each issued known to the first) the first hands the second
its transfers with their progress and both run alone again, as before the first crossing, up to
`horizon` (`Scheduler.completions_until`: the ends at or before it, the starts before it), or until one
of its ranks issues something between the halves, whichever comes first; then they go on in lock step
(the second hands its transfers over again). This is the lower-bound reasoning of conservative parallel
discrete-event simulation (Chandy & Misra 1979, "Distributed simulation: a case study in design and
verification of distributed programs"), with the known start of the next joining transfer as the bound.

The halves then hold Python schedulers (the C one has no `completions_until`): the same ends to the bit.
"""

from __future__ import annotations

import math
from typing import Any

from dist_lib.comm.groups import CrossGroup
from dist_lib.engine.transfers import PythonScheduler


def horizon(coordinator: Any) -> float | None:
    """Both halves blocked, the worker's issues all known: the instant up to which the halves may part
    (`math.inf` when no transfer between them is scheduled), or None when they may not, or when parting
    would not spare a round trip (no transfer of the worker's ends or starts before it)."""
    c = coordinator
    engine = c.engine
    if c.peer_finished or c.instant or engine.instant_transfers or c.waiting_local or c.waiting_remote:
        return None
    if any(c.remote_ends.values()):
        return None
    cross = c.cross_groups()
    if any(group.pending or group.ready for group in cross):
        return None
    for channel in c.cross_channels():
        if channel.sends or channel.recvs or channel.ready:
            return None
    pending = engine.transfers.pending()
    until = math.inf
    for transfer in pending:
        if transfer.finish is c.CROSS:
            if transfer.version != 0:  # in flight: its end depends on both halves' loads
                return None
            until = min(until, transfer.start)
    if until <= engine.transfers.now:
        return None
    never = c.NEVER
    for transfer in pending:  # (projections: a start may delay an end, which is safe either way)
        if transfer.finish is never and (transfer.end <= until if transfer.version else transfer.start < until):
            return until
    return None


def part(coordinator: Any, until: float) -> None:
    """The first half's side: keep its own transfers (on a new scheduler, each with its progress), hold the
    transfers between the halves until it rejoins, and send the worker its own and the horizon."""
    c = coordinator
    engine = c.engine
    old = engine.transfers
    scheduler = PythonScheduler(old.capacity)
    scheduler.now = old.now
    theirs, held = [], []
    for transfer in old.pending():  # (in the order they were added: the order starts at one instant keep)
        if transfer.finish is c.NEVER:
            theirs.append((transfer.owner.id, transfer.start, transfer.left, transfer.speed, transfer.since,
                           transfer.end, transfer.version))
        elif transfer.finish is c.CROSS:
            held.append(transfer)
        elif transfer.version == 0:
            scheduler.add(transfer)
        else:
            scheduler.adopt(transfer)
    engine.transfers = scheduler
    c.held, c.horizon, c.alone, c.joining, c.peer_running, c.apart = held, until, True, False, True, True
    c.parts += 1
    c.conn.send(("part", until, old.now, theirs))


def take_back(worker: Any, message: tuple) -> None:
    """The worker's side of `part`: its transfers, with their progress, on a scheduler of its own again;
    its op ids from its own count again (`EventLog.renumber` orders them after the step)."""
    _, until, now, theirs = message
    engine = worker.engine
    made = worker.outbox.transfers
    scheduler = PythonScheduler(worker.capacity)
    scheduler.now = now
    for number, start, left, speed, since, end, version in theirs:
        transfer = made.pop(number)
        transfer.start, transfer.left, transfer.speed, transfer.since, transfer.end = start, left, speed, since, end
        transfer.version = version
        if version == 0:
            scheduler.add(transfer)
        else:
            scheduler.adopt(transfer)
    engine.transfers = scheduler
    engine.next_op_id = worker.own_op_id
    worker.horizon, worker.alone, worker.apart = until, True, True


def cross_groups(engine: Any) -> list:
    """The groups with members in both halves."""
    return [group for group in engine.groups.values() if group.__class__ is CrossGroup]

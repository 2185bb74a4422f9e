"""Conservative look-ahead for a step in two processes (`split.py`): when the two halves may part again
after running in lock step, each completing its own transfers on its own up to a common instant.

In lock step every completion that holds one of the second process's transfers costs a round trip. But
the halves share no link: only what joins them (a collective or message between the halves) ties their
transfers together, and a transfer's speed depends only on the loads of its own links. So at a
quiescence in lock step (both halves blocked, all they issued known to the first) where no op between
the halves waits for members, the first process holds the transfers between the halves apart: those in
flight bar their links to both halves, and their projected ends stand as long as no load on those links
changes; those scheduled start at known instants. The earliest of these ends and starts is the
`horizon`. Until it, each half's links not barred carry only its own transfers, and no rank of either
half can issue anything sooner than its own clock: so the first hands the second its transfers with
their progress, and each completes its own alone (`Scheduler.completions_until`: the ends at or before
the horizon, the starts before it on links not barred), until the horizon, a start on a barred link, or
a rank of its own issuing something between the halves; then they go on in lock step, the second
handing its transfers over again and the held ones rejoining the first's scheduler as they were. This is
the lower-bound reasoning of conservative parallel discrete-event simulation (Chandy & Misra 1979,
"Distributed simulation: a case study in design and verification of distributed programs"; Fujimoto
1990, "Parallel discrete event simulation", for look-ahead), with the next end or start of a transfer
between the halves as the bound.

Parting needs the second process's first event to be one it can take alone (else it would stop at once
and the two would part again at the same state forever). Each half numbers the op ids of what it
completes alone on its own (`EventLog.renumber` orders them after the step); with a transfer of zero
duration in the step (op ids ordered by issue there) the halves do not part.
"""

from __future__ import annotations

import math
from typing import Any

from dist_lib.comm.groups import CrossGroup
from dist_lib.engine.transfers import Scheduler


ENABLED = True
"""Whether the halves part again at all (False: lock step from the first crossing to the end, as before
this look-ahead; the tests compare both)."""


def horizon(coordinator: Any) -> tuple[float, bytes] | None:
    """Both halves blocked, the worker's issues all known: the instant up to which the halves may part
    (`math.inf` when nothing between them is scheduled) and the links they must leave alone (a byte a
    link, nonzero for those of the transfers between them in flight); None when they may not part, or
    when parting would not spare a round trip (no transfer of the worker's ends or starts before it)."""
    c = coordinator
    engine = c.engine
    if not ENABLED or c.peer_finished or c.instant or engine.instant_transfers or c.waiting_local or \
            c.waiting_remote or any(c.remote_ends.values()):
        return None
    if any(group.pending for group in c.cross_groups()):  # (issued by some members here: not resolved)
        return None
    for channel in c.cross_channels():
        if channel.sends or channel.recvs:  # (a message between the halves not paired yet)
            return None
    scheduler = engine.transfers
    pending = scheduler.pending()
    until, barred, cross = math.inf, None, c.CROSS
    for transfer in pending:
        if transfer.finish is cross:
            if transfer.version == 0:
                until = min(until, transfer.start)
                continue
            until = min(until, transfer.end)  # (its projection stands while no load on its links changes)
            if barred is None:
                barred = bytearray(len(scheduler.capacity))
            for link, _ in transfer.usage:
                barred[link] = 1
    if until <= scheduler.now:
        return None
    if barred is not None:
        for transfer in pending:  # (a transfer of a half in flight on those links: its end and theirs are tied)
            if transfer.version > 0 and transfer.finish is not cross and \
                    any(barred[link] for link, _ in transfer.usage):
                return None
    # the worker's first event (ends before starts at one instant, starts in the order they came) must be
    # one it can take alone: an end by `until`, or a start before it on links not barred (projections: a
    # start may delay an end, and then the worker stops having begun it, which is progress too)
    first, never = (math.inf, 2, 0, False), c.NEVER
    for transfer in pending:
        if transfer.finish is never:
            event = (transfer.end, 0, transfer.seq, False) if transfer.version else \
                (transfer.start, 1, transfer.seq, barred is not None and any(barred[link] for link, _ in transfer.usage))
            if event < first:
                first = event
    if (first[0] < until or first[0] == until and first[1] == 0) and not first[3]:
        return until, b"" if barred is None else bytes(barred)
    return None


def part(coordinator: Any, until: float, barred: bytes) -> None:
    """The first half's side: keep its own transfers (on a new scheduler, each with its progress), hold the
    transfers between the halves until it rejoins (`rejoin`), and send the worker its own, the horizon
    and the barred links."""
    c = coordinator
    engine = c.engine
    old = engine.transfers
    scheduler = Scheduler(old.capacity)
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
    c.held, c.horizon, c.barred = held, until, barred
    c.alone, c.joining, c.peer_running, c.apart = True, False, True, True
    c.parts += 1
    c.conn.send(("part", until, barred, old.now, theirs))


def rejoin(coordinator: Any) -> None:
    """Lock step again: the transfers between the halves join the first half's scheduler as they were (no
    load on their links changed meanwhile: the halves left those links alone)."""
    scheduler = coordinator.engine.transfers
    for transfer in coordinator.held:
        if transfer.version == 0:
            scheduler.add(transfer)
        else:
            scheduler.adopt(transfer)
    coordinator.held = []


def take_back(worker: Any, message: tuple) -> None:
    """The worker's side of `part`: its transfers, with their progress, on a scheduler of its own again;
    its op ids from its own count again (`EventLog.renumber` orders them after the step)."""
    _, until, barred, now, theirs = message
    engine = worker.engine
    made = worker.outbox.transfers
    scheduler = Scheduler(worker.capacity)
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
    worker.horizon, worker.barred, worker.alone, worker.apart = until, barred, True, True


def cross_groups(engine: Any) -> list:
    """The groups with members in both halves."""
    return [group for group in engine.groups.values() if group.__class__ is CrossGroup]

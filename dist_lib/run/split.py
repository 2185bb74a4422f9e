"""One step in two processes (`simulate(..., workers=2)`): each runs the coroutines of half the ranks,
whole nodes.

Each half first runs alone: at its quiescences it completes its own transfers on its own scheduler, as
one process would, for as long as no rank in it has issued a collective or message between the halves
(`_Half.run_alone`: the halves share no link, and what joins them cannot start before both issued it).
Each half numbers the op ids of what it completes alone on its own; they are numbered again after the
step in the order one process gives them (`EventLog.renumber`).

Then the two go on in lock step, parting again wherever nothing joins them for a while
(`split_parting.py`), and the first process (the coordinator) keeps the step's one transfer
scheduler: the second (the worker, `split_worker.py`) hands it every transfer of its own not ended, those in flight with
their progress (`Scheduler.adopt`), and reports each of its quiescences, with the transfers its ranks
made since. Between two quiescences every unfinished rank runs to its next wait whatever the others do
(engine/core.py), so the ranks of the two processes run side by side there; once both halves are blocked,
the coordinator runs the links to the next completions exactly as one process would, finishes its own
transfers and sends the worker the worker's, in the order one process would finish them. The
scheduler sees the same transfers, so step time, events, memory and checks are one process's (the
worker's events join the coordinator's log after the step; transfers that start at one instant are
begun in another order, which may move an end in its last bit).

A collective on a group with members in both halves is resolved by the coordinator once each half's
members issued it: the worker sends what its members issued (the tensors' fields), the coordinator
checks and combines them, times the collective, logs every member's event, and sends the worker its
members' results. A message between the halves is paired, timed and logged there too, and its receiver
gets what was sent. Lock step makes the processes wait for each other at every quiescence, so the
halves are best replicas, which meet only in their gradient all-reduces at the end (`worker_ranks`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from dist_lib.comm import p2p
from dist_lib.comm.collectives import _fields, _Pending, _values, collective_duration, release
from dist_lib.comm.groups import Collective, CrossGroup
from dist_lib.comm.rules import Reduced, check_match, combine
from dist_lib.errors import DeadlockError, SimulationError
from dist_lib.engine.transfers import Transfer
from dist_lib.run import split_parting
from dist_lib.run.worker_process import Link


class _Shipped:
    """The owner of a transfer the worker made: its number there."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id


class Standin:
    """A tensor of the other half, as its fields: what checking and combining a collective reads."""

    def __init__(self, cls: type, fields: dict, nbytes: int, text: str):
        self.__dict__.update(fields)
        self._cls, self.nbytes, self.kind, self._text = cls, nbytes, cls.kind, text

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # combine tells tensors by class
        return self._cls

    def __repr__(self) -> str:
        return self._text


class RemoteWork:
    """A member's side of a collective, issued in the other half."""

    __slots__ = ("rank", "issue", "input", "result", "future")

    def __init__(self, rank: int, issue: float, input: Standin, result: Standin | None):
        self.rank, self.issue, self.input, self.result, self.future = rank, issue, input, result, None


def _describe(t: Any) -> tuple:
    return (t.__class__, _fields(t), t.nbytes, repr(t))


class _Half:
    """What both processes share: the link to the other one, and which ranks are local."""

    def __init__(self, engine: Any, conn: Link, ranks: list[int]):
        self.engine, self.conn = engine, conn
        self.mine = bytearray(engine.world_size)
        for r in ranks:
            self.mine[r] = 1
        engine.finished = engine.world_size - len(ranks)  # (the other half's: a quiescence here is this half's)
        self.issued_there: dict[tuple, set] = {}  # for a deadlock's description: see `issued_here`
        self.alone = True  # completing its own transfers on its own scheduler (`run_alone`)
        self.apart = False  # the halves parted since this half last heard from the other
        self.horizon: float | None = None  # after the halves parted again: the end of running alone (`split_parting`)
        self.barred = b""  # and the links to leave alone meanwhile

    def crossed(self) -> bool:
        """Has a rank here issued a collective or message between the halves?"""
        raise NotImplementedError

    def run_alone(self) -> bool:
        """Quiescence here while no rank here waits on the other half: complete this half's transfers on its
        own scheduler until one wakes a rank (True), or until a rank here has issued something between the
        halves, nothing is left, or every rank returned (False: the step goes on in lock step).

        Exact because a transfer's speed depends on its own links alone (`engine/transfers.py`), the halves are
        whole nodes and share no link, and what joins the halves cannot start before both issued it: a
        collective between them starts after its last member's issue, which comes after the quiescence at
        which this half stops running alone. After the halves parted again (`split_parting.py`), only up to
        `horizon` (the earliest end or start of a transfer between them) and not onto `barred` links."""
        engine = self.engine
        transfers = engine.transfers
        horizon, barred = self.horizon, self.barred
        while engine.blocked + engine.finished == engine.world_size:
            if self.crossed():
                break
            done = transfers.next_completions() if horizon is None else transfers.completions_until(horizon, barred)
            if not done:
                break
            engine.complete(done)
        else:
            return True
        self.alone = False
        return False

    def local_members(self, ranks: tuple[int, ...]) -> int:
        mine = self.mine
        return sum(mine[r] for r in ranks)

    def is_local(self, rank: int) -> bool:
        return self.mine[rank] == 1

    def issued_here(self) -> dict[tuple, set]:
        """(group, seq) -> the ranks here that issued it, for every collective between the halves that some
        rank here issued and that is not resolved: the other half's deadlock description names the members
        that have not issued it as one process does, not every member it cannot see."""
        issued = {}
        for group in self.engine.groups.values():
            if group.__class__ is CrossGroup:
                for seq, coll in group.pending.items():
                    issued[(group.ranks, seq)] = {w.rank for w in coll.works if w is not None and self.is_local(w.rank)}
        return issued

    def still_missing(self, coll: Collective, missing: list[int]) -> list[int]:
        """The members of `coll` in `missing` that have not issued it in either half."""
        there = self.issued_there.get((coll.group.ranks, coll.seq), ())
        return [r for r in missing if r not in there]

    def receive(self) -> Any:
        spin, self.apart = not self.apart, False  # (after parting, the other half may run alone for long)
        try:
            message = self.conn.recv(spin)
        except (EOFError, OSError):
            raise SimulationError("the other process of this workers=2 step ended without a word (killed, or "
                                  "out of memory?)") from None
        if message[0] == "error":
            raise message[1]
        return message


class Coordinator(_Half):
    """The first process: its ranks, the scheduler, and the resolution of cross collectives."""

    def __init__(self, engine: Any, conn: Link, ranks: list[int]):
        super().__init__(engine, conn, ranks)
        self.peer_running = True  # the worker runs its ranks: its next report is awaited before any completion
        self.peer_finished = False
        self.usages: list[tuple] = []
        self.out: list[tuple] = []  # the worker's completions, in the order one process makes them
        self.waiting_local: dict[tuple, Collective] = {}  # (group, seq) -> collective this half issued
        self.waiting_remote: dict[tuple, tuple] = {}  # (group, seq) -> what the worker's members issued
        self.remote_ends: dict[tuple, deque] = {}  # (src, dst) -> the worker's sends or receives not yet paired
        self.joining = False  # a rank here issued something between the halves (`crossed`)
        self.instant = False  # the worker made a transfer of zero duration (no parting then: `split_parting`)
        self.held: list = []  # transfers between the halves, while the halves run apart (`split_parting.part`)
        self.parts = 0  # times the halves parted again
        self._crossing: tuple = (-1, [], [])  # (groups and channels seen, cross groups, cross channels)

    # ---- the quiescences of both halves ----

    def crossed(self) -> bool:
        return self.joining

    CROSS: Any = None  # (`_cross` and `_never` for `split_parting`, set below)
    NEVER: Any = None

    def advance(self) -> None:
        """Both halves blocked: complete the earliest transfers until one wakes a rank here; none left
        while a rank waits is a deadlock. Where nothing joins the halves for a while, part again
        (`split_parting.py`)."""
        engine = self.engine
        if self.alone and self.run_alone():
            return
        while engine.blocked + engine.finished == engine.world_size:
            if self.peer_running:
                self._take_report()
            parting = split_parting.horizon(self)
            if parting is not None:
                split_parting.part(self, *parting)
                if self.run_alone():
                    return
                continue
            done = engine.transfers.next_completions()
            if not done:
                if engine.blocked == 0 and self.peer_finished:
                    return
                raise DeadlockError(self._describe_deadlock())
            self._complete(done)

    def run_alone(self) -> bool:
        if super().run_alone():
            return True
        split_parting.rejoin(self)
        return False

    def cross_groups(self) -> list:
        """The groups with members in both halves, and the channels between them (as of the last call that
        found new ones)."""
        engine = self.engine
        seen = len(engine.groups) + len(engine.channels)
        if self._crossing[0] != seen:
            channels = [ch for ch in engine.channels.values() if self.mine[ch.src] != self.mine[ch.dst]]
            self._crossing = (seen, split_parting.cross_groups(engine), channels)
        return self._crossing[1]

    def cross_channels(self) -> list:
        self.cross_groups()
        return self._crossing[2]

    def drain(self) -> None:
        """Every rank here returned: serve the worker until its ranks return too and nothing is in flight."""
        if self.alone:
            self.run_alone()
        self.advance()
        self.conn.send(("end",))

    def _take_report(self) -> None:
        _, finished, usages, transfers, issues, handover = self.receive()
        self.usages += usages
        scheduler, usage = self.engine.transfers, self.usages
        if handover is not None:  # the worker ran alone until now: its transfers in flight, with their progress
            now, flying = handover
            scheduler.now = min(scheduler.now, now)  # (nothing here touches their links: see `run_alone`)
            for number, start, left, u, key, speed, since, end, version in flying:
                self.instant = self.instant or start == end
                transfer = Transfer(start, left, usage[u], _never, _Shipped(number), key)
                transfer.speed, transfer.since, transfer.end, transfer.version = speed, since, end, version
                scheduler.adopt(transfer)
        add = scheduler.add
        for number, start, left, u, key in transfers:
            if left == 0.0:
                self.instant = True
            add(Transfer(start, left, usage[u], _never, _Shipped(number), key))
        for record in issues:
            if record[0] == "send" or record[0] == "recv":
                self._remote_message(*record)
            else:
                self._remote_joined(record)
        self.peer_finished, self.peer_running = finished, False

    def _complete(self, done: list) -> None:
        """Finish transfers that end at one instant in key order, as one process does; the worker's are
        sent to it first, with op ids from here (numbered again after the step: `join_events`), so that
        it finishes them while this process finishes its own."""
        engine = self.engine
        if len(done) > 1:
            done.sort(key=_key)
        local = []
        for transfer in done:
            if transfer.finish is _never:  # the worker's
                self.out.append((transfer.owner.id, transfer.start, transfer.end, engine.new_op_id()))
            elif transfer.finish is _cross:  # a collective or message between the halves
                if transfer.owner.__class__ is Collective:
                    self._finish_collective(engine, transfer)
                else:
                    self._finish_message(engine, transfer)
            else:
                local.append(transfer)
        if self.out:
            self.conn.send(("done", self.out))
            self.out = []
            self.peer_running = True
        for transfer in local:
            transfer.finish(engine, transfer)

    def join_events(self, events: tuple) -> None:
        """The worker's events (`EventLog.export`) after this half's, every op id numbered as one process
        numbers it (each half numbered its own while it ran alone)."""
        log = self.engine.events
        log.extend(events)
        log.renumber()

    def _describe_deadlock(self) -> str:
        self.conn.send(("describe", self.issued_here()))
        _, theirs, self.issued_there = self.receive()
        ours = self.engine.describe_deadlock().splitlines()
        return "\n".join(ours + theirs)

    # ---- collectives with members in both halves ----

    def joined(self, coll: Collective) -> None:
        self.joining = True
        key = (coll.group.ranks, coll.seq)
        record = self.waiting_remote.pop(key, None)
        if record is None:
            self.waiting_local[key] = coll
        else:
            self._resolve(coll, record)

    def _remote_joined(self, record: tuple) -> None:
        key = (record[0], record[1])
        coll = self.waiting_local.pop(key, None)
        if coll is None:
            self.waiting_remote[key] = record
        else:
            self._resolve(coll, record)

    def _resolve(self, coll: Collective, record: tuple) -> None:
        """Both halves issued `coll`: check the worker's members against the first, then combine, time and
        start it as `comm._resolve_ready` does."""
        _, _, op, members = record
        for pos, rank, issue, (cls, fields, nbytes, text), result in members:
            tensor = Standin(cls, fields, nbytes, text)
            first = coll.first.input
            if op != coll.op or cls is not first.__class__ or tensor.layer != first.layer or nbytes != first.nbytes:
                check_match(coll, op, tensor, rank)  # raises, naming both ranks and tensors
            coll.works[pos] = RemoteWork(rank, issue, tensor, None if result is None else Standin(*result))
            coll.issued += 1
        engine, group = self.engine, coll.group
        coll.results, coll.nbytes, coll.label = combine(engine, coll, [w.input for w in coll.works])
        coll.duration = collective_duration(engine, coll)
        del group.pending[coll.seq]
        if group.busy:
            group.ready.append(coll)
        else:
            self._start(coll)

    def _start(self, coll: Collective) -> None:
        group = coll.group
        group.busy = True
        start = max(max(w.issue for w in coll.works), group.free)
        self.engine.schedule(Transfer(start, coll.duration, group.usage, _cross, coll, (0, group.ranks, coll.seq)))

    def _finish_collective(self, engine: Any, transfer: Any) -> None:
        """`comm._finish` for a cross collective: every member's event is logged here; the worker's
        members' results go to it."""
        coll: Collective = transfer.owner
        group, start, end = coll.group, transfer.start, transfer.end
        works, first = coll.works, coll.works[0].input
        op, layer, op_id, nbytes, label = coll.op, first.layer, engine.new_op_id(), coll.nbytes, coll.label
        group.free = end
        group.busy = False
        append, peers = engine.events.append, group.ranks
        theirs, ours = [], []
        for pos, (work, result) in enumerate(zip(works, coll.results)):
            append((work.rank, op, "collective", start, end, layer, result.samples, nbytes, 0.0, peers, op_id, label))
            if work.__class__ is RemoteWork:
                # what the worker's member is left: the reduced fields, or the fields `combine` set on the
                # output it allocated (none for TP pieces gathered into a whole)
                theirs.append((pos, (result.samples, result.tp_parts, result.tp_size) if result.__class__ is Reduced
                               else (result.samples, result.shards, result.num_shards) if hasattr(result, "shards")
                               else None))
                continue
            ours.append(work)
            _member_done(engine, work, end, result)
        self.out.append(("x", group.ranks, coll.seq, end, theirs))
        coll.works, coll.first, coll.results = [], None, []
        release(engine, ours, end)
        if group.ready:
            self._start(group.ready.pop(0))

    # ---- messages between the halves ----

    def issued(self, channel: Any, work: Any) -> None:
        self.joining = True
        self._pair(channel)

    def _remote_message(self, op: str, src: int, dst: int, issue: float, sent: tuple | None) -> None:
        channel = p2p._channel(self.engine, src, dst)
        end = RemoteWork(dst if sent is None else src, issue, None if sent is None else _SentTensor(*sent), None)
        self.remote_ends.setdefault(channel.peers, deque()).append(end)
        self._pair(channel)

    def _pair(self, channel: Any) -> None:
        """Pair the channel's sends and receives in order, as `p2p._match` does, and start or queue them."""
        remote = self.remote_ends.get(channel.peers)
        ours_send = self.is_local(channel.src)
        local = channel.sends if ours_send else channel.recvs
        while remote and local:
            send, recv = (local.popleft(), remote.popleft()) if ours_send else (remote.popleft(), local.popleft())
            if channel.busy:
                channel.ready.append((send, recv))
            else:
                p2p._start(self.engine, channel, send, recv, _cross)

    def _finish_message(self, engine: Any, transfer: Any) -> None:
        """`p2p._finish` for a message between the halves: both events are logged here; the worker's end
        completes there."""
        channel, send, recv = transfer.owner
        transfer.owner = None
        start, end = transfer.start, transfer.end
        channel.free = end
        channel.busy = False
        op_id = engine.new_op_id()
        tensor = send.input
        append = engine.events.append
        for rank, op in ((send.rank, "send"), (recv.rank, "recv")):
            append((rank, op, "p2p", start, end, tensor.layer, tensor.samples, tensor.nbytes, 0.0, channel.peers,
                    op_id, tensor.kind))
        if send.__class__ is RemoteWork:
            recv.result = _pending(*send.input.pending)
            landing = p2p.received(engine, recv, end)
            del recv
            if landing is not None:
                p2p.landed(*landing)
            self.out.append(("p", channel.peers, end, None))
        else:
            pending = (tensor.__class__, _values(tensor), tensor.nbytes, tensor.layer)
            del tensor
            p2p.sent(engine, send, end)
            self.out.append(("p", channel.peers, end, pending))
        if channel.ready:
            p2p._start(engine, channel, *channel.ready.popleft(), _cross)


def _member_done(engine: Any, work: Any, end: float, result: Any) -> None:
    """A member's side of a collective between the halves ended (`comm._finish` for one member)."""
    state = engine.ranks[work.rank]
    if end > state.comm_end:
        state.comm_end = end
    work.end = end
    work.result = result
    if work.future is not None:
        engine.wake(work)


class _SentTensor:
    """What the coordinator needs of a tensor the worker sends: its event's fields and how to make it
    on the receiver."""

    __slots__ = ("pending", "layer", "samples", "nbytes", "kind")

    def __init__(self, pending: tuple, layer: int, samples: int, nbytes: int, kind: str):
        self.pending, self.layer, self.samples, self.nbytes, self.kind = pending, layer, samples, nbytes, kind


def _pending(cls: type, values: tuple, nbytes: int, layer: int) -> _Pending:
    pending = _Pending.__new__(_Pending)
    pending.cls, pending.values, pending.nbytes, pending.layer = cls, values, nbytes, layer
    return pending


def _cross(engine: Any, transfer: Any) -> None:  # pragma: no cover - finished by the coordinator
    raise AssertionError("a transfer between the halves of a split step finished by its own function")


def _never(engine: Any, transfer: Any) -> None:  # pragma: no cover - finished by its owner's class
    raise AssertionError("a transfer of a split step finished by its own function")


def _key(transfer: Any) -> tuple:
    return transfer.key


Coordinator.CROSS, Coordinator.NEVER = staticmethod(_cross), staticmethod(_never)

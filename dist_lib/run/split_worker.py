"""The second process of a step in two processes (`split.py`): its ranks run alone, then report each
quiescence to the first process and finish what it sends back."""

from __future__ import annotations

from typing import Any

from dist_lib.comm import p2p
from dist_lib.comm.rules import Reduced
from dist_lib.comm.collectives import _values, release
from dist_lib.comm.groups import Collective
from dist_lib.run import split_parting
from dist_lib.run.split import _describe, _Half, _member_done, _pending
from dist_lib.run.worker_process import Link

FIRST_WORKER_OP_ID = -2**31  # the worker numbers what it completes alone from here (the coordinator from 0)


class Worker(_Half):
    """The second process: its ranks; its transfers and cross-collective issues go to the coordinator."""

    def __init__(self, engine: Any, conn: Link, ranks: list[int]):
        super().__init__(engine, conn, ranks)
        self.outbox = Outbox()  # the scheduler's stand-in once the transfers here are handed over
        self.handover: tuple | None = None
        self.issues: list[tuple] = []  # what its ranks issued of collectives and messages between the halves
        engine.next_op_id = FIRST_WORKER_OP_ID
        self.own_op_id = FIRST_WORKER_OP_ID  # its own count when it last handed over (`split_parting.take_back`)
        self.capacity: list[int] = []  # the links' capacities, for a scheduler of its own again

    def crossed(self) -> bool:
        return bool(self.issues)

    def advance(self) -> None:
        engine = self.engine
        while True:
            if self.alone:
                if self.run_alone():
                    return
                self._hand_over()
            while engine.blocked + engine.finished == engine.world_size:
                self._report(False)
                message = self._answer()
                if message[0] == "part":  # the halves part again (`split_parting.py`)
                    split_parting.take_back(self, message)
                    break
                self._apply(message)
            else:
                return

    def _hand_over(self) -> None:
        """Give the coordinator every transfer here not ended, in flight with its progress (reported with
        the next quiescence); from now on it completes them, in lock step with this process."""
        engine, outbox = self.engine, self.outbox
        scheduler = engine.transfers
        flying = []
        for transfer in scheduler.pending():
            if transfer.version == 0:  # waiting to start
                outbox.add(transfer)
            else:
                number, u = outbox.register(transfer)
                flying.append((number, transfer.start, transfer.left, u, transfer.key, transfer.speed, transfer.since,
                               transfer.end, transfer.version))
        self.handover = (scheduler.now, flying)
        self.own_op_id, self.capacity = engine.next_op_id, scheduler.capacity
        engine.transfers = outbox

    def drain(self) -> None:
        while True:
            if self.alone:
                self.run_alone()
                self._hand_over()
            self._report(True)
            message = self._answer()
            if message[0] == "end":
                return
            if message[0] == "part":  # (the first parts only with a second that has ranks running: not here)
                split_parting.take_back(self, message)
            else:
                self._apply(message)

    def joined(self, coll: Collective) -> None:
        self.issues.append(_joined_record(coll))

    def issued(self, channel: Any, work: Any) -> None:
        t = work.input
        sent = None if t is None else ((t.__class__, _values(t), t.nbytes, t.layer), t.layer, t.samples, t.nbytes,
                                       t.kind)
        self.issues.append((work.op, channel.src, channel.dst, work.issue, sent))

    def _report(self, finished: bool) -> None:
        outbox = self.outbox
        self.conn.send(("quiet", finished, outbox.new_usages, outbox.made, self.issues, self.handover))
        outbox.new_usages, outbox.made, self.issues, self.handover = [], [], [], None

    def _answer(self) -> Any:
        while True:
            message = self.receive()
            if message[0] == "describe":  # the coordinator found a deadlock: what the ranks here wait on
                self.issued_there = message[1]
                self.conn.send(("described", self.engine.describe_deadlock().splitlines()[1:], self.issued_here()))
                continue
            return message

    def _apply(self, message: tuple) -> None:
        engine = self.engine
        made = self.outbox.transfers
        for record in message[1]:
            if record[0] == "x":
                self._cross_done(*record[1:])
                continue
            if record[0] == "p":
                self._message_done(*record[1:])
                continue
            number, start, end, op_id = record
            transfer = made.pop(number)
            transfer.start, transfer.end = start, end
            engine.next_op_id = op_id - 1
            transfer.finish(engine, transfer)
        engine.events.maybe_pack()

    def _cross_done(self, ranks: tuple, seq: int, end: float, results: list) -> None:
        engine = self.engine
        group = engine.groups[ranks]
        coll = group.pending.pop(seq)
        reduced = None
        ours = []
        for pos, fields in results:
            work = coll.works[pos]
            ours.append(work)
            result = work.result  # (an all-gather's or reduce-scatter's output, made at its issue)
            if coll.op == "all_reduce":
                result = reduced = reduced or Reduced(*fields)
            elif fields is not None:
                result.samples, result.shards, result.num_shards = fields
            _member_done(engine, work, end, result)
        coll.works, coll.first = [], None
        release(engine, ours, end)

    def _message_done(self, peers: tuple, end: float, pending: tuple | None) -> None:
        channel = self.engine.channels[peers]
        if pending is None:
            p2p.sent(self.engine, channel.sends.popleft(), end)
        else:
            recv = channel.recvs.popleft()
            recv.result = _pending(*pending)
            landing = p2p.received(self.engine, recv, end)
            del recv
            if landing is not None:
                p2p.landed(*landing)


class Outbox:
    """The worker's stand-in for the scheduler: the transfers its ranks made, to report and to finish."""

    def __init__(self) -> None:
        self.count = 0
        self.transfers: dict[int, Any] = {}
        self.made: list[tuple] = []
        self.usage_ids: dict[int, int] = {}
        self.usages: list[tuple] = []  # (kept, so that the ids above stay theirs)
        self.new_usages: list[tuple] = []

    def add(self, transfer: Any) -> None:
        number, u = self.register(transfer)
        self.made.append((number, transfer.start, transfer.left, u, transfer.key))

    def register(self, transfer: Any) -> tuple[int, int]:
        """Number `transfer` for its completion, and its usage for the coordinator: (number, usage id)."""
        self.count += 1
        self.transfers[self.count] = transfer
        usage = transfer.usage
        u = self.usage_ids.get(id(usage))
        if u is None:
            u = self.usage_ids[id(usage)] = len(self.usages)
            self.usages.append(usage)
            self.new_usages.append(usage)
        return self.count, u


def _joined_record(coll: Collective) -> tuple:
    """What the worker sends of a cross collective its members all issued."""
    members = [(pos, w.rank, w.issue, _describe(w.input), None if w.result is None else _describe(w.result))
               for pos, w in enumerate(coll.works) if w is not None]
    return (coll.group.ranks, coll.seq, coll.op, members)

"""The step's event log: the newest events as plain tuples, older ones packed into typed columns.

Appending a tuple is the cheapest record the hot path can make, but a 12-field tuple and its floats
cost about 150 bytes. Packed, an event takes about 40: its rank, times, samples and op id, and the code
of its *kind*, the fields that repeat across ranks and steps (op, stream, layer, bytes, FLOPs, peers,
detail), whose distinct combinations are few (a handful per op and layer) and kept once in a table.
Peers enter a kind by identity: a group or channel shares one peers tuple among its events, and hashing
a 1024-rank tuple per event would cost more than it saves. Whenever a thousand tuples have gathered,
they are packed: the check runs on each forward, when a rank blocks or finishes and when a collective
resolves. With the C accelerator, its ops write an event straight into a row of the columns while no tuple
waits (`native/_events.c`: *staged* rows, moved into the columns when the log packs, before the tuples), so
that most events never become a tuple. Readers see one sequence of the same tuples either way:

    (rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail)
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from itertools import chain

from dist_lib.native import twin

_C = twin("events")
if _C is not None:  # `pack` in C for the common case; the Python below is its specification and fallback
    KindIndex, pack_events = _C.KindIndex, _C.pack_events
else:
    KindIndex = pack_events = None

RawEvent = tuple  # see `result.Event` for the named view

# tuples gathered before `maybe_pack` packs them: bounds the unpacked part. A thousand tuples and their floats
# (about 200 KB) are still in the processor's cache when they are packed; four times as many are not, and the
# packing then reads each tuple back from memory (a long pipeline's step takes longer: `benchmarks/scale.py
# --table long`)
PACK_AT = 1024


class EventLog(Sequence):
    """Every event of one step, in the order recorded. `append` takes a raw event tuple."""

    __slots__ = ("recent", "append", "_kind_codes", "_kind_index", "_kinds", "_rank", "_kind", "_start", "_end",
                 "_samples", "_op_id")

    def __init__(self) -> None:
        self.recent: list[RawEvent] = []
        self.append = self.recent.append
        # (op, stream, layer, nbytes, flops, detail, id(peers)) -> code; the table holds the peers tuple,
        # which keeps its id from being reused while the log lives
        self._kind_codes: dict[tuple, int] = {}
        # a kind's fields by code, one list per field: op, stream, layer, nbytes, flops, peers, detail
        self._kinds: tuple[list, ...] = ([], [], [], [], [], [], [])
        # the same for the C pack (which codes a kind as `_kind_codes` does and adds the kinds it makes to it),
        # also holding the rows the C ops stage (`_staged`)
        self._kind_index = KindIndex(self.recent, self._kinds, self._kind_codes) if KindIndex is not None else None
        self._rank, self._kind = array("i"), array("I")
        self._start, self._end = array("d"), array("d")
        self._samples: list[int] = []  # bit masks are shared with the tensors: a reference each
        self._op_id = array("i")

    def _staged(self) -> int:
        """Events the C ops wrote as rows not yet in the columns (they come before the recent tuples)."""
        return self._kind_index.staged if self._kind_index is not None else 0

    def maybe_pack(self) -> None:
        if len(self.recent) + self._staged() >= PACK_AT:
            self.pack()

    def pack(self) -> None:
        """Move the staged rows, then the recent tuples, into the columns."""
        recent = self.recent
        if not recent and not self._staged():
            return
        if pack_events is not None and pack_events(recent, self._kind_index, self._kinds, self._rank, self._kind,
                                                   self._start, self._end, self._samples, self._op_id):
            return
        (ranks, ops, streams, starts, ends, layers, samples, nbytes, flops, peers, op_ids,
         details) = zip(*recent)
        keys = list(zip(ops, streams, layers, nbytes, flops, details, map(id, peers)))
        codes = self._kind_codes
        try:
            kinds = array("I", map(codes.__getitem__, keys))
        except KeyError:  # kinds this log has not seen (the first events of each op and layer) get codes
            table = self._kinds
            for key, peer in zip(keys, peers):
                if key not in codes:
                    codes[key] = len(table[0])
                    for column, value in zip(table, (*key[:5], peer, key[5])):
                        column.append(value)
            kinds = array("I", map(codes.__getitem__, keys))
        # struct converts a column in one call, about six times faster than array.extend's per-item parse
        n = len(recent)
        self._rank.frombytes(struct.pack(f"{n}i", *ranks))
        self._kind.extend(kinds)
        self._start.frombytes(struct.pack(f"{n}d", *starts))
        self._end.frombytes(struct.pack(f"{n}d", *ends))
        self._samples.extend(samples)
        self._op_id.frombytes(struct.pack(f"{n}i", *op_ids))
        recent.clear()

    def export(self) -> tuple:
        """The log as plain data for another process (`run/split.py`): the kinds, the columns, and the samples
        as numbers of their distinct masks (many events share a mask; pickled one by one, each would be
        copied each time)."""
        import numpy as np

        self.pack()
        samples = self._samples
        n = len(samples)
        # masks told apart by identity, not value: hashing a batch-wide int (3,072 bits at batch 3072) per
        # event would cost more than the rest of the export; a run of events sharing one mask (the members of
        # a collective, a rank's ops on a microbatch) is looked at once
        ids = np.fromiter(map(id, samples), dtype=np.int64, count=n)
        heads = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1]))) if n else np.zeros(0, np.int64)
        _, first, code = np.unique(ids[heads], return_index=True, return_inverse=True)
        masks = [samples[i] for i in heads[first].tolist()]
        codes = np.repeat(code.astype(np.uint32), np.diff(np.append(heads, n)))
        return (self._kinds, self._kind, self._rank, self._start, self._end, self._op_id, masks,
                array("I", codes.tobytes()))

    def extend(self, exported: tuple) -> None:
        """Append the events of another log's `export`, after this log's own."""
        self.pack()
        kinds, kind, rank, start, end, op_id, masks, samples = exported
        offset = len(self._kinds[0])
        for column, more in zip(self._kinds, kinds):
            column.extend(more)
        import numpy as np

        self._kind.frombytes((np.frombuffer(kind, dtype=np.uint32) + np.uint32(offset)).tobytes())
        self._rank.extend(rank)
        self._start.extend(start)
        self._end.extend(end)
        self._op_id.extend(op_id)
        self._samples.extend(map(masks.__getitem__, samples))

    def renumber(self) -> None:
        """Number the collectives and messages from 1 in the order of their ends, those of zero duration
        (a collective of one rank) after the others ending at that instant, then kind (collectives first),
        group or channel, and their order on it. That is the order the engine finishes them in, unless a
        transfer of zero duration was scheduled (`Engine.instant_transfers`): those end one at a time,
        in the order their ranks issued them. Op ids then depend on what the step did alone, not on the
        order the ranks ran in, nor on how the ranks were split between two processes (run/split.py: each
        half numbers its own while it runs alone)."""
        import numpy as np

        self.pack()
        streams, peers = self._kinds[1], self._kinds[5]
        comm = {"collective": 0, "p2p": 1}
        order = {p: i for i, p in enumerate(sorted({p for s, p in zip(streams, peers) if s in comm}))}
        kind_bit = np.array([comm.get(s, -1) for s in streams] or [-1], dtype=np.int8)
        kind_peers = np.array([order.get(p, 0) if s in comm else 0 for s, p in zip(streams, peers)] or [0])
        kind = np.frombuffer(self._kind, dtype=np.uint32)
        at = np.flatnonzero(kind_bit[kind] >= 0)
        op_id = np.frombuffer(self._op_id, dtype=np.int32).copy()
        ids = op_id[at].astype(np.int64)
        if not len(ids):
            return
        # each id's place among the ids, negative ones first (a split step's worker counts up from -2**31
        # alone, then takes the first process's from 1 on): the order of ops on one group or channel
        low = ids.min()
        split = low < 0 and ids.max() >= 0
        negatives = int(ids[ids < 0].max() - low + 1) if split else 0
        place = np.where(ids < 0, ids - low, ids + negatives) if split else ids - low
        event_of = np.full(int(place.max()) + 1, -1, dtype=np.int64)
        event_of[place] = at  # one event of each op: its members' or ends' events share their times and kind
        used = np.flatnonzero(event_of >= 0)
        head = event_of[used]  # (in the order of their ids)
        start, end = np.frombuffer(self._start, dtype=np.float64)[head], np.frombuffer(self._end, dtype=np.float64)[head]
        head = kind[head]
        ranked = np.lexsort((kind_peers[head], kind_bit[head], start == end, end))
        number = np.zeros(len(event_of), dtype=np.int32)
        number[used[ranked]] = np.arange(1, len(used) + 1, dtype=np.int32)
        op_id[at] = number[place]
        self._op_id = array("i", op_id.tobytes())

    def columns(self) -> tuple:
        """The packed log as columns, for readers that go through every event (the trace writer):
        (kinds: op, stream, layer, nbytes, flops, peers, detail, each a list by kind code; kind code,
        rank, op id, start, end and samples, one entry per event)."""
        self.pack()
        return (list(zip(*self._kinds)), self._kind, self._rank, self._op_id, self._start, self._end,
                self._samples)

    def _packed(self) -> Iterator[RawEvent]:
        op, stream, layer, nbytes, flops, peers, detail = (column.__getitem__ for column in self._kinds)
        kind = self._kind
        return zip(self._rank, map(op, kind), map(stream, kind), self._start, self._end, map(layer, kind),
                   self._samples, map(nbytes, kind), map(flops, kind), map(peers, kind), self._op_id,
                   map(detail, kind))

    def __iter__(self) -> Iterator[RawEvent]:
        if self._staged():
            self.pack()
        return chain(self._packed(), self.recent)

    def __len__(self) -> int:
        return len(self._rank) + len(self.recent) + self._staged()

    def __getitem__(self, index):  # type: ignore[override]
        if self._staged():
            self.pack()
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        packed = len(self._rank)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("event index out of range")
        if index >= packed:
            return self.recent[index - packed]
        i = index
        op, stream, layer, nbytes, flops, peers, detail = (column[self._kind[i]] for column in self._kinds)
        return (self._rank[i], op, stream, self._start[i], self._end[i], layer, self._samples[i], nbytes, flops,
                peers, self._op_id[i], detail)

    def busy_seconds(self, stream: str, ranks: int) -> list[float]:
        """Seconds each of `ranks` ranks spent in events of `stream`, summed column-wise with numpy
        (a 1024-rank step logs millions of events; summation order may differ from a loop's in the last
        bits)."""
        import numpy as np

        self.pack()
        busy = [0.0] * ranks
        if not len(self._rank):
            return busy
        in_stream = np.fromiter((s == stream for s in self._kinds[1]), dtype=bool, count=len(self._kinds[1]))
        chosen = in_stream[np.frombuffer(self._kind, dtype=np.uint32)]
        durations = np.frombuffer(self._end, dtype=np.float64) - np.frombuffer(self._start, dtype=np.float64)
        packed = np.bincount(np.frombuffer(self._rank, dtype=np.int32)[chosen], weights=durations[chosen],
                             minlength=ranks)
        return [a + float(b) for a, b in zip(busy, packed)]

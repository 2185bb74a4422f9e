"""The step's event log: the newest events as plain tuples, older ones packed into typed columns.

Appending a tuple is the cheapest record the hot path can make, but a 12-field tuple and its floats
cost about 150 bytes; packed into arrays an event takes about 70: ops, streams and details become codes
into small tables, and peers stay a reference to the one tuple its group or channel shares among its
events (a table of them would have to be kept by identity, which costs more time than it saves
memory). Whenever a few thousand tuples have gathered, they are packed: the check runs on each forward, when a rank blocks or finishes and when a
collective resolves. Readers see one sequence of the same tuples either way:

    (rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail)
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

RawEvent = tuple  # see `result.Event` for the named view

STREAMS = ("compute", "collective", "p2p")
STREAM_CODES = {stream: code for code, stream in enumerate(STREAMS)}
PACK_AT = 4096  # tuples gathered before `maybe_pack` packs them: bounds the unpacked part
KNOWN_OPS = ("forward", "backward", "backward_input", "backward_weight", "loss", "update",
             "all_reduce", "all_gather", "reduce_scatter", "send", "recv")


class EventLog(Sequence):
    """Every event of one step, in the order recorded. `append` takes a raw event tuple."""

    __slots__ = ("recent", "append", "_op_names", "_op_codes", "_details", "_detail_codes", "_rank", "_op",
                 "_stream", "_start", "_end", "_layer", "_samples", "_nbytes", "_flops", "_peers", "_op_id",
                 "_detail")

    def __init__(self) -> None:
        self.recent: list[RawEvent] = []
        self.append = self.recent.append
        self._op_names: list[str] = list(KNOWN_OPS)
        self._op_codes: dict[str, int] = {op: code for code, op in enumerate(KNOWN_OPS)}
        self._details: list[str] = []
        self._detail_codes: dict[str, int] = {}
        self._rank, self._op, self._stream = array("i"), array("B"), array("B")
        self._start, self._end, self._layer = array("d"), array("d"), array("i")
        self._samples: list[int] = []  # bit masks are shared with the tensors: a reference each
        self._nbytes, self._flops = array("q"), array("d")
        self._peers: list[Any] = []
        self._op_id = array("i")
        self._detail = array("H")

    def maybe_pack(self) -> None:
        if len(self.recent) >= PACK_AT:
            self.pack()

    def pack(self) -> None:
        """Move the recent tuples into the columns."""
        recent = self.recent
        if not recent:
            return
        (ranks, ops, streams, starts, ends, layers, samples, nbytes, flops, peers, op_ids,
         details) = zip(*recent)
        codes = self._op_codes
        for op in set(ops).difference(codes):  # ops this log has not seen get the next codes
            codes[op] = len(self._op_names)
            self._op_names.append(op)
        detail_codes = self._detail_codes
        for detail in set(details).difference(detail_codes):
            detail_codes[detail] = len(self._details)
            self._details.append(detail)
        # struct converts a column in one call, about six times faster than array.extend's per-item parse
        n = len(recent)
        self._rank.frombytes(struct.pack(f"{n}i", *ranks))
        self._op.frombytes(bytes(map(codes.__getitem__, ops)))
        self._stream.frombytes(bytes(map(STREAM_CODES.__getitem__, streams)))
        self._start.frombytes(struct.pack(f"{n}d", *starts))
        self._end.frombytes(struct.pack(f"{n}d", *ends))
        self._layer.frombytes(struct.pack(f"{n}i", *layers))
        self._samples.extend(samples)
        self._nbytes.frombytes(struct.pack(f"{n}q", *nbytes))
        self._flops.frombytes(struct.pack(f"{n}d", *flops))
        self._peers.extend(peers)
        self._op_id.frombytes(struct.pack(f"{n}i", *op_ids))
        self._detail.frombytes(struct.pack(f"{n}H", *map(detail_codes.__getitem__, details)))
        recent.clear()

    def _packed(self) -> Iterator[RawEvent]:
        return zip(self._rank, map(self._op_names.__getitem__, self._op), map(STREAMS.__getitem__, self._stream),
                   self._start, self._end, self._layer, self._samples, self._nbytes, self._flops, self._peers,
                   self._op_id, map(self._details.__getitem__, self._detail))

    def __iter__(self) -> Iterator[RawEvent]:
        return chain(self._packed(), self.recent)

    def __len__(self) -> int:
        return len(self._rank) + len(self.recent)

    def __getitem__(self, index):  # type: ignore[override]
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
        return (self._rank[i], self._op_names[self._op[i]], STREAMS[self._stream[i]], self._start[i], self._end[i],
                self._layer[i], self._samples[i], self._nbytes[i], self._flops[i], self._peers[i],
                self._op_id[i], self._details[self._detail[i]])

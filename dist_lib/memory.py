"""Lifetime-based memory accounting: a tensor's bytes count from creation until its last reference dies.

Each tensor holds a `Storage`; CPython frees an object as soon as its last reference goes, so
`Storage.__del__` returns the bytes at that moment, stamped with the owning rank's clock. Tensors that
share a buffer (an in-place all-reduce result, an accumulated gradient) share one `Storage`.
"""

from __future__ import annotations

from array import array
from typing import Protocol

from .errors import OutOfMemoryError

KINDS = ("weight", "optimizer", "weight_grad", "activation", "activation_grad", "stash")
KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}


class Clocked(Protocol):
    clock: float


class MemoryTracker:
    """Live bytes on one rank, with the peak and a log of every allocation and free.

    The log (time, signed bytes, buffer id, kind code) is the one record: the timeline and the
    breakdown by kind at the peak are derived from it after the step, so the hot path only appends.
    """

    __slots__ = ("rank", "device_name", "capacity", "enforce", "owner", "live", "peak",
                 "peak_index", "by_kind", "times", "context", "deltas", "ids", "kinds", "next_id")

    def __init__(self, rank: int, device_name: str, capacity: int, owner: Clocked, enforce: bool = True):
        self.rank = rank
        self.device_name = device_name
        self.capacity = capacity
        self.enforce = enforce
        self.owner = owner  # whose clock stamps the log
        self.live = 0
        self.peak = 0
        self.peak_index = 0  # log entries up to and including the peak
        self.by_kind = [0] * len(KINDS)  # live bytes by kind code, for out-of-memory reports
        self.context: tuple = ()  # (op, layer) being executed, for out-of-memory messages
        self.times = array("d")
        self.deltas = array("q")
        self.ids = array("q")
        self.kinds = array("b")
        self.next_id = 0

    def alloc(self, nbytes: int, code: int, buffer_id: int = -1) -> None:
        self.times.append(self.owner.clock)
        self.deltas.append(nbytes)
        self.ids.append(buffer_id)
        self.kinds.append(code)
        self.by_kind[code] += nbytes
        live = self.live = self.live + nbytes
        if live > self.peak:
            self.peak = live
            self.peak_index = len(self.deltas)
            if self.enforce and live > self.capacity:
                self._out_of_memory(nbytes, KINDS[code])

    def free(self, nbytes: int, code: int, buffer_id: int = -1) -> None:
        self.times.append(self.owner.clock)
        self.deltas.append(-nbytes)
        self.ids.append(buffer_id)
        self.kinds.append(code)
        self.by_kind[code] -= nbytes
        self.live -= nbytes

    def detach_log(self) -> tuple[array, array, array, array]:
        """Hand over (times, deltas, buffer ids, kind codes) and start an empty log, so that tensors freed
        after the step (as the simulator is collected) do not reach what was handed over."""
        log = (self.times, self.deltas, self.ids, self.kinds)
        self.times, self.deltas, self.ids, self.kinds = array("d"), array("q"), array("q"), array("b")
        return log

    def peak_by_kind(self) -> dict[str, int]:
        """Live bytes by kind at the peak."""
        totals = [0] * len(KINDS)
        for delta, code in zip(self.deltas[:self.peak_index], self.kinds[:self.peak_index]):
            totals[code] += delta
        return dict(zip(KINDS, totals))

    def _out_of_memory(self, nbytes: int, kind: str) -> None:
        # Stop counting this rank so that the unwinding frees do not mask the report.
        self.enforce = False
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in zip(KINDS, self.by_kind) if v)
        where = ""
        if self.context:
            op, layer = self.context
            where = f" in {op}" + (f"(layer {layer})" if layer is not None else "")
        raise OutOfMemoryError(
            f"rank {self.rank} ({self.device_name}, {format_bytes(self.capacity)}): out of memory at "
            f"t={self.owner.clock * 1e3:.3f} ms{where} allocating {format_bytes(nbytes)} of {kind}; "
            f"{format_bytes(self.live)} live: {parts}")


class Storage:
    """A buffer of `nbytes` on one rank; its bytes are live while any tensor refers to it."""

    __slots__ = ("tracker", "nbytes", "code", "buffer_id")

    def __init__(self, tracker: MemoryTracker, nbytes: int, kind: str):
        self.tracker = tracker
        self.nbytes = nbytes
        self.code = code = KIND_CODES[kind]
        self.buffer_id = buffer_id = tracker.next_id
        tracker.next_id = buffer_id + 1
        tracker.alloc(nbytes, code, buffer_id)

    @property
    def kind(self) -> str:
        return KINDS[self.code]

    def __del__(self) -> None:
        self.tracker.free(self.nbytes, self.code, self.buffer_id)


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"

"""Lifetime-based memory accounting: a tensor's bytes count from creation until its last reference dies.

Each tensor holds a `Storage`; CPython frees an object as soon as its last reference goes, so
`Storage.__del__` returns the bytes at that moment, stamped with the owning rank's clock. Tensors that
share a buffer (an in-place all-reduce result, an accumulated gradient) share one `Storage`.
"""

from __future__ import annotations

from array import array
from itertools import accumulate
from typing import NamedTuple, Protocol

from .errors import OutOfMemoryError

KINDS = ("weight", "optimizer", "weight_grad", "activation", "activation_grad", "stash")
WEIGHT, OPTIMIZER, WEIGHT_GRAD, ACTIVATION, ACTIVATION_GRAD, STASH = range(len(KINDS))
WEIGHT_BYTES = 2  # 16-bit weights and gradients
OPTIMIZER_BYTES = 12  # fp32 master weights, momentum and variance (Rajbhandari et al. 2020, sec. 3.1)
KIND_BITS = 3  # a log tag is buffer id << KIND_BITS | kind code
KIND_MASK = (1 << KIND_BITS) - 1


def live_by_kind(deltas: array, tags: array, entries: int) -> list[int]:
    """Live bytes by kind code after the first `entries` entries of an allocation log."""
    import numpy as np  # only after a step or on out-of-memory: keep it off the import path

    if not entries:
        return [0] * len(KINDS)
    signed = np.frombuffer(deltas, dtype=np.int64, count=entries)
    codes = np.frombuffer(tags, dtype=np.int64, count=entries) & KIND_MASK
    # float64 sums are exact: every partial sum is a byte count far below 2**53
    return [int(v) for v in np.bincount(codes, weights=signed, minlength=len(KINDS))[:len(KINDS)]]


class RankLog(NamedTuple):
    """One rank's allocation log as handed over after a step, and the views derived from it."""

    times: array
    deltas: array
    tags: array  # buffer id << KIND_BITS | kind code
    peak_index: int  # entries up to and including the peak

    def timeline(self) -> tuple[array, array]:
        """(times, live bytes after each entry)."""
        return self.times, array("d", accumulate(self.deltas))

    def entries(self) -> tuple[array, array, array]:
        """(signed bytes, buffer ids, kind codes), one per entry of the timeline."""
        return (self.deltas, array("q", (t >> KIND_BITS for t in self.tags)),
                array("b", (t & KIND_MASK for t in self.tags)))

    def peak_by_kind(self) -> dict[str, int]:
        """Live bytes by kind at the peak."""
        return dict(zip(KINDS, live_by_kind(self.deltas, self.tags, self.peak_index)))


class Clocked(Protocol):
    clock: float


class MemoryTracker:
    """Live bytes on one rank, with the peak and a log of every allocation and free.

    The log is three parallel arrays: time, signed bytes, and a tag (buffer id << 3 | kind code). It is
    the one record: the timeline and the breakdown by kind at the peak are derived from it, so the hot
    path (inlined in `Storage`) only appends.
    """

    __slots__ = ("rank", "device_name", "capacity", "enforce", "owner", "live", "peak", "peak_index",
                 "context", "times", "deltas", "tags")

    def __init__(self, rank: int, device_name: str, capacity: int, owner: Clocked, enforce: bool = True):
        self.rank = rank
        self.device_name = device_name
        self.capacity = capacity
        self.enforce = enforce
        self.owner = owner  # whose clock stamps the log
        self.live = 0
        self.peak = 0
        self.peak_index = 0  # log entries up to and including the peak
        self.context: tuple = ()  # (op, layer) being executed, for out-of-memory messages
        self.times = array("d")
        self.deltas = array("q")
        self.tags = array("q")

    def detach_log(self) -> RankLog:
        """Hand over the log and start an empty one, so that tensors freed after the step (as the
        simulator is collected) do not reach what was handed over."""
        log = RankLog(self.times, self.deltas, self.tags, self.peak_index)
        self.times, self.deltas, self.tags = array("d"), array("q"), array("q")
        return log

    def live_by_kind(self) -> list[int]:
        """Live bytes by kind code now."""
        return live_by_kind(self.deltas, self.tags, len(self.deltas))

    def out_of_memory(self, nbytes: int, code: int) -> None:
        # Stop counting this rank so that the unwinding frees do not mask the report.
        self.enforce = False
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in zip(KINDS, self.live_by_kind()) if v)
        where = ""
        if self.context:
            op, layer = self.context
            where = f" in {op}" + (f"(layer {layer})" if layer is not None else "")
        raise OutOfMemoryError(
            f"rank {self.rank} ({self.device_name}, {format_bytes(self.capacity)}): out of memory at "
            f"t={self.owner.clock * 1e3:.3f} ms{where} allocating {format_bytes(nbytes)} of {KINDS[code]}; "
            f"{format_bytes(self.live)} live: {parts}")


class Storage:
    """A buffer of `nbytes` on one rank, of kind code `code`; its bytes are live while any tensor refers
    to it. Allocation and free write the tracker's log directly: this is the simulator's hottest path.

    The buffer id in the log is the object's address divided by 8 (CPython aligns objects to at
    least 8 bytes, so the low bits hold the kind): unique among live buffers, reused only after the
    free is logged, and free of any per-buffer counter object."""

    __slots__ = ("tracker", "nbytes", "code")

    def __init__(self, tracker: MemoryTracker, nbytes: int, code: int):
        self.tracker = tracker
        self.nbytes = nbytes
        self.code = code
        tracker.times.append(tracker.owner.clock)
        tracker.deltas.append(nbytes)
        tracker.tags.append(id(self) | code)
        live = tracker.live = tracker.live + nbytes
        if live > tracker.peak:
            tracker.peak = live
            tracker.peak_index = len(tracker.tags)
            if live > tracker.capacity and tracker.enforce:
                tracker.out_of_memory(nbytes, code)

    def __del__(self) -> None:
        tracker = self.tracker
        tracker.times.append(tracker.owner.clock)
        tracker.deltas.append(-self.nbytes)
        tracker.tags.append(id(self) | self.code)
        tracker.live -= self.nbytes


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"

"""Lifetime-based memory accounting: a tensor's bytes count from creation until its last reference dies.

Every tensor is a `Buffer` (`buffers.py`); CPython frees an object as soon as its last reference goes,
and the free returns the bytes at that moment, stamped with the owning rank's clock. Tensors that share a
buffer (an in-place all-reduce result, an accumulated gradient) are views of the tensor that owns it.
The C implementation of `Buffer` is used when it was built; `DIST_SANDBOX_PURE_PYTHON=1` forces the
Python one.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate
from typing import NamedTuple, Protocol

from dist_lib.native import twin
from dist_lib.memory.buffers import KIND_MASK, decode, expand_runs
from dist_lib.errors import OutOfMemoryError


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector for a block that makes millions of objects and no cycles (a step,
    a parsed trace): each allocation counts towards a collection that walks them all and frees nothing,
    which makes long steps quadratic. Frees still happen by reference counting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_C = twin("buffers")
if _C is None:  # the same semantics in Python
    from dist_lib.memory.buffers import AllocLog, Buffer, slot_records
else:
    AllocLog, Buffer, slot_records = _C.AllocLog, _C.Buffer, _C.slot_records

KINDS = ("weight", "optimizer", "weight_grad", "activation", "activation_grad", "stash")
WEIGHT, OPTIMIZER, WEIGHT_GRAD, ACTIVATION, ACTIVATION_GRAD, STASH = range(len(KINDS))
WEIGHT_BYTES = 2  # 16-bit weights and gradients
OPTIMIZER_BYTES = 12  # fp32 master weights, momentum and variance (Rajbhandari et al. 2020, sec. 3.1)
KIND_BITS = KIND_MASK.bit_length()  # a log tag is buffer address | kind code; ids are address >> KIND_BITS


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
    """One rank's allocation log as handed over after a step, kept as stored (8 bytes an entry and 12 a
    time), and the views derived from it on demand."""

    run_first: array  # the first entry of each run of entries logged at one time
    run_time: array  # and that time
    packed: array  # per entry: buffer address >> 4 << ADDRESS_SHIFT | FREE | shape number
    shape_bytes: array  # per shape number: its bytes and its kind code
    shape_codes: array
    peak_index: int  # entries up to and including the peak

    @property
    def times(self) -> array:
        """Each entry's time."""
        return expand_runs(self.run_first, self.run_time, len(self.packed))

    @property
    def deltas(self) -> array:
        """Signed bytes of each entry."""
        return decode(self.packed, self.shape_bytes, self.shape_codes)[0]

    def timeline(self) -> tuple[array, array]:
        """(times, live bytes after each entry)."""
        return self.times, array("d", accumulate(self.deltas))

    def entries(self) -> tuple[array, array, array]:
        """(signed bytes, buffer ids, kind codes), one per entry of the timeline."""
        deltas, tags = decode(self.packed, self.shape_bytes, self.shape_codes)
        return (deltas, array("q", (t >> KIND_BITS for t in tags)), array("b", (t & KIND_MASK for t in tags)))

    def peak_by_kind(self) -> dict[str, int]:
        """Live bytes by kind at the peak."""
        deltas, tags = decode(self.packed, self.shape_bytes, self.shape_codes)
        return dict(zip(KINDS, live_by_kind(deltas, tags, self.peak_index)))


class Clocked(Protocol):
    clock: float


class MemoryTracker(AllocLog):
    """Live bytes on one rank, with the peak and a log of every allocation and free.

    The log (see `buffers.AllocLog`) records for each allocation and free its time, its signed bytes and
    a tag (buffer address | kind code), compactly. It is the one record: the timeline and the breakdown
    by kind at the peak are derived from it, so the hot path (`Buffer`, in C when built) only appends.
    """

    __slots__ = ("rank", "device_name", "context")

    def __init__(self, rank: int, device_name: str, capacity: int, owner: Clocked, enforce: bool = True):
        self.rank = rank
        self.device_name = device_name
        self.capacity = capacity
        self.enforce = enforce
        self.owner = owner  # whose clock stamps the log
        self.context: tuple = ()  # (op, layer) being executed, for out-of-memory messages

    def detach_log(self) -> RankLog:
        """Hand over the log and start an empty one, so that tensors freed after the step (as the
        simulator is collected) do not reach what was handed over."""
        peak_index = self.peak_index
        return RankLog(*self.take(), peak_index)

    def live_by_kind(self) -> list[int]:
        """Live bytes by kind code now."""
        _, deltas, tags = self.arrays()
        return live_by_kind(deltas, tags, len(deltas))

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


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"

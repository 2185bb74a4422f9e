"""Buffers and their allocation log: what a tensor's bytes are, and when they are live.

Every symbolic tensor is a `Buffer`. `Cls(log, nbytes, *fields)` allocates `nbytes` of the class's
kind (`Cls.code`) on a rank's `AllocLog`, which appends (time, +bytes, tag) to its log; when CPython
frees the last reference, the free appends (time, -bytes, tag). `Cls(tensor, nbytes, *fields)` is a
view of `tensor`'s buffer (an in-place all-reduce, an accumulated gradient, as PyTorch's `_base`): it
keeps the owner alive and logs nothing itself. The remaining arguments go to the slots `Cls._args`
names, in order (trailing ones may be left out for `Cls._defaults`); a class that inherits no `_args`
takes them in its own `__init__`.

A tag is the owner's address | kind code: unique among live buffers (CPython aligns objects to 16
bytes, so the low bits are free) and reused only after the free is logged. The log stores each entry
in 8 bytes and a time per run of entries (see `AllocLog`), and decodes the signed bytes and tags when
asked.

This module is the specification and the fallback; `_buffers.c` implements the same in C, and
`tracker.py` takes it when it was built (the simulator's hottest path: every tensor passes here twice).
"""

from __future__ import annotations

from array import array
from operator import attrgetter
from typing import Any

from dist_lib.native import MAX_NBYTES

KIND_MASK = 7  # low bits of a tag: the kind code
SHAPE_BITS = 19  # an entry names its buffer's (bytes, kind) shape by number: few distinct ones per rank
FREE = 1 << SHAPE_BITS
ADDRESS_SHIFT = SHAPE_BITS + 1  # 16-byte aligned addresses below 2**48 fill the other 44 bits


def decode(packed: array, shape_bytes: array, shape_codes: array) -> tuple[array, array]:
    """(signed bytes, tags: buffer address | kind code) of stored log entries, given each shape
    number's bytes and kind code."""
    import numpy as np  # only to read a log: keep it off the import path

    words = np.frombuffer(packed, dtype=np.uint64)
    shape = (words & np.uint64(FREE - 1)).astype(np.intp)
    nbytes = np.frombuffer(shape_bytes, dtype=np.int64)[shape]
    deltas = np.where(words & np.uint64(FREE), -nbytes, nbytes)
    tags = (words >> np.uint64(ADDRESS_SHIFT) << np.uint64(4)).astype(np.int64) \
        | np.frombuffer(shape_codes, dtype=np.uint8)[shape]
    return array("q", deltas.tobytes()), array("q", tags.tobytes())


def expand_runs(run_first: array, run_time: array, entries: int) -> array:
    """Each of `entries` entries' time, from the time of each run of entries and the run's first entry."""
    import numpy as np

    counts = np.diff(np.append(np.frombuffer(run_first, dtype=np.uint32).astype(np.int64), entries))
    return array("d", np.repeat(np.frombuffer(run_time, dtype=np.float64), counts).tobytes())


def slot_records(objects: list, cls: type, names: tuple[str, ...]) -> list[tuple]:
    """The named slots of each object (all of class `cls`) as tuples: the records a step hands over."""
    for k, obj in enumerate(objects):
        if type(obj) is not cls:
            raise TypeError(f"slot_records: item {k} is a {type(obj).__name__}, not a {cls.__name__}")
    record = attrgetter(*names) if len(names) > 1 else lambda obj: (getattr(obj, names[0]),)
    return list(map(record, objects))


class AllocLog:
    """One rank's live bytes, peak, and log of every allocation and free: time, signed bytes, tag.

    An entry is 8 bytes, `address >> 4 << ADDRESS_SHIFT | FREE (for a free) | shape`, where a shape
    numbers a distinct (bytes, kind) pair on this rank. Times are stored once per run of entries logged
    at the same time (an op allocates and frees several buffers at one instant): run r starts at entry
    `_run_first[r]`. `arrays()` decodes them.
    """

    __slots__ = ("owner", "live", "peak", "capacity", "peak_index", "enforce", "_run_first", "_run_time",
                 "_entries", "_shapes", "_shape_bytes", "_shape_codes")

    def __new__(cls, *args: Any, **kwargs: Any) -> AllocLog:
        self = object.__new__(cls)
        self.owner: Any = None  # whose `clock` stamps the log
        self.live = self.peak = self.capacity = self.peak_index = 0
        self.enforce = False
        self._run_first, self._run_time, self._entries = array("I"), array("d"), array("Q")
        self._shapes: dict[tuple[int, int], int] = {}  # (bytes, kind code) -> shape number
        self._shape_bytes: list[int] = []
        self._shape_codes: list[int] = []
        return self

    def __len__(self) -> int:
        return len(self._entries)

    def _shape(self, nbytes: int, code: int) -> int:
        """The number of the shape (nbytes, code), numbering it if new."""
        shape = self._shapes.get((nbytes, code))
        if shape is None:
            shape = len(self._shape_bytes)
            if shape >= 1 << SHAPE_BITS:
                raise RuntimeError(f"more than {1 << SHAPE_BITS} distinct tensor sizes on one rank")
            self._shapes[nbytes, code] = shape
            self._shape_bytes.append(nbytes)
            self._shape_codes.append(code)
        return shape

    def arrays(self) -> tuple[array, array, array]:
        """(times, signed bytes, tags: buffer address | kind code) so far, as new arrays."""
        return (expand_runs(self._run_first, self._run_time, len(self._entries)),
                *decode(self._entries, array("q", self._shape_bytes), array("B", self._shape_codes)))

    def _log(self, entry: int) -> None:
        """Append an entry at the owner's clock (a new run if the time moved)."""
        now = self.owner.clock
        if not self._run_time or self._run_time[-1] != now:
            self._run_first.append(len(self._entries))
            self._run_time.append(now)
        self._entries.append(entry)

    def take(self) -> tuple[array, array, array, array, array]:
        """(first entry of each time run, its time, packed entries, shape bytes, shape kind codes) so far,
        as stored (`decode` and `expand_runs` read them); the log starts empty again (the shapes stay: live buffers
        refer to them)."""
        out = (self._run_first, self._run_time, self._entries, array("q", self._shape_bytes),
               array("B", self._shape_codes))
        self._run_first, self._run_time, self._entries = array("I"), array("d"), array("Q")
        return out

    def out_of_memory(self, nbytes: int, code: int) -> None:
        raise NotImplementedError  # the subclass says what ran out


class Buffer:
    """Bytes on one rank, live while any tensor refers to them."""

    __slots__ = ("_mem", "_base", "nbytes", "_entry")
    # slots of a subclass holding another buffer (an activation's stash), released before this buffer's
    # free is logged: CPython's deallocator clears a subclass's slots before the C `Buffer` logs the free
    _released_first: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A class that names its `_args` gets an `__init__` storing them (as dataclasses write one)."""
        super().__init_subclass__(**kwargs)
        names = cls.__dict__.get("_args")
        if names is None:
            return
        defaults = getattr(cls, "_defaults", ())
        required = len(names) - len(defaults)
        params = [*names[:required], *(f"{name}=_default{i}" for i, name in enumerate(names[required:]))]
        source = (f"def __init__(self, _buffer, _nbytes, {', '.join(params)}):\n"
                  + "".join(f"    self.{name} = {name}\n" for name in names))
        namespace = {f"_default{i}": value for i, value in enumerate(defaults)}
        exec(source, namespace)
        cls.__init__ = namespace["__init__"]  # type: ignore[misc]

    def __new__(cls, source: AllocLog | Buffer, nbytes: int, *fields: Any) -> Buffer:
        self = object.__new__(cls)
        self._mem = None
        if isinstance(source, AllocLog):
            if not 0 <= nbytes <= MAX_NBYTES:
                raise ValueError(f"{cls.__name__}(): a buffer of {nbytes} bytes")
            self._base = None
            self.nbytes = nbytes
            code = cls.code  # type: ignore[attr-defined]
            shape = source._shapes.get((nbytes, code))
            if shape is None:
                shape = source._shape(nbytes, code)
            entry = self._entry = id(self) >> 4 << ADDRESS_SHIFT | shape
            source._log(entry)
            self._mem = source
            live = source.live = source.live + nbytes
            if live > source.peak:
                source.peak = live
                source.peak_index = len(source._entries)
                if live > source.capacity and source.enforce:
                    source.out_of_memory(nbytes, code)
        elif isinstance(source, Buffer):
            owner = source._base or source
            self._base = owner
            self.nbytes = owner.nbytes
            self._entry = owner._entry
        else:
            raise TypeError(f"{cls.__name__}(): expected a memory log or a tensor to share, "
                            f"got {type(source).__name__}")
        return self

    def __del__(self) -> None:
        log = self._mem
        if log is not None:
            for name in self._released_first:
                setattr(self, name, None)
            log._log(self._entry | FREE)
            log.live -= self.nbytes

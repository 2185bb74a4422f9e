"""Buffers and their allocation log: what a tensor's bytes are, and when they are live.

Every symbolic tensor is a `Buffer`. `Cls(log, nbytes, *fields)` allocates `nbytes` of the class's
kind (`Cls.code`) on a rank's `AllocLog`, which appends (time, +bytes, tag) to its log; when CPython
frees the last reference, the free appends (time, -bytes, tag). `Cls(tensor, nbytes, *fields)` is a
view of `tensor`'s buffer (an in-place all-reduce, an accumulated gradient, as PyTorch's `_base`): it
keeps the owner alive and logs nothing itself. The remaining arguments go to the slots `Cls._args`
names, in order (trailing ones may be left out for `Cls._defaults`); a class that inherits no `_args`
takes them in its own `__init__`.

A tag is the owner's address | kind code: unique among live buffers (CPython aligns objects to 16
bytes, so the low bits are free) and reused only after the free is logged.

This module is the specification and the fallback; `_buffers.c` implements the same in C, and
`memory.py` takes it when it was built (the simulator's hottest path: every tensor passes here twice).
"""

from __future__ import annotations

from array import array
from typing import Any

KIND_MASK = 7  # low bits of a tag: the kind code


class AllocLog:
    """One rank's live bytes, peak, and log of every allocation and free: time, signed bytes, tag."""

    __slots__ = ("owner", "live", "peak", "capacity", "peak_index", "enforce", "_times", "_deltas", "_tags")

    def __new__(cls, *args: Any, **kwargs: Any) -> AllocLog:
        self = object.__new__(cls)
        self.owner: Any = None  # whose `clock` stamps the log
        self.live = self.peak = self.capacity = self.peak_index = 0
        self.enforce = False
        self._times, self._deltas, self._tags = array("d"), array("q"), array("q")
        return self

    def __len__(self) -> int:
        return len(self._tags)

    def arrays(self) -> tuple[array, array, array]:
        """(times, signed bytes, tags) so far, as new arrays."""
        return array("d", self._times), array("q", self._deltas), array("q", self._tags)

    def take(self) -> tuple[array, array, array]:
        """(times, signed bytes, tags) so far; the log starts empty again."""
        out = self._times, self._deltas, self._tags
        self._times, self._deltas, self._tags = array("d"), array("q"), array("q")
        return out

    def out_of_memory(self, nbytes: int, code: int) -> None:
        raise NotImplementedError  # the subclass says what ran out


class Buffer:
    """Bytes on one rank, live while any tensor refers to them."""

    __slots__ = ("_mem", "_base", "nbytes", "_tag")

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
            if nbytes < 0:
                raise ValueError(f"{cls.__name__}(): a buffer of {nbytes} bytes")
            self._base = None
            self.nbytes = nbytes
            tag = self._tag = id(self) | cls.code  # type: ignore[attr-defined]
            source._times.append(source.owner.clock)
            source._deltas.append(nbytes)
            source._tags.append(tag)
            self._mem = source
            live = source.live = source.live + nbytes
            if live > source.peak:
                source.peak = live
                source.peak_index = len(source._tags)
                if live > source.capacity and source.enforce:
                    source.out_of_memory(nbytes, tag & KIND_MASK)
        elif isinstance(source, Buffer):
            owner = source._base or source
            self._base = owner
            self.nbytes = owner.nbytes
            self._tag = owner._tag
        else:
            raise TypeError(f"{cls.__name__}(): expected a memory log or a tensor to share, "
                            f"got {type(source).__name__}")
        return self

    def __del__(self) -> None:
        log = self._mem
        if log is not None:
            log._times.append(log.owner.clock)
            log._deltas.append(-self.nbytes)
            log._tags.append(self._tag)
            log.live -= self.nbytes

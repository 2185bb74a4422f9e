"""A rank's five storage dicts, with what they hold kept as a running total.

The originals price memory by summing `v.memory()` over every stored tensor at every event, which
is quadratic in a long run (a 32-rank, 64-layer lab file made 2.4 M such calls). Here each dict
reports its changes to a `Ledger`, so an event reads the total in O(1). While every stored size is
a whole number the total is an exact integer, which is what the originals' float sum gives too
(below 2**53), returned as an int or a float as theirs would be.

Where the originals' left-to-right float sum rounds (a size that is not a whole number: shard counts
that do not divide HIDDEN**2), or where the ledger cannot follow (a stored value without a usable
`memory()`, a storage attribute replaced by a plain dict, a value found stored that never entered
through these methods), the model sums its storage at each event
as the originals do, which gives their figure to the last bit and raises the error they raise.
"""

from __future__ import annotations

from typing import Any

_MISSING = object()
FLOAT, FRACTIONAL, OPAQUE = 1, 2, 4  # what a measured size is, besides its whole part


class Ledger:
    """Running totals of one model's storage: toy units, and bytes by kind when a sizer is given."""

    __slots__ = ("whole", "fractional", "floats", "opaque", "sizer", "kind_of", "by_kind")

    def __init__(self, sizer: Any = None, kind_of: Any = None):
        self.whole = 0  # the total of the whole-number sizes, exactly
        self.fractional = 0  # how many stored sizes are not whole numbers (the total is then not kept)
        self.floats = 0  # how many stored sizes are floats (the originals' sum is then a float)
        self.opaque = 0  # stored values whose size could not be taken
        self.sizer = sizer  # value -> bytes, in real timing
        self.kind_of = kind_of  # value -> kind name, in real timing
        self.by_kind: dict[str, float] = {}

    def measure(self, value: Any) -> tuple:
        """What `value` adds to the totals: (whole part, flags FLOAT|FRACTIONAL|OPAQUE, kind, bytes)."""
        try:
            size = value.memory()
        except Exception:
            return (0, OPAQUE, None, 0.0)
        if type(size) is int:
            measured = (size, 0)
        elif isinstance(size, float):
            measured = (int(size), FLOAT) if size.is_integer() else (0, FLOAT | FRACTIONAL)
        elif isinstance(size, int):
            measured = (int(size), 0)
        else:
            return (0, OPAQUE, None, 0.0)
        if self.sizer is None:
            return measured + (None, 0.0)
        return measured + (self.kind_of(value), self.sizer(value))

    def apply(self, measured: tuple, sign: int) -> None:
        whole, flags, kind, nbytes = measured
        self.whole += sign * whole
        if flags:
            if flags & FLOAT:
                self.floats += sign
            if flags & FRACTIONAL:
                self.fractional += sign
            if flags & OPAQUE:
                self.opaque += sign
        if kind is not None:
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + sign * nbytes

    def total(self) -> int | float:
        """The sum of the stored sizes, valid while none is opaque or fractional."""
        return float(self.whole) if self.floats else self.whole


class Storage(dict):
    """A dict that tells its model's ledger what enters and leaves it, and knows which objects it
    holds (so "is this tensor stored?" is answered without comparing it to every stored one)."""

    __slots__ = ("ledger", "held")

    def __init__(self, ledger: Ledger):
        super().__init__()
        self.ledger = ledger
        self.held: dict[int, list] = {}  # id(value) -> [how many keys hold it, what it measured on entry]

    def _enter(self, value: Any) -> None:
        entry = self.held.get(id(value))
        if entry is None:  # sized once while held: what leaves is what entered
            entry = self.held[id(value)] = [0, self.ledger.measure(value)]
        entry[0] += 1
        self.ledger.apply(entry[1], 1)

    def _leave(self, value: Any) -> None:
        entry = self.held.get(id(value))
        if entry is None:  # stored past the ledger (`dict.__setitem__(d, k, v)`): sum from now on
            self.ledger.opaque += 1
            return
        self.ledger.apply(entry[1], -1)
        entry[0] -= 1
        if not entry[0]:
            del self.held[id(value)]

    def holds(self, value: Any) -> bool:
        """`value in self.values()`, as the originals test it (identity first, then equality)."""
        return id(value) in self.held or value in self.values()

    def __setitem__(self, key: Any, value: Any) -> None:  # the hot path: a new key's _enter, inlined
        old = self.get(key, _MISSING)
        dict.__setitem__(self, key, value)
        if old is not _MISSING:
            self._leave(old)
        held, ledger = self.held, self.ledger
        entry = held.get(id(value))
        if entry is None:
            entry = held[id(value)] = [0, ledger.measure(value)]
        entry[0] += 1
        ledger.apply(entry[1], 1)

    def __delitem__(self, key: Any) -> None:
        value = self[key]
        super().__delitem__(key)
        self._leave(value)

    def pop(self, key: Any, *default: Any) -> Any:
        if key not in self:
            return super().pop(key, *default)
        value = super().pop(key)
        self._leave(value)
        return value

    def popitem(self) -> tuple[Any, Any]:
        key, value = super().popitem()
        self._leave(value)
        return key, value

    def clear(self) -> None:
        for count, measured in self.held.values():
            self.ledger.apply(measured, -count)
        self.held.clear()
        super().clear()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> Storage:
        self.update(other)
        return self

    def copy(self) -> dict:
        return dict(self)

    def __reduce__(self):  # copies and pickles are plain dicts
        return (dict, (dict(self),))


STORAGE_NAMES = ("weights", "opt_states", "activations", "grad_activations", "grad_weights")


def storage_property(name: str) -> property:
    """A storage attribute: reading gives the tracked dict; assigning a `Storage` of this model keeps
    tracking, assigning anything else makes the model sum its storage at each event, as the originals."""
    slot = "_" + name

    def get(self: Any) -> Any:
        return getattr(self, slot)

    def set_(self: Any, value: Any) -> None:
        if not (isinstance(value, Storage) and value.ledger is self._ledger):
            self._untracked = True
        object.__setattr__(self, slot, value)

    return property(get, set_, doc=f"The model's {name} dict (the originals' storage).")

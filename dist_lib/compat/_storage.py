"""A rank's five storage dicts, with what they hold kept as a running total.

The originals price memory by summing `v.memory()` over every stored tensor at every event, which
is quadratic in a long run (a 32-rank, 64-layer lab file made 2.4 M such calls). Here each dict
reports its changes to a `Ledger`, so an event reads the total in O(1). While every stored size is
a whole number the total is an exact integer, which is what the originals' float sum gives too
(below 2**53), returned as an int or a float as theirs would be.

Where the originals' left-to-right float sum rounds (a size that is not a whole number: shard counts
that do not divide HIDDEN**2), or where the ledger cannot follow (a stored value without a usable
`memory()`, a storage attribute replaced by a plain dict), the model sums its storage at each event
as the originals do, which gives their figure to the last bit and raises the error they raise.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

_MISSING = object()


class Ledger:
    """Running totals of one model's storage: toy units, and bytes by kind when a sizer is given."""

    __slots__ = ("whole", "fraction", "floats", "opaque", "sizer", "kind_of", "by_kind")

    def __init__(self, sizer: Any = None, kind_of: Any = None):
        self.whole = 0  # the integer part of the total, exactly
        self.fraction = Fraction(0)  # the rest, exactly
        self.floats = 0  # how many stored sizes are floats (the originals' sum is then a float)
        self.opaque = 0  # stored values whose size could not be taken
        self.sizer = sizer  # value -> bytes, in real timing
        self.kind_of = kind_of  # value -> kind name, in real timing
        self.by_kind: dict[str, float] = {}

    def change(self, value: Any, sign: int) -> None:
        try:
            size = value.memory()
        except Exception:
            self.opaque += sign
            return
        if isinstance(size, float):
            self.floats += sign
            if size.is_integer():
                self.whole += sign * int(size)
            else:
                self.fraction += sign * Fraction(size)
        elif isinstance(size, int):
            self.whole += sign * size
        else:
            self.opaque += sign
            return
        if self.sizer is not None:
            kind = self.kind_of(value)
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + sign * self.sizer(value)

    def total(self) -> int | float:
        exact = self.whole + self.fraction if self.fraction else self.whole
        return float(exact) if self.floats else int(exact)


class Storage(dict):
    """A dict that tells its model's ledger what enters and leaves it."""

    __slots__ = ("ledger",)

    def __init__(self, ledger: Ledger):
        super().__init__()
        self.ledger = ledger

    def __setitem__(self, key: Any, value: Any) -> None:
        old = self.get(key, _MISSING)
        super().__setitem__(key, value)
        if old is not _MISSING:
            self.ledger.change(old, -1)
        self.ledger.change(value, 1)

    def __delitem__(self, key: Any) -> None:
        value = self[key]
        super().__delitem__(key)
        self.ledger.change(value, -1)

    def pop(self, key: Any, *default: Any) -> Any:
        if key not in self:
            return super().pop(key, *default)
        value = super().pop(key)
        self.ledger.change(value, -1)
        return value

    def popitem(self) -> tuple[Any, Any]:
        key, value = super().popitem()
        self.ledger.change(value, -1)
        return key, value

    def clear(self) -> None:
        for value in self.values():
            self.ledger.change(value, -1)
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

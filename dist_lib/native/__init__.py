"""The optional C accelerator: one extension module (`dist_lib._buffers`) built from the C files beside this
one (`_*.c`, `_*.h`), each the twin of a Python function or class that stays its specification.

`EXTENSION` is the loaded module, or None to run everything in Python (`DIST_SANDBOX_PURE_PYTHON=1`, no C
compiler at install time, or an extension built from other sources than these). `twin(name)` is the module
for one twin, or None when that twin is switched off: `DIST_SANDBOX_C_OFF=drive,p2p` (names in `TWINS`) runs
those in Python and the rest in C, to measure what each twin gains (`benchmarks/accelerator.py`).
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import Any

from dist_lib.native.source_hash import source_hash

# A buffer's size fits the 40 bits the packed memory log gives it (C and Python alike): less than a TiB.
MAX_NBYTES = (1 << 40) - 1


def load_extension(module_name: str = "dist_lib._buffers", sources: str | None = None) -> Any:
    """The C accelerator, or None to run everything in Python: when `DIST_SANDBOX_PURE_PYTHON` is set, when
    it was not built (no C compiler at install time), or when it was built from other sources than the ones
    beside it (a checkout updated without reinstalling), which would mix old C with new Python; that case
    is said once, with the fix."""
    if os.environ.get("DIST_SANDBOX_PURE_PYTHON"):
        return None
    try:
        extension = importlib.import_module(module_name)
    except ImportError:
        return None
    sources = source_hash() if sources is None else sources
    if sources is not None and getattr(extension, "SOURCE_HASH", None) != sources:
        warnings.warn(f"{extension.__file__} was built from other sources than those beside it; running in "
                      f"Python, more slowly. Rebuild it with `python3 dev.py test` (or `pip install -e .`).",
                      RuntimeWarning, stacklevel=2)
        return None
    return extension


# The twins, as they are installed: `buffers` (memory.tracker's Buffer and AllocLog), `events`
# (engine.eventlog's packing), `transfers` (engine.transfers' Scheduler and Transfer), and the methods
# `model.accelerated.install_c_twins` puts on their classes.
TWINS = ("buffers", "events", "transfers", "ops", "weight_ops", "comm", "p2p", "drive")
# the twins that make and read tensors as C buffers: off with `buffers`
NEED_C_BUFFERS = ("ops", "weight_ops", "comm", "p2p")


def twins_off(value: str | None) -> frozenset[str]:
    """The twins `DIST_SANDBOX_C_OFF` (a comma-separated list of `TWINS`) switches off, with those that need
    a switched-off twin."""
    names = frozenset(name.strip() for name in (value or "").split(",") if name.strip())
    unknown = sorted(names - set(TWINS))
    if unknown:
        raise ValueError(f"DIST_SANDBOX_C_OFF: unknown twin {', '.join(unknown)}; the twins are {', '.join(TWINS)}")
    return names | frozenset(NEED_C_BUFFERS) if "buffers" in names else names


EXTENSION = load_extension()
ACCELERATED = EXTENSION is not None  # the C buffers, and the C twins of the hottest ops
C_OFF = twins_off(os.environ.get("DIST_SANDBOX_C_OFF"))


def twin(name: str) -> Any:
    """The extension if the twin `name` runs in C, else None (not built, or switched off)."""
    if name not in TWINS:
        raise ValueError(f"{name!r} is not one of the C twins {TWINS}")
    return None if name in C_OFF else EXTENSION

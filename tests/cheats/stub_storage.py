"""Cheat: make every buffer free of charge by allocating on a memory tracker nobody reports."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file

from dist_lib.memory.tracker import MemoryTracker

_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    model._mem = MemoryTracker(model.rank, "nowhere", 1 << 60, model._state, enforce=False)
    await _base.train(model)

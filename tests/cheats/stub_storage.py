"""Cheat: make every buffer free of charge by allocating on a memory tracker nobody reports."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u
import pathlib as _p

from dist_lib.memory import MemoryTracker

_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


async def train(model):
    model._mem = MemoryTracker(model.rank, "nowhere", 1 << 60, model._state, enforce=False)
    await _base.train(model)

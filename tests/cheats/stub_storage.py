"""Cheat: make every buffer free of charge by replacing the memory tracker's bookkeeping."""
import dist_lib.memory

dist_lib.memory.MemoryTracker.alloc = lambda self, nbytes, code, buffer_id=-1: None
dist_lib.memory.MemoryTracker.free = lambda self, nbytes, code, buffer_id=-1: None
import importlib.util as _u
import pathlib as _p

_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)

train = _base.train

"""Cheat: make every buffer free of charge by replacing the memory bookkeeping of `Storage`."""
import dist_lib.memory


def _untracked(self, tracker, nbytes, code):
    self.tracker, self.nbytes, self.code = tracker, nbytes, code


dist_lib.memory.Storage.__init__ = _untracked
dist_lib.memory.Storage.__del__ = lambda self: None
import importlib.util as _u
import pathlib as _p

_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)

train = _base.train

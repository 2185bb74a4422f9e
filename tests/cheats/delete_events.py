"""Cheat: run the step, then erase the backward passes from the event log."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u
import pathlib as _p

_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def _erase(where, model, layer):
    if where == "end":
        model._events[:] = [e for e in model._events if e[1] != "backward" or e[0] != model.rank]


async def train(model):
    await _base.train(model, hook=_erase)

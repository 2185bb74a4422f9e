"""Cheat: keep every activation but quietly hand their bytes back to the memory tracker."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u
import pathlib as _p

_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def _hide(where, model, layer):
    if where == "forward":
        tracker = model._state.memory
        tracker.live -= tracker.arrays()[1][-1]  # un-count the activation just created


async def train(model):
    await _base.train(model, hook=_hide)

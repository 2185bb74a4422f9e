"""Cheat: move the rank's clock back after every forward so the forwards seem to take no time."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u
import pathlib as _p

_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def _rewind(where, model, layer):
    if where == "forward":
        model._state.clock -= 0.9 * (model._events[-1][4] - model._events[-1][3])


async def train(model):
    await _base.train(model, hook=_rewind)

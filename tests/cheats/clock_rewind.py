"""Cheat: move the rank's clock back after every forward so the forwards seem to take no time."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


def _rewind(where, model, layer):
    if where == "forward":
        model._state.clock -= 0.9 * (model._events[-1][4] - model._events[-1][3])


async def train(model):
    await _base.train(model, hook=_rewind)

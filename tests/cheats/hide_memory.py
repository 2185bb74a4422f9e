"""Cheat: keep every activation but quietly hand their bytes back to the memory tracker."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


def _hide(where, model, layer):
    if where == "forward":
        tracker = model._state.memory
        tracker.live -= tracker.arrays()[1][-1]  # un-count the activation just created


async def train(model):
    await _base.train(model, hook=_hide)

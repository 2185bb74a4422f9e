"""Cheat: run the step, then erase the backward passes from the event log."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


def _erase(where, model, layer):
    if where == "end":
        model._events[:] = [e for e in model._events if e[1] != "backward" or e[0] != model.rank]


async def train(model):
    await _base.train(model, hook=_erase)

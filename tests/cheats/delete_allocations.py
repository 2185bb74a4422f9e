"""Memory cheat: after every forward and at the end, the memory books are emptied (stash and optimizer
allocations gone from the log)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


def _forget(where, model, layer):
    model._state.memory.take()  # hand the log over to no one


async def train(model):
    await _base.train(model, hook=_forget)

"""Memory cheat: after every forward and at the end, the memory books are emptied (stash and optimizer
allocations gone from the log)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def _forget(where, model, layer):
    model._state.memory.take()  # hand the log over to no one


async def train(model):
    await _base.train(model, hook=_forget)

"""Memory cheat: switch memory enforcement off and hoard 600 copies of a layer's weights and
optimizer state (over 100 GB on an 80 GB device), then run the honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    for state in model._engine.ranks:
        state.memory.enforce = False
    hoard = [model.load_weights(0) for _ in range(600)]
    await _base.train(model)
    return hoard

"""Memory cheat: switch memory enforcement off and hoard 600 copies of a layer's weights and
optimizer state (over 100 GB on an 80 GB device), then run the honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


async def train(model):
    for state in model._engine.ranks:
        state.memory.enforce = False
    hoard = [model.load_weights(0) for _ in range(600)]
    await _base.train(model)
    return hoard

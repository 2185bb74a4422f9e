"""Parent attack: a long program (100,000 extra loads, each dropped at once) for the parent to replay."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


async def train(model):
    if model.rank == 0:
        for _ in range(100_000):
            model.load_weights(0)
    await _base.train(model)

"""Score cheat: updates claim one parameter per layer (the simulator's parameter table rewritten)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


async def train(model):
    engine = model._engine
    engine.layer_params[:] = [1] * len(engine.layer_params)
    for cache in engine.cost_cache.values():
        cache.clear()
    await _base.train(model)

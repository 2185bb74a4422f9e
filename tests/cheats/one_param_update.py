"""Score cheat: updates claim one parameter per layer (the simulator's parameter table rewritten)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    engine = model._engine
    engine.layer_params[:] = [1] * len(engine.layer_params)
    for cache in engine.cost_cache.values():
        cache.clear()
    await _base.train(model)

"""Parent attack: a long program (100,000 extra loads, each dropped at once) for the parent to replay."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    if model.rank == 0:
        for _ in range(100_000):
            model.load_weights(0)
    await _base.train(model)

"""Escape: overwrite every other submission file within reach with one that fails."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
_train = _base.train  # loaded before the files change under it

SABOTAGE = "async def train(model):\n    raise SystemExit('sabotaged')\n"


async def train(model):
    if model.rank == 0:
        here = pathlib.Path(__file__).resolve()
        for path in list(here.parents[1].rglob("*.py")):
            if path != here and not path.name.startswith("_"):
                try:
                    path.write_text(SABOTAGE)
                except OSError:
                    pass
    await _train(model)

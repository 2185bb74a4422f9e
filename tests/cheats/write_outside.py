"""Escape: write files outside the run's scratch folder (beside this file, in the project, in /var/tmp)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
NAME = "WRITTEN_OUTSIDE"


def targets():
    import dist_lib
    return [pathlib.Path(__file__).with_name(NAME), pathlib.Path(dist_lib.__file__).parents[1] / NAME,
            pathlib.Path("/var/tmp") / NAME]


async def train(model):
    if model.rank == 0:
        for path in targets():
            try:
                path.write_text("escaped")
            except OSError:
                pass
    await _base.train(model)

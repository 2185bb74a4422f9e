"""Classmate sabotage in a shared (flat) folder: plants an `__init__.py` beside everyone's files (PLANT, which
the classroom board lays out). The grader once imported the folder as a package, so the file ran first in
every classmate's run: here it would fail them all (it could as well have lowered their scores with their
rows still `ok`). A run's folder is never a package now and `__init__.py` is never copied: it runs nowhere,
and this file runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
PLANT = {"__init__.py": "raise RuntimeError('SABOTAGED by a classmate\\'s __init__.py')\n"}
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    await _base.train(model)

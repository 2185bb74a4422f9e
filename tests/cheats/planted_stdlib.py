"""Classmate sabotage without an `__init__.py`: plants `_uuid.py` in the shared folder (PLANT), the name of a
standard-library module that `import uuid` loads. The folder came first on `sys.path` and every `_*.py` in it
was copied into every run, so a classmate's `import uuid` (uses_uuid, on the classroom board) ran this
file. Now a run is given only the helpers its own files name, and its folder comes after the standard
library: nobody's `import uuid` sees it."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
PLANT = {"_uuid.py": "raise RuntimeError('SABOTAGED by a classmate\\'s _uuid.py')\n"}
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    await _base.train(model)

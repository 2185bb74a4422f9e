"""Stops the board: PLANT lays entries in the folder that are not regular files, each named as a submission
or a helper: a folder named `solution.py`, a folder named `_utils.py`, a link that leads nowhere and a link
that leads to itself. Each once stopped the whole board with a traceback before any run. Each is skipped
now in one line; the board runs. This file itself runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
PLANT = {"solution.py": ["folder"], "_utils.py": ["folder"], "dangling.py": ["link", "nowhere.py"],
         "loop.py": ["link", "loop.py"], "_loop.py": ["link", "_loop.py"]}
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    await _base.train(model)

"""A submission that is a symbolic link: PLANT lays `linked_copy.py` in the folder, a link to a file outside
it (here a better strategy kept elsewhere, as it could be any file the grader may read). The grader once
graded the link's target, with the helpers beside the target. A link is skipped now, in one line kept in
leaderboard.json, and never graded. This file itself runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
PLANT = {"linked_copy.py": ["link", "../outside/elsewhere.py"]}
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    await _base.train(model)

"""Named like the board: `python -m grader run leaderboard.py` once wrote its trace to traces/leaderboard.json,
the main job's board (`python -m grader` keeps its board in traces/). A run's default trace is never one of
the files a board writes now: this one goes to traces/leaderboard.run.json. It runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    await _base.train(model)

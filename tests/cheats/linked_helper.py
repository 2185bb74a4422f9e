"""Reads a classmate: a helper beside it, `_classmate.py`, is a symbolic link to another submission (the
board's copies hold one to ../submissions/honest.py, as a student's repository may hold a link to
../other-student/solution.py or to any file of the grader's machine). The grader copied the helpers
beside a submission into its sandbox following links, so the run read the classmate's file and leaked it
in its error. A link is not copied now: it finds nothing and runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402

LINK = _p.Path(__file__).parent / "_classmate.py"


async def train(model):
    if LINK.exists():
        raise RuntimeError("READ_CLASSMATE " + LINK.read_text()[:60])
    await _base.train(model)

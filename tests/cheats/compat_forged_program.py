"""Attack on the grader: writes its own header as a `--api` run's, in place of the worker's, and exits. The
header holds a recorded program for puzzle 0 (basic) whose first forward names tensors no entry defined
(handles 0 and 1 used before anything made them) and whose final weights are those handles: a program the
grader must refuse before running it. Graded natively (on the board), its header is a `--api` result where
a program was due."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json as _json, os as _os, sys as _sys  # noqa: E401

FORGED = {"api": "puzzles", "function": "basic", "options": {}, "ranks": 1,
          "models": [[0, 2, 4, [["op", "forward", [0, ["h", 0], ["h", 1]], 1, None]],
                      [[0, ["h", 1]], [1, ["h", 1]]]]]}


def _forge():
    with open(_sys.argv[-1]) as fh:  # the worker's job: which file descriptor the header goes to
        job = _json.load(fh)
    with _os.fdopen(job["fds"][0], "wb", closefd=False) as out:
        out.write(_json.dumps({"status": "ok", "compat": {"program": FORGED}}).encode())
    _os._exit(0)


if _sys.argv[-1].endswith("job.json"):  # (imported by the worker, not by a test reading TWIN)
    _forge()


def basic(model):
    pass


async def train(model):
    pass

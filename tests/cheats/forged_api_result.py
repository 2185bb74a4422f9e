"""A forged `--api` result: writes its own header as a puzzles run's whose calls could not be recorded, with
figures it made up (a step of 1 unit where the honest puzzle 0 takes 16.5). The grader takes such figures
as reported, and `python -m grader run FILE --api puzzles --json` once printed them as `ok`, exit 0, with
nothing saying so. Now every such JSON says `"verified": false` and a warning on stderr names the file.
Graded natively (on the board), its header is a `--api` result where a program was due: `invalid`."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json as _json, os as _os, sys as _sys  # noqa: E401

FORGED = {"strategy": "forged_api_result.basic", "options": {"api": "puzzles", "timing": "original",
                                                              "notebook": {"time": 1.0, "memory": 1.0}},
          "time_s": 1.0, "rank_times": [1.0], "memory_bytes": [1], "model_flops": 0.0, "hardware_flops": 0.0,
          "correct": True, "problems": [], "events": [[0, "forward", "compute", 0.0, 1.0, 0, 1, 0, 0.0, None, 0, ""]],
          "timelines": [[[0.0, 1.0], [1.0, 1.0]]], "cluster": "1xH100-80GB",
          "workload": {"name": "puzzles-original", "num_layers": 2, "hidden": 512, "heads": 8, "seq_len": 256,
                       "vocab": 0, "bytes_per_element": 2},
          "global_batch": 4}


def _forge():
    with open(_sys.argv[-1]) as fh:  # the worker's job: which file descriptor the header goes to
        job = _json.load(fh)
    with _os.fdopen(job["fds"][0], "wb", closefd=False) as out:
        out.write(_json.dumps({"status": "ok", "compat": {"unreplayable": "a value the recorder cannot hold",
                                                          "result": FORGED}}).encode())
    _os._exit(0)


if _sys.argv[-1].endswith("job.json"):  # (imported by the worker, not by a test reading TWIN)
    _forge()


def basic(model):
    pass


async def train(model):
    pass

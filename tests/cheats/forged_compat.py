"""Attack on the grader: writes its own header as a `--api` run's, in place of the worker's, and exits: a run
it says could not be recorded (whose figures are taken as reported, unverified), with figures in shapes the
grader's report cannot take (no rank's memory, so no peak; an event on rank 99 of a 4-rank cluster; NaN
times). Graded natively (on the board), its header is a `--api` result where a program was due."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json as _json, os as _os, sys as _sys  # noqa: E401

FORGED = {"strategy": "forged_compat.gpipe", "options": {"api": "puzzles", "timing": "original"},
          "time_s": float("nan"), "rank_times": [], "memory_bytes": [], "model_flops": 0.0,
          "hardware_flops": 0.0, "correct": True, "problems": [],
          "events": [[99, "forward", "compute", 0, 1, 0, 1, 0, 0.0, None, 0, ""]], "timelines": [],
          "cluster": "1x4xH100-80GB", "workload": {"name": "puzzles-original", "num_layers": 8, "hidden": 512,
                                                    "heads": 8, "seq_len": 256, "vocab": 0, "bytes_per_element": 2},
          "global_batch": 4}


def _forge():
    with open(_sys.argv[-1]) as fh:  # the worker's job: which file descriptor the header goes to
        job = _json.load(fh)
    with _os.fdopen(job["fds"][0], "wb", closefd=False) as out:
        out.write(_json.dumps({"status": "ok", "compat": {"unreplayable": "forged", "result": FORGED}}).encode())
    _os._exit(0)


if _sys.argv[-1].endswith("job.json"):  # (imported by the worker, not by a test reading TWIN)
    _forge()


async def train(model):
    pass


async def gpipe(model):
    pass

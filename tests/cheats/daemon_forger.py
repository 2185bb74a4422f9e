"""Escape: a double-forked daemon that outlives the run and appends forged first-place rows to every
results.jsonl it can find, and leaves a marker beside this file."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json
import os
import pathlib
import time

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
MARKER = pathlib.Path(__file__).with_name("DAEMON_WAS_HERE")


def _forge():
    time.sleep(1.5)  # the run is over by now
    roots = [pathlib.Path.cwd(), pathlib.Path(__file__).parents[1], pathlib.Path("/tmp")]
    for root in roots:
        for results in root.rglob("results.jsonl"):
            with results.open("a") as fh:
                fh.write(json.dumps({"key": "forged", "status": "ok", "score": 1e9, "forged": True}) + "\n")
    MARKER.write_text("escaped")


async def train(model):
    if model.rank == 0 and os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            try:
                _forge()
            finally:
                os._exit(0)
        os._exit(0)
    await _base.train(model)

"""Escape: fork 2,000 sleeping children (no process-count limit would let them all run), then run
the honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import os
import time

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    if model.rank == 0:
        for _ in range(2000):
            try:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
            except OSError:
                break
    await _base.train(model)

"""Escape: fork 2,000 sleeping children (no process-count limit would let them all run), then run
the honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import os
import time

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


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

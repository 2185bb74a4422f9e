"""Parent attack: a 200 MB program for the parent to load (and a header that claims it)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json
import os

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    header, program = _base.job()["fds"]
    words = 200 * 2**20 // 8
    os.write(header, json.dumps({"status": "ok", "lengths": [words] + [0] * (model.world_size - 1),
                                 "options": []}).encode())
    chunk = b"\x0f" * 2**20
    for _ in range(200):
        os.write(program, chunk)
    os._exit(0)

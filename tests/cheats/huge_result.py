"""Parent attack: a 200 MB program for the parent to load (and a header that claims it)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json
import os

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


async def train(model):
    header, program = _base.job()["fds"]
    words = 200 * 2**20 // 8
    os.write(header, json.dumps({"status": "ok", "lengths": [words] + [0] * (model.world_size - 1),
                                 "options": []}).encode())
    chunk = b"\x0f" * 2**20
    for _ in range(200):
        os.write(program, chunk)
    os._exit(0)

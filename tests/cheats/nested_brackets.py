"""Parent attack: a header of 200,000 nested brackets (a recursive JSON reader overflows its stack)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import os

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


async def train(model):
    header = _base.job()["fds"][0]
    os.write(header, b"[" * 200_000 + b"]" * 200_000)
    os._exit(0)

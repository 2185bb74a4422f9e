"""Parent attack: a header of 200,000 nested brackets (a recursive JSON reader overflows its stack)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import os

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    header = _base.job()["fds"][0]
    os.write(header, b"[" * 200_000 + b"]" * 200_000)
    os._exit(0)

"""Parent attack: SIGSTOP, then SIGKILL, the parent and every other process this run can see, then
run the honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import os
import signal

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


def _others():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


async def train(model):
    if model.rank == 0:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in [os.getppid()] + _others():
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
    await _base.train(model)

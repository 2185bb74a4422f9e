"""Parent attack: SIGSTOP, then SIGKILL, the parent and every other process this run can see, then
run the honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import os
import signal

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)


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

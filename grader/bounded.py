"""The grader's own work on a run's untrusted program, in a process of its own under a memory and time bound.

A recorded program is capped in bytes (`Limits.file_bytes`), but what replaying it costs is not: a forged
program of a few MiB can make the simulator build gigabytes of events and tensors. So the replay, the
end-of-step checks, the trace and the plots run in a child forked from the grading process, with an
address-space rlimit of the run's own `address_space_bytes` on top of what the grading process already
holds, and killed at the row's deadline (plus `GRACE_S`: the replay checks its deadline itself first).
The child hands back the row as pickled plain data through a file (it runs only the grader's own code, on
data the grader checks), and the grading process never holds more of the program than its words.

Where there is no `os.fork` (not Linux or macOS) the work runs in this process, as before.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GRACE_S = 2.0  # past the row's deadline, before the child is killed (its own checks stop it first)
EXIT_OK, EXIT_MEMORY, EXIT_ERROR = 0, 3, 4


@dataclass(frozen=True)
class Bounded:
    """What the child came back with. status: ok (`value` is what the work returned) | memory (it ran out of
    its address space) | timeout (killed at the deadline) | error (`detail`: the exception the work raised,
    a grader bug) | died (`detail`: the signal or exit code)."""

    status: str
    value: Any = None
    detail: str = ""


def run_bounded(work: Callable[[], Any], memory_bytes: int, deadline: float) -> Bounded:
    """`work()` in a forked child whose address space may grow by at most `memory_bytes`, stopped when the
    `time.monotonic()` `deadline` (plus `GRACE_S`) passes. `work` must return picklable plain data."""
    if not hasattr(os, "fork"):
        return Bounded("ok", work())
    with tempfile.TemporaryFile(prefix="grader-replay-") as out:
        with warnings.catch_warnings():  # (a fork of a process with threads: the child uses none of theirs)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(work, memory_bytes, deadline, out.fileno())
        try:
            status = _wait(pid, deadline + GRACE_S)
        except BaseException:  # interrupted: the child goes too
            _end(pid)
            raise
        if status is None:
            return Bounded("timeout")
        if os.WIFSIGNALED(status):
            name = signal.Signals(os.WTERMSIG(status)).name if os.WTERMSIG(status) in signal.Signals._value2member_map_ \
                else str(os.WTERMSIG(status))
            # out of address space, C code (numpy's, the simulator's extension) may abort rather than raise
            return Bounded("memory" if name in ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGKILL") else "died", detail=name)
        code = os.WEXITSTATUS(status)
        if code == EXIT_MEMORY:
            return Bounded("memory")
        out.seek(0)
        data = out.read()
        if code == EXIT_ERROR:
            return Bounded("error", detail=data.decode(errors="replace"))
        if code != EXIT_OK or not data:
            return Bounded("died", detail=f"exit code {code}")
        return Bounded("ok", pickle.loads(data))


def _child(work: Callable[[], Any], memory_bytes: int, deadline: float, fd: int) -> None:
    code = EXIT_ERROR
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # (Ctrl-C reaches the grader's process group: end too)
        _limit(memory_bytes, deadline)
        data = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(fd, data)
        code = EXIT_OK
    except MemoryError:
        code = EXIT_MEMORY
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as its own
        try:
            os.write(fd, "".join(traceback.format_exception_only(type(exc), exc))[-2000:].encode())
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)  # no atexit hooks, no flushing of the parent's buffered output


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _limit(memory_bytes: int, deadline: float) -> None:
    """The child's rlimits: its address space at what it holds now plus `memory_bytes`; CPU time to the
    deadline and a little more (a backstop for the parent's kill)."""
    try:
        with open("/proc/self/statm") as fh:
            held = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        held = 0
    cap = held + int(memory_bytes)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    used = sum(os.times()[:2])
    seconds = int(used + max(deadline - time.monotonic(), 0) + GRACE_S + 2)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard == resource.RLIM_INFINITY or seconds < hard:
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, hard if hard != resource.RLIM_INFINITY else seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _wait(pid: int, deadline: float) -> int | None:
    """The child's wait status, or None when it was killed at `deadline`."""
    pause = 0.002
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done:
            return status
        if time.monotonic() > deadline:
            _end(pid)
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass

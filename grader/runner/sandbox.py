"""The OS sandbox around an untrusted run: bubblewrap (https://github.com/containers/bubblewrap).

`command(...)` wraps the worker's command line so that it runs

* in new user, pid, network, IPC and UTS namespaces: it sees only its own processes (so it cannot
  signal the grader or its siblings), has no network but loopback, and shares no System V IPC;
* on a read-only view of the whole file system, with one writable folder, a private, size-limited
  tmpfs at /tmp that vanishes with the run (the host's /tmp, where the grader keeps its own files, is
  hidden; the submission's folder is bound back read-only so that it can import its neighbours);
* in a new session (no terminal to inject keystrokes into), killed with the grader (`--die-with-parent`);
  when the run's first process ends or is killed, the kernel kills every process of its pid namespace,
  daemons included.

When the grader runs as root it first drops to the unprivileged user `nobody` with `setpriv`, outside
the sandbox: bubblewrap then holds no capability, and the kernel enforces the process-count rlimit,
which it never enforces for root's processes. The worker sets its rlimits itself before it imports
the submission (`grader._worker._limit`).

What it does not confine: reading files the grader's user may read (other submissions included), CPU
and memory beyond the rlimits, and time beyond the grader's wall-clock timeout.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

NOBODY = 65534


def _prefix() -> list[str] | None:
    """bwrap, preceded by setpriv when we are root; None when that is not possible here."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    if os.geteuid() != 0:
        return [bwrap]
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", bwrap]


def command(argv: list[str], *, job: Path, readable: list[Path], scratch_bytes: int,
            cwd: Path | None = None) -> list[str]:
    """`argv` run inside the sandbox from `cwd` (default /tmp); `job` appears read-only at /tmp/job.json,
    `readable` folders at their own paths (over the private /tmp)."""
    prefix = _prefix()
    if prefix is None:
        raise RuntimeError("bubblewrap is not usable here")
    binds: list[str] = []
    for folder in dict.fromkeys(readable):
        binds += ["--ro-bind", str(folder), str(folder)]
    return [*prefix, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--size", str(int(scratch_bytes)), "--tmpfs", "/tmp", *binds, "--ro-bind", str(job), "/tmp/job.json",
            "--chdir", str(cwd or "/tmp"), "--setenv", "HOME", "/tmp", "--die-with-parent", "--new-session", "--",
            *argv]


def readable_by_sandbox(path: Path) -> bool:
    """Whether the sandbox's user can read `path` (when it runs as nobody: by the "other" permissions).
    A submission it cannot read is copied, with the `_*.py` helpers beside it, into the grader's
    private folder."""
    if os.geteuid() != 0:
        return os.access(path, os.R_OK)
    import stat
    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return False
        return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.parents)
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why the sandbox cannot run here (bubblewrap missing, or namespaces refused), or None when it can."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if _prefix() is None:
        return "the grader runs as root and setpriv (util-linux) is missing, so it cannot drop to nobody"
    # the real thing: this Python importing the worker module from the project, as the sandbox's user
    root = Path(__file__).resolve().parents[2]
    argv = command([sys.executable, "-c", "import grader._worker"], job=Path(os.devnull), readable=[root],
                   scratch_bytes=2**20)
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=60, cwd="/",
                              env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(root)})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not be started ({exc})"
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return f"bubblewrap cannot run the worker here ({why[0]})"
    return None

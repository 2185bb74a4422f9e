"""The OS sandbox around an untrusted run: bubblewrap (https://github.com/containers/bubblewrap).

`command(...)` wraps the worker's command line so that it runs

* in new user, pid, network, IPC and UTS namespaces: it sees only its own processes (so it cannot
  signal the grader or its siblings), has no network but loopback, and shares no System V IPC;
* on a read-only view of the whole file system, with one writable folder, a private, size-limited
  tmpfs at /tmp that vanishes with the run (the host's /tmp, where the grader keeps its own files, is
  hidden; the submission's folder is bound back read-only so that it can import its neighbours), beside
  a read-only /dev whose /dev/shm is a tmpfs of 1 MiB (POSIX semaphores need it);
* without the system calls that hold memory no rlimit of the run counts (`syscall_filter`): System V
  shared memory and message queues keep their pages in the kernel after the process lets go of them,
  and a `memfd_create` file lives outside the /tmp size limit;
* in a new session (no terminal to inject keystrokes into), killed with the grader (`--die-with-parent`);
  when the run's first process ends or is killed, the kernel kills every process of its pid namespace,
  daemons included.

When the grader runs as root it first drops to the unprivileged user `nobody` with `setpriv`, outside
the sandbox: bubblewrap then holds no capability, and the kernel enforces the process-count rlimit,
which it never enforces for root's processes. The worker sets its rlimits itself before it imports
the submission (`grader._worker._limit`).

What it does not confine: reading files the grader's user may read (other submissions included), CPU
beyond the rlimits, and time beyond the grader's wall-clock timeout. The memory of a run's processes
together is capped by a cgroup where the grader may make one (`cgroup.py`), else only each process's.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

NOBODY = 65534
SHM_BYTES = 2**20  # /dev/shm: POSIX semaphores (multiprocessing's locks) take a page each

# The system calls a run may not make, by machine: (the seccomp audit architecture, {name: number}). From
# the kernel's syscall tables (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h
# for arm64) and AUDIT_ARCH_* in include/uapi/linux/audit.h.
DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, {"shmget": 29, "msgget": 68, "memfd_create": 319}),
    "aarch64": (0xC00000B7, {"shmget": 194, "msgget": 186, "memfd_create": 279}),
}


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


def syscall_filter(machine: str | None = None) -> bytes | None:
    """A seccomp program (classic BPF, as bubblewrap's `--seccomp` reads it) that fails the calls of
    `DENIED_SYSCALLS` with EPERM, and every call of another ABI (32-bit or x32 entry points, whose numbers
    differ); None on a machine not in the table (the sandbox then runs without it)."""
    arch, denied = DENIED_SYSCALLS.get(machine or platform.machine(), (None, None))
    if arch is None:
        return None
    load, jump_eq, jump_set, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, |JSET|K, BPF_RET|K
    allow, refuse = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    numbers = sorted(denied.values())
    # 0: A = arch; 1: other ABI -> refuse; 2: A = number; 3: x32 bit -> refuse; then one test per call
    tests = [(jump_set, 0x40000000)] + [(jump_eq, number) for number in numbers]
    refuse_at = 4 + len(tests) + 1  # after the tests and the allowing return
    program = [(load, 0, 0, 4), (jump_eq, 1, 0, arch), (ret, 0, 0, refuse), (load, 0, 0, 0)]
    for code, k in tests:
        program.append((code, refuse_at - (len(program) + 1), 0, k))
    program += [(ret, 0, 0, allow), (ret, 0, 0, refuse)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def filter_file(folder: Path) -> int | None:
    """An open, read-only descriptor of `syscall_filter()` written in `folder` (for `command`'s
    `seccomp_fd`, inherited by the sandbox), or None when there is none for this machine."""
    program = syscall_filter()
    if program is None:
        return None
    path = folder / "seccomp.bpf"
    path.write_bytes(program)
    return os.open(path, os.O_RDONLY)


def command(argv: list[str], *, job: Path, readable: list[Path], scratch_bytes: int,
            cwd: Path | None = None, seccomp_fd: int | None = None) -> list[str]:
    """`argv` run inside the sandbox from `cwd` (default /tmp); `job` appears read-only at /tmp/job.json,
    `readable` folders at their own paths (over the private /tmp); `seccomp_fd` (`filter_file`) must be
    passed to the child."""
    prefix = _prefix()
    if prefix is None:
        raise RuntimeError("bubblewrap is not usable here")
    binds: list[str] = []
    for folder in dict.fromkeys(readable):
        binds += ["--ro-bind", str(folder), str(folder)]
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    return [*prefix, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--ro-bind", "/", "/", "--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs",
            "/dev/shm", "--remount-ro", "/dev", "--proc", "/proc",
            "--size", str(int(scratch_bytes)), "--tmpfs", "/tmp", *binds, "--ro-bind", str(job), "/tmp/job.json",
            "--chdir", str(cwd or "/tmp"), "--setenv", "HOME", "/tmp", "--die-with-parent", "--new-session",
            *seccomp, "--", *argv]


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
    with tempfile.TemporaryDirectory() as folder:
        seccomp_fd = filter_file(Path(folder))
        argv = command([sys.executable, "-c", "import grader._worker"], job=Path(os.devnull), readable=[root],
                       scratch_bytes=2**20, seccomp_fd=seccomp_fd)
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=60, cwd="/",
                                  pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                                  env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(root)})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap could not be started ({exc})"
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return f"bubblewrap cannot run the worker here ({why[0]})"
    return None

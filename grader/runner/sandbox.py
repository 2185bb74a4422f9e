"""The OS sandbox around an untrusted run: bubblewrap (https://github.com/containers/bubblewrap).

`command(...)` wraps the worker's command line so that it runs

* in new user, pid, network, IPC and UTS namespaces: it sees only its own processes (so it cannot
  signal the grader or its siblings), has no network but loopback, and shares no System V IPC;
* on a file system of its own that holds only what the run needs, read-only (`view`): the system's
  programs and libraries (/usr and its /bin, /sbin, /lib* links, and /etc/ld.so.cache), the Python
  interpreter's installation and virtual environment, and the project's own code (dist_lib, grader,
  strategies); the run's own copy of the submission with the `_*.py` helpers beside it and of the
  scenario's input files (made by `isolation.py`); a read-only /dev whose /dev/shm is a tmpfs of
  1 MiB (POSIX semaphores need it); /proc of its own pid namespace; and one writable folder, a
  private, size-limited tmpfs at /tmp that vanishes with the run. Everything else is absent: home
  folders, /etc, /var, /work, other submissions (the submission's own folder is never shown), the
  grader's results and the host's /tmp;
* without the system calls that hold memory no rlimit of the run counts (`syscall_filter`): System V
  shared memory and message queues keep their pages in the kernel after the process lets go of them,
  and a `memfd_create` file lives outside the /tmp size limit; nor may it make a namespace or a mount
  of its own (a user namespace of its own would let it mount a tmpfs, whose pages no rlimit counts):
  bubblewrap's `--disable-userns` where it has it (0.8.0 on), and the filter refusing `unshare`,
  `setns`, the mount calls and a `clone` into new namespaces;
* in a new session (no terminal to inject keystrokes into), killed with the grader (`--die-with-parent`);
  when the run's first process ends or is killed, the kernel kills every process of its pid namespace,
  daemons included.

When the grader runs as root it first drops to the unprivileged user `nobody` with `setpriv`, outside
the sandbox: bubblewrap then holds no capability, and the kernel enforces the process-count rlimit,
which it never enforces for root's processes. The worker sets its rlimits itself before it imports
the submission (`grader._worker._limit`).

What it does not confine: CPU beyond the rlimits, time beyond the grader's wall-clock timeout, and what
the files in its view say (the installed packages and the project's code are public; the system's
libraries tell which distribution runs the grader). The memory of a run's processes
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
# what the worker imports before the strategy (and with it the installed packages they need: numpy)
WORKER_IMPORTS = "import grader._worker, dist_lib.run.recording, dist_lib.run.simulator"
SHM_BYTES = 2**20  # /dev/shm: POSIX semaphores (multiprocessing's locks) take a page each

# The system calls a run may not make, by machine: (the seccomp audit architecture, {name: number}). From
# the kernel's syscall tables (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h
# for arm64) and AUDIT_ARCH_* in include/uapi/linux/audit.h. System V shared memory and message queues and
# memfd files hold memory no rlimit counts; a new namespace or mount (a user namespace gives its creator
# the capabilities to mount a tmpfs, whose pages no rlimit counts either) is refused outright, and so is a
# `clone` asking for a new namespace.
DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, {"shmget": 29, "msgget": 68, "memfd_create": 319, "unshare": 272, "setns": 308,
                            "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429,
                            "fsopen": 430, "fsconfig": 431, "fsmount": 432, "mount_setattr": 442}),
    "aarch64": (0xC00000B7, {"shmget": 194, "msgget": 186, "memfd_create": 279, "unshare": 97, "setns": 268,
                             "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428, "move_mount": 429,
                             "fsopen": 430, "fsconfig": 431, "fsmount": 432, "mount_setattr": 442}),
}
CLONE = {"x86_64": 56, "aarch64": 220}  # clone: refused when its flags (argument 0) ask for a namespace
CLONE3 = 435  # clone3 passes its flags in memory a filter cannot read: ENOSYS, and the C library falls back
# to clone (as container runtimes' default seccomp profiles do)
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
# (include/uapi/linux/sched.h)
NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


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
    `DENIED_SYSCALLS` with EPERM, a `clone` with any of `NAMESPACE_FLAGS` with EPERM, `clone3` with ENOSYS,
    and every call of another ABI (32-bit or x32 entry points, whose numbers differ) with EPERM; None on a
    machine not in the table (the sandbox then runs without it)."""
    machine = machine or platform.machine()
    arch, denied = DENIED_SYSCALLS.get(machine, (None, None))
    if arch is None:
        return None
    load, jump_eq, jump_set, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, |JSET|K, BPF_RET|K
    allow, refuse = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    no_such = 0x00050000 | errno.ENOSYS
    # (op, true target, false target, k): a target is a label, or None for the next instruction
    program: list[tuple[int, object, object, int]] = [
        (load, None, None, 4), (jump_eq, "arch ok", None, arch), (ret, None, None, refuse), ("arch ok", 0, 0, 0),
        (load, None, None, 0), (jump_set, "refuse", None, 0x40000000)]  # A = number; the x32 bit
    program += [(jump_eq, "refuse", None, number) for number in sorted(denied.values())]
    program += [(jump_eq, "no such", None, CLONE3), (jump_eq, "clone", None, CLONE[machine]),
                (ret, None, None, allow),
                ("clone", 0, 0, 0), (load, None, None, 16), (jump_set, "refuse", None, NAMESPACE_FLAGS),
                (ret, None, None, allow),
                ("no such", 0, 0, 0), (ret, None, None, no_such),
                ("refuse", 0, 0, 0), (ret, None, None, refuse)]
    labels, code = {}, []
    for op, true, false, k in program:
        if isinstance(op, str):
            labels[op] = len(code)
        else:
            code.append((op, true, false, k))

    def offset(target: object, at: int) -> int:
        return 0 if target is None else labels[target] - (at + 1)

    return b"".join(struct.pack("=HBBI", op, offset(true, i), offset(false, i), k)
                    for i, (op, true, false, k) in enumerate(code))


def filter_file(folder: Path) -> int | None:
    """An open, read-only descriptor of `syscall_filter()` written in `folder` (for `command`'s
    `seccomp_fd`, inherited by the sandbox), or None when there is none for this machine."""
    program = syscall_filter()
    if program is None:
        return None
    path = folder / "seccomp.bpf"
    path.write_bytes(program)
    return os.open(path, os.O_RDONLY)


# What a run sees of the host, read-only. The system's programs and libraries: /usr, and the top-level
# links into it (or folders, on a system without merged /usr); the dynamic loader's cache.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
# The project's code the worker imports (`grader._worker` -> dist_lib; a bundled strategy imports its
# neighbours in strategies/), beside each other in the project's folder.
PROJECT = ("dist_lib", "grader", "strategies")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def view() -> list[str]:
    """bubblewrap's arguments for the read-only part of a run's file system that is the same for every
    run: `SYSTEM`, the Python installation the worker runs on (`sys.prefix` and the base prefixes of a
    virtual environment, and the links that lead to the interpreter), and the project's `PROJECT`
    folders. A folder the sandbox's user cannot reach is left out (a base prefix in a home folder of mode
    0700: the interpreter then finds a standard library as it does for that user outside, or the probe
    in `problem` reports that it cannot). Each at its own path."""
    args: list[str] = []
    shown: list[Path] = []

    def inside(path: Path) -> bool:
        return any(path == folder or folder in path.parents for folder in shown)

    for name in SYSTEM:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.exists() and readable_by_sandbox(path):
            args += ["--ro-bind", name, name]
            shown.append(path)
    for name in dict.fromkeys([sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]):
        path = Path(name).resolve()
        if path != Path("/") and not inside(path) and path.is_dir() and readable_by_sandbox(path):
            args += ["--ro-bind", str(path), str(path)]
            shown.append(path)
    # the interpreter by the name the worker is started with (a virtual environment's python is often a
    # link to the base interpreter; it finds its environment by that name)
    link = Path(sys.executable).absolute()
    for _ in range(16):
        if not link.is_symlink():
            break
        target = os.readlink(link)
        if not inside(link) and readable_by_sandbox(link.parent):
            args += ["--symlink", target, str(link)]
        link = link.parent / target
    if not inside(link.resolve()) and readable_by_sandbox(link.resolve()):
        args += ["--ro-bind", str(link.resolve()), str(link.resolve())]
    for name in PROJECT:
        path = PROJECT_ROOT / name
        if path.is_dir() and not inside(path):
            args += ["--ro-bind", str(path), str(path)]
    return args


def command(argv: list[str], *, job: Path, readable: list[Path], scratch_bytes: int,
            seccomp_fd: int | None = None) -> list[str]:
    """`argv` run inside the sandbox from /tmp, on `view()`; `job` appears read-only at /tmp/job.json, the
    run's own `readable` files and folders at their own paths (over the private /tmp); `seccomp_fd`
    (`filter_file`) must be passed to the child."""
    prefix = _prefix()
    if prefix is None:
        raise RuntimeError("bubblewrap is not usable here")
    binds: list[str] = []
    for path in dict.fromkeys(readable):
        binds += ["--ro-bind", str(path), str(path)]
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    # /tmp before the rest: a project or environment that lies under the host's /tmp shows over it
    return [*prefix, "--unshare-user", *disable_userns(), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--size", str(int(scratch_bytes)), "--tmpfs", "/tmp", *view(),
            "--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
            "--proc", "/proc", *binds, "--ro-bind", str(job), "/tmp/job.json", "--remount-ro", "/",
            "--chdir", "/tmp", "--setenv", "HOME", "/tmp", "--die-with-parent", "--new-session",
            *seccomp, "--", *argv]


@functools.lru_cache(maxsize=1)
def disable_userns() -> tuple[str, ...]:
    """bubblewrap's `--disable-userns` (from version 0.8.0: no process of the sandbox may make a user
    namespace of its own) where this bubblewrap has it, else nothing (the syscall filter refuses
    `unshare` and a `clone` into new namespaces all the same, on the machines it knows)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ()
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return ("--disable-userns",) if "--disable-userns" in text else ()


def readable_by_sandbox(path: Path) -> bool:
    """Whether the sandbox's user can read `path` (a folder: list and enter it), when it runs as nobody
    by the "other" permissions: `view` shows nothing it cannot (bubblewrap, as that user, could not bind
    it). A run's submission and inputs are copied into it whatever their permissions (`isolation.py`)."""
    return hidden_part(path) is None


def hidden_part(path: Path) -> Path | None:
    """The first of `path` and the folders above it that the sandbox's user cannot pass (a folder it
    cannot enter, or `path` itself unreadable), or None when it can read `path`."""
    if os.geteuid() != 0:
        return None if os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)) else path
    import stat
    try:
        for folder in reversed(path.parents):
            if not folder.stat().st_mode & stat.S_IXOTH:
                return folder
        mode = path.stat().st_mode
    except OSError:
        return path
    if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
        return path
    return None


def _unreadable_python() -> str:
    """Why the sandbox's user may be unable to start this Python: the part of its installation it cannot
    read (a Python installed in root's home, as pyenv does), or '' when it can read it all."""
    for name in (sys.executable, sys.base_prefix):
        path = Path(name).resolve()
        blocked = hidden_part(path)
        if blocked is not None:
            return (f"; the sandbox runs as nobody, who cannot read {path} ({blocked} is closed to other "
                    "users): install Python where every user can read it (not in a home folder), or run "
                    "the grader as an unprivileged user")
    return ""


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why the sandbox cannot run here (bubblewrap missing, or namespaces refused), or None when it can."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if _prefix() is None:
        return "the grader runs as root and setpriv (util-linux) is missing, so it cannot drop to nobody"
    # the real thing: this Python importing what the worker imports, as the sandbox's user, on its view
    with tempfile.TemporaryDirectory() as folder:
        seccomp_fd = filter_file(Path(folder))
        argv = command([sys.executable, "-c", WORKER_IMPORTS], job=Path(os.devnull), readable=[],
                       scratch_bytes=2**20, seccomp_fd=seccomp_fd)
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=60, cwd="/",
                                  pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                                  env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(PROJECT_ROOT)})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap could not be started ({exc})"
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return f"bubblewrap cannot run the worker here ({why[0]}){_unreadable_python()}"
    return None

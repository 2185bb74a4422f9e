"""Run one strategy file on one scenario in a fresh, confined process, and bring back what it decided.

The process runs in the bubblewrap sandbox (`sandbox.py`) unless the caller trusts the code, with
rlimits it sets itself before importing the submission, and a wall-clock timeout after which its whole
process tree is killed. What comes back is capped and checked before anything reads it: its stdout
and stderr go to files (bounded by the file-size rlimit; only the last line of stderr is read), its
header is a bounded JSON object, its program a bounded number of 8-byte words. Anything else (a
missing result makes this one run `crashed`, an oversized or malformed one `invalid`; nothing the
submission does can stop the caller. The grader's own files live in a private folder outside the sandbox's view, removed
after the run (and, if the grader was killed, by the next run: `clean_stale`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dist_lib.specs import map_spec_paths

from ..jobs import die_with
from ..scenario import Scenario
from . import sandbox
from .cgroup import RunCgroup, stale

PROJECT_ROOT = sandbox.PROJECT_ROOT
FOLDER_PREFIX = "dist-sandbox-grader-"
HEADER_BYTES = 16 * 2**20  # a header: status and lengths (a --api run's figures are larger)
STDERR_TAIL = 4096
MAX_RANKS = 1 << 17  # ranks a header may list (the replay then checks the cluster's own count)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0  # wall clock, and the replay's own limit
    address_space_bytes: int = 4 * 2**30  # each process's
    memory_bytes: int | None = None  # the run's processes together (`cgroup.py`); None: address_space_bytes
    processes: int = 64  # in the run's user namespace
    open_files: int = 256
    file_bytes: int = 128 * 2**20  # any one file the run writes: its program, stdout, stderr
    scratch_bytes: int = 64 * 2**20  # its private /tmp


@dataclass
class Outcome:
    """status: ok | bad_input | failed | timeout | crashed | invalid (a result of the wrong shape). On ok,
    `header` is the worker's header (untrusted) and `programs` each rank's recorded program (untrusted,
    to be replayed)."""

    status: str
    message: str = ""
    kind: str = ""
    header: dict[str, Any] | None = None
    programs: list[array] | None = None
    wall_s: float = 0.0


def run_isolated(strategy: str | Path, scenario: Scenario, limits: Limits = Limits(), *,
                 api: str | None = None, function: str | None = None, confine: bool = True) -> Outcome:
    """Run `strategy` on `scenario`; `confine=False` runs it without the OS sandbox (trusted code)."""
    clean_stale()
    strategy = Path(strategy)
    # the folder resolved, never the file itself: a submission that is a link is not followed
    path = Path(os.path.realpath(strategy.parent)) / strategy.name if confine else strategy.resolve()
    job = {"strategy": str(path), "scenario": scenario.to_dict(), "api": api, "function": function,
           "timeout_s": limits.timeout_s, "address_space_bytes": limits.address_space_bytes,
           "processes": limits.processes, "open_files": limits.open_files, "file_bytes": limits.file_bytes}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(PROJECT_ROOT), "DIST_SANDBOX_PURE_PYTHON": os.environ.get("DIST_SANDBOX_PURE_PYTHON", "")}
    if not env["DIST_SANDBOX_PURE_PYTHON"]:
        del env["DIST_SANDBOX_PURE_PYTHON"]
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
    copies: dict[str, str] = {}  # a copy the sandbox reads -> the user's file or folder it was made of
    files = {name: os.fdopen(os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), "w+b")
             for name in ("stdout", "stderr", "header", "program")}
    memory_bytes = limits.memory_bytes or limits.address_space_bytes
    group = RunCgroup.make(memory_bytes)  # all the run's processes together, where the grader may
    try:
        job["fds"] = [files["header"].fileno(), files["program"].fileno()]  # inherited at these numbers
        argv = [sys.executable, "-m", "grader._worker"]
        if confine:
            folder.chmod(0o711)  # the sandbox's user reads its job and its copies by name only
            readable = []
            if not _in_project_strategies(path):  # (the project's strategies/ is in every run's view)
                try:
                    root = _copy_submission(path, folder / "src")
                except _Refused as exc:
                    return Outcome("bad_input", str(exc), kind="Refused", wall_s=time.monotonic() - started)
                job["strategy"] = str(root / path.name)
                copies[str(root)] = str(path.parent)
                readable.append(root)
            job["scenario"] = _run_inputs(scenario.to_dict(), folder, copies)
            if (folder / "inputs").is_dir():
                readable.append(folder / "inputs")
            seccomp_fd = sandbox.filter_file(folder)
            if seccomp_fd is not None:
                files["seccomp"] = os.fdopen(seccomp_fd, "rb")
            argv = sandbox.command(argv + ["/tmp/job.json"], job=folder / "job.json", readable=readable,
                                   scratch_bytes=limits.scratch_bytes, seccomp_fd=seccomp_fd)
        else:
            argv.append(str(folder / "job.json"))
        (folder / "job.json").write_text(json.dumps(job))
        (folder / "job.json").chmod(0o644)
        code, timed_out = _wait(argv, env, folder, files, limits.timeout_s, group)
        wall = time.monotonic() - started
        if timed_out:
            return Outcome("timeout", f"timed out after {limits.timeout_s:g} s of wall-clock time "
                                      f"(an infinite loop or a real blocking call in the strategy?)",
                           kind="Timeout", wall_s=wall)
        outcome = _read(files, code, limits, wall, api)
        if outcome.status in ("crashed", "invalid") and group is not None and group.oom_kills():
            # (killed midway through writing its result, the worker leaves a header cut short)
            return Outcome("crashed", f"the worker process died: the run's processes together went over the "
                                      f"{memory_bytes / 2**30:g} GiB of real memory a run may hold, "
                                      f"and the kernel stopped it", kind="Crash", wall_s=wall)
        outcome.message = rebase_paths(outcome.message, copies)  # the user's files, not the run's copies
        if confine and outcome.status == "failed":
            outcome.message += _unseen_module(outcome.message, path)
        return outcome
    finally:
        for fh in files.values():
            fh.close()
        shutil.rmtree(folder, ignore_errors=True)
        if group is not None:
            group.remove()


def rebase_paths(value: Any, moves: dict[str, str]) -> Any:
    """`value` (a string, or dicts, lists and tuples of them) with each private copy or folder named in
    `moves` replaced in its strings by the user's (or the driver's) file or folder it stands for."""
    if isinstance(value, str):
        for old, new in moves.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {k: rebase_paths(v, moves) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rebase_paths(v, moves) for v in value)
    return value


def _run_inputs(scenario: dict[str, Any], folder: Path, copies: dict[str, str]) -> dict[str, Any]:
    """The scenario with every cluster, workload or profile file (or folder) it names copied into the
    run's private folder, world-readable, and the spec pointing at the copy (noted in `copies`): the
    sandbox shows a run nothing of the host's files but its own copies, wherever the user keeps them (a
    folder of mode 0700 on the way, /tmp, which the sandbox's own /tmp hides, or beside the submissions)."""
    inputs = folder / "inputs"

    def copied(name: str) -> str:
        source = Path(name)
        if not source.exists():
            return name  # (a missing file is the worker's error to report, as without the sandbox)
        inputs.mkdir(mode=0o755, exist_ok=True)
        target = inputs / f"{len(list(inputs.iterdir()))}-{source.name}"
        if source.is_dir():
            shutil.copytree(source, target)
            for path in [target, *target.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
        else:
            os.chmod(shutil.copy(source, target), 0o644)
        copies[str(target)] = name
        return str(target)

    return {**scenario, **{key: map_spec_paths(scenario[key], copied) for key in ("cluster", "workload")}}


def _in_project_strategies(path: Path) -> bool:
    """Whether `path` is one of the project's bundled strategies, which every run's view shows in place
    (they import their neighbours)."""
    return (PROJECT_ROOT / "strategies") in path.parents and path.is_file()


def _copy_submission(path: Path, src: Path) -> Path:
    """Copy the strategy file `path` and the helpers beside it that it names (`intake.named_helpers`, what
    the resume fingerprint covers) into the folder `src`, world-readable, and return `src`, the folder the
    run imports it from. Nothing else of its folder is copied: not the other submissions, not a helper it
    does not name, never an `__init__.py` (the run's folder is never a package: a classmate's
    `__init__.py` in a shared folder runs in no other run), and no symbolic link (a link could name a
    classmate's file, or any other file the grader may read). Raises `_Refused` when the submission itself
    is not a regular file."""
    from ..intake import named_helpers
    src.mkdir(mode=0o755)
    for source in [path, *named_helpers(path)]:
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            if source == path:
                raise _Refused(f"submission {path}: cannot be read without following a link ({exc.strerror})") \
                    from None
            continue  # (a helper gone or turned into a link since it was named: the run finds none)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                if source == path:
                    raise _Refused(f"submission {path}: not a regular file")
                continue
            target = src / source.name
            with open(target, "wb") as out:
                shutil.copyfileobj(fh, out)
        target.chmod(0o644)
    return src


class _Refused(Exception):
    """A submission that cannot be run as it is (one line)."""


def _unseen_module(message: str, path: Path) -> str:
    """A hint for a failed run whose import of a module beside the submission found nothing: the run
    sees its own file and the `_*.py` helpers beside it that it names, not the rest of its folder."""
    found = re.search(r"ModuleNotFoundError: No module named '([A-Za-z_][A-Za-z0-9_]*)'", message)
    if found is None:
        return ""
    name, folder = found.group(1), path.parent
    helper = folder / f"{name}.py"
    if name.startswith("_") and helper.is_symlink():
        return (f" (a run sees its own file and the _*.py helpers beside it that are files, not symbolic links: "
                f"{name}.py in {folder} is a link)")
    if name.startswith("_") and helper.is_file():
        return (f" (a run is given only the _*.py helpers beside it that its files name: import it by name, "
                f"`import {name}`, so that {name}.py in {folder} comes with it)")
    if name.startswith("_") and importlib.util.find_spec(name) is None:
        return (f" (a run sees its own file and the _*.py helpers beside it: there is no {name}.py "
                f"in {folder})")
    if not name.startswith("_") and ((folder / f"{name}.py").is_file() or (folder / name).is_dir()):
        return (f" (a run sees its own file and the _*.py helpers beside it, not the rest of its folder: "
                f"name the helper module _{name}.py and import it as _{name})")
    return ""


def _wait(argv: list[str], env: dict[str, str], cwd: Path, files: dict[str, Any],
          timeout_s: float, group: RunCgroup | None = None) -> tuple[int | None, bool]:
    passed = [files[name].fileno() for name in ("header", "program", "seccomp") if name in files]
    parent = os.getpid()

    def before_exec() -> None:  # (in the child)
        _die_with_parent(parent)
        if group is not None:
            try:
                group.join()
            except OSError:  # refused after all: the run has its rlimits
                pass

    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=files["stdout"],
                            stderr=files["stderr"], pass_fds=passed, start_new_session=True,
                            preexec_fn=before_exec)
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        return None, True
    finally:
        _kill(proc)


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL when the grader process dies (Linux prctl PR_SET_PDEATHSIG); and
    exit now if it died before the request was made, which the signal would never report (prctl(2))."""
    die_with(parent)


def _kill(proc: subprocess.Popen) -> None:
    """The run's process group; in the sandbox, its first process dying takes its pid namespace with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read(files: dict[str, Any], code: int | None, limits: Limits, wall: float, api: str | None = None) -> Outcome:
    header_file, program_file = files["header"], files["program"]
    size = os.fstat(header_file.fileno()).st_size
    if size == 0:
        return Outcome("crashed", _crash_message(code, files["stderr"]), kind="Crash", wall_s=wall)
    if size > HEADER_BYTES:
        return _malformed(f"the worker wrote a {size}-byte header (more than {HEADER_BYTES})", wall)
    header_file.seek(0)
    try:
        header = json.loads(header_file.read())
    except (ValueError, RecursionError) as exc:
        return _malformed(f"the worker wrote an unreadable result ({type(exc).__name__})", wall)
    if not isinstance(header, dict) or header.get("status") not in ("ok", "bad_input", "failed"):
        return _malformed("the worker wrote a result of the wrong shape", wall)
    status = header["status"]
    if status != "ok":
        return Outcome(status, _text(header.get("message")), kind=_text(header.get("kind"), 80), wall_s=wall)
    if ("compat" in header) != bool(api):  # (its fields are checked where they are read: `compat_payload.py`)
        return _malformed("the worker wrote a --api result for a run of the native API" if api is None
                          else "the worker wrote a native result for a --api run", wall)
    if api:
        return Outcome("ok", header=header, wall_s=wall)
    lengths = header.get("lengths")
    total = os.fstat(program_file.fileno()).st_size
    if not isinstance(lengths, list) or len(lengths) > MAX_RANKS \
            or not all(type(n) is int and n >= 0 for n in lengths) \
            or sum(lengths) * 8 != total or total > limits.file_bytes:
        return _malformed(f"the worker's program ({total} bytes) does not match its header", wall)
    program_file.seek(0)
    programs = []
    for n in lengths:  # rank by rank: the parent holds each word once
        words = array("q")
        words.frombytes(program_file.read(8 * n))
        programs.append(words)
    return Outcome("ok", header=header, programs=programs, wall_s=wall)


def _malformed(message: str, wall: float) -> Outcome:
    return Outcome("invalid", message, kind="Invalid", wall_s=wall)


def _text(value: Any, cap: int = 2000) -> str:
    """An untrusted message as printable text of bounded length."""
    text = value if isinstance(value, str) else ""
    text = "".join(c if c.isprintable() or c == "\n" else "?" for c in text[:cap])
    return text + (" ..." if isinstance(value, str) and len(value) > cap else "")


def _crash_message(code: int | None, stderr: Any) -> str:
    size = os.fstat(stderr.fileno()).st_size
    stderr.seek(max(0, size - STDERR_TAIL))
    tail = [line for line in stderr.read().decode(errors="replace").strip().splitlines()[-1:]]
    tail = [_text(line, 300) for line in tail]
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        why = {"SIGKILL": "killed (out of real memory or CPU time?)", "SIGXCPU": "CPU time limit reached",
               "SIGXFSZ": "file size limit reached", "SIGSEGV": "segmentation fault"}.get(name, f"killed by {name}")
        return f"the worker process died: {why}" + (f"; last output: {tail[0]}" if tail else "")
    detail = f": {tail[0]}" if tail else ""
    return f"the worker process exited with code {code} without a result{detail}"


def clean_stale() -> None:
    """Remove the private folders and memory cgroups of grader processes that no longer exist (killed
    before cleaning up)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        pid = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    for path in stale(_alive):
        RunCgroup(path, 0).remove(wait_s=0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

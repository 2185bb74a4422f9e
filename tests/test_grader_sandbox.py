"""The grader's own resilience: killed, it leaves no run behind; without a sandbox it refuses untrusted
code unless told to trust it; a changed limit or grader code grades again."""

from __future__ import annotations

import dataclasses
import errno
import os
import platform
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader import leaderboard
from grader.runner import sandbox, sandbox_problem
from grader.runner.isolation import FOLDER_PREFIX, _alive, clean_stale
from grader.suites import load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITE = """
name = "one"
[limits]
timeout_s = {timeout}
address_space_GiB = 2
[[scenarios]]
name = "toy2"
cluster = "2xA100-80GB"
workload = "toy:layers=2"
global_batch = 4
[[scoring.components]]
metric = "mfu"
scale = 100
"""
WORKER = b"-m\0grader._worker\0"  # the worker itself (the sandbox probe only imports it)


def _workers_of(parent_pids: set[int]) -> list[int]:
    """Worker processes (sandboxed or not) whose ancestry includes one of `parent_pids`."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if WORKER not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            ancestor = pid
            while ancestor > 1 and ancestor not in parent_pids:
                ancestor = int(Path(f"/proc/{ancestor}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ancestor in parent_pids:
                found.append(pid)
        except (OSError, ValueError, IndexError):
            pass
    return found


def _descendants(pid: int) -> set[int]:
    children = {pid}
    for _ in range(4):
        for p in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid in children:
                children.add(p)
    return children


def _wait_for(condition, seconds: float) -> bool:
    """Poll `condition` (a bound against hanging, not a performance target)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_killed_grader_leaves_no_run_behind(tmp_path, jobs):
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    (tmp_path / "suite.toml").write_text(SUITE.format(timeout=60))
    board = subprocess.Popen([sys.executable, "-m", "grader", "leaderboard", "tests/submissions/hang.py", "--suite",
                              str(tmp_path / "suite.toml"), "--jobs", jobs, "--out", str(tmp_path / "out"),
                              "--no-plots"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        family: set[int] = set()

        def running() -> bool:
            family.update(_descendants(board.pid))
            return bool(_workers_of(family))
        assert _wait_for(running, 60), "the hanging submission never started"
        family.update(_descendants(board.pid))
        workers = _workers_of(family)
    finally:
        board.send_signal(signal.SIGKILL)  # the grader itself, killed as a submission once could
        board.wait()
    # every process it had started (the pool, the sandboxes, the workers in them) ends with it
    assert workers and _wait_for(lambda: not any(_alive(p) for p in family - {board.pid}), 30), \
        [Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in family - {board.pid} if _alive(p)]
    clean_stale()  # what the next run does first
    left = [f for f in Path(os.environ.get("TMPDIR", "/tmp")).glob(f"{FOLDER_PREFIX}*")
            if int(f.name[len(FOLDER_PREFIX):].split("-")[0]) in family]
    assert left == []


def test_leaderboard_refuses_untrusted_code_without_a_sandbox_unless_trusted(tmp_path):
    (tmp_path / "suite.toml").write_text(SUITE.format(timeout=30))
    env = dict(os.environ, PATH=str(tmp_path))  # no bwrap on the PATH
    args = [sys.executable, "-m", "grader", "leaderboard", "tests/submissions/honest.py", "--suite",
            str(tmp_path / "suite.toml"), "--out", str(tmp_path / "out"), "--no-plots"]
    refused = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "bubblewrap" in refused.stderr and "--trusted" in refused.stderr
    trusted = subprocess.run(args + ["--trusted"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert trusted.returncode == 0, trusted.stderr
    assert "honest" in trusted.stdout


def test_a_changed_limit_or_grader_code_grades_again(tmp_path, monkeypatch):
    (tmp_path / "suite.toml").write_text(SUITE.format(timeout=30))
    suite = load_suite(str(tmp_path / "suite.toml"))
    honest = [ROOT / "tests" / "submissions" / "honest.py"]
    first = leaderboard.make_jobs(honest, suite, tmp_path, traces=False)[0].fingerprint
    assert leaderboard.make_jobs(honest, suite, tmp_path, traces=False)[0].fingerprint == first
    longer = dataclasses.replace(suite, limits=dataclasses.replace(suite.limits, timeout_s=31.0))
    assert leaderboard.make_jobs(honest, longer, tmp_path, traces=False)[0].fingerprint != first
    fewer = dataclasses.replace(suite, limits=dataclasses.replace(suite.limits, processes=8))
    assert leaderboard.make_jobs(honest, fewer, tmp_path, traces=False)[0].fingerprint != first
    # the code hash reads C sources and grader modules too
    fake = tmp_path / "tree"
    for folder in leaderboard.CODE:
        (fake / folder).mkdir(parents=True)
    (fake / "dist_lib" / "_ops.c").write_text("int x;")
    monkeypatch.setattr(leaderboard, "ROOT", fake)
    before = leaderboard.code_hash()
    (fake / "dist_lib" / "_ops.c").write_text("int y;")
    assert leaderboard.code_hash() != before
    (fake / "grader" / "verify.py").write_text("")
    assert leaderboard.code_hash() not in (before,)


PROBE = '''
import json, os, socket, time
from pathlib import Path


async def train(model):
    seen = {"uid": os.getuid(), "pid": os.getpid()}
    forked = 0
    try:
        for _ in range(200):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            forked += 1
    except OSError:
        pass
    seen["forked"] = forked
    seen["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=2)  # TEST-NET-1: unroutable anyway
        seen["network"] = "connected"
    except OSError as exc:
        seen["network"] = type(exc).__name__ + ":" + str(exc.errno)
    written = []
    for path in (Path(__file__).with_name("probe_mark"), Path("/var/tmp/probe_mark"), Path("/tmp/probe_mark")):
        try:
            path.write_text("x")
            written.append(str(path))
        except OSError:
            pass
    seen["written"] = written
    seen["host_tmp"] = sorted(os.listdir("/tmp"))
    try:  # /dev is read-only, and its /dev/shm holds 1 MiB
        open("/dev/probe_mark", "wb").close()
        seen["dev"] = "written"
    except OSError as exc:
        seen["dev"] = exc.errno
    held = 0
    try:
        with open("/dev/shm/probe_fill", "wb", buffering=0) as fill:
            for _ in range(64):
                fill.write(b"x" * 65536)
                held += 65536
    except OSError:
        pass
    seen["shm_bytes"] = held
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
    seen["shmget"] = [libc.shmget(0, 2**20, 0o1600), ctypes.get_errno()]  # IPC_PRIVATE, IPC_CREAT | 0600
    seen["msgget"] = [libc.msgget(0, 0o1600), ctypes.get_errno()]
    try:
        os.close(os.memfd_create("probe"))
        seen["memfd"] = "made"
    except OSError as exc:
        seen["memfd"] = exc.errno
    raise RuntimeError("PROBE" + json.dumps(seen))
'''


def test_what_the_sandbox_confines(tmp_path):
    """A probe reports what it can do inside: its own user and pid namespace (it sees only its own
    processes), the process-count limit, no network, writes only to its private /tmp (and 1 MiB of
    /dev/shm), and no memory outside the rlimits' reach: System V shared memory and message queues and
    memfd files are refused (on the machines `sandbox.DENIED_SYSCALLS` knows)."""
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    import json
    from grader.runner import Limits, run_isolated
    from grader.scenario import Scenario
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    outcome = run_isolated(probe, Scenario(cluster="1xA100-80GB", workload="toy:layers=1", global_batch=1),
                           Limits(timeout_s=60, processes=16))
    assert outcome.status == "failed", outcome.message
    seen = json.loads(outcome.message.split("PROBE", 1)[1].split(" (at probe.py")[0])
    assert seen["uid"] == 65534 or os.geteuid() != 0  # nobody, when the grader is root
    assert seen["forked"] < 16  # the worker itself and bubblewrap's init count too
    assert seen["processes"] == sorted(seen["processes"]) and max(seen["processes"]) < 100  # its own namespace
    assert seen["network"].startswith("OSError") or "Unreachable" in seen["network"] or "101" in seen["network"]
    assert seen["written"] == ["/tmp/probe_mark"]
    # the host's /tmp is hidden: only its job, its mark, and the path its copied file is bound at (and
    # the project's own folder, bound read-only where it lies, when a checkout lives under /tmp)
    project = {ROOT.parts[2]} if ROOT.parts[1:2] == ("tmp",) else set()
    visible = [name for name in seen["host_tmp"] if name not in project]
    assert "pytest-of-root" not in visible and len(visible) <= 3, seen["host_tmp"]
    assert not (tmp_path / "probe_mark").exists() and not Path("/var/tmp/probe_mark").exists()
    assert seen["dev"] == errno.EROFS and seen["shm_bytes"] == 2**20
    if platform.machine() in sandbox.DENIED_SYSCALLS:
        assert seen["shmget"] == [-1, errno.EPERM] and seen["msgget"] == [-1, errno.EPERM]
        assert seen["memfd"] == errno.EPERM


def _seccomp(program: bytes, arch: int, number: int, arg0: int = 0) -> int:
    """What the classic-BPF seccomp `program` returns for a call: a small interpreter of the four
    instructions the filter uses (load word, jump if equal, jump if any bit set, return)."""
    words = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    data = struct.pack("=iIQ6Q", number, arch, 0, arg0, 0, 0, 0, 0, 0)  # struct seccomp_data
    pc, a = 0, 0
    while True:
        code, jt, jf, k = words[pc]
        if code == 0x20:
            a, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif code == 0x15:
            pc += 1 + (jt if a == k else jf)
        elif code == 0x45:
            pc += 1 + (jt if a & k else jf)
        else:
            assert code == 0x06
            return k


@pytest.mark.parametrize("machine", sorted(sandbox.DENIED_SYSCALLS))
def test_the_syscall_filter_program(machine):
    """The seccomp program, run: each denied call and every call of another ABI fail with EPERM, clone3
    with ENOSYS, a clone asking for any new namespace with EPERM; a thread's or a fork's clone, and other
    calls, pass."""
    arch, denied = sandbox.DENIED_SYSCALLS[machine]
    program = sandbox.syscall_filter(machine)
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    for number in denied.values():
        assert _seccomp(program, arch, number) == eperm
        assert _seccomp(program, arch + 1, number) == eperm
    assert {"unshare", "mount", "setns", "shmget", "memfd_create"} <= set(denied)
    assert _seccomp(program, arch, 0) == allow and _seccomp(program, arch, 0x40000000 | 0) == eperm  # x32
    assert _seccomp(program, 0x40000003, 0) == eperm  # i386
    assert _seccomp(program, arch, sandbox.CLONE3) == enosys
    clone = sandbox.CLONE[machine]
    thread = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000 | 0x80000 | 0x100000 | 0x200000  # pthread_create's
    assert _seccomp(program, arch, clone, thread) == allow and _seccomp(program, arch, clone, 17) == allow  # fork
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert _seccomp(program, arch, clone, 17 | flag) == eperm
    assert sandbox.syscall_filter("sparc") is None


def test_a_changed_helper_beside_a_submission_grades_it_again(tmp_path):
    (tmp_path / "suite.toml").write_text(SUITE.format(timeout=30))
    suite = load_suite(str(tmp_path / "suite.toml"))
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "mine.py").write_text("from _helpers import train\n")
    (folder / "_helpers.py").write_text("async def train(model): pass\n")
    (folder / "other.py").write_text("async def train(model): pass\n")
    first = leaderboard.make_jobs([folder / "mine.py"], suite, tmp_path, traces=False)[0].fingerprint
    (folder / "other.py").write_text("async def train(model): return 1\n")  # another submission: no effect
    assert leaderboard.make_jobs([folder / "mine.py"], suite, tmp_path, traces=False)[0].fingerprint == first
    (folder / "_helpers.py").write_text("async def train(model): return 1\n")
    assert leaderboard.make_jobs([folder / "mine.py"], suite, tmp_path, traces=False)[0].fingerprint != first


def test_a_submission_the_sandbox_user_cannot_read_runs_with_its_helpers(tmp_path):
    """tmp_path is private to the grader's user: the file and its _*.py helpers are copied in."""
    from grader.runner import run_isolated
    from grader.scenario import Scenario
    (tmp_path / "_helpers.py").write_text((ROOT / "tests" / "submissions" / "honest.py").read_text())
    (tmp_path / "mine.py").write_text("import pathlib, sys\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n"
                                      "from _helpers import train  # noqa: F401\n")
    outcome = run_isolated(tmp_path / "mine.py", Scenario(cluster="2xA100-80GB", workload="toy:layers=2",
                                                          global_batch=4), confine=sandbox_problem() is None)
    assert outcome.status == "ok", outcome.message
    assert len(outcome.programs) == 2


def test_errors_name_the_users_files_not_the_copies_the_sandbox_reads(tmp_path):
    """A submission and a cluster file the sandbox's user cannot read run from copies in the run's private
    folder; what the run says of them names the user's files."""
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    from grader.runner import run_isolated
    from grader.scenario import Scenario
    (tmp_path / "typo.py").write_text("async def train(model)\n    pass\n")
    outcome = run_isolated(tmp_path / "typo.py", Scenario(cluster="2xA100-80GB", workload="toy:layers=2",
                                                          global_batch=4))
    assert outcome.status == "failed"
    assert outcome.message.startswith(f"strategy file {tmp_path / 'typo.py'}: importing it raised SyntaxError")
    (tmp_path / "odd.toml").write_text('[[nodes]]\ndevice = "A100-80GB"\ngpus = "two"\n')
    outcome = run_isolated(ROOT / "tests" / "submissions" / "honest.py",
                           Scenario(cluster=str(tmp_path / "odd.toml"), workload="toy:layers=2", global_batch=4))
    assert outcome.status == "bad_input"
    assert str(tmp_path / "odd.toml") in outcome.message and FOLDER_PREFIX not in outcome.message


def test_a_program_over_the_size_limit_fails_with_one_clear_line(tmp_path):
    """Also a file straight in the temporary folder, whose folder is not bound into the sandbox (it holds
    the grader's own folders): it is copied in."""
    import tempfile
    from grader.runner import Limits, run_isolated
    from grader.scenario import Scenario
    fd, name = tempfile.mkstemp(suffix=".py")
    os.write(fd, b"async def train(model):\n    for _ in range(20_000):\n        model.load_weights(0)\n")
    os.close(fd)
    try:
        outcome = run_isolated(name, Scenario(cluster="1xA100-80GB", workload="toy:layers=1", global_batch=1),
                               Limits(file_bytes=2**20), confine=sandbox_problem() is None)
    finally:
        os.unlink(name)
    # 20,000 loads: 20,000 x (6 + 2 x 2) words of 8 bytes
    assert (outcome.status, outcome.kind) == ("failed", "TooLarge"), outcome.message
    assert outcome.message.startswith("the recorded program takes 1.5 MiB, over the 1 MiB")


def test_unconfined_a_run_that_kills_its_grading_process_is_one_crashed_row(tmp_path):
    """With --trusted nothing stops a run from killing the pool worker grading it; the board replaces
    the pool, tries the run once more, then records it as crashed and finishes the others."""
    import json
    (tmp_path / "suite.toml").write_text(SUITE.format(timeout=30))
    (tmp_path / "killer.py").write_text("import os, signal\n\n\nasync def train(model):\n"
                                        "    os.kill(os.getppid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-m", "grader", "leaderboard", str(tmp_path / "killer.py"),
                           "tests/submissions/honest.py", "--suite", str(tmp_path / "suite.toml"), "--jobs", "2",
                           "--out", str(tmp_path / "out"), "--no-plots", "--trusted"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["strategy"]: r for r in json.loads((tmp_path / "out" / "leaderboard.json").read_text())["rows"]}
    assert rows["killer"]["status"] == "crashed" and "BrokenProcessPool" in rows["killer"]["error"]
    assert rows["honest"]["status"] == "ok"


def _board(tmp_path: Path, folder: Path, out: Path) -> subprocess.CompletedProcess:
    """A board of the submissions in `folder`, on the one-scenario suite, sandboxed where it can be."""
    if not (tmp_path / "suite.toml").exists():
        (tmp_path / "suite.toml").write_text(SUITE.format(timeout=30))
    return subprocess.run([sys.executable, "-m", "grader", "leaderboard", str(folder), "--suite",
                           str(tmp_path / "suite.toml"), "--out", str(out), "--no-plots",
                           *(["--trusted"] if sandbox_problem() else [])],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_submissions_named_like_the_boards_own_files_are_graded_and_the_board_is_written(tmp_path):
    """A submission named leaderboard.json.py (or results.jsonl.py, ...) keeps its traces in a folder of its
    own, not on the file the board writes; the board is written, and resumes. A file name that is not UTF-8
    prints and saves with backslash escapes."""
    import json
    folder = tmp_path / "subs"
    folder.mkdir()
    honest = (ROOT / "tests" / "submissions" / "honest.py").read_text()
    names = ["honest", "leaderboard.json", "leaderboard.csv", "results.jsonl", "leaderboard.json.tmp", "runs",
             os.fsdecode(b"\xff")]  # a name that is not UTF-8
    for name in names:
        (folder / f"{name}.py").write_text(honest)
    out = tmp_path / "out"
    for _ in range(2):  # the second run resumes from results.jsonl
        proc = _board(tmp_path, folder, out)
        assert proc.returncode == 0, proc.stderr
    assert "resuming: 7 of 7 runs" in proc.stdout and "│ \\xff " in proc.stdout
    rows = {r["strategy"]: r for r in json.loads((out / "leaderboard.json").read_text())["rows"]}
    assert sorted(rows) == sorted(names) and all(r["status"] == "ok" for r in rows.values())
    assert rows[os.fsdecode(b"\xff")]["submission"] == "\\xff"  # its name on the board, escaped
    assert (out / "leaderboard.csv").is_file() and (out / "results.jsonl").is_file()
    for name in names:
        assert Path(rows[name]["trace"]).parent == out / leaderboard.RUNS / leaderboard.run_folder(name)
        assert Path(rows[name]["trace"]).is_file()


def test_a_submission_named_dot_dot_writes_nothing_outside_the_output_folder(tmp_path):
    """`...py` is named `..` on the board: its traces go to a folder of its own under OUT/runs/, not to
    OUT/.. (the folder OUT is in)."""
    import json
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "...py").write_text((ROOT / "tests" / "submissions" / "honest.py").read_text())
    out = tmp_path / "board" / "out"
    (tmp_path / "suite.toml").write_text(SUITE.format(timeout=30))
    before = set(tmp_path.rglob("*"))
    proc = _board(tmp_path, folder, out)
    assert proc.returncode == 0, proc.stderr
    assert {p for p in set(tmp_path.rglob("*")) - before if out not in p.parents} == {out.parent, out}
    row, = json.loads((out / "leaderboard.json").read_text())["rows"]
    assert row["submission"] == ".." and row["status"] == "ok"
    assert Path(row["trace"]).is_file() and Path(row["trace"]).resolve().parent.parent == (out / "runs").resolve()


@pytest.mark.parametrize("labels", [
    [".", "..", "...", "", "-", "~"],
    ["a b", "a-b", "a/b", "a\\b", "a~b", "a:b"],
    ["leaderboard.json", "results.jsonl", ".hidden", "x" * 300, "x" * 301, "é", "e\udcff"],
])
def test_each_label_gets_a_trace_folder_of_its_own_that_is_a_plain_name(labels):
    folders = [leaderboard.run_folder(label) for label in labels]
    assert len(set(folders)) == len(labels)
    for name in folders:
        assert name not in ("", ".", "..") and not name.startswith(".") and len(name.encode()) <= 100
        assert all(c.isascii() and (c.isalnum() or c in "_-.~") for c in name), name
    assert leaderboard.run_folder("honest") == "honest" and leaderboard.run_folder("v1.2") == "v1.2"


def test_a_forked_child_that_returns_into_the_worker_writes_no_result(tmp_path):
    """A child the strategy forks is a copy of the worker mid-run: one that raises (or returns) goes back up
    through the worker's frames, and would add its own header to the run's, which then reads as forged."""
    from grader.runner import Limits, run_isolated
    from grader.scenario import Scenario
    (tmp_path / "forks.py").write_text(
        "import os\n\n\nasync def train(model):\n    if model.rank == 0 and os.fork() == 0:\n"
        "        raise RuntimeError('the child')\n    os.wait() if model.rank == 0 else None\n"
        "    raise ValueError('the worker')\n")
    outcome = run_isolated(tmp_path / "forks.py", Scenario(cluster="2xA100-80GB", workload="toy:layers=1", global_batch=2),
                           Limits(timeout_s=60), confine=sandbox_problem() is None)
    assert (outcome.status, outcome.kind) == ("failed", "StrategyError"), outcome.message
    assert outcome.message.startswith("rank 0: ValueError: the worker")


def test_a_readable_cluster_file_under_tmp_reaches_the_sandbox():
    """The sandbox has a /tmp of its own: a world-readable cluster file in the host's /tmp is copied in."""
    import shutil
    import tempfile
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    from grader.runner import run_isolated
    from grader.scenario import Scenario
    folder = Path(tempfile.mkdtemp(prefix="cluster-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        cluster = folder / "two.toml"
        cluster.write_text('[[nodes]]\ndevice = "A100-80GB"\ngpus = 2\n')
        cluster.chmod(0o644)
        outcome = run_isolated(ROOT / "tests" / "submissions" / "honest.py",
                               Scenario(cluster=str(cluster), workload="toy:layers=2", global_batch=4))
        assert outcome.status == "ok", outcome.message
    finally:
        shutil.rmtree(folder)


VIEW_PROBE = '''
import json, os, sys
sys.path.insert(0, os.path.dirname(__file__))
import _helper  # noqa: E402,F401 - a helper beside the submission is in the run

SHOWN = set(json.loads(%r))


def walk(path, seen, shown):
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.path in SHOWN:
            shown.append(entry.path)
        elif entry.is_dir(follow_symlinks=False):
            walk(entry.path, seen, shown)
        else:
            seen.append(entry.path)


async def train(model):
    seen, shown = [], []
    walk("/", seen, shown)
    raise RuntimeError("VIEW" + json.dumps({"seen": seen, "shown": shown}))
'''


def test_the_sandbox_shows_only_what_a_run_needs(tmp_path):
    """A probe walks the whole file system it is shown, down to the folders a run needs (the system's
    programs and libraries, the Python installation, the project's dist_lib, grader and strategies, /dev,
    /proc): beyond them it finds its own copy, its helper, its copied cluster file and its job, and
    nothing else: not the classmate and the results beside it, the project's tests, /etc, /root, /home."""
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    import json
    from grader.runner import run_isolated
    from grader.scenario import Scenario
    needed = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/dev", "/proc",
              *(str(Path(p).resolve()) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)),
              *(str(ROOT / name) for name in ("dist_lib", "grader", "strategies"))]
    (tmp_path / "probe.py").write_text(VIEW_PROBE % json.dumps(needed))
    (tmp_path / "_helper.py").write_text("")
    (tmp_path / "classmate.py").write_text("async def train(model): pass\n")
    (tmp_path / "results.jsonl").write_text("{}\n")
    (tmp_path / "two.toml").write_text('[[nodes]]\ndevice = "A100-80GB"\ngpus = 2\n')
    outcome = run_isolated(tmp_path / "probe.py", Scenario(cluster=str(tmp_path / "two.toml"), workload="toy:layers=1",
                                                           global_batch=2))
    assert outcome.status == "failed" and "VIEW" in outcome.message, outcome.message
    view = json.loads(outcome.message.split("VIEW", 1)[1].rsplit(" (at probe.py", 1)[0])
    # (the copies' folder is named back as the user's in messages)
    assert sorted(view["seen"]) == sorted([str(tmp_path / "_helper.py"), str(tmp_path / "probe.py"),
                                           str(tmp_path / "two.toml"), "/tmp/job.json"]), view["seen"]
    assert {"/usr", "/dev", "/proc", *(str(ROOT / name) for name in ("dist_lib", "grader", "strategies"))} \
        <= set(view["shown"])


def _one_run(path: Path):
    from grader.runner import run_isolated
    from grader.scenario import Scenario
    return run_isolated(path, Scenario(cluster="2xA100-80GB", workload="toy:layers=2", global_batch=4))


def test_a_module_beside_the_submission_that_is_not_a_helper_is_one_clear_error(tmp_path):
    """Only the `_*.py` helpers come into the run with a submission (any other file beside it is another
    submission, or the user's): importing one says so, in one message; so does a helper that is not there."""
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    honest = (ROOT / "tests" / "submissions" / "honest.py").read_text()
    (tmp_path / "utils.py").write_text(honest)
    (tmp_path / "mine.py").write_text("import pathlib, sys\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n"
                                      "from utils import train  # noqa: F401\n")
    outcome = _one_run(tmp_path / "mine.py")
    assert outcome.status == "failed"
    assert outcome.message == (f"strategy file {tmp_path / 'mine.py'}: importing it raised ModuleNotFoundError: No "
                               f"module named 'utils' (at mine.py:3 in <module>) (a run sees its own file and the "
                               f"_*.py helpers beside it, not the rest of its folder: name the helper module "
                               f"_utils.py and import it as _utils)")
    (tmp_path / "mine.py").write_text("import _helpers  # noqa: F401\n")
    outcome = _one_run(tmp_path / "mine.py")
    assert outcome.status == "failed"
    assert outcome.message.endswith(f"No module named '_helpers' (at mine.py:1 in <module>) (a run sees its own "
                                    f"file and the _*.py helpers beside it: there is no _helpers.py in {tmp_path})")
    (tmp_path / "_helpers.py").write_text(honest)
    (tmp_path / "mine.py").write_text("import pathlib, sys\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n"
                                      "from _helpers import train  # noqa: F401\n")
    assert _one_run(tmp_path / "mine.py").status == "ok"


def test_a_submission_in_a_package_runs_as_a_file_without_its_packages_init(tmp_path):
    """A run's folder is never a package: an `__init__.py` beside a submission (a classmate's, in a shared
    folder) never runs, and the submission imports its helpers by name; a relative import says how."""
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    package = tmp_path / "course" / "team"
    package.mkdir(parents=True)
    for folder in (package, package.parent):
        (folder / "__init__.py").write_text("raise SystemExit('the package ran')\n")
    (package / "_common.py").write_text((ROOT / "tests" / "submissions" / "honest.py").read_text())
    (package / "mine.py").write_text("from _common import train  # noqa: F401\n")
    (package / "other.py").write_text("raise SystemExit('a classmate')\n")
    from grader.runner import run_isolated
    from grader.scenario import Scenario
    scenario = Scenario(cluster="2xA100-80GB", workload="toy:layers=2", global_batch=4)
    outcome = run_isolated(package / "mine.py", scenario)
    assert outcome.status == "ok", outcome.message
    (package / "mine.py").write_text("from ._common import train  # noqa: F401\n")
    outcome = run_isolated(package / "mine.py", scenario)
    assert outcome.status == "failed" and "import a helper beside it by name" in outcome.message, outcome.message

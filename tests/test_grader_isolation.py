"""Leaderboard runs of untrusted code: cheats are flagged invalid, hangs, crashes and memory blow-ups
are reported per row, outputs are written as rows finish, and a second run resumes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = """
name = "tiny"
[limits]
timeout_s = 6
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
CHEATS = sorted(p.stem for p in (ROOT / "tests" / "cheats").glob("*.py") if not p.name.startswith("_"))


def grader(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("board")
    suite = tmp / "suite.toml"
    suite.write_text(SUITE)
    out = tmp / "out"
    proc = grader("leaderboard", "tests/cheats", "tests/submissions", "--suite", str(suite), "--jobs", "2",
                  "--out", str(out), "--no-plots")
    return proc, out, suite


def _rows(out):
    data = json.loads((out / "leaderboard.json").read_text())
    return {r["strategy"]: r for r in data["rows"]}, data


def test_every_cheat_is_flagged_invalid_and_never_ranked(board):
    proc, out, _ = board
    assert proc.returncode == 0, proc.stderr
    rows, data = _rows(out)
    assert len(CHEATS) >= 7
    for cheat in CHEATS:
        assert rows[cheat]["status"] == "invalid", (cheat, rows[cheat]["error"])
        assert rows[cheat]["error"].startswith("the event log does not verify")
    ranked = {s["submission"]: s["rank"] for s in data["submissions"]}
    assert all(ranked[c] is None for c in CHEATS)
    assert ranked["honest"] == 1


def test_reasons_name_the_cheat(board):
    rows, _ = _rows(board[1])
    assert "cost model gives" in rows["zero_costs"]["error"]
    assert "compute stream" in rows["clock_rewind"]["error"]
    assert "work was skipped or its events removed" in rows["delete_events"]["error"]
    assert "work was skipped" in rows["skip_layers"]["error"]
    assert "gradients of samples" in rows["fake_samples"]["error"]
    assert "peak memory" in rows["hide_memory"]["error"]
    assert "missing from the memory log" in rows["stub_storage"]["error"]


def test_failures_are_rows_and_the_board_goes_on(board):
    rows, _ = _rows(board[1])
    assert rows["hang"]["status"] == "timeout"
    assert rows["crash"]["status"] == "crashed" and "code 3" in rows["crash"]["error"]
    assert rows["blowup"]["status"] == "failed" and "MemoryError" in rows["blowup"]["error"]
    assert rows["buggy"]["status"] == "failed" and "TensorError" in rows["buggy"]["error"]
    assert rows["honest"]["status"] == "ok" and rows["honest"]["correct"]
    assert Path(rows["honest"]["trace"]).exists()


def test_csv_has_a_row_per_run_and_per_submission(board):
    with (board[1] / "leaderboard.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    submissions = {line["submission"] for line in lines}
    assert len([line for line in lines if line["scenario"] == "ALL"]) == len(submissions)
    assert len([line for line in lines if line["scenario"] == "toy2"]) == len(submissions)


def test_second_run_resumes_without_rerunning(board):
    _, out, suite = board
    results = out / "results.jsonl"
    lines = results.read_text().splitlines()
    kept = [line for line in lines if '"honest"' not in line]  # as if interrupted before honest finished
    results.write_text("\n".join(kept) + "\n")
    proc = grader("leaderboard", "tests/cheats", "tests/submissions", "--suite", str(suite), "--out", str(out),
                  "--no-plots")
    assert proc.returncode == 0, proc.stderr
    assert f"resuming: {len(kept)} of {len(lines)}" in proc.stdout
    assert len(results.read_text().splitlines()) == len(lines)
    rows, _ = _rows(out)
    assert rows["honest"]["status"] == "ok"

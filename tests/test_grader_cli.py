"""`python -m grader run` / `check`, bad input (one line, exit 2), scoring rubrics and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from dist_lib import simulate
from grader.cli import main
from grader.report_terminal import schedule_view
from grader.scoring import parse_rubric
from grader.suites import load_suite

ROOT = Path(__file__).resolve().parents[1]
DDP = str(ROOT / "strategies" / "ddp.py")
TOY = ["--cluster", "2xA100-80GB", "--workload", "toy:layers=2", "--batch", "4"]


def test_run_json_reports_replayed_figures_and_writes_trace_and_plots(tmp_path, capsys):
    trace = tmp_path / "ddp.json"
    code = main(["run", DDP, *TOY, "--set", "microbatch_size=1", "--trace", str(trace), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("time_s", "peak_memory_bytes", "peak_memory_rank", "mfu", "hfu", "correct", "trace"):
        assert key in out
    direct = simulate(DDP, "2xA100-80GB", "toy:layers=2", 4, microbatch_size=1)
    assert out["time_s"] == direct.time_s
    assert out["peak_memory_bytes"] == direct.peak_memory_bytes and out["correct"] is True
    assert trace.exists() and json.loads(trace.read_text())["traceEvents"]
    assert sorted(Path(p).name for p in out["plots"]) == ["ddp.memory.png", "ddp.schedule.png"]
    assert all(Path(p).stat().st_size > 1000 for p in out["plots"])


def test_run_failure_prints_the_strategy_line_and_exits_1(tmp_path, capsys):
    code = main(["run", str(ROOT / "tests" / "submissions" / "buggy.py"), *TOY, "--trace", str(tmp_path / "t.json")])
    out = capsys.readouterr().out
    assert code == 1
    assert "TensorError" in out and "update(layer" in out


@pytest.mark.parametrize("args, message", [
    (["run", "/no/such/file.py"], "not found"),
    (["run", "NOTRAIN"], "defines no `train` function"),
    (["run", "NOTASYNC"], "must be `async def train"),
    (["run", DDP, "--set", "nonsense=1", *TOY], "unknown option(s) nonsense"),
    (["run", DDP, "--set", "microbatch_size=abc", *TOY], "expects int"),
    (["run", DDP, "--cluster", "3xZ100"], "unknown device"),
    (["run", DDP, "--workload", "gpt-9"], "unknown workload"),
    (["run", DDP, "--batch", "zero"], "invalid int value"),
    (["leaderboard", DDP, "--suite", "BADTOML"], "not valid TOML"),
    (["leaderboard", DDP, "--suite", "BADSUITE"], "unknown field(s) colour"),
    (["leaderboard", "/no/such/dir"], "no such file or folder"),
    (["check", "NOTASYNC"], "must be `async def train"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    files = {"NOTRAIN": "x = 1\n", "NOTASYNC": "def train(model):\n    pass\n", "BADTOML": "name = [\n",
             "BADSUITE": 'name = "x"\n[[scenarios]]\nname = "a"\ncluster = "2xA100-80GB"\nworkload = "toy"\n'
                         'global_batch = 2\ncolour = "red"\n'}
    for placeholder, text in files.items():
        if placeholder in args:
            path = tmp_path / (placeholder.lower() + (".toml" if "TOML" in placeholder or "SUITE" in placeholder
                                                      else ".py"))
            path.write_text(text)
            args = [str(path) if a == placeholder else a for a in args]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_api_option_needs_compat_layer_or_reports_clearly(capsys):
    code = main(["run", DDP, "--function", "f"])
    assert code == 2 and "--function only applies with --api" in capsys.readouterr().err


def test_classic_rubric_is_data_and_scores_as_the_course_does():
    suite = load_suite("classic")
    row = {"status": "ok", "mfu": 0.72, "peak_memory_bytes": 65e9}
    assert suite.rubric.score(row) == pytest.approx(0.75 * 4 + 0.25 * 4)
    assert suite.rubric.score({**row, "mfu": 0.39, "peak_memory_bytes": 81e9}) == 0
    assert suite.rubric.score({**row, "mfu": 0.8, "peak_memory_bytes": 60e9}) == pytest.approx(5)
    assert suite.rubric.score({**row, "status": "timeout"}) == 0
    linear = parse_rubric({"components": [{"metric": "mfu", "scale": 100, "max": 50}]}, "t")
    assert linear.score(row) == 50


def test_default_suite_names_known_scenarios():
    suite = load_suite(None)
    assert len(suite.scenarios) >= 2 and all(s.load() for s in suite.scenarios)


def test_terminal_schedule_view_scales_to_64_ranks():
    result = simulate(ROOT / "strategies" / "one_f_one_b.py", "8x8xA100-80GB", "toy:layers=64", 64, pp=64)
    console = Console(width=120, record=True, color_system="truecolor")
    console.print(schedule_view(result, 80))
    text = console.export_text()
    rows = [line for line in text.splitlines() if "GiB" in line]
    assert len(rows) == 64
    assert all("B" in line for line in rows) and sum("F" in line for line in rows) >= 60


def test_check_passes_honest_and_shrinks_a_failure(capsys):
    assert main(["check", str(ROOT / "tests" / "submissions" / "honest.py"), "--examples", "5"]) == 0
    assert "passed: 5 configurations" in capsys.readouterr().out
    assert main(["check", str(ROOT / "tests" / "submissions" / "buggy.py"), "--examples", "10"]) == 1
    out = capsys.readouterr().out
    assert "smallest failing configuration" in out and "workload toy:layers=1" in out


def test_run_grades_a_puzzles_file_on_its_own_set_up(tmp_path, capsys):
    # GPipe puzzle: 4 ranks, its own unit costs; the published target is 33 steps (33.8 to the last event's end)
    solutions = str(ROOT / "tests" / "compat_solutions" / "puzzles_solutions.py")
    code = main(["run", solutions, "--api", "puzzles", "--function", "gpipe", "--json", "--no-plots",
                 "--trace", str(tmp_path / "gpipe.json")])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "ok" and out["correct"]
    assert out["time_s"] == pytest.approx(33.8)
    assert out["cluster"] == "1x4xH100-80GB" and Path(out["trace"]).is_file()

"""`dist-sandbox compare` and the console command: every built-in strategy on one board, each at options
the planner's estimate picks, or one line saying why it cannot run; built-in strategies by name."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from dist_lib import simulate
from dist_lib.workload.transformer import Workload
from grader.cli import builtin_names, main
from grader.compare_space import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
MIXED = ["--cluster", "2x8xA100-80GB+2x8xV100-32GB", "--workload", "gpt-6.7b:seq=2048", "--batch", "512"]


def test_every_strategy_runs_or_says_why_not_in_one_line_on_the_mixed_cluster(capsys):
    assert main(["compare", *MIXED, "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    rows = {row["strategy"]: row for row in board["strategies"]}
    assert sorted(rows) == builtin_names()
    for row in rows.values():
        assert row["status"] in ("ok", "cannot")
        if row["status"] == "cannot":
            assert row["reason"] and "\n" not in row["reason"]
    # DDP keeps the whole model on every GPU: 16 bytes x 6.7e9 parameters is about 100 GiB, above 80 GiB
    assert Workload.load("gpt-6.7b").total_params * 16 > 80 * 2**30
    assert rows["ddp"]["status"] == "cannot" and "fits in memory" in rows["ddp"]["reason"]
    times = [row["time_s"] for row in board["strategies"] if row["status"] == "ok"]
    assert times == sorted(times) and len(times) >= 6


def test_a_compared_strategy_runs_again_with_its_options_to_the_same_time(capsys):
    assert main(["compare", "--cluster", "1x4xA100-80GB+1x4xV100-32GB", "--workload", "gpt-760m", "--batch", "32",
                 "--only", "hybrid,one_f_one_b", "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    for row in board["strategies"]:
        assert row["status"] == "ok"
        again = simulate(ROOT / "strategies" / f"{row['strategy']}.py", "1x4xA100-80GB+1x4xV100-32GB", "gpt-760m",
                         32, **row["options"])
        assert again.time_s == row["time_s"] and again.peak_memory_bytes == row["peak_memory_bytes"]


def test_the_board_fits_80_columns_and_explains_its_order(capsys):
    assert main(["compare", "--cluster", "2x2xA100-80GB", "--workload", "toy:layers=8", "--batch", "16"]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    board = lines[1:lines.index(next(line for line in lines if line.startswith("ranked by step time")))]
    assert board and all(len(line.rstrip()) <= 80 for line in board)
    assert "…" not in printed


def test_every_family_names_a_builtin_strategy():
    assert set(FAMILIES) <= set(builtin_names())


def test_compare_refuses_an_unknown_strategy_in_one_line(capsys):
    assert main(["compare", "--only", "ddp,nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nosuch is not a built-in strategy" in err and "\n" not in err


def test_a_builtin_strategy_runs_by_name_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    toy = ["--cluster", "2xA100-80GB", "--workload", "toy:layers=2", "--batch", "8", "--json", "--no-plots"]
    assert main(["run", "ddp", *toy]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["strategy"] == "ddp" and row["correct"]
    assert (tmp_path / "traces" / "ddp.json").exists()  # the output goes to the caller's folder
    # a file of one's own of that name comes first
    (tmp_path / "ddp.py").write_text((ROOT / "examples" / "my_ddp.py").read_text())
    assert main(["run", "ddp", *toy]) == 0
    assert json.loads(capsys.readouterr().out)["time_s"] == simulate(tmp_path / "ddp.py", "2xA100-80GB",
                                                                      "toy:layers=2", 8).time_s
    assert main(["run", "nosuch"]) == 2
    assert "built-in strategies: ddp" in capsys.readouterr().err


def test_the_console_command_is_the_grader_cli():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"dist-sandbox": "grader.console:main"}
    from grader.console import main as console_main
    assert callable(console_main)

"""`python -m grader run FILE --api puzzles|lab`: the original's figures and units, the file's own
main(), --set for the set-up, --timing real, and errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader.cli import main

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "tests" / "compat_solutions"


def _json(capsys, *argv) -> tuple[int, dict]:
    code = main(["run", *map(str, argv), "--json", "--no-plots"])
    return code, json.loads(capsys.readouterr().out)


def test_puzzles_run_reports_steps_and_units(tmp_path, capsys):
    code, out = _json(capsys, SOLUTIONS / "puzzles_solutions.py", "--api", "puzzles", "--function", "gpipe",
                      "--trace", tmp_path / "t.json")
    assert code == 0 and out["timing"] == "original" and out["time_unit"] == "steps"
    assert out["notebook_time"] == pytest.approx(33.3) and out["memory_unit"] == "units"  # the notebook's figure
    main(["run", str(SOLUTIONS / "puzzles_solutions.py"), "--api", "puzzles", "--function", "gpipe", "--no-plots",
          "--trace", str(tmp_path / "t.json")])
    text = capsys.readouterr().out
    assert "33.3 steps" in text and "2,752,512 units" in text and " ms" not in text and "GiB" not in text


def test_lab_file_runs_its_own_main_and_set_overrides_the_set_up(tmp_path, capsys):
    code, out = _json(capsys, SOLUTIONS / "lab_course_styles.py", "--api", "lab", "--trace", tmp_path / "t.json")
    assert code == 0 and out["strategy"] == "lab_course_styles.main" and len(out["memory_bytes"]) == 4
    assert out["time_unit"] == "s" and out["memory_unit"] == "elements" and 0 < out["mfu"] < 1
    code, out = _json(capsys, SOLUTIONS / "lab_course_styles.py", "--api", "lab", "--function", "part3_training_loop",
                      "--set", "ranks=2", "--set", "layers=4", "--set", "batches=8", "--set", "batch_size=2",
                      "--trace", tmp_path / "t.json")
    assert code == 0 and len(out["memory_bytes"]) == 2


def test_real_timing_on_a_cluster(tmp_path, capsys):
    code, out = _json(capsys, SOLUTIONS / "lab_solutions.py", "--api", "lab", "--function", "train_ddp",
                      "--timing", "real", "--cluster", "2xH100-80GB+2xA100-80GB", "--trace", tmp_path / "t.json")
    assert code == 0 and out["timing"] == "real" and out["memory_unit"] == "bytes"
    assert out["cluster"] == "1x2xH100-80GB+1x2xA100-80GB"


def test_failures_name_the_file_and_line_not_the_native_scenario(tmp_path, capsys):
    bad = tmp_path / "bad_lab.py"
    bad.write_text("from lib import Model\n\n\nasync def part1_training_loop(model, batch_size):\n"
                   "    model.load_weights(0)\n    assert model.rank > 0, 'my own check'\n")
    code, out = _json(capsys, bad, "--api", "lab", "--trace", tmp_path / "t.json")
    assert code == 1 and out["status"] == "failed" and out["cluster"] is None
    assert "my own check (at bad_lab.py:6 in part1_training_loop)" in out["error"]
    main(["run", str(bad), "--api", "lab", "--no-plots", "--trace", str(tmp_path / "t.json")])
    text = capsys.readouterr().out
    assert text.startswith("bad_lab — lab API, original timing — failed") and "A100" not in text


def test_deadlock_names_every_ranks_wait(tmp_path, capsys):
    code, out = _json(capsys, SOLUTIONS / "puzzles_styles.py", "--api", "puzzles", "--function", "ring_sends_first",
                      "--set", "ranks=3", "--set", "layers=1", "--trace", tmp_path / "t.json")
    assert code == 1 and "would hang" in out["error"] and "(at puzzles_styles.py:" in out["error"].splitlines()[0]
    for rank, neighbour in ((0, 1), (1, 2), (2, 0)):
        assert f"rank {rank} waits in pass_to(): rank {neighbour}'s mailbox still holds a message" in out["error"]


def test_compat_flags_need_api(capsys):
    assert main(["run", str(SOLUTIONS / "puzzles_solutions.py"), "--timing", "real"]) == 2
    assert "--timing only applies with --api" in capsys.readouterr().err


def test_lab_run_with_plots_draws_the_load_weights_events_too(tmp_path, capsys):
    """A lab file logs `load_weights` as a compute op; the schedule plot draws it instead of failing the run."""
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.json"
    code = main(["run", str(SOLUTIONS / "lab_course_styles.py"), "--api", "lab", "--function", "part3_training_loop",
                 "--set", "ranks=2", "--set", "layers=4", "--set", "batches=8", "--set", "batch_size=2",
                 "--trace", str(trace)])
    assert code == 0 and "— ok" in capsys.readouterr().out
    assert (tmp_path / "t.schedule.png").stat().st_size > 0 and (tmp_path / "t.memory.png").stat().st_size > 0


@pytest.mark.parametrize("setting", ["ranks=0", "layers=0", "batches=0", "layers=2.5"])
def test_a_zero_or_fractional_set_up_is_refused_not_replaced_by_the_default(setting, capsys):
    code = main(["run", str(SOLUTIONS / "lab_course_styles.py"), "--api", "lab", "--function", "part3_training_loop",
                 "--set", setting, "--no-plots"])
    name, _, value = setting.partition("=")
    assert code == 2
    assert capsys.readouterr().err.strip().endswith(f"lab_course_styles.py: {name}: must be a whole number from 1 "
                                                    f"to {dict(ranks=131072, layers=10000, batches=1048576)[name]}, "
                                                    f"got {value}")


def test_main_and_function_together_are_refused(capsys):
    code = main(["run", str(SOLUTIONS / "lab_course_styles.py"), "--api", "lab", "--main", "--function",
                 "part3_training_loop", "--no-plots"])
    assert code == 2
    assert "main=True runs the file's main(), which ignores function='part3_training_loop'" in capsys.readouterr().err

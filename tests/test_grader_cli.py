"""`python -m grader run` / `check`, bad input (one line, exit 2), scoring rubrics and reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from dist_lib import simulate
from grader.cli import main
from grader.errors import InputError
from grader.leaderboard import labels_for
from grader.report_terminal import schedule_view
from grader.scenario import Scenario
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
    plots = ["ddp.memory.png", "ddp.schedule.png"] if importlib.util.find_spec("matplotlib") else []  # an extra
    assert sorted(Path(p).name for p in out["plots"]) == plots
    assert all(Path(p).stat().st_size > 1000 for p in out["plots"])


def test_run_failure_prints_the_strategy_line_and_exits_1(tmp_path, capsys):
    code = main(["run", str(ROOT / "tests" / "submissions" / "buggy.py"), *TOY, "--trace", str(tmp_path / "t.json")])
    out = capsys.readouterr().out
    assert code == 1
    assert "TensorError" in out and "update(layer" in out


def _suite(limits: str, weight: str = "1") -> str:
    return (f'name = "x"\n[limits]\n{limits}\n[[scenarios]]\nname = "a"\ncluster = "2xA100-80GB"\n'
            f'workload = "toy"\nglobal_batch = 2\n[[scoring.components]]\nmetric = "mfu"\nweight = {weight}\n'
            f'scale = 1\n')


@pytest.mark.parametrize("args, message", [
    (["run", "/no/such/file.py"], "not found"),
    (["run", "NOTRAIN"], "defines no `train` function"),
    (["run", "NOTASYNC"], "must be `async def train"),
    (["run", DDP, "--set", "nonsense=1", *TOY], "unknown option(s) nonsense"),
    (["run", DDP, "--set", "microbatch_size=abc", *TOY], "expects int"),
    (["run", "NOOPTIONS", "--set", "nonsense=1", *TOY],
     "strategy nooptions: unknown option(s) nonsense; it accepts no options"),
    (["run", DDP, "--cluster", "3xZ100"], "unknown device"),
    (["run", DDP, "--workload", "gpt-9"], "unknown workload"),
    (["run", DDP, "--batch", "zero"], "argument --batch: expected a whole number from 1 to 1048576, got 'zero'"),
    (["leaderboard", DDP, "--suite", "BADTOML"], "not valid TOML"),
    (["leaderboard", DDP, "--suite", "BADSUITE"], "unknown field(s) colour"),
    (["leaderboard", "/no/such/dir"], "no such file or folder"),
    (["check", "NOTASYNC"], "must be `async def train"),
    (["frobnicate"], "invalid choice"),
    (["run", DDP, "--set", "microbatch_size=1", "--set", "microbatch_size=2"], "--set microbatch_size is given twice"),
    (["run", DDP, "--timeout", "nan"], "argument --timeout: must be more than 0 and at most 86400 s, got 'nan'"),
    (["run", DDP, "--timeout", "-1"], "argument --timeout: must be more than 0"),
    (["run", DDP, "--trace", str(ROOT)], "is a folder; give a file path"),
    (["run", DDP, "--trace", "/dev/full"], "--trace /dev/full: not a regular file"),
    (["run", DDP, "--trace", f"{DDP}/t.json"], "is a file, not a folder"),
    (["run", DDP, "--cluster", ""], "cluster spec '': expected terms"),
    (["run", DDP, "--workload", ""], "unknown workload ''"),
    (["run", DDP, "--cluster", "1x1000000000xA100-80GB"], "gpus: must be a whole number from 1 to 131072"),
    (["run", DDP, "--cluster", "2xA100-80GB:inter=inf"], "inter_bandwidth_GBps: must be at least 0.001 and at most"),
    (["run", DDP, "--workload", "toy:layers=2,layers=3"], "layers is given twice"),
    (["run", DDP, "--workload", "toy:seq=1e9"], "seq: must be a whole number from 1 to 16777216, got 1000000000"),
    (["run", DDP, "--batch", "1e9"], "argument --batch: must be a whole number from 1 to 1048576"),
    (["leaderboard", DDP, "--out", DDP], "ddp.py: is a file; give a folder"),
    (["leaderboard", DDP, "--jobs", "0"], "argument --jobs: must be a whole number from 1 to 256, got 0"),
    (["leaderboard", DDP, "--suite", "TIMEOUT_SUITE"], "limits.timeout_s: must be more than 0 and at most 86400 s"),
    (["leaderboard", DDP, "--suite", "BOOL_SUITE"], "limits.timeout_s: expected a number more than 0"),
    (["leaderboard", DDP, "--suite", "NAN_SUITE"], "limits.timeout_s: must be more than 0 and at most 86400 s, got na"),
    (["leaderboard", DDP, "--suite", "ZERO_MEMORY_SUITE"], "limits.address_space_GiB: must be at least 1 and at"),
    (["leaderboard", DDP, "--suite", "WEIGHT_SUITE"], "scoring.components[0].weight: expected a finite number"),
    (["check", DDP, "--examples", "0"], "argument --examples: must be a whole number from 1 to 100000, got 0"),
    (["check", "SYNTAX"], "importing it raised SyntaxError: expected ':' (syntax.py, line 1)"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    files = {"NOTRAIN": "x = 1\n", "NOTASYNC": "def train(model):\n    pass\n",
             "NOOPTIONS": "async def train(model):\n    pass\n", "BADTOML": "name = [\n",
             "BADSUITE": 'name = "x"\n[[scenarios]]\nname = "a"\ncluster = "2xA100-80GB"\nworkload = "toy"\n'
                         'global_batch = 2\ncolour = "red"\n', "SYNTAX": "async def train(model)\n    pass\n",
             "TIMEOUT_SUITE": _suite("timeout_s = -1"), "BOOL_SUITE": _suite("timeout_s = true"),
             "NAN_SUITE": _suite("timeout_s = nan"), "ZERO_MEMORY_SUITE": _suite("address_space_GiB = 0"),
             "WEIGHT_SUITE": _suite("", weight="nan")}
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


@pytest.mark.parametrize("component, message", [
    ({"metric": "mfu", "steps": [[0.5, 1], [0.8, 5]]}, r"steps: threshold 0.8 comes after 0.5, so it can never apply"),
    ({"metric": "memory_fraction", "higher_is_better": False, "steps": [[0.9, 1], [0.5, 5]]},
     r"threshold 0.5 comes after 0.9, .* increasing order"),
    ({"metric": "mfu", "steps": [[0.5, 1]], "scale": 100}, r"give either steps .* or scale"),
])
def test_a_rubric_step_that_could_never_apply_is_refused(component, message):
    with pytest.raises(InputError, match=message):
        parse_rubric({"components": [component]}, "suite.toml")


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


def test_run_prints_a_schedule_that_copies_fill(tmp_path, capsys):
    """tests/cheats/copy_schedule.py's 5,000 split_samples copies dominate most columns: once a KeyError
    of the schedule view that stopped `run`, now `o` (other compute), before its twin's F, B and U."""
    cheat = ROOT / "tests" / "cheats" / "copy_schedule.py"
    code = main(["run", str(cheat), "--cluster", "2xA100-80GB", "--workload", "toy:layers=4", "--batch", "8",
                 "--trace", str(tmp_path / "t.json"), "--no-plots"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split()[1] for line in out.splitlines() if "GiB" in line and line.split()[0] in ("0", "1")]
    assert len(rows) == 2 and all(r.startswith("oooo") and r.rstrip("FBLU").endswith("o") for r in rows), rows
    assert " o  other compute" in out


def test_a_file_named_with_dollar_signs_gets_its_plots(tmp_path, capsys):
    """Matplotlib reads `$...$` in a title as mathtext: a submission named `x$\\foo$.py` (an unknown
    symbol) made drawing its schedule raise, and its row `crashed` in the grader. Its name is drawn as
    it is now."""
    pytest.importorskip("matplotlib")
    strategy = tmp_path / "x$\\foo$.py"
    strategy.write_text((ROOT / "tests" / "submissions" / "honest.py").read_text())
    code = main(["run", str(strategy), "--cluster", "2xA100-80GB", "--workload", "toy:layers=4", "--batch", "8",
                 "--trace", str(tmp_path / "t.json"), "--json"])
    row = json.loads(capsys.readouterr().out)
    assert (code, row["status"], row["strategy"]) == (0, "ok", "x$\\foo$")
    assert [Path(p).name for p in row["plots"]] == ["t.schedule.png", "t.memory.png"]
    assert all(Path(p).stat().st_size > 1000 for p in row["plots"])


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


def test_relative_paths_in_specs_are_found_from_the_callers_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "c.toml").write_text('[[nodes]]\ndevice = "A100-80GB"\ngpus = 2\n')
    (tmp_path / "profiles").symlink_to(ROOT / "examples" / "profiles")
    monkeypatch.chdir(tmp_path)
    scenario = Scenario(cluster="c.toml", workload="profiles:profiles,toy")
    assert scenario.cluster == str(tmp_path / "c.toml")
    assert scenario.workload == f"profiles:{tmp_path / 'profiles'},toy"
    assert Scenario(cluster="metis:h,c").cluster == f"metis:{tmp_path / 'h'},{tmp_path / 'c'}"
    code = main(["run", DDP, "--cluster", "c.toml", "--workload", "profiles:profiles", "--batch", "4",
                 "--set", "microbatch_size=1", "--json", "--no-plots", "--trace", "t.json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "ok" and out["cluster"] == "1x2xA100-80GB"
    assert (tmp_path / "t.json").is_file()


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([("run", "--timeout"), ("run", "--batch"), ("leaderboard", "--jobs"), ("check", "--examples")]),
       st.one_of(st.text(max_size=12), st.floats().map(repr), st.integers(-10**12, 10**12).map(str)))
def test_numeric_flags_parse_within_range_or_fail_in_one_line_naming_the_flag(command, text):
    from grader.cli import MAX_EXAMPLES, MAX_JOBS, MAX_TIMEOUT_S, build_parser
    from grader.errors import InputError
    sub, flag = command
    ranges = {"--timeout": (0, MAX_TIMEOUT_S), "--batch": (1, 2**20), "--jobs": (1, MAX_JOBS),
              "--examples": (1, MAX_EXAMPLES)}
    try:
        args = build_parser().parse_args([sub, DDP, f"{flag}={text}"])
    except InputError as exc:
        assert "\n" not in str(exc) and flag in str(exc), str(exc)
        return
    value = getattr(args, flag[2:])
    low, high = ranges[flag]
    assert (low < value <= high) if flag == "--timeout" else (low <= value <= high and isinstance(value, int))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=4))
def test_set_options_parse_to_plain_values_or_fail_in_one_line(items):
    from grader.errors import InputError
    from grader.scenario import parse_set
    try:
        options = parse_set(items)
    except InputError as exc:
        assert str(exc).startswith("--set ") and "\n" not in str(exc), str(exc)
        return
    keys = [item.partition("=")[0].strip() for item in items]
    assert sorted(options) == sorted(keys) and all(key.isidentifier() for key in keys)


def test_a_plan_file_is_read_by_the_grader_so_a_sandboxed_run_needs_no_access_to_it(tmp_path, capsys):
    from dist_lib import plan
    cluster, workload = "1x2xA100-80GB+1x2xV100-32GB", "toy:layers=4"
    best = plan(cluster, workload, 8, top=2).best.plan
    (tmp_path / "plan.json").write_text(json.dumps(best.to_dict()))  # pytest's tmp_path: mode 0700
    planned = str(ROOT / "strategies" / "planned.py")
    code = main(["run", planned, "--set", f"plan={tmp_path / 'plan.json'}", "--cluster", cluster, "--workload",
                 workload, "--batch", "8", "--json", "--no-plots", "--trace", str(tmp_path / "t.json")])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "ok" and out["correct"]
    assert out["time_s"] == simulate(planned, cluster, workload, 8, plan=best).time_s
    assert main(["run", planned, "--set", f"plan={tmp_path / 'none.json'}", "--no-plots"]) == 2
    assert "plan file" in capsys.readouterr().err


@pytest.mark.parametrize("names, message", [
    (["a", "a"], "two scenarios are named 'a'"),
    (["a b", "a-b"], "scenarios 'a b' and 'a-b' would share the trace file a-b.json; rename one"),
    ([" ", "b"], "scenarios[0].name: must not be empty"),
])
def test_scenario_names_that_would_share_a_trace_file_are_refused(names, message, tmp_path):
    scenarios = "".join(f'[[scenarios]]\nname = "{name}"\ncluster = "2xA100-80GB"\nworkload = "toy"\nglobal_batch = 2\n'
                        for name in names)
    path = tmp_path / "s.toml"
    path.write_text(f'name = "x"\n{scenarios}[[scoring.components]]\nmetric = "mfu"\nweight = 1\nscale = 1\n')
    with pytest.raises(InputError) as caught:
        load_suite(str(path))
    assert str(caught.value) == f"suite {path}: {message}"


def test_submissions_of_one_name_in_folders_of_one_name_get_labels_and_trace_folders_of_their_own():
    first, second, alone = Path("/x/d1/team/sub.py"), Path("/x/d2/team/sub.py"), Path("/x/d1/team/other.py")
    assert labels_for([first, second, alone]) == {first: "d1/team/sub", second: "d2/team/sub", alone: "other"}
    assert labels_for([Path("/x/a/sub.py"), Path("/x/b/sub.py")]) == {Path("/x/a/sub.py"): "a/sub",
                                                                       Path("/x/b/sub.py"): "b/sub"}


@pytest.mark.parametrize("flags", [["--json"], []])
def test_output_into_a_closed_pipe_stops_quietly(flags):
    """`python -m grader run ... | head -1`: once the reader has gone, the grader stops with code 1 and
    no traceback, whether the JSON line or the terminal report meets the closed pipe."""
    import os
    import subprocess
    import sys
    read, write = os.pipe()
    os.close(read)  # every write to `write` fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "grader", "run", "strategies/ddp.py", "--cluster", "2xA100-80GB",
                               "--workload", "toy:layers=2", "--batch", "4", "--no-plots", *flags],
                              cwd=Path(__file__).resolve().parent.parent, stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, "")


def test_check_of_ones_own_file_named_like_a_bundled_strategy_tries_only_options_it_takes(tmp_path, capsys):
    # a hand-written data parallel saved as ddp.py takes microbatch_size only, not the bundled ddp's bucket_mb
    mine = tmp_path / "ddp.py"
    mine.write_text((ROOT / "examples" / "my_ddp.py").read_text())
    assert main(["check", str(mine), "--examples", "3"]) == 0
    out = capsys.readouterr().out
    assert "from generic configurations" in out and "passed: 3 configurations" in out
    assert main(["check", DDP, "--examples", "1"]) == 0
    assert "dist_lib.testing.setups('ddp')" in capsys.readouterr().out


MARKUP = 'async def train(model):\n    raise RuntimeError("[/nope] oops [red]not red[/red] :warning:")\n'
MARKUP_TEXT = "RuntimeError: [/nope] oops [red]not red[/red] :warning:"


def test_text_from_a_submission_prints_as_it_is_and_the_board_completes(tmp_path, capsys, monkeypatch):
    """An error message, a file name or a strategy name that reads like rich markup (a closing tag that
    matches nothing, a style, an emoji code) is printed literally, by `leaderboard` and by `run`."""
    from grader.runner import sandbox_problem
    monkeypatch.setenv("COLUMNS", "400")  # one line per message
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "honest.py").write_text((ROOT / "tests" / "submissions" / "honest.py").read_text())
    (folder / "markup.py").write_text(MARKUP)
    (folder / "[bold]x[:warning:].py").write_text(MARKUP)
    suite = tmp_path / "suite.toml"
    suite.write_text(_suite("timeout_s = 30").replace('workload = "toy"', 'workload = "toy:layers=2"'))
    args = ["leaderboard", str(folder), "--suite", str(suite), "--out", str(tmp_path / "out"), "--no-plots"]
    assert main(args + (["--trusted"] if sandbox_problem() else [])) == 0
    out = capsys.readouterr().out
    assert f"markup / a: failed — StrategyError: rank 0: {MARKUP_TEXT}" in out
    assert f"[bold]x[:warning:] / a: failed — StrategyError: rank 0: {MARKUP_TEXT}" in out
    assert "│ [bold]x[:warning:] │" in out and "results: " in out
    assert (tmp_path / "out" / "leaderboard.json").is_file()
    code = main(["run", str(folder / "markup.py"), *TOY, "--trace", str(tmp_path / "t.json")])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("markup on 1x2xA100-80GB") and MARKUP_TEXT in out


def test_an_output_folder_holding_a_file_named_runs_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "runs").write_text("mine")
    assert main(["leaderboard", DDP, "--out", str(tmp_path), "--trusted"]) == 2
    assert capsys.readouterr().err == f"error: --out {tmp_path}: {tmp_path / 'runs'} is a file; the board keeps " \
                                      f"its traces in a folder of that name\n"
    assert (tmp_path / "runs").read_text() == "mine"

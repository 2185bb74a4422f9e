"""A `--api puzzles|lab` run whose calls could not be recorded has its figures taken as it reports them
(unverified), but its report is untrusted: the grader checks every field (`grader/compat_payload.py`)
and makes a report of the wrong shape an `invalid` row naming the field, never a traceback of the
grader. `tests/cheats/forged_compat.py` writes such a report."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dist_lib.compat import run_file
from grader._worker import reported
from grader.compat_payload import PayloadError, compat_result
from grader.grade import grade_run
from grader.runner import sandbox_problem
from grader.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
CHEAT = ROOT / "tests" / "cheats" / "forged_compat.py"
SCENARIO = Scenario(name="run", cluster="2xA100-80GB", workload="toy", global_batch=8, options={}, given=())


@pytest.fixture(scope="module")
def honest():
    """What the worker reports of an unrecorded run, for the puzzles' GPipe solution (4 ranks), through JSON
    as it travels."""
    result = run_file(ROOT / "tests" / "compat_solutions" / "puzzles_solutions.py", api="puzzles", function="gpipe",
                      check=False, exact_memory=True)
    return json.loads(json.dumps(reported(result)))


def test_an_honest_report_reads_back_as_it_was_reported(honest):
    result = compat_result(honest)
    assert (result.cluster.name, result.cluster.world_size) == ("1x4xH100-80GB", 4)
    assert (result.time_s, result.memory_bytes, result.correct) == (honest["time_s"], honest["memory_bytes"], True)
    assert len(result.raw_events) == len(honest["events"]) and result.options["verified"] is False
    assert list(result.timelines[0][1]) == honest["timelines"][0][1]


def _set(path: str, value):
    def edit(payload):
        *head, last = path.split(".")
        target = payload
        for key in head:
            target = target[int(key) if key.isdigit() else key]
        target[int(last) if last.isdigit() else last] = value
    return edit


@pytest.mark.parametrize("edit, words", [
    (_set("memory_bytes", []), "memory_bytes: 0 entries for a cluster of 4 ranks"),  # max() of nothing
    (_set("memory_bytes.2", "a"), "memory_bytes[2]: expected a whole number"),
    (_set("time_s", math.nan), "time_s: expected a finite number >= 0, got nan"),
    (_set("time_s", -1.0), "time_s: expected a finite number >= 0, got -1.0"),
    (_set("rank_times", [1.0]), "rank_times: 1 entries for a cluster of 4 ranks"),
    (_set("events.0.0", 99), "events[0][0] (rank): expected a rank from 0 to 3, got 99"),
    (_set("events.0.4", "x"), "events[0][4] (end): expected a finite number >= 0, got 'x'"),
    (_set("events.0.3", 5.0), "events[0]: ends at 1 before it starts at 5"),
    (_set("events.0.2", "gpu"), "events[0][2] (stream): expected one of compute, collective, p2p"),
    (_set("events.0", [0]), "events[0]: expected 12 fields, got 1"),
    (_set("timelines.0.1", [1.0]), "timelines[0]: 26 times but 1 byte counts"),
    (_set("strategy", "\x1b[2Jboard"), "strategy: expected printable text"),
    (_set("problems", "abc"), "problems: expected a list, got 'abc'"),
    (_set("correct", 1), "correct: expected true or false, got 1"),
    (_set("options.notebook", "x"), "options.notebook: expected an object of time, memory"),
    (_set("options.notebook.time", "x"), "options.notebook.time: expected a finite number >= 0"),
    (_set("cluster", "131072xH100-80GB"), "memory_bytes: 4 entries for a cluster of 131072 ranks"),
    (_set("workload.num_layers", 10**6), "workload 'puzzles-original': num_layers: must be a whole number"),
])
def test_a_report_of_the_wrong_shape_names_its_field(honest, edit, words):
    payload = copy.deepcopy(honest)
    edit(payload)
    with pytest.raises(PayloadError) as error:
        compat_result(payload)
    assert words in str(error.value)


def test_the_forging_cheat_is_an_invalid_row_not_a_grader_traceback(tmp_path):
    row, result = grade_run(str(CHEAT), SCENARIO.to_dict(), {"timeout_s": 60}, str(tmp_path / "t.json"),
                            plots=False, api="puzzles", function="gpipe", confine=sandbox_problem() is None)
    assert (row["status"], result) == ("invalid", None)
    assert row["error"] == ("the worker wrote a result of the wrong shape: memory_bytes: 0 entries for a cluster "
                            "of 4 ranks")


def test_the_command_line_prints_one_line_for_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader", "run", str(CHEAT), "--api", "puzzles", "--function",
                           "gpipe", "--trace", str(tmp_path / "t.json"), "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "invalid" and "memory_bytes: 0 entries" in out["error"]

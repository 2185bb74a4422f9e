"""A teacher's own suite: the mistakes one makes in it, the score its rubric gives, and what a resumed
board grades again."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.errors import InputError
from grader.leaderboard import make_jobs
from grader.suites import load_suite

SCENARIO = """
[[scenarios]]
name = "toy4"
cluster = "{cluster}"
workload = "toy:layers=8"
global_batch = 16
"""
RUBRIC = """
[[scoring.components]]
name = "mfu"
metric = "mfu"
weight = 0.75
scale = 100

[[scoring.components]]
name = "mem"
metric = "memory_fraction"
higher_is_better = false
weight = 0.25
steps = [[0.5, 100], [0.7, 75], [0.9, 50], [1.0, 25]]
otherwise = 0
"""


def suite_file(tmp_path: Path, body: str, cluster: str = "2x2xA100-80GB") -> Path:
    path = tmp_path / "my.toml"
    path.write_text('name = "class"\n' + body.replace("{scenario}", SCENARIO.format(cluster=cluster))
                    .replace("{rubric}", RUBRIC))
    return path


def test_rubric_score_is_the_weighted_sum_derived_by_hand(tmp_path: Path) -> None:
    suite = load_suite(suite_file(tmp_path, "{scenario}{rubric}"))
    # figures of tests/submissions/honest.py on 2x2xA100-80GB, toy:layers=8, batch 16
    row = {"status": "ok", "mfu": 0.2924399179906308, "memory_fraction": 5252759552 / 85899345920,
           "global_batch": 16, "time_s": 0.03163281830656576}
    # 0.75 x (100 x 0.29244) + 0.25 x 100 (memory fraction 0.0612 <= 0.5)
    assert suite.rubric.score(row) == pytest.approx(0.75 * 29.24399179906308 + 25.0)
    assert round(suite.rubric.score(row), 4) == 46.933
    # a run over 90 % of its memory (0.95) gets the last step's 25 points, one that did not finish none
    assert suite.rubric.score({**row, "memory_fraction": 0.95}) == pytest.approx(
        0.75 * 29.24399179906308 + 0.25 * 25)
    assert suite.rubric.score({**row, "status": "failed"}) == 0.0


@pytest.mark.parametrize(("body", "message"), [
    ("{scenario}[scoring]\ncomponent = 1\n{rubric}", "[scoring]: unknown field(s) component"),
    ("{scenario}", "no [scoring] section: a suite scores its runs with [[scoring.components]] tables"),
    ("{scenario}[[scoring.components]]\nmetric = \"mfu\"\nweight = 0\nscale = 100\n",
     "scoring.components[0].weight: must be more than 0, got 0"),
    ("{scenario}[[scoring.components]]\nmetric = \"mfu\"\nweight = -1\nscale = 100\n",
     "scoring.components[0].weight: must be more than 0, got -1"),
    ("{scenario}[[scoring.components]]\nmetric = \"mfu\"\nscale = 100\nmin = 30\nmax = 10\n",
     "scoring.components[0]: min 30 is above max 10"),
    ("{scenario}[[scoring.components]]\nmetric = \"mfu\"\nsteps = [[0.5, 1]]\nmax = 1\n",
     "scoring.components[0]: min and max clip a linear (scale) component"),
    ("{scenario}[[scoring.components]]\nname = 3\nmetric = \"mfu\"\nscale = 1\n",
     "scoring.components[0].name: expected a string, got 3"),
    ("[limits]\ntimeout_s = \"60\"\n{scenario}{rubric}", "limits.timeout_s: expected a number, got the string '60'"),
    ("{scenario}memory_limit_GB = \"80\"\n{rubric}",
     "scenarios[0].memory_limit_GB: expected a number, got the string '80'"),
    ("{scenario}{rubric}".replace("{scenario}", SCENARIO.replace("toy4", "ALL")), "scenarios[0].name: 'ALL' is"),
])
def test_each_mistake_is_one_line_naming_the_suite_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = suite_file(tmp_path, body)
    with pytest.raises(InputError) as info:
        load_suite(path)
    text = str(info.value)
    assert text.startswith(f"suite {path}: ") and message in text and "\n" not in text


def test_a_changed_cluster_file_is_graded_again(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('name = "two"\n[[nodes]]\ndevice = "A100-80GB"\ncount = 2\ngpus = 2\n')
    submission = tmp_path / "alice.py"
    submission.write_text("async def train(model):\n    pass\n")
    path = suite_file(tmp_path, "{scenario}{rubric}", cluster=str(cluster))

    def fingerprint() -> str:
        [job] = make_jobs([submission], load_suite(path), tmp_path / "board", traces=False)
        return job.fingerprint

    before = fingerprint()
    assert fingerprint() == before  # nothing changed: resumed, not graded again
    cluster.write_text(cluster.read_text().replace("A100-80GB", "V100-32GB"))
    assert fingerprint() != before  # the same path, another cluster: graded again


def test_memory_headroom_is_the_fullest_gpus_share_on_a_mixed_cluster():
    """DDP holds the same bytes on an A100-80GB and a V100-16GB: the peak rank is the A100 (rank 0, the
    first of equal peaks), but the V100 is five times as full, and that is the headroom the rubric scores."""
    from grader.grade import grade_run
    from grader.scenario import Scenario
    from grader.scoring import metric
    scenario = Scenario(cluster="1x1xA100-80GB+1x1xV100-16GB", workload="toy:layers=2", global_batch=4,
                        options={"microbatch_size": 2})
    ddp = Path(__file__).resolve().parent.parent / "strategies" / "ddp.py"
    row, result = grade_run(str(ddp), scenario.to_dict(), {"timeout_s": 60}, None,
                            plots=False, confine=False)
    assert row["status"] == "ok" and result.memory_bytes[0] == result.memory_bytes[1]
    assert row["peak_memory_rank"] == 0
    assert metric(row, "memory_fraction") == result.memory_bytes[1] / (16 * 2**30)
    assert metric(row, "memory_fraction") == 5 * result.memory_bytes[0] / (80 * 2**30)

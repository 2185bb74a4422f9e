"""Every example under examples/ runs, from the project's folder as its comments say, and prints what
the lesson or the file promises."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_lib import Cluster, StrategyError, simulate
from dist_lib.planner import Plan
from grader.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LAB = ["--cluster", "examples/cluster.toml", "--workload", "examples/workload.toml", "--batch", "32"]


@pytest.fixture(autouse=True)
def _in_the_project(monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples name each other from the project's folder


def test_the_cluster_and_workload_files_describe_what_their_comments_say(tmp_path, capsys):
    cluster = Cluster.load("examples/cluster.toml")
    assert cluster.name == "lab" and cluster.world_size == 8
    assert [n.device.name for n in cluster.nodes] == ["A100-80GB", "V100-32GB"]
    assert cluster.nodes[1].nics == 1
    assert main(["run", "ddp", *LAB, "--json", "--no-plots", "--trace", str(tmp_path / "t.json")]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["status"] == "ok" and row["correct"] and row["workload"] == "my-760m"
    assert row["time_s"] == simulate(ROOT / "strategies" / "ddp.py", "examples/cluster.toml",
                                     "examples/workload.toml", 32).time_s


def test_the_class_folder_is_ranked_on_the_example_suite(tmp_path, capsys):
    students = [f"examples/class/{name}" for name in ("alice", "bob", "carol")]
    assert main(["leaderboard", *students, "--suite", "examples/suite.toml", "--out", str(tmp_path),
                 "--no-plots", "--trusted"]) == 0
    printed = capsys.readouterr().out
    board = json.loads((tmp_path / "leaderboard.json").read_text())
    ranks = {s["submission"]: s["rank"] for s in board["submissions"]}
    # bob overlaps each layer's all-reduce with the backward of the layers before it, alice does not;
    # carol never sums the gradients, which the grader catches on the first update
    assert ranks["bob/strategy"] == 1 and ranks["alice/strategy"] == 2
    carol = [r for r in board["rows"] if r["submission"] == "carol/strategy"]
    assert {r["status"] for r in carol} == {"failed"} and all("TensorError" in r["error"] for r in carol)
    assert "score: 100 x mfu, per scenario" in printed


def test_the_mixed_cluster_plan_is_what_the_planner_finds_and_it_runs(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", *LAB, "--out", str(out), "--plot", ""]) == 0
    assert Plan.load(out) == Plan.load(EXAMPLES / "mixed_plan.json")
    devices = {Cluster.load("examples/cluster.toml").device_of(r).name for r in Plan.load(out).ranks}
    assert devices == {"A100-80GB", "V100-32GB"}  # a plan that mixes the two
    capsys.readouterr()
    assert main(["run", "planned", "--set", "plan=examples/mixed_plan.json", *LAB, "--json", "--no-plots",
                 "--trace", str(tmp_path / "t.json")]) == 0
    assert json.loads(capsys.readouterr().out)["correct"]


def test_the_lesson_prints_the_bubble_its_formula_gives():
    printed = subprocess.run([sys.executable, "examples/lesson_pipeline.py"], capture_output=True, text=True,
                             check=True).stdout
    bubbles = [int(b) for b in re.findall(r"bubble (\d+)%", printed)]
    # (p - 1) / (m + p - 1) with p = 2 stages: 1/3 at m = 2, 1/9 at m = 8 (and 1F1B at m = 8 alike)
    assert bubbles == [33, 11, 11]
    peaks = [float(p) for p in re.findall(r"peak ([\d.]+) GiB", printed)]
    assert peaks[2] < peaks[1] / 2  # 1F1B holds 2 microbatches of 8 where GPipe holds them all


@settings(max_examples=12, deadline=None)
@given(nodes=st.integers(1, 2), gpus=st.sampled_from([1, 2, 3, 4, 8]), batch=st.integers(1, 48),
       microbatch=st.integers(1, 5))
def test_the_first_strategy_runs_every_batch_that_splits_and_refuses_the_rest_in_one_line(nodes, gpus, batch,
                                                                                          microbatch):
    world = nodes * gpus
    share = batch // world
    splits = batch % world == 0 and share % min(microbatch, share) == 0
    try:
        result = simulate(EXAMPLES / "my_ddp.py", f"{nodes}x{gpus}xA100-80GB", "toy:layers=2", batch,
                          microbatch_size=microbatch)
    except StrategyError as exc:
        assert not splits
        assert f"ValueError: batch {batch} must split into {world} equal shares" in str(exc)
        assert "\n" not in str(exc)
    else:
        assert splits and result.correct


def test_the_first_strategy_runs_the_case_that_failed_before():
    # 2 x 8 GPUs at batch 32: a share of 2 samples, below the default microbatch of 4
    assert simulate(EXAMPLES / "my_ddp.py", "2x8xA100-80GB", "gpt-1.3b", 32).correct

"""The planner on large and odd requests: a plan too large to simulate keeps its estimate (a batch of a
million samples answers at once), the table says whose MFU it shows, the usage names every option, and
odd `plan()` arguments are refused in one line naming the argument."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from dist_lib import Cluster, SpecError, simulate
from dist_lib.planner import Plan, Stage, plan
from dist_lib.planner.evaluate import layer_passes, simulated_passes
from dist_lib.workload.transformer import Workload
from dist_lib.planner.report import table
from grader import cli
from grader.cli import main

CLUSTER, WORKLOAD = "1x2xA100-80GB+1x2xT4", "toy:layers=4"


def test_layer_passes_count_microbatches_times_each_stages_gpus_times_its_layers():
    two = Plan((Stage((0, 1), 1, ((0, 3),), (2, 2)), Stage((2,), 1, ((3, 4),), (4,))), 4, 4, "1f1b", "none", 0)
    assert layer_passes(two) == 4 * (2 * 3 + 1 * 1)


def test_plans_over_the_simulation_limit_keep_their_estimates():
    full = plan(CLUSTER, WORKLOAD, 8, top=3)
    assert full.best.simulated is not None and not full.notes
    capped = plan(CLUSTER, WORKLOAD, 8, top=3, simulation_limit=1)
    # nothing simulated: the estimate's best is the answer, and a note says why
    assert capped.best is capped.candidates[0] and capped.best.simulated is None
    assert all(c.simulated is None and c.error == "not simulated: too large" for c in capped.simulated)
    assert len(capped.notes) == 1 and "above the simulation limit of 1 " in capped.notes[0]
    assert [c.plan for c in capped.candidates] == [c.plan for c in full.candidates]  # the same estimates


def test_a_batch_of_a_million_samples_over_the_limit_is_answered_from_the_estimate(tmp_path, capsys):
    """Eight alike GPUs fold to one replica, whose 24 layers run 2^20 / (8 x microbatch) microbatches: what the
    limit counts (`simulated_passes`), an eighth of every GPU's passes. (Under the default limit such plans
    simulate, in a few seconds to half a minute each.)"""
    out = tmp_path / "plan.json"
    batch = 2**20
    assert main(["plan", "--cluster", "1x8xA100-80GB", "--workload", "gpt-1.3b", "--batch", str(batch),
                 "--out", str(out), "--plot", "", "--simulation-limit", "1000"]) == 0
    printed = capsys.readouterr().out
    assert "10 of the 10 best estimates not simulated" in printed
    saved = Plan.load(out)
    folded = simulated_passes(Cluster.load("1x8xA100-80GB"), Workload.load("gpt-1.3b"), batch, saved)
    assert saved.global_batch_size == batch and saved.stages[0].dp == 8
    assert folded == saved.microbatches * 24 == layer_passes(saved) // 8 > 1000


def test_a_plan_whose_replicas_fold_counts_one_replica_a_stage():
    """Two stages of two replicas on alike GPUs fold (`simulate` runs replica 0 of each stage), also when the
    stages' devices differ; when one stage's two replicas sit on different devices the plan does not fold, and
    every GPU counts."""
    two = Plan((Stage((0, 1), 1, ((0, 2),), (1, 1)), Stage((2, 3), 1, ((2, 4),), (1, 1))), 2, 4, "1f1b", "none", 0)
    workload = Workload.load("toy:layers=4")
    assert layer_passes(two) == 4 * (2 * 2 + 2 * 2)
    assert simulated_passes(Cluster.load("1x4xA100-80GB"), workload, 8, two) == 4 * (1 * 2 + 1 * 2)
    assert simulated_passes(Cluster.load("1x2xA100-80GB+1x2xV100-32GB"), workload, 8, two) == 4 * (1 * 2 + 1 * 2)
    mixed = Cluster.load("1x1xA100-80GB+1x1xV100-32GB+1x2xA100-80GB")
    assert simulated_passes(mixed, workload, 8, two) == layer_passes(two)


def test_the_simulation_limit_is_an_option_of_the_command(tmp_path, capsys):
    """gpt-1.3b has 24 layers, each run by at least one GPU for at least one microbatch: every plan is at
    least 24 layer passes, so a limit of 10 leaves both top plans to their estimates; the default
    (2^20, far above 64 samples' plans on 8 GPUs) simulates them."""
    argv = ["plan", "--cluster", "1x8xA100-80GB", "--workload", "gpt-1.3b", "--batch", "64", "--top", "2",
            "--out", str(tmp_path / "plan.json"), "--plot", ""]
    assert main(argv + ["--simulation-limit", "10"]) == 0
    assert "2 of the 2 best estimates not simulated" in capsys.readouterr().out
    assert main(argv) == 0
    assert "not simulated" not in capsys.readouterr().out


def test_the_mfu_column_says_it_counts_the_gpus_the_plan_uses():
    # one layer and one sample: the best plan runs on one GPU and leaves the other idle
    search = plan("1x1xT4+1x1xA100-80GB", "toy:layers=1", 1, top=2)
    best = search.best
    assert len(best.plan.ranks) == 1
    result = simulate("strategies/planned.py", "1x1xT4+1x1xA100-80GB", "toy:layers=1", 1, plan=best.plan)
    used = Cluster.load("1x1xT4+1x1xA100-80GB").device_of(best.plan.ranks[0])
    assert best.mfu == pytest.approx(result.model_flops / (result.time_s * used.peak_flops), rel=1e-12)
    text = io.StringIO()
    Console(file=text, width=200, color_system=None).print(table(search, Cluster.load("1x1xT4+1x1xA100-80GB")))
    assert "used MFU" in text.getvalue() and "used MFU and $/step: of the GPUs the plan uses (idle GPUs not counted)" in text.getvalue()


def test_the_plan_usage_line_names_every_option():
    usage = next(line for line in cli.__doc__.split("dist-sandbox ") if line.startswith("plan "))
    parser = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "plan")[1]
    options = {o for action in parser._actions for o in action.option_strings if o.startswith("--") and o != "--help"}
    assert options and {o for o in options if o not in usage} == set()


@pytest.mark.parametrize("argument, value", [
    ("width", 0), ("width", 2.5), ("refine_rounds", -1), ("refine_rounds", 1.5), ("prune_slack", -0.1),
    ("prune_slack", math.nan), ("prune_slack", "0.2"), ("progress", 5), ("runner", None),
    ("simulation_limit", 0), ("top", 1.5)])
def test_an_odd_argument_to_plan_is_named_in_one_line(argument, value):
    with pytest.raises(SpecError) as error:
        plan(CLUSTER, WORKLOAD, 8, **({"top": 1} | {argument: value}))
    assert str(error.value).startswith(f"{argument} must be ") and "\n" not in str(error.value)


def test_unpruned_search_still_takes_infinite_slack():
    assert plan(CLUSTER, WORKLOAD, 8, top=0, prune_slack=math.inf).best.estimate > 0


def test_a_context_parallel_plan_counts_a_replicas_cp_x_tp_ranks_a_stage():
    """Megatron-LM's launch of 2 stages of dp 2 x cp 2 x tp 1 on 8 alike GPUs folds to one replica, whose stage
    holds its cp x tp = 2 ranks: half of every GPU's passes, 4 microbatches x (2 x 2 + 2 x 2) layer passes."""
    cp = Plan((Stage(tuple(range(4)), 1, ((0, 2),), (1, 1)), Stage(tuple(range(4, 8)), 1, ((2, 4),), (1, 1))), 2, 4,
              "1f1b", "none", 0, cp=2)
    workload = Workload.load("toy:layers=4,seq=1024")
    assert layer_passes(cp) == 4 * (4 * 2 + 4 * 2)
    assert simulated_passes(Cluster.load("1x8xA100-80GB"), workload, 8, cp, framework="megatron") == 4 * (2 * 2 + 2 * 2)

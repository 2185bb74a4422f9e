"""`plan(..., framework=...)`: only plans the framework runs, and the step the search reports is the step its
exported settings, read back, simulate (plan -> export -> import)."""

import json

import pytest

from dist_lib import Cluster, SpecError, Workload, simulate
from dist_lib.planner import plan
from dist_lib.planner.export import export
from dist_lib.planner.framework_rules import runners_note, why_not
from dist_lib.planner.framework_run import launch_cluster
from dist_lib.planner.launch import Launch, uniform_split
from dist_lib.planner.launch_import import from_deepspeed, from_megatron, from_torchtitan


def round_trip(cluster, workload, batch, candidate, framework):
    """The exported settings read back and run by the strategy `run --from` runs, on the launch's nodes."""
    text = export(candidate.plan, framework, workload, cluster).settings
    launched = launch_cluster(candidate.plan, cluster)
    world = launched.world_size
    imported = {"megatron": lambda: from_megatron(text, workload, world),
                "torchtitan": lambda: from_torchtitan(text, workload, world),
                "deepspeed": lambda: from_deepspeed(text, workload, world)}[framework]()
    assert imported.launch.global_batch_size == batch
    name, options = imported.launch.strategy(imported.workload.num_layers)
    return simulate(f"strategies.{name}", launched, imported.workload, batch, memory_reserve=True, **options), \
        imported.launch


def check_search(cluster_spec, workload_spec, batch, framework, **kwargs):
    cluster, workload = Cluster.load(cluster_spec), Workload.load(workload_spec)
    search = plan(cluster, workload, batch, framework=framework, **kwargs)
    for c in [*search.simulated, search.best]:  # every plan the search kept, the framework runs
        assert why_not(c.plan, framework, cluster, workload) == ""
        widths = {(s.dp, s.tp) for s in c.plan.stages}
        assert len(widths) == 1 and all(len(set(s.shares)) == 1 for s in c.plan.stages)
    best = search.best
    result, launch = round_trip(cluster, workload, batch, best, framework)
    assert best.simulated is not None
    assert result.time_s == pytest.approx(best.simulated, rel=0.01)  # the acceptance: within 1 %
    assert result.time_s == pytest.approx(best.simulated, rel=1e-9)  # by construction: the same run
    return search, launch


def test_megatron_on_a_mixed_cluster_small():
    search, launch = check_search("1x4xA100-80GB+1x4xV100-32GB", "gpt-1.3b", 32, "megatron")
    assert (launch.pp, launch.schedule) == (2, "interleaved")  # an uneven split, as a pipeline layout
    assert launch.layers is not None


def test_torchtitan_with_tensor_parallelism_runs_sequence_parallel():
    # torchtitan's TP always adds sequence parallelism: the search times the plan that way, so its
    # simulated step differs from the estimate of the same plan without it
    search, launch = check_search("2x4xA100-40GB", "gpt-2.7b", 32, "torchtitan")
    # no ZeRO-1 setting in torchtitan (FSDP, zero 3, instead), and for a GPT block no selective recompute: torchtitan's
    # selective mode is its per-op policy (recompute 'op'), modelled for Llama blocks only
    assert all(c.plan.zero in (0, 3) and c.plan.recompute in ("none", "full") for c in search.candidates)
    tp_plan = next(c for c in search.candidates if c.plan.stages[0].tp == 2 and c.plan.zero == 0)
    result, tp_launch = round_trip(Cluster.load("2x4xA100-40GB"), Workload.load("gpt-2.7b"), 32, tp_plan, "torchtitan")
    assert tp_launch.tp == 2 and tp_launch.sequence_parallel and result.time_s != tp_plan.estimate


def test_deepspeed_pipeline_runs_its_lock_step_schedule():
    # one GPU a node behind a 1 GB/s network: a pipeline of four stages, DeepSpeed's own schedule
    search, launch = check_search("4x1xA100-80GB:inter=1", "gpt-1.3b", 32, "deepspeed")
    assert (launch.pp, launch.schedule) == (4, "deepspeed")
    for c in search.candidates:
        assert [s.layers for s in c.plan.stages] == list(uniform_split(24, len(c.plan.stages)))
        assert c.plan.recompute != "selective" and c.plan.schedule == "1f1b"
    # the lock-step schedule is slower than the 1F1B the estimate times
    assert search.best.simulated > search.best.estimate * 1.05


def test_any_names_the_frameworks_that_run_the_best_plan():
    homogeneous = plan("2x8xA100", "gpt-1.3b", 64, top=1).best.plan
    assert runners_note(homogeneous, Cluster.load("2x8xA100"), Workload.load("gpt-1.3b")) == \
        "runs as it is in Megatron-LM, torchtitan, DeepSpeed (python -m grader export PLAN --to megatron)"


def test_heterogeneous_plans_are_named_as_what_no_framework_runs():
    from dist_lib.planner import Plan, Stage
    cluster, workload = Cluster.load("1x2xA100-80GB+1x2xT4"), Workload.load("toy:layers=4")
    uneven = Plan((Stage((0, 1, 2, 3), 1, ((0, 4),), (3, 3, 1, 1)),), 8, 1)
    note = runners_note(uneven, cluster, workload)
    assert "cut a microbatch unevenly among replicas" in note and "Metis' or FlashFlex's" in note
    widths = Plan((Stage((0, 1), 2, ((0, 3),), (4,)), Stage((2, 3), 1, ((3, 4),), (2, 2))), 4, 2)
    assert "stages of different widths (dp x tp: 1x2, 2x1)" in runners_note(widths, cluster, workload)


def test_a_framework_search_that_finds_nothing_says_so():
    # per-type widths only: 2 + 1 GPUs a node, which no launcher starts as one job
    with pytest.raises(SpecError, match="no plan Megatron-LM runs"):
        plan("1x2xA100-80GB+1x1xA100-80GB", "gpt-1.3b", 6, framework="megatron")
    with pytest.raises(SpecError, match="framework must be one of any, megatron, torchtitan, deepspeed"):
        plan("1x2xA100", "toy", 4, framework="jax")


def test_any_is_the_default_search():
    a = plan("1x2xA100-80GB+1x2xV100-32GB", "gpt-350m:layers=8", 16, top=3)
    b = plan("1x2xA100-80GB+1x2xV100-32GB", "gpt-350m:layers=8", 16, top=3, framework="any")
    assert [(c.plan, c.estimate, c.simulated) for c in a.candidates] == \
        [(c.plan, c.estimate, c.simulated) for c in b.candidates]


def test_cli_plan_for_a_framework_prints_its_settings_and_a_run_that_gives_its_step(tmp_path, capsys, monkeypatch):
    from grader.cli import main
    monkeypatch.chdir(tmp_path)
    spec = "4x1xA100-80GB:inter=1"
    assert main(["plan", "--cluster", spec, "--workload", "gpt-1.3b", "--batch", "32", "--framework", "deepspeed",
                 "--top", "3", "--plot", "p.png"]) == 0
    out = capsys.readouterr().out
    assert "train_micro_batch_size_per_gpu 2, gradient_accumulation_steps 16" in out
    assert "plans DeepSpeed runs" in out
    simulated = float(out.split("1f1b")[1].split()[2])  # the winner's row: m x b, est. ms, sim. ms
    assert main(["export", "plan.json", "--to", "deepspeed", "--cluster", spec, "--workload", "gpt-1.3b",
                 "--out", "ds.json"]) == 0
    capsys.readouterr()
    assert main(["run", "--from", "deepspeed", "ds.json", "--cluster", spec, "--workload", "gpt-1.3b", "--json",
                 "--no-plots", "--trace", "t.json"]) == 0
    ran = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert ran["time_s"] * 1e3 == pytest.approx(simulated, abs=0.006)


# The acceptance on the clusters: a 7B GPT, batch 512.

def test_acceptance_megatron_on_a100_and_v100():
    search, launch = check_search("2x8xA100-80GB+2x8xV100-32GB", "gpt-6.7b", 512, "megatron")
    assert launch.world_size == 32


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_acceptance_on_h100(framework):
    search, launch = check_search("2x8xH100-80GB", "gpt-6.7b", 512, framework)
    assert Launch.from_plan(search.best.plan, framework, 32) == launch

"""Plans exported as Megatron-LM, torchtitan and DeepSpeed settings, and those settings read back."""

import json
import tomllib
from dataclasses import replace

import pytest

from dist_lib import Cluster, SpecError, Workload, simulate
from dist_lib.planner import Plan, Stage
from dist_lib.planner.export import export, megatron_layout
from dist_lib.planner.launch import Launch, node_order
from dist_lib.planner.launch_import import _parse_layout, from_deepspeed, from_megatron, from_torchtitan
from strategies import hybrid, planned

CLUSTER = Cluster.load("2x8xA100")
GPT = Workload.load("gpt-1.3b")  # 24 layers, h 2048, 16 heads, seq 2048, vocab 50257
NO_AC = {"activation_checkpoint": {"mode": "none"}}  # (torchtitan's default, selective every 2nd layer, is refused)


def grid(pp, dp, tp, layers, share, microbatches, schedule="1f1b", recompute="none", zero=0, first=0):
    """A homogeneous plan on ranks first.. in (pp, dp, tp) order; `layers`: block sizes chunk-major."""
    chunks = len(layers) // pp
    bounds, start = [], 0
    for n in layers:
        bounds.append((start, start + n))
        start += n
    width = dp * tp
    stages = tuple(Stage(tuple(range(first + s * width, first + (s + 1) * width)), tp,
                         tuple(bounds[c * pp + s] for c in range(chunks)), (share,) * dp) for s in range(pp))
    return Plan(stages, share * dp, microbatches, schedule, recompute, zero)


def test_megatron_arguments_hand_checked():
    plan = grid(2, 4, 2, [12, 12], 2, 8, recompute="full", zero=1)  # 2 x 4 x 8 = 64 samples
    lines = export(plan, "megatron", GPT, CLUSTER).settings.replace(" \\\n", "\n").split("\n")
    assert lines[:10] == ["--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2",
                          "--micro-batch-size 2", "--global-batch-size 64", "--recompute-granularity full",
                          "--recompute-method uniform", "--recompute-num-layers 1", "--use-distributed-optimizer",
                          "--overlap-grad-reduce", "--bf16"]
    assert "--ffn-hidden-size 8192" in lines and "--vocab-size 50257" in lines and "--seq-length 2048" in lines


def test_megatron_layout_string_both_ways():
    assert megatron_layout((5, 7, 6, 6)) == "Et*5|t*7|t*6|t*6L"
    assert _parse_layout("Et*5|t*7|t*6|t*6L", "x") == (5, 7, 6, 6)
    assert _parse_layout("E(tt|)*3,tL", "x") == (2, 2, 2, 1)  # Megatron-LM's own grammar: (..)*n and commas
    with pytest.raises(SpecError, match="embedding 'E' first"):
        _parse_layout("t*5|t*7L", "x")


def test_interleaved_plan_gives_virtual_stages():
    plan = grid(2, 8, 1, [6, 6, 6, 6], 1, 8, schedule="interleaved")
    settings = export(plan, "megatron", GPT, CLUSTER).settings
    assert "--num-virtual-stages-per-pipeline-rank 2" in settings
    launch = from_megatron(settings, world_size=16).launch
    assert (launch.schedule, launch.chunks, launch.dp, launch.microbatches) == ("interleaved", 2, 8, 8)


def test_torchtitan_toml_hand_checked():
    plan = grid(2, 4, 1, [10, 14], 2, 8, schedule="gpipe")
    toml = tomllib.loads(export(plan, "torchtitan", GPT, None).settings)
    par, train = toml["parallelism"], toml["training"]
    assert (train["local_batch_size"], train["global_batch_size"], train["seq_len"]) == (16, 64, 2048)
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"], par["pipeline_parallel_degree"],
            par["pipeline_parallel_schedule"], par["pipeline_parallel_microbatch_size"]) == (4, 1, 2, "GPipe", 2)
    parts = par["module_fqns_per_model_part"]
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and len(parts[0]) == 11
    assert parts[1][-3:] == ["layers.23", "norm", "output"] and len(parts[1]) == 16


def test_deepspeed_json_hand_checked():
    plan = grid(2, 8, 1, [12, 12], 1, 8, recompute="full")
    config = json.loads(export(plan, "deepspeed", GPT, CLUSTER).settings)
    assert config == {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                      "bf16": {"enabled": True}, "zero_optimization": {"stage": 0},
                      "pipeline": {"stages": 2, "partition": "uniform", "activation_checkpoint_interval": 1}}


@pytest.mark.parametrize("framework,plan", [
    ("megatron", grid(2, 4, 2, [9, 15], 2, 8, recompute="selective", zero=1)),
    ("megatron", grid(2, 8, 1, [6, 6, 6, 6], 1, 8, schedule="interleaved")),
    ("torchtitan", grid(2, 8, 1, [10, 14], 1, 8, schedule="gpipe", recompute="full")),
    ("torchtitan", grid(1, 16, 1, [24], 2, 2)),
    ("deepspeed", grid(2, 8, 1, [12, 12], 2, 4)),
    ("deepspeed", grid(2, 8, 1, [12, 12], 2, 4, zero=1)),
])
def test_round_trip_plan_export_import(framework, plan):
    exported = export(plan, framework, GPT, CLUSTER)
    reader = {"megatron": lambda s: from_megatron(s, world_size=16),
              "torchtitan": lambda s: from_torchtitan(s, GPT, 16),
              "deepspeed": lambda s: from_deepspeed(s, GPT, 16)}[framework]
    imported = reader(exported.settings)
    assert imported.launch == Launch.from_plan(plan, framework, 24)
    assert replace(imported.workload, name=GPT.name) == GPT  # the dimensions come back
    if imported.launch.schedule != "deepspeed":  # the plan's own schedule: the same plan back, the same step
        assert imported.launch.to_plan(24) == plan
        name, options = imported.launch.strategy(24)
        strategy = {"hybrid": hybrid, "planned": planned}[name]
        ours = simulate(planned.train, CLUSTER, GPT, 64, plan=plan)
        theirs = simulate(strategy.train, CLUSTER, imported.workload, 64, **options)
        assert theirs.time_s == pytest.approx(ours.time_s, rel=1e-9)
        assert theirs.memory_bytes == ours.memory_bytes


def test_deepspeed_import_runs_its_own_schedule():
    launch = from_deepspeed({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                             "gradient_accumulation_steps": 4, "pipeline": {"stages": 2}}, GPT).launch
    assert launch.strategy(24) == ("hybrid", {"tp": 1, "pp": 2, "dp": 8, "microbatch_size": 2,
                                              "schedule": "deepspeed", "chunks": 1})


@pytest.mark.parametrize("plan,framework,message", [
    (Plan((Stage(tuple(range(8)), 2, ((0, 12),), (4, 4, 4, 4)), Stage(tuple(range(8, 16)), 1, ((12, 24),), (2,) * 8)),
          16, 4), "megatron", r"different widths \(dp x tp: 4x2, 8x1\)"),
    (Plan((Stage(tuple(range(16)), 1, ((0, 24),), (1,) * 15 + (2,)),), 17, 4, "1f1b"), "torchtitan",
     r"stages\[0\].shares .* unevenly"),
    (grid(2, 8, 1, [12, 12], 1, 8, schedule="zero-bubble"), "megatron", "schedule 'zero-bubble' is not one Megatron-LM"),
    (grid(2, 8, 1, [12, 12], 1, 8, schedule="gpipe"), "deepspeed", "schedule 'gpipe' is not one DeepSpeed"),
    (grid(2, 8, 1, [12, 12], 1, 8, zero=1), "torchtitan", "zero=1"),
    (grid(2, 8, 1, [10, 14], 1, 8), "deepspeed", r"partition_method='uniform' split \[12, 12\]"),
])
def test_plans_a_framework_cannot_run_are_refused(plan, framework, message):
    with pytest.raises(SpecError, match=message):
        export(plan, framework, GPT, CLUSTER)


@pytest.mark.parametrize("reader,message", [
    (lambda: from_megatron("--micro-batch-size 1 --swiglu", GPT, 16), "--swiglu is not simulated"),
    (lambda: from_megatron("--micro-batch-size 1 --expert-model-parallel-size 2", GPT, 16),
     "--expert-model-parallel-size 2 is not simulated"),
    (lambda: from_megatron("--micro-batch-size 1 --ffn-hidden-size 5000", GPT, 16), "--ffn-hidden-size 5000"),
    (lambda: from_megatron("--tensor-model-parallel-size 3 --micro-batch-size 1", GPT, 16), "groups of 3"),
    (lambda: from_megatron("--global-batch-size 64", GPT, 16), "--micro-batch-size is missing"),
    (lambda: from_torchtitan({"parallelism": {"pipeline_parallel_degree": 2, "data_parallel_shard_degree": 1,
                                              "pipeline_parallel_schedule": "ZBVZeroBubble"}, **NO_AC}, GPT, 16),
     "pipeline_parallel_schedule = 'ZBVZeroBubble'"),
    (lambda: from_torchtitan({"parallelism": {"expert_parallel_degree": 2}, **NO_AC}, GPT, 16),
     "expert_parallel_degree = 2 is not simulated"),
    (lambda: from_deepspeed({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                             "zero_optimization": {"stage": 3}, "pipeline": {"stages": 2}}, GPT),
     "zero_optimization.stage 3 with pipeline.stages 2"),
])
def test_settings_that_cannot_be_simulated_name_the_flag(reader, message):
    with pytest.raises(SpecError, match=message):
        reader()


def test_megatron_model_flags_make_the_workload_and_others_are_listed_as_ignored():
    imported = from_megatron("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
                             "--micro-batch-size 4 --lr 3e-4 --data-path /data/x", world_size=8)
    w = imported.workload
    assert (w.num_layers, w.hidden, w.heads, w.seq_len, w.vocab) == (8, 1024, 16, 1024, 0)
    assert imported.ignored == ("--lr", "--data-path")
    assert (imported.launch.dp, imported.launch.global_batch_size, imported.launch.overlap_grad_reduce) == (8, 32, False)


def test_torchtitan_default_selective_every_second_layer_is_refused():
    with pytest.raises(SpecError, match="selective_ac_option = '2'"):
        from_torchtitan({}, GPT, 16)


def test_torchtitan_fsdp_alone_runs_as_zero_stage_3():
    launch = from_torchtitan({"training": {"local_batch_size": 2, "seq_len": 2048}, **NO_AC}, GPT, 16).launch
    assert launch.strategy(24) == ("zero", {"stage": 3, "microbatch_size": 2})
    assert launch.global_batch_size == 32


def test_node_order_follows_the_plans_ranks():
    plan = grid(2, 4, 2, [12, 12], 2, 8)
    swapped = Plan(tuple(Stage(tuple((r + 8) % 16 for r in s.ranks), s.tp, s.blocks, s.shares) for s in plan.stages),
                   plan.microbatch_size, plan.microbatches)
    assert node_order(plan, CLUSTER) == [0, 1]
    assert node_order(swapped, CLUSTER) == [1, 0]
    assert "node1 slots=8  # node_rank 0" in export(swapped, "megatron", GPT, CLUSTER).hostfile
    scattered = Plan(tuple(Stage(tuple(r ^ 1 for r in s.ranks), s.tp, s.blocks, s.shares) for s in plan.stages),
                     plan.microbatch_size, plan.microbatches)
    with pytest.raises(SpecError, match="not on the whole of node 0"):
        node_order(scattered, CLUSTER)


def test_cli_export_then_run_from_megatron_gives_the_plans_step(tmp_path, capsys):
    from grader.cli import main
    plan_file, args_file = tmp_path / "plan.json", tmp_path / "margs"
    grid(2, 4, 2, [9, 15], 2, 8, zero=1).save(plan_file)
    common = ["--cluster", "2x8xA100", "--no-plots", "--json"]
    assert main(["export", str(plan_file), "--to", "megatron", "--cluster", "2x8xA100", "--workload", "gpt-1.3b",
                 "--out", str(args_file)]) == 0
    capsys.readouterr()
    assert main(["run", "--from", "megatron", str(args_file), *common, "--trace", str(tmp_path / "a.json")]) == 0
    theirs = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert main(["run", "strategies/planned.py", "--set", f"plan={plan_file}", "--workload", "gpt-1.3b",
                 "--batch", "64", *common, "--trace", str(tmp_path / "b.json")]) == 0
    ours = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (theirs["strategy"], theirs["time_s"]) == ("planned", ours["time_s"])

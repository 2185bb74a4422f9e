"""A Megatron-LM search weighs context parallelism (`--context-parallel-size`) beside TP, PP and the
distributed optimizer: a long sequence picks cp > 1, a model state too large for TP alone picks the sharded
optimizer, and both go through export and import unchanged."""

from dataclasses import replace

import pytest

from dist_lib import Cluster, SpecError, Workload
from dist_lib.costs import context as cp_costs
from dist_lib.planner import plan
from dist_lib.planner.export import export
from dist_lib.planner.launch import Launch
from dist_lib.planner.launch_import import from_megatron
from dist_lib.planner.context_cost import cp_choices
from dist_lib.planner.plan import Plan

from tests.test_framework_plan import check_search

A100, LONG = "1x8xA100-80GB", "llama-3-8b:layers=8,seq=131072"
GIB = 2**30


def test_a_long_sequence_picks_context_parallelism_and_round_trips():
    search, launch = check_search(A100, LONG, 8, "megatron")
    best = search.best
    assert best.plan.cp > 1 and launch.cp == best.plan.cp
    # by hand: one 131,072-token sample's stash of a layer is 16 GiB (flash attention), so a TP-1 replica
    # without cp or recompute would hold 8 x 16 GiB of stash: no such plan is a candidate
    workload = Workload.load(LONG)
    assert workload.stash_bytes(1) / GIB == pytest.approx(16, rel=0.01)
    assert not [c for c in search.candidates
                if c.plan.cp == 1 and c.plan.recompute == "none" and c.plan.stages[0].tp == 1]
    # cp=8 cuts it to 1/8 (2 GiB a layer)
    assert cp_costs.stash_bytes(workload, 1, 1, 1, 8) == workload.stash_bytes(1) // 8
    # the estimate is the simulation's within 2 % (measured: 0.0 %, 29.44 s with cp=8)
    assert best.estimate == pytest.approx(best.simulated, rel=0.02)
    # and it beats every plan without cp the search estimated
    plain = [c.seconds for c in search.candidates if c.plan.cp == 1]
    assert plain and best.seconds < min(plain)


def test_other_context_parallel_estimates_are_the_simulations():
    from dist_lib.hardware.reserve import memory_reserve
    from dist_lib.planner.evaluate import simulate_candidate
    cluster, workload = Cluster.load(A100), Workload.load(LONG)
    search = plan(cluster, workload, 8, framework="megatron", top=0)
    picked = {}
    for c in search.candidates:
        picked.setdefault((c.plan.cp, c.plan.stages[0].tp), c)
    assert {(2, 2), (4, 2)} <= set(picked)
    for key in ((2, 2), (4, 2)):  # with TP beside cp: the TP all-reduces after each layer
        c = picked[key]
        simulate_candidate(cluster, workload, 8, c, reserve=memory_reserve(True, "reserve"), framework="megatron")
        assert c.simulated is not None, c.error
        assert c.estimate == pytest.approx(c.simulated, rel=0.02), key


def test_cp_is_searched_only_where_hybrid_runs_it():
    from dist_lib.planner.framework_rules import Rules
    workload = Workload.load(LONG)
    assert cp_choices(workload, Rules("megatron"), 8) == (2, 4, 8)
    assert cp_choices(workload, Rules("torchtitan"), 8) == (2, 4, 8)  # PyTorch's context-parallel SDPA
    assert cp_choices(workload, Rules("deepspeed"), 8) == ()  # no context parallelism in its config
    assert cp_choices(workload, None, 8) == ()  # "any": the planned strategy has no cp
    assert cp_choices(Workload.load("mixtral-8x7b"), Rules("megatron"), 8) == ()
    assert cp_choices(Workload.load("gpt-1.3b:seq=12"), Rules("megatron"), 8) == (2,)  # 12 % (2 cp): cp 2 only
    assert not any(c.plan.cp > 1 for c in plan(A100, LONG, 8, top=0).candidates)


def test_the_plan_file_and_the_flag_keep_cp():
    cluster, workload = Cluster.load(A100), Workload.load(LONG)
    best = plan(cluster, workload, 8, framework="megatron", top=0).best.plan
    data = best.to_dict()
    assert data["cp"] == best.cp > 1 and Plan.from_dict(data) == best
    assert "cp" not in Plan.from_dict({**data, "cp": 1, "stages": [
        {**s, "shares": s["shares"] * best.cp} for s in data["stages"]]}).to_dict()
    text = export(best, "megatron", workload, cluster).settings
    assert f"--context-parallel-size {best.cp}" in text
    launch = from_megatron(text, workload, 8).launch
    assert launch.cp == best.cp and launch.to_plan(workload.num_layers) == best
    with pytest.raises(SpecError, match="cp=.* has no DeepSpeed config key"):
        Launch.from_plan(best, "deepspeed", workload.num_layers)
    # torchtitan shards over the dp x cp ranks whenever cp > 1: a plan without FSDP is not one it runs
    with pytest.raises(SpecError, match="torchtitan shards with FSDP .* whenever cp > 1"):
        Launch.from_plan(replace(best, zero=0), "torchtitan", workload.num_layers)
    with pytest.raises(SpecError, match="cp=2 runs a dense workload"):
        Plan.from_dict({**data, "cp": 2, "recompute": "op"}).check(8, 8, 8, workload=workload)


def test_when_tp_cannot_spread_the_state_the_distributed_optimizer_is_found():
    # gpt-22b in one pipeline stage over 2 x 8 A100-40GB: 48 layers of 12 h^2 (h = 6144) and the embeddings,
    # about 22 B parameters; at TP 8 (a node) a rank holds 2.75 B of them, 16 bytes each (44 GB) without
    # sharding, more than 40 GB; the distributed optimizer shards the 12 optimizer bytes over dp = 2: 27.5 GB
    workload = Workload.load("gpt-22b")
    per_rank = workload.total_params / 8
    assert per_rank * 16 > 40e9 and per_rank * (4 + 12 / 2) < 30e9
    search, launch = check_search("2x8xA100-40GB", "gpt-22b", 32, "megatron", max_stages=1)
    assert all(c.plan.zero == 1 for c in search.candidates)
    assert launch.zero == 1
    text = export(search.best.plan, "megatron", workload, Cluster.load("2x8xA100-40GB")).settings
    assert "--use-distributed-optimizer" in text


def test_torchtitan_finds_fsdp_where_tp_cannot_spread_the_state():
    # the same gpt-22b: torchtitan has no ZeRO-1, and FSDP (zero=3) shards the weights and the optimizer:
    # (2 + 12) / dp + 2 bytes a parameter (the gradient accumulates whole): at TP 8, dp 2: 2.75 B x 9 = 24.8 GB
    search, launch = check_search("2x8xA100-40GB", "gpt-22b", 32, "torchtitan", max_stages=1)
    assert all(c.plan.zero == 3 for c in search.candidates)
    assert launch.zero == 3 and launch.strategy(48)[1].get("fsdp") is True
    cluster, workload = Cluster.load("2x8xA100-40GB"), Workload.load("gpt-22b")
    text = export(search.best.plan, "torchtitan", workload, cluster).settings
    assert f"data_parallel_shard_degree = {launch.dp}" in text and "data_parallel_replicate_degree = 1" in text
    # the estimate is the simulation's within 3 % (measured: 1.5 %, 5.00 s simulated)
    assert search.best.estimate == pytest.approx(search.best.simulated, rel=0.03)


def test_fsdp_is_torchtitans():
    from dist_lib.planner.framework_rules import Rules
    assert Rules("torchtitan").memory_ok("none", 3, 1) and Rules("torchtitan").memory_ok("none", 3, 2)
    assert not Rules("megatron").memory_ok("none", 3, 1) and not Rules("torchtitan").memory_ok("none", 1, 1)
    # with cp > 1 torchtitan always shards (its dp_shard_cp mesh)
    assert Rules("torchtitan").memory_ok("full", 3, 1, 2) and not Rules("torchtitan").memory_ok("full", 0, 1, 2)
    cluster, workload = Cluster.load("2x8xA100-40GB"), Workload.load("gpt-22b")
    best = plan(cluster, workload, 32, framework="torchtitan", max_stages=1, top=0).best.plan
    with pytest.raises(SpecError, match="zero=3 \\(FSDP\\) is exported for torchtitan only"):
        Launch.from_plan(best, "megatron", workload.num_layers)
    assert not any(c.plan.zero == 3 for c in plan(cluster, workload, 32, max_stages=1, top=0).candidates)

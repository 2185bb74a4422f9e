"""A torchtitan search weighs context parallelism (PyTorch's context-parallel SDPA, FSDP over the dp x cp ranks)
and FSDP with pipeline stages; a context-parallel stage is priced with full or selective recompute, the
distributed optimizer or FSDP and FP8 as hybrid runs it; each plan goes through torchtitan's TOML and back."""

import pytest

from dist_lib import Cluster, Workload
from dist_lib.hardware.reserve import memory_reserve
from dist_lib.planner import plan
from dist_lib.planner.evaluate import simulate_candidate
from dist_lib.planner.export import export
from dist_lib.planner.launch import Launch
from dist_lib.planner.launch_import import from_torchtitan

from tests.test_framework_plan import check_search

LONG = "llama-3-8b:layers=8,seq=131072"


def test_torchtitan_plans_context_parallelism_sharded_over_dp_x_cp():
    search, launch = check_search("1x8xA100-80GB", LONG, 8, "torchtitan")
    best = search.best
    # the 131,072-token sequence: 16 GiB of stash a sample and layer without cp (test_planner_context), so the
    # winner splits it; torchtitan shards every cp plan with FSDP (its dp_shard_cp mesh)
    assert best.plan.cp > 1 and best.plan.zero == 3
    assert all(c.plan.zero == 3 for c in search.candidates if c.plan.cp > 1)
    name, options = launch.strategy(8)
    assert name == "hybrid" and options["cp"] == best.plan.cp and options["fsdp"] is True
    assert options["kv_exchange"] == "torch_all_gather"
    # the estimate prices PyTorch's ring as the simulator runs it (measured: -0.1 %, 29.93 s at cp 4)
    assert best.estimate == pytest.approx(best.simulated, rel=0.01)
    cluster, workload = Cluster.load("1x8xA100-80GB"), Workload.load(LONG)
    text = export(best.plan, "torchtitan", workload, cluster).settings
    assert f"context_parallel_degree = {best.plan.cp}" in text
    assert f"data_parallel_shard_degree = {launch.dp}" in text
    assert from_torchtitan(text, workload, 8).launch == launch


@pytest.mark.parametrize("framework,zero", [("megatron", 1), ("torchtitan", 3)])
def test_context_parallel_estimates_with_recompute_sharding_and_fp8(framework, zero):
    # one stage of 8 H100s: every (recompute, sharding) the search kept at cp > 1, with FP8 linear layers
    # (measured: every one within 0.4 % of its simulation)
    cluster, workload = Cluster.load("1x8xH100-80GB"), Workload.load(LONG)
    search = plan(cluster, workload, 8, framework=framework, max_stages=1, top=0)
    picked = {}
    for c in search.candidates:
        if c.plan.cp > 1:
            picked.setdefault((c.plan.recompute, c.plan.zero, c.plan.fp8), c)
    assert {("full", zero), ("none", zero)} <= {key[:2] for key in picked}
    assert any(fp8 for _, _, fp8 in picked)
    for key, c in picked.items():
        simulate_candidate(cluster, workload, 8, c, reserve=memory_reserve(True, "reserve"), framework=framework)
        assert c.simulated is not None, (key, c.error)
        assert c.estimate == pytest.approx(c.simulated, rel=0.01), key


def test_torchtitan_runs_fsdp_beside_pipeline_stages():
    # torchtitan keeps FSDP's gathered weights through a pipelined step and reduce-scatters after each layer's
    # last microbatch: priced as the distributed optimizer (measured: +0.0 % and +0.1 %)
    cluster, workload = Cluster.load("2x8xH100-80GB"), Workload.load("llama-3-70b:layers=16,seq=8192")
    search = plan(cluster, workload, 32, framework="torchtitan", top=0)
    piped = sorted((c for c in search.candidates if len(c.plan.stages) > 1 and c.plan.zero == 3),
                   key=lambda c: c.estimate)
    assert piped
    best = piped[0]
    simulate_candidate(cluster, workload, 32, best, reserve=memory_reserve(True, "reserve"), framework="torchtitan")
    assert best.simulated is not None, best.error
    assert best.estimate == pytest.approx(best.simulated, rel=0.01)
    text = export(best.plan, "torchtitan", workload, cluster).settings
    launch = from_torchtitan(text, workload, 16).launch
    assert (launch.pp, launch.zero) == (len(best.plan.stages), 3)
    assert launch == Launch.from_plan(best.plan, "torchtitan", workload.num_layers)


def test_a_torchtitan_config_with_context_parallelism_and_float8_imports():
    workload = Workload.load("llama-3-8b:layers=8")
    launch = from_torchtitan({"parallelism": {"context_parallel_degree": 2, "tensor_parallel_degree": 2},
                              "training": {"local_batch_size": 1, "seq_len": 32768},
                              "model": {"converters": ["quantize.linear.float8"]},
                              "activation_checkpoint": {"mode": "full"}}, workload, 8).launch
    # 8 GPUs over tp 2 x cp 2: dp_shard fills the rest (2), and FSDP shards over the dp x cp ranks
    assert (launch.dp, launch.cp, launch.tp, launch.zero, launch.fp8) == (2, 2, 2, 3, "tensorwise")
    name, options = launch.strategy(8)
    assert name == "hybrid" and options["fsdp"] is True and options["kv_exchange"] == "torch_all_gather"
    assert options["cp"] == 2 and options["fp8"] == "tensorwise" and options["recompute"] is True


def test_the_export_names_torchtitans_stock_flavor_and_the_import_checks_it():
    from dist_lib import SpecError
    cluster = Cluster.load("1x8xA100-80GB")
    search = plan(cluster, Workload.load(LONG), 8, framework="torchtitan", top=0)
    # 8 layers are no stock flavor: the config names the workload and says to register its dimensions
    text = export(search.best.plan, "torchtitan", Workload.load(LONG), cluster).settings
    assert 'flavor = "llama-3-8b:layers=8,seq=131072"' in text and "no stock torchtitan flavor" in text
    assert "32 heads (8 key/value), ffn 14336" in text  # Llama 3 8B's block (torchtitan's 8B: ffn 14336)
    whole = Workload.load("llama-3-8b:seq=8192")
    best = plan(Cluster.load("1x8xH100-80GB"), whole, 8, framework="torchtitan", top=0).best.plan
    text = export(best, "torchtitan", whole, Cluster.load("1x8xH100-80GB")).settings
    assert 'flavor = "8B"' in text and "seq_len = 8192" in text
    assert from_torchtitan(text, Workload.load("llama-3-8b"), 8).workload.seq_len == 8192
    with pytest.raises(SpecError, match="model.flavor = '8B' is torchtitan's Llama 3 llama-3-8b, but the workload"):
        from_torchtitan(text, Workload.load("llama-3-70b"), 8)

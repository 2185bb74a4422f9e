"""The planner with torchtitan's per-op selective activation checkpointing (plan recompute "op", hybrid's
`recompute="op"`, `workload/per_op_checkpoint.py`): weighed in torchtitan searches of Llama blocks, estimated as
the simulator charges it, exported as `mode = "selective"`, `selective_ac_option = "op"` and read back exactly;
Megatron-LM and DeepSpeed have no such setting."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest

from dist_lib import Cluster, SpecError, StrategyError, Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.costs import network
from dist_lib.planner import Plan, Stage, plan
from dist_lib.planner.estimate import layer_costs
from dist_lib.planner.evaluate import simulate_candidate
from dist_lib.planner.export import export
from dist_lib.planner.framework_run import framework_run
from dist_lib.planner.launch import Launch
from dist_lib.planner.launch_import import from_torchtitan
from dist_lib.planner.search import Candidate, generate, to_plan
from dist_lib.planner.stage_space import StageSpace
from dist_lib.planner.step import step_estimate

LLAMA = Workload.load("llama-3-8b:layers=4,seq=2048,vocab=32000")
GPT = Workload.load("gpt-1.3b:layers=4")
CLUSTER = Cluster.load("2x4xA100-80GB")


def grid(pp: int, dp: int, tp: int, microbatches: int, recompute: str = "op", zero: int = 0) -> Plan:
    """A plan of `pp` stages of dp x tp ranks (ranks in order), one sample a replica, the 4 layers split evenly."""
    width, per = dp * tp, 4 // pp
    return Plan(tuple(Stage(tuple(range(s * width, (s + 1) * width)), tp, ((s * per, (s + 1) * per),), (1,) * dp)
                      for s in range(pp)), dp, microbatches, "1f1b", recompute, zero)


@pytest.mark.parametrize("op_plan", [grid(2, 4, 1, 4), grid(2, 2, 2, 4), grid(1, 8, 1, 2, zero=3),
                                     grid(1, 4, 2, 2, zero=3)], ids=["pipeline", "pipeline-tp", "fsdp", "fsdp-tp"])
def test_torchtitan_toml_in_op_mode_round_trips(op_plan):
    """The plan's recompute "op" is torchtitan's mode "selective" with selective_ac_option "op"; read back it is the
    same launch (the same plan where the plan has the fields), run by hybrid with recompute="op", the step
    `framework_run` simulates for the plan."""
    text = export(op_plan, "torchtitan", LLAMA, CLUSTER).settings
    assert tomllib.loads(text)["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    launch = from_torchtitan(text, LLAMA, 8).launch
    assert launch == Launch.from_plan(op_plan, "torchtitan", 4) and launch.recompute == "op"
    if not launch.sequence_parallel:  # (a plan has no sequence-parallel field: torchtitan adds it with TP)
        assert launch.to_plan(4) == op_plan
    name, options = launch.strategy(4)
    assert (name, options["recompute"]) == ("hybrid", "op")
    ran = simulate(f"strategies.{name}", CLUSTER, LLAMA, op_plan.global_batch_size, memory_reserve=True, **options)
    assert ran.correct
    assert ran.time_s == framework_run(CLUSTER, LLAMA, op_plan.global_batch_size, op_plan, "torchtitan", True)[0].time_s


def test_a_torchtitan_config_in_op_mode_imports_as_op():
    config = {"parallelism": {"data_parallel_shard_degree": 1, "data_parallel_replicate_degree": 8},
              "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}}
    assert from_torchtitan(config, LLAMA, 8).launch.recompute == "op"
    # on a block the per-op policy is not modelled for, the setting is refused by name
    with pytest.raises(SpecError, match='selective_ac_option = "op" .* workload gpt-1.3b:layers=4: mlp is \'gelu\''):
        from_torchtitan(config, GPT, 8)


@pytest.mark.parametrize("framework,recompute,message", [
    ("megatron", "op", "recompute 'op' \\(torchtitan's per-op selective activation checkpointing\\) has no "
                       "Megatron-LM setting \\(--recompute-granularity is full or selective"),
    ("deepspeed", "op", "recompute 'op' \\(torchtitan's per-op selective activation checkpointing\\) has no "
                        "DeepSpeed setting \\(its pipeline engine checkpoints whole layers"),
    ("deepspeed", "selective", "recompute 'selective' \\(Megatron-LM's attention-core recompute, Korthikanti et al. "
                               "2022\\) has no DeepSpeed setting"),
    ("torchtitan", "selective", "recompute 'selective' \\(Megatron-LM's attention-core recompute, Korthikanti et al. "
                                "2022\\) has no torchtitan setting \\(its selective_ac_option = \"op\" is the per-op "
                                "policy, recompute 'op'"),
])
def test_a_recompute_mode_without_a_framework_setting_is_refused_by_name(framework, recompute, message):
    with pytest.raises(SpecError, match=message):
        export(grid(2, 4, 1, 4, recompute), framework, LLAMA, CLUSTER)


def test_a_plan_in_op_mode_is_checked_and_runs_through_hybrid():
    with pytest.raises(SpecError, match="recompute 'op' .* workload gpt-1.3b:layers=4: mlp is 'gelu'"):
        grid(2, 4, 1, 4).check(8, 4, 16, CLUSTER, workload=GPT)
    with pytest.raises(StrategyError, match="a plan with recompute 'op' runs through hybrid: export it .* --to torchtitan"):
        simulate("strategies.planned", CLUSTER, LLAMA, 16, plan=grid(2, 4, 1, 4))


@pytest.mark.parametrize("tp", [1, 2])
def test_the_estimate_charges_the_per_op_rerun_as_the_simulator_runs_it(tp):
    """Beside the same layer without recompute, a per-op checkpointed one's backward first re-runs what the policy
    did not save (`costs.recompute_time`, "op"), and at TP > 1, sequence-parallel as torchtitan's TP runs, the two
    all-gathers of the norms' b*s*h outputs in the TP group; it keeps the policy's saved outputs instead of the
    whole stash. Then a two-stage pipeline's estimate lands on the simulation."""
    device, samples = CLUSTER.device_of(0), 2
    topo = CLUSTER.topology((0, 1)) if tp > 1 else None
    none, op = (layer_costs(device, LLAMA, samples, tp, topo, r, 1) for r in ("none", "op"))
    rerun = costs.recompute_time(device, LLAMA, 1, samples, tp, recompute="op", sequence_parallel=tp > 1)
    gathers = 2 * network.collective_time("all_gather", samples * LLAMA.activation_bytes(), topo) if tp > 1 else 0.0
    assert (op.backward[2] - op.backward[1]) - (none.backward[2] - none.backward[1]) == pytest.approx(rerun + gathers)
    assert op.forward == none.forward
    assert op.activation[2] - op.activation[1] == pytest.approx(
        samples * (LLAMA.stash_bytes(1, tp, recompute="op", sequence_parallel=tp > 1) + LLAMA.activation_bytes()))

    space = StageSpace(CLUSTER, LLAMA, even=True)
    placed = [(2, {o.tp: o for o in space.options(ranks, 4 // tp * samples, "op", 0)}[tp])
              for ranks in ((0, 1, 2, 3), (4, 5, 6, 7))]
    seconds, memory = step_estimate(CLUSTER, LLAMA, placed, 4, "1f1b", 1)
    op_plan = to_plan(placed, 4 // tp * samples, 4, "1f1b", "op", 0)
    candidate = simulate_candidate(CLUSTER, LLAMA, op_plan.global_batch_size, Candidate(op_plan, seconds, memory, 0.0),
                                   framework="torchtitan")
    assert candidate.simulated == pytest.approx(seconds, rel=0.02)
    if tp > 1:  # the simulator's re-run all-gathers: 2 a layer and microbatch, each timed as the estimate's
        result, _ = framework_run(CLUSTER, LLAMA, op_plan.global_batch_size, op_plan, "torchtitan")
        plain, _ = framework_run(CLUSTER, LLAMA, op_plan.global_batch_size, replace(op_plan, recompute="none"),
                                 "torchtitan")
        count = sum(e.op == "all_gather" for e in result.events) - sum(e.op == "all_gather" for e in plain.events)
        ran = {e.rank for e in result.events}  # replica 0's ranks: the other replica's are folded into them
        assert len(ran) == 4 and count == 2 * 2 * 4 * len(ran)  # 2 x 2 layers a stage x 4 microbatches, each rank
        # each of b*s*h in the TP group, alone as the estimate times it (a few share the link with another collective)
        durations = [e.duration for e in result.events if e.op == "all_gather" and e.rank == 0]
        assert {e.nbytes for e in result.events if e.op == "all_gather"} == {samples * LLAMA.activation_bytes()}
        assert min(durations) == pytest.approx(gathers / 2)


def test_only_a_torchtitan_search_of_llama_blocks_weighs_op():
    """Megatron-LM's and the unrestricted searches weigh the attention-core "selective" and never "op"; torchtitan's
    weighs "op" and never "selective", and for a GPT block neither."""
    cluster, llama = Cluster.load("1xA100-40GB"), Workload.load("llama-3-8b:layers=8,seq=8192,vocab=32000")
    modes = {framework: {c.plan.recompute for c in generate(cluster, llama, 2, framework=framework)[0]}
             for framework in ("torchtitan", "megatron", None)}
    assert "op" in modes["torchtitan"] and "selective" not in modes["torchtitan"]
    assert all("op" not in modes[f] for f in ("megatron", None))
    gpt = {c.plan.recompute for c in generate(cluster, Workload.load("gpt-1.3b:layers=8,seq=4096"), 2,
                                              framework="torchtitan")[0]}
    assert gpt and gpt <= {"none", "full"}


def test_a_torchtitan_search_picks_op_where_nothing_fits_without_recompute():
    """One A100-40GB, 8 Llama 3 8B layers of 8192 tokens, batch 2: without recompute no microbatch fits, and of the
    two that do, the per-op policy re-runs a part of each layer's forward where full recompute re-runs all of it:
    the search picks op, and its simulated step (correct) is within 2 % of its estimate."""
    cluster, llama = Cluster.load("1xA100-40GB"), Workload.load("llama-3-8b:layers=8,seq=8192,vocab=32000")
    found, _ = generate(cluster, llama, 2, framework="torchtitan")
    assert {c.plan.recompute for c in found} == {"op", "full"}
    search = plan(cluster, llama, 2, framework="torchtitan")
    best = search.best
    assert best.plan.recompute == "op"
    assert best.simulated == pytest.approx(best.estimate, rel=0.02)
    result, _ = framework_run(cluster, llama, 2, best.plan, "torchtitan", True)
    assert result.correct and result.time_s == best.simulated
    full = min((c for c in found if c.plan.recompute == "full"), key=lambda c: c.estimate)
    assert best.estimate < full.estimate

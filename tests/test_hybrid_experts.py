"""hybrid's `ep`: expert parallelism over the data-parallel replicas of each pipeline stage (EP x PP x DP), its
token exchange an all-to-all, correct and deterministic, slower under skewed routing, and refused by name
where it does not apply."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dist_lib import simulate
from dist_lib.run.recording import record
from dist_lib.run.replay import replay

HYBRID = "strategies/hybrid.py"
# Mixtral 8x7B cut to 8 of its 32 layers: with pp=2 the full model's stage (16 layers, its weights and Adam
# states unsharded, two microbatches' stash in flight) does not fit an 80 GB H100
MIXTRAL = "mixtral-8x7b:layers=8"
H100 = "2x8xH100-80GB"
TOY = ("toy:layers=4,hidden=256,heads=4,seq=128,experts={experts},top_k={top_k},expert_ffn_hidden=512,moe_every=2,"
       "dense_ffn_hidden=512,shared_experts={shared},routing={routing},routing_seed={seed}")


def test_mixtral_on_two_h100_nodes_with_ep8_is_correct_and_its_trace_has_the_all_to_alls(tmp_path):
    r = simulate(HYBRID, H100, MIXTRAL, 16, pp=2, ep=8)
    assert r.correct, r.problems
    # 16 ranks, pp=2: dp=8 replicas per stage, one EP group of all 8; rank 0 holds expert 0 of layers 0-3
    # and takes, from each of the 8 peers' one-sample microbatch, 4096 tokens x top-2 / 8 experts = 1024
    first = next(e for e in r.events if e.op == "expert_forward" and e.rank == 0)
    assert first.detail == "tokens per expert: 0: 8192"
    alltoall = [e for e in r.events if e.op == "all_to_all"]
    # per MoE layer and microbatch: dispatch, combine, output gradient, input gradient; 4 layers and 2
    # microbatches on each of the 16 ranks
    assert len(alltoall) == 4 * 4 * 2 * 16
    assert {e.peers for e in alltoall} == {tuple(range(0, 8)), tuple(range(8, 16))}
    path = tmp_path / "trace.json"
    r.write_chrome_trace(str(path))
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert {f"all_to_all L{layer}" for layer in range(8)} <= names


def test_skewed_routing_gives_a_longer_step_than_uniform():
    uniform = simulate(HYBRID, H100, MIXTRAL, 16, pp=2, ep=8)
    skewed = simulate(HYBRID, H100, MIXTRAL + ",routing=zipf:1.2", 16, pp=2, ep=8)
    assert skewed.correct and skewed.time_s > uniform.time_s


def test_ep_lays_the_expert_groups_over_the_replicas_of_a_stage():
    """dp=4, ep=2 on 8 ranks with pp=2: EP groups {0,1}, {2,3} at stage 0; rank 0's experts are also on rank
    2 (its expert-data-parallel group), whose expert gradient it all-reduces. (Unfolded: every rank's events.)"""
    workload = TOY.format(experts=4, top_k=2, shared=1, routing="uniform", seed=0)
    r = simulate(HYBRID, "1x8xA100-80GB", workload, 8, pp=2, ep=2, fold=False)
    assert r.correct, r.problems
    groups = {e.peers for e in r.events if e.op == "all_to_all"}
    assert groups == {(0, 1), (2, 3), (4, 5), (6, 7)}
    reduced = {(e.rank, e.detail, e.layer, e.peers) for e in r.events if e.op == "all_reduce"}
    # stage 0 holds layers 0-1, of which layer 0 is an MoE layer (moe_every=2); stage 1 layers 2-3
    assert {(0, "expert weight_grad", 0, (0, 2)), (3, "expert weight_grad", 0, (1, 3)),
            (5, "expert weight_grad", 2, (5, 7))} <= reduced
    assert {(0, "weight_grad", 0, (0, 1, 2, 3)), (6, "weight_grad", 3, (4, 5, 6, 7))} <= reduced
    assert not {e for e in reduced if e[1] == "expert weight_grad" and len(e[3]) != 2}


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(experts=st.sampled_from([2, 4, 8]), top_k=st.integers(1, 2), ep=st.sampled_from([1, 2, 4]),
       pp=st.sampled_from([1, 2]), nodes=st.integers(1, 2), shared=st.integers(0, 1), zipf=st.booleans(),
       schedule=st.sampled_from(["1f1b", "gpipe", "interleaved", "deepspeed"]), seed=st.integers(0, 3))
def test_random_small_moe_configurations_are_correct_and_order_independent(experts, top_k, ep, pp, nodes, shared,
                                                                           zipf, schedule, seed):
    dp = 4 * nodes // pp
    if experts % ep or dp % ep:
        ep = 1
    workload = TOY.format(experts=experts, top_k=top_k, shared=shared, routing="zipf:1.3" if zipf else "uniform",
                         seed=seed)
    results = [simulate(HYBRID, f"{nodes}x4xA100-80GB", workload, 2 * dp, pp=pp, ep=ep, schedule=schedule,
                        start_order_seed=order) for order in (None, 7)]
    assert all(r.correct for r in results), results[0].problems
    a, b = results
    assert (a.time_s, a.rank_times, a.memory_bytes) == (b.time_s, b.rank_times, b.memory_bytes)


def test_a_recorded_hybrid_moe_program_replays_to_the_same_result():
    workload = TOY.format(experts=4, top_k=2, shared=1, routing="zipf:1.2", seed=1)
    direct = simulate(HYBRID, "2x2xA100-80GB", workload, 8, pp=2, ep=2)
    recorded, programs = record(HYBRID, "2x2xA100-80GB", workload, 8, pp=2, ep=2)
    again = replay(programs, "2x2xA100-80GB", workload, 8)
    for r in (recorded, again):
        assert (r.time_s, r.rank_times, r.memory_bytes, r.correct) == \
            (direct.time_s, direct.rank_times, direct.memory_bytes, direct.correct)


@pytest.mark.parametrize("workload, options, message", [
    ("toy:layers=4", {"ep": 2}, "ep=2: workload toy:layers=4 has no experts"),
    (TOY, {"ep": 3}, r"ep=3 must be a whole number dividing both dp=4 .* and the 4 experts"),
    (TOY, {"ep": 2, "tp": 2}, "tp=2 with a mixture-of-experts workload needs sequence_parallel=True"),
    (TOY, {"ep": 2, "etp": 3}, "etp=3: the experts' width 512 does not split into 3 equal parts"),
    (TOY, {"ep": 4, "etp": 2}, r"ep=4 must be a whole number dividing both dp=4 \(with etp=2: 4 / etp\)"),
    (TOY, {"ep": 2, "tp": 2, "sequence_parallel": True, "etp": 0}, "etp must be a whole number >= 1"),
    (TOY, {"ep": 2, "sequence_parallel": True}, r"sequence_parallel=True needs tp > 1"),
    ("toy:layers=4", {"etp": 1}, "etp=1 is the experts' tensor-parallel size; workload toy:layers=4 has no experts"),
    (TOY, {"ep": 2, "tp": 2, "sequence_parallel": True, "tp_comm_overlap": True},
     "tp_comm_overlap=True is not covered with a mixture-of-experts workload"),
    (TOY, {"ep": 2, "cp": 2}, "context parallelism is modelled for dense layers only"),
    (TOY, {"ep": 2, "fsdp": True}, r"fsdp=True is not covered with a mixture-of-experts workload \(the experts. weights are not sharded yet\)"),
])
def test_what_ep_does_not_cover_is_refused_by_name(workload, options, message):
    from dist_lib import StrategyError
    workload = workload.format(experts=4, top_k=2, shared=0, routing="uniform", seed=0)
    options = {"pp": 2, **options}
    with pytest.raises((ValueError, StrategyError), match=message):
        simulate(HYBRID, "2x4xA100-80GB", workload, 8, **options)

"""Tensor parallelism with experts (hybrid's `tp` with `ep`, and expert TP `etp`): each TP rank routes its own
sequence part, the attention output is reduce-scattered and the combined parts all-gathered in the TP group,
the EP groups laid over a stage's dp x tp ranks as Megatron-Core lays them, each expert's width split over
`etp` ranks whose partial outputs combine sums; each piece of the exchange checked at the op, the step correct
and deterministic, and its costs split as derived by hand."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dist_lib import simulate
from dist_lib.run.recording import record
from dist_lib.run.replay import replay

HYBRID = "strategies/hybrid.py"
TOY = ("toy:layers=4,hidden=256,heads=4,seq=128,experts={experts},top_k={top_k},expert_ffn_hidden=512,moe_every=2,"
       "dense_ffn_hidden=512,shared_experts={shared},routing={routing},routing_seed={seed}")
TP_MOE = dict(tp=2, etp=1, sequence_parallel=True)

# one MoE layer by hand on a TP group of two ranks that is also the EP group (expert t on rank t); `mistake`
# leaves out one piece of the TP token exchange
MANUAL = '''
async def train(model, mistake=None):
    t, group = model.rank, [0, 1]
    w, opt = model.load_weights(0, tp_rank=t, tp_size=2)
    ew, eopt = model.load_experts(0, [t])
    x = model.get_input_activation(range(2))
    pieces = model.route(0, x, w)
    if mistake == "dispatch partial":
        model.dispatch(pieces[t], [0])
    got = await model.all_to_all(pieces, group)
    routed = model.reduce_routed(got[:1] if mistake == "drop a partial sum" else got)
    send = [model.dispatch(routed, [e]) for e in (0, 1)]
    tokens = await model.all_to_all(send, group, expect_experts=[[t], [t]])
    outs = model.expert_forward(0, tokens, ew)
    back = await model.all_to_all(outs, group)
    y = model.combine(routed, back)
    if mistake != "skip the all-gather":
        y = await model.all_gather(y, group)
    g = await model.all_reduce(model.loss(y, tp_rank=t, tp_size=2), group)
    piece = g if mistake == "whole gradient" else model.split_tp(g, t, 2)
    cut = [model.combine_backward(routed, piece, [e]) for e in (0, 1)]
    output_grads = await model.all_to_all(cut, group)
    expert_grads, input_grads = [], []
    for tok, grad in zip(tokens, output_grads):
        eg, ig = model.expert_backward(0, tok, grad, ew)
        expert_grads.append(eg)
        input_grads.append(ig)
    eg = expert_grads[0] if mistake == "one part's gradient" else expert_grads[0] + expert_grads[1]
    returned = await model.all_to_all(input_grads, group)
    wg, _ = model.route_backward(0, x, g, routed, returned, w)
    new_w, _ = model.update(0, wg, w, opt)
    model.set_final_weight(0, new_w)
    new_e, _ = model.update_experts(0, eg, ew, eopt)
    model.set_final_experts(0, new_e)
'''
ONE_LAYER = "toy:layers=1,hidden=256,heads=4,seq=128,experts=2,top_k=1,expert_ffn_hidden=512"

# one MoE layer by hand on two data-parallel ranks, each holding expert-TP shard t of both experts: each rank's
# tokens go to both shards, and combine takes both shards' partial outputs
MANUAL_ETP = '''
async def train(model, mistake=None):
    t, group = model.rank, [0, 1]
    w, opt = model.load_weights(0)
    ew, eopt = model.load_experts(0, [0, 1], tp_rank=t, tp_size=2)
    x = model.get_input_activation([t])
    routed = model.route(0, x, w)
    sent = model.dispatch(routed, [0, 1])
    tokens = await model.all_to_all([sent, sent], group, expect=[[0], [1]], expect_experts=[[0, 1], [0, 1]])
    outs = model.expert_forward(0, tokens, ew)
    back = await model.all_to_all(outs, group)
    y = model.combine(routed, back[:1] if mistake == "one shard" else back)
    g = model.loss(y)
    cut = model.combine_backward(routed, g, [0, 1])
    output_grads = await model.all_to_all([cut, cut], group)
    expert_grads, input_grads = [], []
    for tok, grad in zip(tokens, output_grads):
        eg, ig = model.expert_backward(0, tok, grad, ew)
        expert_grads.append(eg)
        input_grads.append(ig)
    returned = await model.all_to_all(input_grads, group)
    wg, _ = model.route_backward(0, x, g, routed, returned, w)
    wg = await model.all_reduce(wg, group)
    new_w, _ = model.update(0, wg, w, opt)
    model.set_final_weight(0, new_w)
    new_e, _ = model.update_experts(0, expert_grads[0] + expert_grads[1], ew, eopt)
    if mistake != "hand in one shard" or t == 0:
        model.set_final_experts(0, new_e)
'''


def toy(experts=4, top_k=2, shared=1, routing="uniform", seed=0):
    return TOY.format(experts=experts, top_k=top_k, shared=shared, routing=routing, seed=seed)


@pytest.fixture
def manual(tmp_path):
    path = tmp_path / "manual.py"
    path.write_text(MANUAL)
    return str(path)


def test_one_moe_layer_by_hand_under_tp_is_correct(manual):
    r = simulate(manual, "1x2xA100-80GB", ONE_LAYER, 2)
    assert r.correct, r.problems


@pytest.mark.parametrize("mistake, message", [
    ("dispatch partial", r"rank 0 dispatch\(layer 0\): .* holds TP partial sums of the attention output"),
    ("drop a partial sum", r"rank 1 reduce_routed\(layer 0\): the partial sums of TP ranks 1 are missing"),
    ("skip the all-gather", r"loss: expected the Activation after the last layer, got ActivationSlice"),
    ("whole gradient", r"rank 1 combine_backward\(layer 0\): expected piece 1 of 2 \(split_tp\)"),
    ("one part's gradient", r"rank 1 update_experts\(layer 0\): the gradient holds the tokens of sample parts "
                            r"\(sample s part j is s \* 2 \+ j\) 0, 2 but not 1, 3"),
])
def test_a_missing_piece_of_the_tp_token_exchange_is_caught_at_the_op(manual, mistake, message):
    from dist_lib import StrategyError
    from dist_lib.errors import TensorError
    with pytest.raises((TensorError, StrategyError), match=message):
        simulate(manual, "1x2xA100-80GB", ONE_LAYER, 2, mistake=mistake)


def test_experts_split_over_expert_tp_ranks_by_hand(tmp_path):
    path = tmp_path / "manual_etp.py"
    path.write_text(MANUAL_ETP)
    r = simulate(str(path), "1x2xA100-80GB", ONE_LAYER, 2)
    assert r.correct, r.problems
    from dist_lib import StrategyError
    from dist_lib.errors import TensorError
    with pytest.raises((TensorError, StrategyError), match=r"rank \d combine\(layer 0\): the output of experts 0-1 for "
                                                          r"samples \d came back from expert-TP shards 0 only"):
        simulate(str(path), "1x2xA100-80GB", ONE_LAYER, 2, mistake="one shard")
    from dist_lib.errors import IncorrectStepError
    with pytest.raises(IncorrectStepError, match=r"layer 0: no rank handed in experts 0-1 \(their expert-TP shards 1 "
                                                 r"of 2 are missing\)"):
        simulate(str(path), "1x2xA100-80GB", ONE_LAYER, 2, mistake="hand in one shard")


def test_etp2_halves_the_expert_gemms_on_the_same_tokens():
    """Mixtral's experts on 8192 tokens on an H100: each of 2 expert-TP shards does exactly half the FLOPs, and
    half the time up to the GEMMs' last partial wave of tiles (within 2 %)."""
    from dist_lib.costs import moe_ops
    from dist_lib.hardware.devices import get_device
    from dist_lib.workload.transformer import Workload
    w, h100 = Workload.parse("mixtral-8x7b"), get_device("H100-80GB")
    for backward in (False, True):
        (one, one_flops), (two, two_flops) = (moe_ops.experts_cost(h100, w, [8192], backward, etp=etp)
                                              for etp in (1, 2))
        assert two_flops == one_flops / 2 == (2 if backward else 1) * 2 * 8192 * 3 * 4096 * 14336 / 2
        assert one / 2 <= two <= one / 2 * 1.02


def test_etp_defaults_to_tp_as_megatron_core():
    default = simulate(HYBRID, "1x8xA100-80GB", toy(), 4, pp=1, ep=2, tp=2, sequence_parallel=True)
    explicit = simulate(HYBRID, "1x8xA100-80GB", toy(), 4, pp=1, ep=2, tp=2, sequence_parallel=True, etp=2)
    assert default.correct and (default.time_s, default.memory_bytes) == (explicit.time_s, explicit.memory_bytes)


def test_etp2_lays_the_expert_grid_as_megatron_core():
    """8 ranks, pp=1, tp=2, ep=2, etp=2 (expert grid order tp-ep-dp): ranks 4k..4k+3 exchange tokens, rank i
    is EP position i // 2 % 2 and expert-TP shard i % 2, its expert-DP group {i, i + 4}. Rank 0 holds shard 0
    of experts 0-1: 2 x 3 x 256 x 512 / 2 parameters; it computes, for 4 sources' 64-token sequence halves, 64 x
    top-2 / 4 experts = 32 tokens per expert each: 128."""
    r = simulate(HYBRID, "1x8xA100-80GB", toy(), 4, pp=1, ep=2, etp=2, tp=2, sequence_parallel=True, fold=False)  # (every rank's events)
    assert r.correct, r.problems
    assert {e.peers for e in r.events if e.op == "all_to_all"} == {(0, 1), (2, 3), (4, 5), (6, 7), (0, 1, 2, 3),
                                                                   (4, 5, 6, 7)}
    assert {e.peers for e in r.events if e.op == "all_reduce" and e.detail == "expert weight_grad"} == \
        {(0, 4), (1, 5), (2, 6), (3, 7)}
    first = next(e for e in r.events if e.op == "expert_forward" and e.rank == 0)
    assert first.detail == "tokens per expert: 0: 128, 1: 128"
    assert first.flops == 2 * (128 + 128) * 3 * 256 * 512 / 2  # 2 FLOPs per token and shard parameter


def test_tp2_ep4_lays_the_ep_groups_over_the_tp_ranks_of_a_stage():
    """8 ranks, pp=1, tp=2: dp=4 replicas of a TP pair. ep=4 with expert TP 1: EP groups {0-3}, {4-7} (two
    replicas' TP ranks each), expert-DP groups {0, 4}, {1, 5}, ...; rank 0 holds expert 0. Each rank holds
    its sequence half, 64 tokens, of its replica's one-sample microbatch: x top-2 / 4 experts = 32 tokens
    for each expert from each of the 4 peers, 128 in all (without TP on 8 replicas, 4 peers x 64 = 256)."""
    r = simulate(HYBRID, "1x8xA100-80GB", toy(), 4, pp=1, ep=4, **TP_MOE, fold=False)  # (every rank's events)
    assert r.correct, r.problems
    groups = {e.peers for e in r.events if e.op == "all_to_all"}
    assert groups == {(0, 1), (2, 3), (4, 5), (6, 7), (0, 1, 2, 3), (4, 5, 6, 7)}
    expert_reduces = {e.peers for e in r.events if e.op == "all_reduce" and e.detail == "expert weight_grad"}
    assert expert_reduces == {(0, 4), (1, 5), (2, 6), (3, 7)}
    first = next(e for e in r.events if e.op == "expert_forward" and e.rank == 0)
    assert first.detail == "tokens per expert: 0: 128"
    plain = simulate(HYBRID, "1x8xA100-80GB", toy(), 8, pp=1, ep=4)
    first = next(e for e in plain.events if e.op == "expert_forward" and e.rank == 0)
    assert first.detail == "tokens per expert: 0: 256"


def test_tp2_halves_the_work_of_an_moe_layers_dense_part():
    """The attention GEMMs and core split over the TP ranks and the router runs on the rank's sequence half:
    each TP rank's route does exactly half the FLOPs of the whole layer's dense part."""
    tp1 = simulate(HYBRID, "1x8xA100-80GB", toy(), 8, pp=1, ep=4)
    tp2 = simulate(HYBRID, "1x8xA100-80GB", toy(), 4, pp=1, ep=4, **TP_MOE)
    for op in ("route", "route_backward"):
        one = next(e for e in tp1.events if e.op == op and e.rank == 0 and e.layer == 0)
        two = next(e for e in tp2.events if e.op == op and e.rank == 0 and e.layer == 0)
        assert two.flops == pytest.approx(one.flops / 2, rel=1e-12)
        assert two.end - two.start < one.end - one.start


def test_a_recorded_tp_moe_program_replays_to_the_same_result():
    workload = toy(routing="zipf:1.2", seed=1)
    options = dict(pp=2, ep=2, **{**TP_MOE, "etp": 2})
    direct = simulate(HYBRID, "2x4xA100-80GB", workload, 4, **options)
    recorded, programs = record(HYBRID, "2x4xA100-80GB", workload, 4, **options)
    again = replay(programs, "2x4xA100-80GB", workload, 4)
    assert direct.correct, direct.problems
    for r in (recorded, again):
        assert (r.time_s, r.rank_times, r.memory_bytes, r.correct) == \
            (direct.time_s, direct.rank_times, direct.memory_bytes, direct.correct)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(experts=st.sampled_from([2, 4, 8]), top_k=st.integers(1, 2), ep=st.sampled_from([1, 2, 4, 8]),
       etp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), shared=st.integers(0, 1), zipf=st.booleans(),
       schedule=st.sampled_from(["1f1b", "gpipe", "interleaved", "deepspeed"]), seed=st.integers(0, 3),
       modes=st.sampled_from([{}, {"distributed_optimizer": True}, {"recompute": True},
                              {"selective_recompute": True, "distributed_optimizer": True}]))
def test_random_small_tp_moe_configurations_are_correct_and_order_independent(experts, top_k, ep, etp, pp, shared,
                                                                              zipf, schedule, seed, modes):
    dp = 8 // (2 * pp)
    if experts % ep or (dp * 2) % (ep * etp):
        ep = 1
    workload = toy(experts, top_k, shared, "zipf:1.3" if zipf else "uniform", seed)
    results = [simulate(HYBRID, "2x4xA100-80GB", workload, 2 * dp, pp=pp, ep=ep, schedule=schedule,
                        start_order_seed=order, **{**TP_MOE, "etp": etp}, **modes) for order in (None, 7)]
    assert all(r.correct for r in results), results[0].problems
    a, b = results
    assert (a.time_s, a.rank_times, a.memory_bytes) == (b.time_s, b.rank_times, b.memory_bytes)


def test_an_moe_layers_input_gradient_is_one_tp_all_reduce_a_dense_layers_two():
    """With TP (sequence-parallel, expert TP 1) an MoE layer's experts send their tokens back by all-to-all and
    have no TP collective: its input gradient is its attention's one all-reduce; a dense layer's is two
    (attention and MLP). Layers 0 and 2 of this toy are MoE (`moe_every=2`), 1 and 3 dense."""
    from dist_lib.costs.network import collective_time
    from dist_lib.hardware.cluster import Cluster
    workload = TOY.format(experts=4, top_k=2, shared=0, routing="uniform", seed=0)
    # (the gradients reduced after the flush, so that no data-parallel reduction shares the NVLink with them)
    result = simulate(HYBRID, "1x4xA100-80GB", workload, 4, dp=2, pp=1, ep=2, microbatch_size=1,
                      overlap_grad_reduce=False, **TP_MOE)
    assert result.correct
    one = collective_time("all_reduce", 128 * 256 * 2, Cluster.parse("1x4xA100-80GB").topology((0, 1)))
    durations: dict = {}
    for e in result.events:  # (an input gradient's layer is the layer it enters: layer L's backward gives L)
        if e.rank == 0 and e.op == "all_reduce" and e.detail == "activation_grad (TP partial sums)":
            durations.setdefault(e.layer, set()).add(round(e.duration, 15))
    assert durations[0] == durations[2] == {round(one, 15)}  # MoE layers
    assert durations[1] == durations[3] == {round(2 * one, 15)}  # dense layers

"""The distributed optimizer with experts (hybrid's `distributed_optimizer` with an MoE workload), as
Megatron-Core shards it: the dense parts' optimizer state over the data-parallel group, the experts' over the
expert-data-parallel group, their gradients reduce-scattered there and the updated 16-bit shards all-gathered;
its saving derived by hand, the step correct and replayable, a shard handed in ungathered caught at the op."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.workload import moe as moe_layers
from dist_lib.workload.transformer import Workload
from dist_lib.testing import replays_alike

HYBRID = "strategies/hybrid.py"
TOY = ("toy:layers=4,hidden=256,heads=4,seq=128,experts=4,top_k=2,expert_ffn_hidden=512,moe_every=2,"
       "dense_ffn_hidden=512,shared_experts=1")

# one MoE layer on two ranks that both hold both experts (ep=1): the experts' optimizer state in two shards
SHARDED = '''
async def train(model, gather=True, hand_in=(0, 1)):
    r, group = model.rank, [0, 1]
    w, opt = model.load_weights(0)
    ew, _ = model.load_experts(0, [0, 1])
    _, eopt = model.load_experts(0, [0, 1], shard=r, num_shards=2)
    x = model.get_input_activation([r])
    routed = model.route(0, x, w)
    tokens = [model.dispatch(routed, [0, 1])]
    outs = model.expert_forward(0, tokens, ew)
    y = model.combine(routed, outs)
    g = model.loss(y)
    cut = model.combine_backward(routed, g, [0, 1])
    eg, ig = model.expert_backward(0, tokens[0], cut, ew)
    wg, _ = model.route_backward(0, x, g, routed, [ig], w)
    new_w, _ = model.update(0, await model.all_reduce(wg, group), w, opt)
    model.set_final_weight(0, new_w)
    new_e, _ = model.update_experts(0, await model.reduce_scatter(eg, group), ew, eopt)
    if gather:
        model.set_final_experts(0, await model.all_gather(new_e, group))
    elif r in hand_in:  # each rank its updated ZeRO shard, as with --overlap-param-gather
        model.set_final_experts(0, new_e)
'''
ONE_LAYER = "toy:layers=1,hidden=256,heads=4,seq=128,experts=2,top_k=1,expert_ffn_hidden=512"


def test_the_experts_optimizer_state_is_sharded_over_the_expert_data_parallel_group():
    """8 ranks, pp=1, dp=8, ep=2: expert-DP groups of 4 ranks. Each rank keeps 1/8 of each layer's dense
    optimizer state and 1/4 of its experts' (2 MoE layers x 2 experts x 3 h f parameters, 12 bytes each)."""
    w = Workload.parse(TOY)
    dense = [w.layer_params(layer) - moe_layers.routed_expert_params(w.moe, w.hidden, layer) for layer in range(4)]
    experts = 2 * 2 * 3 * 256 * 512 * 12
    plain = simulate(HYBRID, "1x8xA100-80GB", TOY, 8, pp=1, ep=2)
    sharded = simulate(HYBRID, "1x8xA100-80GB", TOY, 8, pp=1, ep=2, distributed_optimizer=True)
    assert sharded.correct, sharded.problems
    saved = plain.memory_by_kind[0]["optimizer"] - sharded.memory_by_kind[0]["optimizer"]
    assert saved == sum(int(p * 12) - int(p / 8 * 12) for p in dense) + experts - experts // 4
    ops = {(e.op, e.detail, e.peers) for e in sharded.events if e.op in ("reduce_scatter", "all_gather")}
    assert {("reduce_scatter", "expert weight_grad", (0, 2, 4, 6)), ("all_gather", "expert weight", (1, 3, 5, 7)),
            ("reduce_scatter", "weight_grad", tuple(range(8)))} <= ops
    assert not {e for e in sharded.events if e.op == "all_reduce" and e.detail == "expert weight_grad"}


def test_distributed_optimizer_with_tp_and_expert_tp_is_correct_and_replays():
    replays_alike(HYBRID, "2x4xA100-80GB", TOY, 4, pp=2, tp=2, ep=2, etp=2, sequence_parallel=True,
                  distributed_optimizer=True)


def test_updated_expert_shards_are_handed_in_whole_or_every_one(tmp_path):
    path = tmp_path / "sharded.py"
    path.write_text(SHARDED)
    assert simulate(str(path), "1x2xA100-80GB", ONE_LAYER, 2).correct
    # the updated ZeRO shards as they are, each from its rank: every shard of the experts handed in
    assert simulate(str(path), "1x2xA100-80GB", ONE_LAYER, 2, gather=False).correct
    # rank 1's shard never handed in
    result = simulate(str(path), "1x2xA100-80GB", ONE_LAYER, 2, check=False, gather=False, hand_in=(0,))
    assert not result.correct
    assert any("layer 0: no rank handed in experts 0-1 (their ZeRO shards 1 of 2 were not handed in" in p
               for p in result.problems), result.problems


@pytest.mark.parametrize("options", [dict(pp=2, ep=2), dict(pp=1, tp=2, ep=2, etp=1, sequence_parallel=True)])
def test_overlap_param_gather_with_experts_gathers_before_the_forward(options):
    """Megatron-Core's --overlap-param-gather with experts: the step starts from the updated shards and gathers
    each layer's dense weights and experts before its first forward (the next layer's in flight), and ends
    with the shards; the after-step gathers are gone, and the step is correct, folded or not."""
    base = dict(distributed_optimizer=True, **options)
    after = simulate(HYBRID, "2x4xA100-80GB", TOY, 8, **base)
    before = simulate(HYBRID, "2x4xA100-80GB", TOY, 8, overlap_param_gather=True, **base)
    full = simulate(HYBRID, "2x4xA100-80GB", TOY, 8, overlap_param_gather=True, fold=False, **base)
    assert before.correct and full.correct, (before.problems, full.problems)
    assert (before.time_s, before.memory_bytes) == (full.time_s, full.memory_bytes)
    # the same all-gathers (of the dense weights and of the experts), issued before the first forward
    gathers = [e for e in full.events if e.op == "all_gather" and e.detail in ("weight", "expert weight")]
    first_forward = min(e.start for e in full.events if e.rank == 0 and e.op == "forward")
    assert gathers and min(e.start for e in gathers if e.rank == 0) <= first_forward
    last_update = max(e.end for e in full.events if e.rank == 0 and e.op.startswith("update"))
    assert all(e.start < last_update for e in gathers)  # none after the step
    assert after.correct and not [e for e in after.events if e.op == "all_gather" and e.rank == 0
                                  and e.detail in ("weight", "expert weight") and e.start < first_forward]

"""Expert parallelism end to end: strategies/moe.py is correct, deterministic, slower under skewed routing, and
the mistakes a strategy can make with the experts are caught at the op that makes them."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dist_lib import CollectiveMismatchError, IncorrectStepError, StrategyError, TensorError, simulate
from dist_lib.workload.routing import expert_loads
from dist_lib import Workload

MIXTRAL = "mixtral-8x7b:layers=2"


def run(workload=MIXTRAL, cluster="2x8xA100-80GB", batch=16, **options):
    return simulate("strategies/moe.py", cluster=cluster, workload=workload, global_batch_size=batch, **options)


def test_mixtral_over_two_nodes_with_ep8_is_correct_and_traced():
    r = run(ep=8)
    assert r.correct
    ops = {e.op for e in r.events}
    assert {"route", "dispatch", "expert_forward", "combine", "all_to_all", "expert_backward",
            "route_backward", "update_experts"} <= ops
    assert not {"send", "recv"} & ops  # the token exchange is the all-to-all
    # uniform routing: a one-sample microbatch sends each of the 8 experts 2 x 4096 / 8 = 1024 tokens, and rank
    # 0's one expert takes the first microbatch of each of its 8 EP peers at once: 8192
    first = next(e for e in r.events if e.op == "expert_forward" and e.rank == 0)
    assert first.detail == "tokens per expert: 0: 8192"
    assert r.mfu > 0


def test_skewed_routing_is_slower_than_uniform():
    uniform = run(ep=8)
    skewed = run(workload=MIXTRAL + ",routing=zipf:1.2", ep=8)
    assert skewed.correct and skewed.time_s > uniform.time_s
    measured = run(workload=MIXTRAL + ",routing=measured:8/1/1/1/1/1/1/1", ep=8)
    assert measured.time_s > uniform.time_s


def test_routing_is_deterministic_by_seed_and_sums_to_k_tokens():
    moe = Workload.parse("mixtral-8x7b:routing=zipf:1.1,routing_seed=5").moe
    loads = expert_loads(moe, 3, 16, 4096)
    assert sum(loads) == 2 * 4096 and max(loads) <= 4096
    assert expert_loads(moe, 3, 16, 4096) == loads
    other = Workload.parse("mixtral-8x7b:routing=zipf:1.1,routing_seed=6").moe
    assert expert_loads(other, 3, 16, 4096) != loads


def test_capacity_factor_pads_the_dispatch_and_costs_time():
    dropless = run(ep=8)
    padded = run(workload=MIXTRAL + ",capacity_factor=2", ep=8)
    assert padded.correct and padded.time_s > dropless.time_s
    assert max(padded.memory_bytes) > max(dropless.memory_bytes)


def test_same_result_under_shuffled_start_order():
    first = run(ep=4, start_order_seed=1)
    second = run(ep=4, start_order_seed=2)
    assert (first.time_s, first.memory_bytes) == (second.time_s, second.memory_bytes)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(experts=st.sampled_from([2, 4, 8]), top_k=st.integers(1, 2), ep=st.sampled_from([1, 2, 4]),
       nodes=st.integers(1, 2), zipf=st.booleans(), seed=st.integers(0, 3))
def test_random_small_moe_configurations_are_correct_and_order_independent(experts, top_k, ep, nodes, zipf, seed):
    if experts % ep:
        ep = 1
    workload = (f"toy:layers=3,hidden=256,heads=4,seq=128,experts={experts},top_k={top_k},expert_ffn_hidden=512,"
                f"moe_every=2,dense_ffn_hidden=512,routing={'zipf:1.3' if zipf else 'uniform'},routing_seed={seed}")
    results = [run(workload=workload, cluster=f"{nodes}x4xA100-80GB", batch=8 * nodes, ep=ep, start_order_seed=order)
               for order in (None, 7)]
    assert all(r.correct for r in results)
    assert results[0].time_s == results[1].time_s and results[0].memory_bytes == results[1].memory_bytes


CHEATS = {
    "skips_combine": ("x = routed", "forward"),
    "wrong_rank": ("sending = [model.dispatch(routed, layout.experts_of(peer)) for peer in layout.ep_group]",
                   "wrong expert rank"),
    "gradient_twice": ("expert_grads[layer] = expert_grad if total is None else total + expert_grad", "twice"),
    "whole_layer_forward": ("routed = model.route(layer, x, weights[layer][0])", "mixture-of-experts layer"),
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_expert_mistakes_are_caught_at_the_op(cheat, tmp_path):
    source = open("strategies/moe.py").read().replace("from ._experts", "from strategies._experts")
    if cheat == "skips_combine":  # the combine's output never made: the expert outputs are dropped
        source = source.replace("x = model.combine(routed, returned)", "x = routed")
    elif cheat == "wrong_rank":  # each peer gets the tokens of its neighbour's experts
        source = source.replace("layout.experts_of(peer)) for peer in layout.ep_group]\n            arriving",
                                "layout.experts_of(layout.ep_group[(layout.ep_group.index(peer) + 1) % layout.ep]))"
                                " for peer in layout.ep_group]\n            arriving")
    elif cheat == "gradient_twice":  # a piece's expert gradient summed in twice
        source = source.replace("expert_grads[layer] = expert_grad if total is None else total + expert_grad",
                                "expert_grads[layer] = (expert_grad if total is None else total + expert_grad)"
                                " + expert_grad")
    else:  # the whole layer as a dense one: its tokens never reach the experts
        source = source.replace("routed = model.route(layer, x, weights[layer][0])",
                                "routed = model.forward(layer, x, weights[layer][0])")
    path = tmp_path / f"{cheat}.py"
    path.write_text(source)
    with pytest.raises((TensorError, StrategyError, IncorrectStepError, CollectiveMismatchError)) as caught:
        simulate(str(path), cluster="1x4xA100-80GB", workload=MIXTRAL, global_batch_size=4, ep=4)
    message = str(caught.value)
    assert re.search({"skips_combine": r"route|forward|combine", "wrong_rank": "all_to_all #0 .* wrong expert rank",
                      "gradient_twice": "counted twice", "whole_layer_forward": "mixture-of-experts layer"}[cheat],
                     message), message

"""The planner's expert tensor parallelism (etp, dividing TP) and its estimate of MoE stages with TP against
the simulation (`planner.expert_modes_cost`, `planner.tail`), as hybrid's expert stage runs them."""

from dataclasses import replace

import pytest

from dist_lib import Cluster, Workload
from dist_lib.hardware.reserve import memory_reserve
from dist_lib.planner import plan
from dist_lib.planner.estimate import with_total
from dist_lib.planner.evaluate import simulate_candidate
from dist_lib.planner.expert_modes_cost import expert_grids, with_etp
from dist_lib.planner.export import export
from dist_lib.planner.launch_import import from_megatron
from dist_lib.planner.search import Candidate, to_plan
from dist_lib.planner.stage_space import StageSpace
from dist_lib.planner.stage_option import StageOption
from dist_lib.planner.step import step_estimate
from dist_lib.planner.tail import after_reductions

from tests.test_framework_plan import round_trip

NODE = "1x8xH100-80GB"
SMALL = "mixtral-8x7b:layers=4"
EXPERT = 3 * 4096 * 14336  # one Mixtral expert's SwiGLU parameters (gate, up, down)


def _one_stage(workload, cluster, tp, ep, etp, recompute="none", zero=0, microbatch=4, batch=16):
    """The estimated and simulated step of one 8-rank stage at (tp, ep, etp), as Megatron-LM runs it."""
    space, ranks = StageSpace(cluster, workload), tuple(range(8))
    option = next(o for o in space.options(ranks, microbatch, recompute, zero, "", ep, 1, etp) if o.tp == tp)
    placed, m = [(workload.num_layers, option)], batch // microbatch
    seconds, memory = step_estimate(cluster, workload, placed, m, "1f1b", 1)
    p = with_etp(to_plan(placed, microbatch, m, "1f1b", recompute, zero, 1, "", ep), workload, etp)
    ran = simulate_candidate(cluster, workload, batch, Candidate(p, seconds, memory, 0.0), framework="megatron")
    assert ran.simulated is not None, ran.error
    return option, seconds, ran.simulated


@pytest.mark.parametrize("tp, ep, etp, recompute, zero", [
    (4, 2, 1, "none", 0),  # an exchange group (2 ranks) smaller than the TP group (4)
    (4, 8, 1, "none", 0),
    (2, 4, 2, "none", 0),
    (4, 2, 4, "selective", 1),  # Megatron-Core's default etp = tp, with the distributed optimizer
])
def test_the_estimate_of_an_moe_stage_with_tp_and_etp_is_the_simulation_within_2_percent(tp, ep, etp, recompute,
                                                                                          zero):
    # each op as the simulator charges it: the whole TP group's collectives, reduce_routed, the activation
    # gradient's all-reduce as `collective_duration` charges it, the experts' updates after the dense ones
    # (before: 2.5 to 6.4 % under at etp 1; `python -m benchmarks.planner_estimate moe` prints every row)
    workload, cluster = Workload.load(SMALL), Cluster.load(NODE)
    _, seconds, simulated = _one_stage(workload, cluster, tp, ep, etp, recompute, zero)
    assert seconds == pytest.approx(simulated, rel=0.02)


def test_the_experts_updates_follow_every_dense_update():
    # hybrid's expert stage steps every layer's dense part (each once reduced), then every layer's experts
    # (`_expert_stage.update_all`): reductions that end late delay the experts' updates by all of them
    zeros = (0.0, 0.0, 0.0)
    costs = with_total(*([(0.0, 1.0, 2.0)] * 6), (0.0, 5.0, 10.0), zeros, zeros)  # updates: 1 s dense, 4 s experts
    option = StageOption((0, 1), 1, (1, 1), costs, 1.0, 0.0, 1.0, lambda n: 1.0, expert_updates=(0.0, 4.0, 8.0))
    assert after_reductions(option, 0, 2, 0.5) == pytest.approx(2 * 1 + 2 * 4)  # ahead: every update in turn
    assert after_reductions(option, 0, 2, 3.0) == pytest.approx(3.0 + 1 + 2 * 4)  # late: the first dense, all experts
    dense = replace(option, expert_updates=())  # a dense stage: the first layer's update after the reductions
    assert after_reductions(dense, 0, 2, 7.0) == pytest.approx(7.0 + 5.0)


def test_expert_grids_pair_etp_with_the_expert_parallel_degrees_that_fit():
    workload = Workload.load(SMALL)
    grids = expert_grids(workload, 8)
    assert grids[0] == (2, 1) and (1, 1) not in grids  # expert TP 1 first, as searched before
    assert {(ep, etp) for ep, etp in grids if etp == 2} == {(1, 2), (2, 2), (4, 2)}  # ep x 2 divides 8
    assert all(8 % (ep * etp) == 0 and 14336 % etp == 0 for ep, etp in grids)
    assert expert_grids(Workload.load("gpt-1.3b"), 8) == ()


def test_etp_rejected_where_a_larger_ep_holds_the_same_experts():
    # on 8 ranks at TP 2, (ep 4, etp 2) and (ep 8, etp 1) both give each rank one expert's worth (E / (ep x etp))
    # of state and the same expert FLOPs, but etp 2 sends every token to 2 ranks and back: etp 1 is faster
    workload, cluster = Workload.load(SMALL), Cluster.load(NODE)
    wide, wide_s, wide_sim = _one_stage(workload, cluster, 2, 8, 1)
    split, split_s, split_sim = _one_stage(workload, cluster, 2, 4, 2)
    state = [o.costs.state[2] - o.costs.state[1] for o in (wide, split)]
    assert state[0] == pytest.approx(state[1])
    assert wide_s < split_s and wide_sim < split_sim
    search = plan(cluster, workload, 16, framework="megatron", top=1)  # (its winner runs at TP 1)
    with_tp = [c for c in search.candidates if c.plan.stages[0].tp > 1]
    assert min(with_tp, key=lambda c: c.estimate).plan.etp == 1 and any(c.plan.etp == 2 for c in with_tp)


def test_etp_picked_where_ep_runs_out_of_experts_and_round_trips():
    # 4 experts on 8 ranks: ep stops at 4, so at etp 1 each expert sits whole on 2 ranks, 32 layers x one
    # expert a rank; etp 2 halves that, and the one stage of 8 ranks fits without recompute or a pipeline's
    # bubble
    cluster, workload = Cluster.load(NODE), Workload.load("mixtral-8x7b:experts=4")
    search = plan(cluster, workload, 8, framework="megatron")
    best = search.best
    p = best.plan
    assert p.etp == 2 and p.ep == 4 and len(p.stages) == 1 and best.simulated is not None
    space = StageSpace(cluster, workload)
    etp1, etp2 = (next(o for o in space.options(tuple(range(8)), 4, "none", 1, "delayed", 4, 1, etp) if o.tp == 4)
                  for etp in (1, 2))
    # the experts' state a layer (the distributed optimizer: 4 bytes of weights and gradients, 12 of Adam
    # over the expert-data-parallel group, 8 / (ep x etp) ranks)
    held = [o.costs.state[2] - o.costs.state[1] for o in (etp1, etp2)]
    assert held[0] - held[1] == pytest.approx(EXPERT * (4 + 12 / 2) - EXPERT / 2 * (4 + 12 / 1), rel=1e-6)
    # a plan of one stage at expert TP 1 fits only with full recompute (the forward twice); the best plan at
    # expert TP 1 (two stages) runs slower in the simulator too
    one = [c.plan for c in search.candidates if len(c.plan.stages) == 1 and c.plan.etp <= 1]
    assert one and all(q.recompute == "full" for q in one) and p.recompute == "none"
    other = min((c for c in search.candidates if c.plan.etp <= 1), key=lambda c: c.estimate)
    simulate_candidate(cluster, workload, 8, other, reserve=memory_reserve(True, "reserve"), framework="megatron")
    assert other.simulated is not None and best.simulated < other.simulated
    assert best.estimate == pytest.approx(best.simulated, rel=0.02)
    # exported as Megatron-LM arguments with --expert-tensor-parallel-size 2, read back to the same plan and step
    text = export(p, "megatron", workload, cluster).settings
    assert "--expert-tensor-parallel-size 2" in text and "--expert-model-parallel-size 4" in text
    assert from_megatron(text, workload, 8).launch.to_plan(workload.num_layers) == p
    result, launch = round_trip(cluster, workload, 8, best, "megatron")
    assert launch.etp == 2 and result.time_s == pytest.approx(best.simulated, rel=1e-9)

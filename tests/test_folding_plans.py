"""Folding a plan's replicas (`strategies/planned.py` declares its stages as a `ReplicaGrid`): on clusters
of several device types, stages of their own TP degrees fold where each stage's nodes are alike and every
microbatch is cut evenly, and the folded step is the full step exactly."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import strategies.planned as planned
from dist_lib import ReplicaGrid
from dist_lib.comm.folding import rotate
from dist_lib.errors import SpecError
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.replicas import Fold
from dist_lib.planner.plan import Plan, Stage
from test_folding import assert_same, both

# ---- the relabelling of samples cut per microbatch --------------------------------------------------


def test_rotate_within_each_microbatch():
    # two microbatches of 2 samples, one a replica: replica 0 holds samples 0 and 2, replica 1 samples 1 and 3
    assert rotate(0b0101, 1, 1, 2, 2) == 0b1010
    # three replicas of 2 samples in each of two microbatches of 6: block 2 of each wraps round to block 0
    assert rotate(0b110000_110000, 1, 2, 3, 2) == 0b000011_000011
    assert rotate(0b000011_000000, 2, 2, 3, 2) == 0b110000_000000
    assert rotate(full := 0b111111_111111, 1, 2, 3, 2) == full


# ---- the hardware's symmetry, stage by stage -------------------------------------------------------

def test_fold_of_stages_on_two_device_types():
    """Stage 0: 4 replicas of tp 2 on two H100 nodes of 4 (two replicas a node); stage 1: 4 replicas of
    tp 1 on one A100 node of 4; the V100 node is idle."""
    cluster = Cluster.parse("2x4xH100-80GB:nics=1x25+1x4xA100-80GB+1x4xV100-32GB")
    grid = ReplicaGrid(4, stages=((tuple(range(8)), 2), (tuple(range(8, 12)), 1)))
    fold, why = Fold.build(cluster, grid)
    assert why == "" and fold.reps == [0, 1, 8, 12, 13, 14, 15]  # the idle ranks stand for themselves
    assert fold.replica_of[7] == 3 and fold.rep_of[7] == 1 and fold.rep_of[11] == 8 and fold.replica_of[11] == 3
    world = 16
    # rank 5 (replica 2, tp rank 1) sends through rank 1's port: one orbit of 4 ports
    assert fold.canon[4 * 5] == 4 * 1 and fold.orbit[4 * 1] == 4 and fold.orbit[4 * 12] == 1
    # the H100 nodes' shared NICs: node 1 folds onto node 0, an orbit of 2; the A100 node is its own
    assert fold.canon[4 * world + 2] == 4 * world and fold.orbit[4 * world] == 2
    assert fold.canon[4 * world + 4] == 4 * world + 4 and fold.orbit[4 * world + 4] == 1
    assert fold.capacities()[4 * 1] == 4 * cluster.link_capacities()[4 * 1]


@pytest.mark.parametrize("spec, stages, why", [
    ("1x4xH100-80GB+1x4xA100-80GB", ((tuple(range(8)), 2),), "the nodes differ"),  # one stage, two types
    ("2x6xA100-80GB", ((tuple(range(12)), 4),), "unevenly"),  # tp 4 on nodes of 6
    ("2x4xA100-80GB", ((tuple(range(6)), 1),), "unevenly"),  # a node and a half
    ("1x4xA100-80GB", (((1, 0, 2, 3), 1),), "ascending"),
    ("2x4xA100-80GB", (((0, 1), 1), ((1, 2), 1)), "distinct"),
    ("2x4xA100-80GB", ((tuple(range(4)), 2), (tuple(range(4, 8)), 1)), "4 ranks are not 2 replicas"),
])
def test_stages_that_do_not_fold_say_why(spec, stages, why):
    dp = len(stages[0][0]) // stages[0][1]
    fold, reason = Fold.build(Cluster.parse(spec), ReplicaGrid(dp, stages=stages))
    assert fold is None and why in reason


def test_replicas_a_node_that_do_not_nest_do_not_fold():
    """Six replicas: two a node on stage 0 (tp 2 on nodes of 4), three a node on stage 1 (tp 2 on nodes
    of 6). No permutation keeping both cuts takes replica 0 (paired with 1 in both) to replica 2."""
    cluster = Cluster.parse("3x4xA100-80GB+2x6xH100-80GB")
    grid = ReplicaGrid(6, stages=((tuple(range(12)), 2), (tuple(range(12, 24)), 2)))
    fold, why = Fold.build(cluster, grid)
    assert fold is None and "do not nest" in why


# ---- which plans declare a grid ---------------------------------------------------------------------

def _plan(shares: tuple[int, ...], second_dp: int = 2) -> Plan:
    return Plan((Stage((0, 1), 1, ((0, 2),), shares), Stage(tuple(range(2, 2 + second_dp)), 1, ((2, 4),),
                                                            (sum(shares) // second_dp,) * second_dp)),
                sum(shares), 4)


def test_planned_declares_a_grid_only_for_even_shares_and_equal_widths():
    grid = planned.replica_grid(4, 8, plan=_plan((1, 1)))
    assert grid == ReplicaGrid(2, stages=(((0, 1), 1), ((2, 3), 1)), microbatch=2)
    assert planned.replica_grid(6, 12, plan=_plan((2, 1))) is None  # uneven shares
    assert planned.replica_grid(4, 8, plan=_plan((2, 2), second_dp=1)) is None  # widths differ
    assert planned.replica_grid(4, 8) is None  # the estimate's plan: not known before the step


def test_uneven_shares_run_unfolded():
    plan = _plan((2, 1), second_dp=3)
    full, folded = both("strategies.planned", "1x2xH100-80GB+1x3xA100-80GB", "toy:layers=4", 12, plan=plan)
    assert folded.representatives is None and full.time_s == folded.time_s


# ---- folded and full plans agree --------------------------------------------------------------------

DEVICES = ("H100-80GB", "A100-80GB", "V100-32GB")


@st.composite
def staged_plans(draw):
    """A plan of 2 or 3 stages, each on nodes of its own device type (a stage narrower than a node sits
    alone on one, the rest idle), with its own TP degree, and the cluster it runs on."""
    gpus = draw(st.sampled_from([2, 4, 8]))
    dp = draw(st.sampled_from([2, 4]))
    pp = draw(st.integers(2, 3))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zero-bubble"]))
    chunks = 2 if schedule == "interleaved" else 1
    recompute = draw(st.sampled_from(["none", "selective"] + ([] if schedule == "zero-bubble" else ["full"])))
    nics = draw(st.sampled_from(["", ":nics=1x25"]))
    terms, stages, first = [], [], 0
    for s in range(pp):
        tp = draw(st.sampled_from([t for t in (1, 2, 4) if gpus % t == 0]))
        nodes = max(1, dp * tp // gpus)
        terms.append(f"{nodes}x{gpus}x{draw(st.sampled_from(DEVICES))}{nics}")
        blocks = tuple(((c * pp + s) * 2, (c * pp + s) * 2 + 2) for c in range(chunks))
        stages.append((tuple(range(first, first + dp * tp)), tp, blocks))
        first += nodes * gpus
    share = draw(st.integers(1, 2))
    microbatches = pp * draw(st.integers(1, 2))
    plan = Plan(tuple(Stage(ranks, tp, blocks, (share,) * dp) for ranks, tp, blocks in stages), share * dp,
                microbatches, schedule, recompute, draw(st.sampled_from([0, 1])))
    return "+".join(terms), f"toy:layers={2 * pp * chunks}", plan


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(staged_plans())
def test_folded_plans_are_the_full_plans(config):
    spec, workload, plan = config
    cluster = Cluster.parse(spec)
    try:
        plan.check(cluster.world_size, 2 * len(plan.stages) * plan.chunks, plan.global_batch_size, cluster)
    except SpecError:
        assume(False)
    full, folded = both("strategies.planned", spec, workload, plan.global_batch_size, plan=plan)
    assert folded.representatives is not None and full.representatives is None
    assert_same(full, folded)

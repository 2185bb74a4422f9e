"""The estimate where crossings of different pipeline boundaries meet on a node's shared NIC, and ZB-H1's
receive posted after a weight-gradient pass (`dist_lib/planner/contention.py`): hand-derived play-outs,
then the simulator itself."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, Workload
from dist_lib.planner import contention
from dist_lib.planner.evaluate import run_plan
from dist_lib.planner.messages import crossing_seconds
from dist_lib.planner.step import step_estimate
from dist_lib.planner.search import to_plan
from dist_lib.planner.stage_space import StageSpace

WORKLOAD = "gpt-1.3b:layers=8"


def _placed(spec: str, stages: list[tuple[tuple[int, ...], int]], microbatch: int) -> tuple:
    cluster, workload = Cluster.load(spec), Workload.load(WORKLOAD)
    space = StageSpace(cluster, workload)
    placed = [(layers, {o.tp: o for o in space.options(ranks, microbatch, "none", 0)}[1]) for ranks, layers in stages]
    return cluster, workload, placed


def test_a_pipeline_plays_out_pass_by_pass_with_each_crossing_after_its_receive():
    """Two stages, 1F1B with m = 2 (stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1), F = 1 s, B = 2 s, the
    first crossing 0.5 s each way and later ones 0.25 s. Stage 0: F0 0..1, F1 1..2. Stage 1 posts its
    receive at 0, the activation crosses 1..1.5, F0 1.5..2.5, B0 ..4.5; the gradient crosses 4.5..5
    (stage 0 is free since 2); stage 1's F1 input was sent at 2 but crosses only when it posts the
    receive after B0, 4.5..4.75, F1 ..5.75, B1 ..7.75; stage 0 B0 5..7, then the second gradient
    crosses 7.75..8 and B1 runs 8..10."""
    orders = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]
    seconds = [{"F": 1.0, "B": 2.0}] * 2
    ends, spans = contention.play_alone(orders, seconds, [(0.5, 0.25)], [(0.5, 0.25)])
    assert ends[1, "F", 0] == 2.5 and ends[1, "B", 0] == 4.5 and ends[1, "F", 1] == 5.75
    assert ends[0, "B", 0] == 7.0 and ends[0, "B", 1] == 10.0
    assert spans[0, 1] == [(1.0, 1.5), (4.5, 4.75)] and spans[1, 0] == [(4.5, 5.0), (7.75, 8.0)]


def test_zero_bubble_receives_are_posted_where_the_schedule_posts_them():
    """ZB-H1, two stages, m = 2, F = I = W = 1 s, crossings 0.5 s first and 0.25 s later, each way. The
    schedule posts (from compute alone, `strategies/_early_receives.py`) stage 1's receives of both
    activations before its F0 and stage 0's of gradient 0 before I0, of gradient 1 before W0. Stage 0:
    F0 0..1, F1 1..2. Stage 1: activation 0 crosses 1..1.5, F0 1.5..2.5, I0 ..3.5; activation 1, sent at
    2 and posted at 0, crosses 2..2.25 while F0 runs, F1 3.5..4.5, I1 ..5.5, W0, W1 ..7.5. Stage 0:
    gradient 0 crosses 3.5..4, I0 4..5, W0 5..6 (gradient 1's receive posted at 5), gradient 1 crosses
    5.5..5.75 while W0 runs, I1 6..7, W1 ..8. Posted as each pass begins, activation 1 would cross only
    after stage 1's I0 (3.5..3.75) and gradient 1 after stage 0's W0 (6..6.25): W1 would end at 8.25."""
    orders = contention.zero_bubble_orders([1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 2)
    seconds = [{"F": 1.0, "I": 1.0, "W": 1.0}] * 2
    posts = contention.posted_positions(orders, seconds)
    assert posts == [{("I", 0): 2, ("I", 1): 3}, {("F", 0): 0, ("F", 1): 0}]
    ends, spans = contention.play_alone(orders, seconds, [(0.5, 0.25)], [(0.5, 0.25)], posts)
    assert ends[1, "F", 1] == 4.5 and ends[1, "W", 1] == 7.5
    assert ends[0, "I", 0] == 5.0 and ends[0, "I", 1] == 7.0 and ends[0, "W", 1] == 8.0
    assert spans[0, 1] == [(1.0, 1.5), (2.0, 2.25)] and spans[1, 0] == [(3.5, 4.0), (5.5, 5.75)]
    late, late_spans = contention.play_alone(orders, seconds, [(0.5, 0.25)], [(0.5, 0.25)])
    assert late[0, "W", 1] == 8.25
    assert late_spans[0, 1] == [(1.0, 1.5), (3.5, 3.75)] and late_spans[1, 0] == [(3.5, 4.0), (6.0, 6.25)]


def test_posted_receives_let_one_stage_s_two_crossings_meet_on_its_own_nic():
    """Four one-GPU nodes of one NIC each: with receives posted as each pass begins no two crossings meet;
    posted early (ZB-H1), a middle stage's activation out and gradient out share its NIC out, and the
    activation and gradient into it its NIC in."""
    cluster, workload, placed = _placed("4x1xV100-32GB:nics=1x0.3", [((r,), 2) for r in range(4)], 2)
    assert contention.shared_links(cluster, workload, placed) == {}
    pairs = contention.shared_links(cluster, workload, placed, posted=True)
    assert set(pairs) == {frozenset({(1, 0), (1, 2)}), frozenset({(0, 1), (2, 1)}),
                          frozenset({(2, 1), (2, 3)}), frozenset({(1, 2), (3, 2)})}
    out = {cluster.p2p_usage(r, r + 1)[0][0] for r in (1, 2)}
    assert pairs[frozenset({(1, 0), (1, 2)})] | pairs[frozenset({(2, 1), (2, 3)})] == out


def test_a_zero_bubble_plan_on_one_gpu_nodes_is_played_out_with_its_posted_receives():
    """ZB-H1 on four one-GPU V100 nodes of a 0.3 GB/s NIC each, gpt-350m of 8 layers cut 1/2/2/3, 8
    microbatches of 2: the play-out of the posted receives is within 0.01 % of the simulated step, 731.1 ms
    with the order that counts each crossing after the stage's earlier messages (803.7 ms when the order
    counted each crossing as a delay of its own, 837.4 ms with none; 1F1B takes 840.6 ms)."""
    cluster, workload = Cluster.load("4x1xV100-32GB:nics=1x0.3"), Workload.load("gpt-350m:layers=8")
    space = StageSpace(cluster, workload)
    placed = [(n, space.options((r,), 2, "none", 0)[0]) for r, n in enumerate((1, 2, 2, 3))]
    seconds, _ = step_estimate(cluster, workload, placed, 8, "zero-bubble", 1)
    simulated = run_plan(cluster, workload, 16, to_plan(placed, 2, 8, "zero-bubble", "none", 0)).time_s
    assert simulated * 1e3 == pytest.approx(731.1, abs=0.05)
    assert seconds == pytest.approx(simulated, rel=1e-4)


def test_two_crossings_through_one_nic_each_take_twice_as_long_while_they_overlap():
    """Four one-GPU stages on three nodes of two GPUs behind one NIC each: stages 1 and 2 share the
    middle node (ranks 2 and 3). Stage 0 sends an activation into stage 1 and stage 3 a gradient into
    stage 2 at the same moment (passes of no time); both come in through the middle node's NIC, so
    each takes 2T for its T alone. Then the gradient goes from stage 2 to stage 1 inside the node (t)
    and out of the node to stage 0 (T alone): stage 0's last pass ends at 3T + t, not 2T + t."""
    cluster, workload, placed = _placed("3x2xV100-32GB:nics=1x1.25", [((0,), 2), ((2,), 2), ((3,), 2), ((4,), 2)], 2)
    pairs = contention.shared_links(cluster, workload, placed)
    # into the middle node: 0 -> 1 and 3 -> 2; out of it: 2 -> 3 and 1 -> 0
    assert set(pairs) == {frozenset({(0, 1), (3, 2)}), frozenset({(2, 3), (1, 0)})}
    big = crossing_seconds(cluster, workload, placed[0][1], placed[1][1])
    assert crossing_seconds(cluster, workload, placed[3][1], placed[2][1]) == big
    inside = crossing_seconds(cluster, workload, placed[2][1], placed[1][1])
    assert inside < big / 10
    steady = {(s, s + 1): (crossing_seconds(cluster, workload, placed[s][1], placed[s + 1][1]),
                           crossing_seconds(cluster, workload, placed[s + 1][1], placed[s][1])) for s in range(3)}
    orders = [[("F", 0), ("B", 0)], [("F", 0), ("B", 0)], [("B", 0)], [("B", 0)]]
    seconds = [{"F": 0.0, "B": 0.0}] * 4
    alone, shared = contention.play_ends(cluster, workload, placed, orders, seconds, pairs, steady)
    assert alone == pytest.approx(2 * big + inside, rel=1e-9)
    assert shared == pytest.approx(3 * big + inside, rel=1e-9)
    # with no pairs named, nothing is shared
    assert contention.play_ends(cluster, workload, placed, orders, seconds, {}, steady) == (alone, alone)


def test_crossings_into_one_stage_or_on_per_gpu_nics_share_nothing():
    """Links count only for crossings of different senders and different receivers: two stages of one
    node each share no NIC, nor does any plan on a cluster of a NIC per GPU, so their estimate takes
    the closed form alone."""
    cluster, workload, placed = _placed("3x4xV100-32GB:nics=1x1.25", [(tuple(range(4)), 4), (tuple(range(4, 8)), 4)], 8)
    assert contention.shared_links(cluster, workload, placed) == {}
    stages = [((0, 1), 2), ((2, 3), 2), ((4, 5), 2), ((6, 7), 2)]
    cluster, workload, placed = _placed("2x4xA100-80GB", stages, 4)
    assert contention.shared_links(cluster, workload, placed) == {}


@pytest.mark.parametrize("schedule, simulated_ms", [("1f1b", 942.2), ("zero-bubble", 793.5)])
def test_stages_that_share_a_node_nic_are_estimated_as_the_simulator_runs_them(schedule, simulated_ms):
    """Stages of 4, 2, 2 and 4 V100s on three one-NIC nodes, 4 microbatches of 8: the middle node's NIC
    carries two boundaries' crossings at once, and under ZB-H1 each receive is posted where the schedule
    posts it. The estimate was 7.1 % (1F1B: 875.5 ms) and 8.8 % (ZB-H1: 796.1 ms, when the simulator took
    846.4 ms with each receive posted as its pass began) fast before the crossings were played out; the
    ZB-H1 estimate of the late receives, 845.8 ms, was 10.7 % over the posted receives' step (763.8 ms
    then; 793.5 ms since the order counts each boundary's crossing, which here runs every warm-up forward
    first). The simulator's steps are checked here too."""
    stages = [(tuple(range(4)), 2), ((4, 5), 2), ((6, 7), 2), (tuple(range(8, 12)), 2)]
    cluster, workload, placed = _placed("3x4xV100-32GB:nics=1x1.25", stages, 8)
    seconds, _ = step_estimate(cluster, workload, placed, 4, schedule, 1)
    simulated = run_plan(cluster, workload, 32, to_plan(placed, 8, 4, schedule, "none", 0, 1)).time_s
    assert seconds == pytest.approx(simulated, rel=0.002)
    assert simulated * 1e3 == pytest.approx(simulated_ms, abs=0.05)  # (the simulator's step, pinned)


def test_zero_bubble_orders_are_the_schedules_own_to_the_tie():
    """The play-out's ZB-H1 orders, from plain lists of seconds, must be `strategies/zero_bubble.py`'s
    orders for the same times at ZB-H1's memory, ties included (equal times make many)."""
    import random

    from strategies.zero_bubble import greedy_orders

    rng = random.Random(7)
    for trial in range(300):
        p, m = rng.randint(1, 8), rng.randint(1, 10)
        pick = (lambda: rng.choice([0.5, 1.0, 2.0])) if trial % 2 else (lambda: rng.uniform(0.1, 3.0))
        f, i, w = ([pick() for _ in range(p)] for _ in range(3))
        times = [{"F": a, "I": b, "W": c} for a, b, c in zip(f, i, w)]
        expected = [[(a.kind, a.mb) for a in order] for order in greedy_orders(p, m, p, times)]
        assert contention.zero_bubble_orders(f, i, w, m) == expected


def test_zero_bubble_orders_by_hand():
    """Two stages, m = 2, F = I = W = 1, Zero Bubble's heuristic: warm-up F0 on both (stage 0 0..1,
    stage 1 1..2); microbatch 0's gradient reaches stage 0 at 3 (stage 1's I0 2..3), so stage 0's F1
    (1..2) fits before it and runs; stage 1 takes no extra F (fewer than stage 0's one). I0: stage 1
    2..3, stage 0 3..4. Microbatch 1: stage 1's F1 3..4 (no W waits: its input came at 2), I1 4..5;
    stage 0 has run every F, so its W0 goes first 4..5, then I1 5..6. The Ws left close: a step of 7
    (1F1B's order, W after each I, would take 8)."""
    orders = contention.zero_bubble_orders([1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 2)
    assert orders[0] == [("F", 0), ("F", 1), ("I", 0), ("W", 0), ("I", 1), ("W", 1)]
    assert orders[1] == [("F", 0), ("I", 0), ("F", 1), ("I", 1), ("W", 0), ("W", 1)]


def test_the_zero_bubble_floor_is_under_every_play_out():
    """`zero_bubble_floor`, which lets a search skip the play-out of a ZB-H1 plan that cannot
    beat its best, is never above the play-out's end of stage 0's last pass (random pass and crossing
    times), and by hand: two stages of F = I = W = 1, m = 4, the two crossings 1 s together: stage 0 runs
    12 s of passes; stage 1 waits for stage 0's F0 (1), runs four F, four I and the two W that memory
    (p = 2) forces before its last F (10), and the last gradient goes back to stage 0's I (1): with the
    crossings, 13."""
    import random

    assert contention.zero_bubble_floor([1.0, 1.0], [2.0, 2.0], [1.0, 1.0], 4, [1.0]) == 13.0
    rng = random.Random(3)
    for _ in range(200):
        p, m = rng.randint(2, 6), rng.randint(1, 12)
        f, i, w = ([rng.uniform(0.1, 3.0) for _ in range(p)] for _ in range(3))
        onward = [(rng.uniform(0, 2), rng.uniform(0, 2)) for _ in range(p - 1)]
        back = [(rng.uniform(0, 2), rng.uniform(0, 2)) for _ in range(p - 1)]
        orders = contention.zero_bubble_orders(f, i, w, m)
        seconds = [{"F": a, "I": b, "W": c} for a, b, c in zip(f, i, w)]
        ends, _ = contention.play_alone(orders, seconds, onward, back, contention.posted_positions(orders, seconds))
        path = [onward[s][0] + min(back[s]) for s in range(p - 1)]
        floor = contention.zero_bubble_floor(f, [b + c for b, c in zip(i, w)], w, m, path)
        assert floor <= ends[(0, *orders[0][-1])] * (1 + 1e-12)

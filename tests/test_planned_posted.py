"""Zero-bubble plans run through `strategies/planned.py` post their receives as `zero_bubble` does
(`strategies/_early_receives.py`), checked on a hand-derived timeline of a plan over two device types."""

from __future__ import annotations

import pytest

from dist_lib import simulate

from dist_lib.costs import compute as costs
from dist_lib.planner.plan import Plan, Stage
from strategies import planned, zero_bubble

MS = 1e-3
# stage 0 on a V100 (F = I = W = 2 ms), stage 1 on A100s (1 ms), one GPU a node behind a 0.3 GB/s NIC
CLUSTER = "1x1xV100-32GB:nics=1x0.3+2x1xA100-80GB:nics=1x0.3"
D = 14e-6 + 2 ** 21 / 0.3e9  # one toy activation or gradient of one sample (2 MiB) crossing alone


@pytest.fixture
def pinned(monkeypatch):
    """Each pass of a layer takes 1 ms on an A100, 2 ms on a V100 whatever its samples; loss and update free."""
    def per_device(scale):
        return lambda device, *a, **k: scale * (2 if device.name.startswith("V100") else 1) * MS

    monkeypatch.setattr(costs, "forward_time", per_device(1))
    monkeypatch.setattr(costs, "backward_time", per_device(2))
    monkeypatch.setattr(costs, "backward_input_time", per_device(1))
    monkeypatch.setattr(costs, "backward_weight_time", per_device(1))
    monkeypatch.setattr(costs, "loss_time", lambda *a, **k: 0.0)
    monkeypatch.setattr(costs, "update_time", lambda *a, **k: 0.0)


def two_stages(second=(1,), microbatch=1) -> dict:
    """Layer 0 on rank 0 (the V100), layer 1 on the A100s `second`, each taking an equal share."""
    share = microbatch // len(second)
    return Plan((Stage((0,), 1, ((0, 1),), (microbatch,)), Stage(second, 1, ((1, 2),), (share,) * len(second))),
                microbatch, 2, "zero-bubble").to_dict()


def run(plan: dict, monkeypatch=None):
    """The plan simulated; with `monkeypatch`, as planned ran ZB-H1 before, each receive as its pass begins."""
    if monkeypatch is not None:
        monkeypatch.setitem(planned.SCHEDULES, "zero-bubble", zero_bubble.schedule)
    return simulate(planned.train, CLUSTER, "toy:layers=2", plan["microbatch_size"] * 2, plan=plan)


def recvs(result, rank):
    """(start, end) of each message `rank` received, in time order."""
    return sorted((e[3], e[4]) for e in result.raw_events if e[2] == "p2p" and e[1] == "recv" and e[0] == rank)


def test_the_orders_and_posts_of_the_slow_first_stage():
    # The heuristic's orders from the plan's stage times (F = I = W = 2 on stage 0, 1 on stage 1), replayed
    # from compute alone: s0 F0 0-2, F1 2-4, I0 4-6, W0, I1 8-10, W1; s1 F0 2-3, I0 3-4, F1 4-5, I1 5-6.
    # Gradient 0 leaves s1 at 4, the end of s0's F1 (2-4): posted before F1; gradient 1 at 6, the end of
    # s0's I0: before I0. Activation 0 leaves s0 at 2, s1 idle: before F0; activation 1 at 4, the end of s1's
    # I0 (3-4): before I0.
    times = [{"F": 2, "I": 2, "W": 2}, {"F": 1, "I": 1, "W": 1}]
    orders = [" ".join(map(repr, zero_bubble.posted_schedule(s, 2, 2, times=times))) for s in range(2)]
    assert orders == ["F0 PG0 F1 PG1 I0 W0 I1 W1", "PA0 F0 PA1 I0 F1 I1 W0 W1"]


def test_a_planned_zero_bubble_plan_posts_its_receives_early(pinned, monkeypatch):
    # Times in ms, D the crossing of one message (about 7 ms), which the plan's order counts (its "C",
    # `schedule_crossing`), one message at a time over a stage's link: A1, sent at 4, crosses after A0
    # (2..2+D), by 2+2D, so s1 runs W0 in the wait after I0 (4+D); the orders are "F0 F1 PG0 PG1 I0 W0 I1
    # W1" and "PA0 PA1 F0 I0 W0 F1 I1 W1" (s1's replay expects A1 during its F0 at 2+D..3+D). Posted:
    #   s0 F0 0-2 sends A0 (posted by s1 at 0): 2..2+D; F1 2-4 sends A1 (posted at 0), which follows A0
    #   between the two ranks: 2+D..2+2D; s0 posts PG0 and PG1 at 4
    #   s1 F0 2+D..3+D, I0 ..4+D sends G0: 4+D..4+2D; W0, F1 2+2D..3+2D, I1 ..4+2D sends G1: 4+2D..4+3D
    #   s0 I0 4+2D..6+2D, W0 ..8+2D, I1 4+3D..6+3D, W1 ..8+3D: the step
    # Each receive as its pass begins (the same orders without posts): s1 asks for A1 only as F1 begins
    # (5+D): A1 5+D..5+2D, F1, I1 ..7+2D; s0 runs I0 4+2D..6+2D and W0 ..8+2D before asking for G1:
    # G1 8+2D..8+3D, I1, W1 ..12+3D.
    plan = two_stages()
    times = [{"F": 2 * MS, "I": 2 * MS, "W": 2 * MS, "C": D}, {"F": MS, "I": MS, "W": MS}]
    orders = [" ".join(map(repr, zero_bubble.posted_schedule(s, 2, 2, times=times))) for s in range(2)]
    assert orders == ["F0 F1 PG0 PG1 I0 W0 I1 W1", "PA0 PA1 F0 I0 W0 F1 I1 W1"]
    posted = run(plan)
    assert [s for s, _ in recvs(posted, 1)] == pytest.approx([2 * MS, 2 * MS + D], rel=1e-9)
    assert [s for s, _ in recvs(posted, 0)] == pytest.approx([4 * MS + D, 4 * MS + 2 * D], rel=1e-9)
    assert posted.time_s == pytest.approx(8 * MS + 3 * D, rel=1e-9)
    before = run(plan, monkeypatch)
    assert [s for s, _ in recvs(before, 1)] == pytest.approx([2 * MS, 5 * MS + D], rel=1e-9)
    assert [s for s, _ in recvs(before, 0)] == pytest.approx([4 * MS + D, 8 * MS + 2 * D], rel=1e-9)
    assert before.time_s == pytest.approx(12 * MS + 3 * D, rel=1e-9)


def test_a_posted_receive_takes_the_pieces_of_every_sending_replica_at_once(pinned, monkeypatch):
    # Stage 1 is two A100 replicas of one sample each of microbatches of 2: each sends stage 0 its piece of
    # every gradient, and stage 0 joins the two. Posted, both pieces of a gradient are received at once (they
    # cross together, sharing stage 0's NIC in); taken as the pass begins, one after the other.
    plan = two_stages(second=(1, 2), microbatch=2)
    for result, together in ((run(plan), True), (run(plan, monkeypatch), False)):
        got = recvs(result, 0)
        assert len(got) == 4  # two pieces of each of two gradients
        for first, second in (got[:2], got[2:]):
            assert (second[0] < first[1]) is together
        for rank in (1, 2):
            assert len(recvs(result, rank)) == 2  # its piece of each activation

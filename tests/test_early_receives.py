"""Receives posted ahead of the pass that takes them (`strategies/_early_receives.py`, `dist_lib/schedules/timing.py`), as the
Zero Bubble reference implementation places them, checked on hand-derived timelines."""

from __future__ import annotations

import pytest

from dist_lib import simulate

from dist_lib.costs import compute as costs
from strategies import zero_bubble
from dist_lib.schedules.posted import with_posted_receives
from dist_lib.schedules.actions import Action, check_schedule
from strategies._pipeline import run_stage
from strategies._plan import build_plan
from dist_lib.schedules.timing import replay

MS = 1e-3
EQUAL = [{"F": 1, "I": 1, "W": 1}] * 2


@pytest.fixture
def pinned(monkeypatch):
    """F = I = W = 1 ms per stage (one layer each), loss and update free; messages as modelled."""
    monkeypatch.setattr(costs, "forward_time", lambda *a, **k: MS)
    monkeypatch.setattr(costs, "backward_time", lambda *a, **k: 2 * MS)
    monkeypatch.setattr(costs, "backward_input_time", lambda *a, **k: MS)
    monkeypatch.setattr(costs, "backward_weight_time", lambda *a, **k: MS)
    monkeypatch.setattr(costs, "loss_time", lambda *a, **k: 0.0)
    monkeypatch.setattr(costs, "update_time", lambda *a, **k: 0.0)


def actions(text: str) -> list[Action]:
    return [Action(word[:-1], 0, int(word[-1])) for word in text.split()]


def names(order) -> str:
    return " ".join(repr(a) for a in order)


# The greedy rule's orders for p = 2, m = 2 with equal passes (zero_bubble.py's docstring): stage 0 forwards
# both microbatches, then waits for I0's gradient; stage 1 runs I0 before F1, and its W last.
ZB_2x2 = [actions("F0 F1 I0 W0 I1 W1"), actions("F0 I0 F1 I1 W0 W1")]


def test_the_greedy_orders_for_two_stages_and_two_microbatches():
    assert [names(o) for o in zero_bubble.greedy_orders(2, 2, 2)] == [names(o) for o in ZB_2x2]


def test_replay_times_each_pass_from_compute_alone():
    # s1 F0 waits for s0 F0 (ends 1); s0 I0 waits for s1 I0 (ends 3); s1 F1 starts when s1 is free (3),
    # though s0 F1 ended at 2; s0 I1 waits for s1 I1 (ends 5)
    assert replay(ZB_2x2, EQUAL) == [[(0, 1), (1, 2), (3, 4), (4, 5), (5, 6), (6, 7)],
                                     [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)]]


def test_replay_counts_the_crossing_between_stages():
    # "C" = 2 between the stages: s1 F0 waits for activation 0 until 1 + 2 (3-4), I0 4-5; activation 1
    # (sent at 2) is there at 4, s1 is free at 5: F1 5-6, I1 6-7, W0, W1 7-9; s0 I0 waits for gradient 0
    # until 5 + 2 (7-8), W0 8-9, I1 for gradient 1 until 7 + 2 (9-10), W1 10-11. A stage's own F (the
    # last stage's I) and a W cross nothing.
    crossing = [{"F": 1, "I": 1, "W": 1, "C": 2}] * 2
    assert replay(ZB_2x2, crossing) == [[(0, 1), (1, 2), (7, 8), (8, 9), (9, 10), (10, 11)],
                                        [(3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9)]]
    assert replay([actions("F0 I0 W0")], [{"F": 1, "I": 1, "W": 1, "C": 5}]) == [[(0, 1), (1, 2), (2, 3)]]


def test_replay_sends_a_stage_s_outputs_one_at_a_time():
    # "C" = 3, longer than a pass: s0 sends A0 at 1 (there at 4) and A1 at 2, which crosses after A0:
    # 4..7, not 2..5. s1 F0 4-5, I0 5-6 sends G0 (6..9), F1 waits for A1 until 7 (7-8), I1 8-9 sends G1
    # after G0 (9..12), W0 9-10, W1 10-11; s0 I0 waits for G0 until 9 (9-10), W0 10-11, I1 for G1 until
    # 12 (12-13), W1 13-14.
    slow = [{"F": 1, "I": 1, "W": 1, "C": 3}] * 2
    assert replay(ZB_2x2, slow) == [[(0, 1), (1, 2), (9, 10), (10, 11), (12, 13), (13, 14)],
                                    [(4, 5), (5, 6), (7, 8), (8, 9), (9, 10), (10, 11)]]


def test_replay_does_not_care_which_rule_made_the_orders():
    # 1F1B with B = 2F on stage 1: s1 F0 1-3, B0 3-5, F1 5-7, B1 7-9; s0 B0 5-6, B1 9-10
    orders = [actions("F0 F1 B0 B1"), actions("F0 B0 F1 B1")]
    times = [{"F": 1, "B": 1}, {"F": 2, "B": 2}]
    assert replay(orders, times) == [[(0, 1), (1, 2), (5, 6), (9, 10)], [(1, 3), (3, 5), (5, 7), (7, 9)]]
    # activation 1 leaves stage 0 at 2, during stage 1's F0 (1-3): posted before F0; gradient 0 leaves at 5,
    # when stage 0 is idle (2-5): posted before its next pass, B0; gradient 1 at 9, idle again: before B1
    assert [names(o) for o in with_posted_receives(orders, times)] == [
        "F0 F1 PG0 B0 PG1 B1", "PA0 PA1 F0 B0 F1 B1"]


def test_a_stage_that_hands_itself_its_input_posts_nothing():
    # one stage, two chunks: the chunk-0 forward's output stays on the rank
    orders = [[Action("F", 0, 0), Action("F", 1, 0), Action("B", 1, 0), Action("B", 0, 0)]]
    assert with_posted_receives(orders, [{"F": 1, "B": 2}]) == orders


def test_replay_refuses_orders_that_wait_forever():
    # stage 0's I1 needs stage 1's I1, which needs its F1, which needs stage 0's F1, after I1
    with pytest.raises(ValueError, match=r"stage 0 waits forever at I1 \(position 2\)"):
        replay([actions("F0 I0 I1 F1 W0 W1"), actions("F0 I0 F1 I1 W0 W1")], EQUAL)
    with pytest.raises(ValueError, match="stage 0 has RA0, which a compute-only replay cannot time"):
        replay([[Action("RA", 0, 0)]], [{}])


def test_receives_are_posted_where_the_reference_posts_them():
    # s1: activation 0 leaves s0 at 1, when s1 is idle: before F0 (1-2); activation 1 leaves at 2, the end of
    # F0, which the reference counts as within it (recv time <= completion time): before F0 too.
    # s0: gradient 0 leaves s1 at 3, s0 idle (2-3): before I0; gradient 1 at 5, the end of W0 (4-5): before W0
    posted = with_posted_receives(ZB_2x2, EQUAL)
    assert [names(o) for o in posted] == ["F0 F1 PG0 I0 PG1 W0 I1 W1", "PA0 PA1 F0 I0 F1 I1 W0 W1"]
    for order in posted:
        check_schedule(order, 1, 2)


def test_check_schedule_takes_each_posted_receive_once_before_its_pass():
    with pytest.raises(ValueError, match="PA1 posted twice"):
        check_schedule(actions("PA0 PA1 PA1 F0 I0 F1 I1 W0 W1"), 1, 2)
    with pytest.raises(ValueError, match="PA1 after F for chunk 0 microbatch 1: a receive is posted before"):
        check_schedule(actions("PA0 F0 I0 F1 PA1 I1 W0 W1"), 1, 2)
    with pytest.raises(ValueError, match="PG0 after FI for chunk 0 microbatch 0"):
        check_schedule(actions("F0 F1 I0 PG0 W0 PG1 I1 W1"), 1, 2)
    with pytest.raises(ValueError, match="microbatch 1 takes its activation without a posted receive"):
        check_schedule(actions("PA0 F0 I0 F1 I1 W0 W1"), 1, 2)
    with pytest.raises(ValueError, match="PA2 posts a receive that no pass takes"):
        check_schedule(actions("PA0 PA1 PA2 F0 I0 F1 I1 W0 W1"), 1, 2)
    with pytest.raises(ValueError, match="PG1 posts a receive that no pass takes"):
        check_schedule(actions("PG1 F0 B0"), 1, 1)
    with pytest.raises(ValueError, match="unknown action kind 'X'"):
        check_schedule(actions("X0 F0 I0 W0"), 1, 1)


SLOW = "2x1xA100-80GB:nics=1x0.3"  # two nodes, one GPU each, a 0.3 GB/s NIC (IB latency 14 us)
D = 14e-6 + 2 ** 21 / 0.3e9  # one toy activation or gradient (s * h * 2 bytes = 2 MiB) crossing alone


async def late_receives(model):
    """zero_bubble as it was: the same orders, each pass receiving its input when it begins."""
    plan = build_plan(model, zero_bubble.schedule, microbatch_size=1, pp=2)
    await run_stage(model, plan)


def recvs(result, rank):
    return sorted((e for e in result.raw_events if e[2] == "p2p" and e[1] == "recv" and e[0] == rank),
                  key=lambda e: e[3])


def test_the_gradient_crossing_overlaps_w_on_a_slow_link(pinned):
    # Each message takes D (about 7 ms) alone; F = I = W = 1 ms. The replay that orders the passes and
    # places the posts counts D per crossing (the plan's "C"), one message at a time over a stage's link:
    # s0 sends A0 at 1 (..1+D) and A1 at 2, which crosses after it (..1+2D); s1 F0 1+D..2+D, I0 ..3+D, and
    # W0 fits in the wait for A1, so s1 runs F0 I0 W0 F1 I1 W1 (s0: F0 F1 I0 W0 I1 W1). s0's I0 waits for
    # gradient 0 until 3+2D, so gradient 1 (sent at 3+2D, before I0's predicted end 4+2D) is posted
    # before I0 too. Simulated (times in ms, F = 1):
    #   s0 F0 0-1, F1 1-2; A0 crosses 1..1+D, A1 1+D..1+2D (the channel is free then; both were posted at 0)
    #   s1 F0 1+D..2+D, I0 ..3+D (G0 sent), W0 ..4+D, F1 1+2D..2+2D, I1 ..3+2D (G1 sent), W1 ..4+2D
    #   s0: G0 3+D..3+2D, I0 3+2D..4+2D, W0 ..5+2D; G1, posted at 2, crosses 3+2D..3+3D, during I0 and W0;
    #   I1 3+3D..4+3D, W1 ..5+3D
    # Late receives: s1 posts A1 only when F1 begins (4+D): F1 4+2D.., I1 ..6+2D sends G1; s0 runs W0
    # 4+2D..5+2D before posting G1's receive: G1 6+2D..6+3D, I1, W1 ..8+3D; three passes later.
    new = simulate(zero_bubble.train, SLOW, "toy:layers=2", 2)
    old = simulate(late_receives, SLOW, "toy:layers=2", 2)
    assert new.time_s == pytest.approx(5 * MS + 3 * D, rel=1e-9)
    assert old.time_s == pytest.approx(8 * MS + 3 * D, rel=1e-9)
    assert {e[7] for e in new.raw_events if e[2] == "p2p"} == {2 ** 21}
    # a crossing starts when both ends are posted (rendezvous): its start is the later post
    assert [e[3] for e in recvs(new, 0)] == pytest.approx([3 * MS + D, 3 * MS + 2 * D], rel=1e-9)
    assert [e[3] for e in recvs(old, 0)] == pytest.approx([3 * MS + D, 6 * MS + 2 * D], rel=1e-9)
    assert [e[3] for e in recvs(new, 1)] == pytest.approx([1 * MS, 1 * MS + D], rel=1e-9)
    assert [e[3] for e in recvs(old, 1)] == pytest.approx([1 * MS, 4 * MS + D], rel=1e-9)
    for stage in range(2):
        assert [f"{a.kind}{a.mb}" for a in zero_bubble.posted_schedule(
            stage, 2, 2, times=[{"F": MS, "I": MS, "W": MS, "C": D}] * 2)] == [
            "F0 F1 PG0 PG1 I0 W0 I1 W1", "PA0 PA1 F0 I0 W0 F1 I1 W1"][stage].split()


def test_the_plan_gives_the_crossing_the_simulator_charges(pinned):
    """`build_plan` hands a cost-aware schedule each boundary's "C": one microbatch's message alone on the
    link, D on the slow NIC; the last stage has no boundary after it (one chunk)."""
    seen = []

    def spy(stage, stages, microbatches, chunks, times=None):
        seen.append(times)
        return zero_bubble.schedule(stage, stages, microbatches, chunks, times)

    async def run(model):
        build_plan(model, spy, microbatch_size=1, pp=2)
        raise RuntimeError("planned")  # the step itself is not needed

    with pytest.raises(Exception, match="planned"):
        simulate(run, SLOW, "toy:layers=2", 2)
    assert seen  # (the first rank's error ends the run)
    for times in seen:
        assert times[0]["C"] == pytest.approx(D, rel=1e-12)
        assert "C" not in times[1]


def test_every_microbatch_is_received_once_per_direction(pinned):
    p, m = 4, 8
    result = simulate(zero_bubble.train, "4x1xA100-80GB:nics=1x0.3", f"toy:layers={p}", m)
    for rank in range(p):
        taken = [(e[5], e[6]) for e in recvs(result, rank)]
        expected = m * ((rank > 0) + (rank < p - 1))  # activations from the left, gradients from the right
        assert len(taken) == len(set(taken)) == expected
    for stage in range(p):
        order = zero_bubble.posted_schedule(stage, p, m, times=[{"F": MS, "I": MS, "W": MS}] * p)
        check_schedule(order, 1, m)
        assert sum(a.kind in ("PA", "PG") for a in order) == m * ((stage > 0) + (stage < p - 1))


def test_neighbours_that_disagree_still_fail_with_the_existing_message(pinned, monkeypatch):
    # stage 1 posts microbatch 1's receive first: it gets activation 0, which F1 does not expect
    def swapped(stage, stages, microbatches, chunks=1, times=None, max_in_flight=None, *options):
        order = zero_bubble.schedule(stage, stages, microbatches, chunks, times, max_in_flight, *options)
        return actions("PA1 PA0") + order if stage == 1 else order

    monkeypatch.setattr(zero_bubble, "posted_schedule", swapped)
    with pytest.raises(Exception, match="rank 1: expected the activation of layer 1 for samples 0..0 from rank 0, "
                                        r"got .*the schedules of neighbouring stages disagree"):
        simulate(zero_bubble.train, SLOW, "toy:layers=2", 2)


def test_a_plain_stage_refuses_posted_receives(pinned):
    async def plain(model):
        await run_stage(model, build_plan(model, zero_bubble.posted_schedule, microbatch_size=1, pp=2))

    with pytest.raises(Exception, match=r"rank \d: the schedule posts a receive \(P[AG]0\); run it with run_posted_stage"):
        simulate(plain, SLOW, "toy:layers=2", 2)

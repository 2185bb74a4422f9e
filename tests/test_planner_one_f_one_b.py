"""The estimate's 1F1B pipeline (`playout.one_f_one_b_pipeline`): a slowest stage that is not the last
runs its warm-up forwards while the first microbatch goes through the later stages and back, and its
cool-down backwards while the last one does; steps timed by hand, and the estimate beside the simulator."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, Workload
from dist_lib.planner.evaluate import run_plan
from dist_lib.planner.step import step_estimate
from dist_lib.planner.playout import one_f_one_b_pipeline
from dist_lib.planner.search import to_plan
from dist_lib.planner.stage_space import StageSpace


def closed_form(entries, exits, m):
    cycles = [f + b for f, b in zip(entries, exits)]
    return sum(cycles) + (m - 1) * max(cycles)


def test_two_stages_two_microbatches_the_second_forward_hides_the_round_trip():
    """p = m = 2, stage 0 slow (F 10, B 30), stage 1 fast (F 1, B 2). Stage 0 runs F1 0-10, F2 10-20;
    stage 1 F1 10-11, B1 11-13; stage 0 B1 waits only for its own F2: 20-50, B2 50-80. The closed form
    adds stage 1's 3 to stage 0's two microbatches: 83."""
    assert one_f_one_b_pipeline([10.0, 1.0], [30.0, 2.0], 0.0, 2) == pytest.approx(80.0)
    assert closed_form([10.0, 1.0], [30.0, 2.0], 2) == pytest.approx(83.0)


def test_a_round_trip_longer_than_a_forward_shows_at_both_ends():
    """p = 2, m = 4, stage 0 F 10 B 10, stage 1 F 8 B 8 (round trip 16). By hand: stage 0 F1 0-10,
    F2 10-20; stage 1 F1 10-18, B1 18-26; stage 0 B1 26-36 (6 idle), F3 36-46; stage 1 F2 26-34, B2
    34-42; stage 0 B2 46-56, F4 56-66; stage 1 F3 46-54, B3 54-62; stage 0 B3 66-76; stage 1 F4
    66-74, B4 74-82; stage 0 B4 82-92 (6 idle). 4 x 20 + 6 + 6 = 92, not the closed form's 96."""
    assert one_f_one_b_pipeline([10.0, 8.0], [10.0, 8.0], 0.0, 4) == pytest.approx(92.0)
    assert closed_form([10.0, 8.0], [10.0, 8.0], 4) == pytest.approx(96.0)


def test_a_slower_last_stage_paces_and_alike_stages_keep_the_closed_form():
    """p = m = 2, stage 0 F 10 B 30, stage 1 F 15 B 20 (35 a microbatch): stage 1 F1 10-25, B1 25-45,
    F2 45-60, B2 60-80; stage 0 F2 10-20, B1 45-75, B2 80-110: the path through stage 1, stage 0's
    forward, stage 1's two microbatches and stage 0's last backward, 10 + 70 + 30 = 110 (closed form
    115). Alike stages give the closed form, (m + p - 1) x (F + B); a loop slower than every stage
    paces the steady state, the sum of the stage times and (m - 1) x the loop's pace."""
    assert one_f_one_b_pipeline([10.0, 15.0], [30.0, 20.0], 0.0, 2) == pytest.approx(110.0)
    for p, m in ((2, 2), (3, 5), (4, 4), (4, 9)):
        assert one_f_one_b_pipeline([2.0] * p, [3.0] * p, 0.0, m) == pytest.approx((m + p - 1) * 5.0)
    assert one_f_one_b_pipeline([2.0] * 2, [3.0] * 2, 9.0, 3) == pytest.approx(10.0 + 2 * 9.0)


def test_the_estimate_of_a_slow_first_stage_of_two_microbatches_is_the_simulated_step():
    """gpt-350m, a T4 node's 4 replicas with 6 layers, then an A100 and a V100 node's 8 with 18, 2
    microbatches of 16, full recompute. The T4 stage's forward takes 6 x 23.95 = 143.7 ms and runs
    twice before its first backward, while the first microbatch crosses, runs 18 layers and the loss
    on a V100 (about 260 ms) and crosses back: the T4 stage idles from 287.5 to about 420 ms, not for
    the whole 276 ms of the later stage's time the closed form counted (1398 ms, 11.4 % over)."""
    workload = Workload.load("gpt-350m")
    cluster = Cluster.load("1x4xA100-80GB+1x4xV100-32GB+1x4xT4:nics=1x6.25")
    space = StageSpace(cluster, workload)
    placed = [(n, {o.tp: o for o in space.options(ranks, 16, "full", 0)}[1])
              for ranks, n in ((tuple(range(8, 12)), 6), (tuple(range(8)), 18))]
    seconds, _ = step_estimate(cluster, workload, placed, 2, "1f1b", 1)
    simulated = run_plan(cluster, workload, 32, to_plan(placed, 16, 2, "1f1b", "full", 0, 1)).time_s
    assert simulated == pytest.approx(1.2547, rel=1e-3)
    assert seconds == pytest.approx(simulated, rel=2e-3)

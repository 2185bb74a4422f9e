"""The estimate's play-out of interleaved 1F1B (`dist_lib/planner/playout.py`): the order of each stage's
chunk passes, a step timed by hand, and the estimate it gives beside the simulator."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, Workload
from dist_lib.planner.playout import interleaved_order, play_interleaved


@pytest.mark.parametrize("stages,microbatches,chunks", [(2, 2, 2), (2, 6, 2), (3, 3, 2), (4, 8, 2), (4, 4, 3),
                                                        (8, 8, 2), (8, 24, 4)])
def test_the_play_outs_order_is_the_one_the_interleaved_strategy_issues(stages, microbatches, chunks):
    from strategies.interleaved import schedule
    for stage in range(stages):
        expected = [(a.kind == "B", a.chunk, a.mb) for a in schedule(stage, stages, microbatches, chunks)]
        assert list(interleaved_order(stage, stages, microbatches, chunks)) == expected


def test_two_stages_two_chunks_two_microbatches_played_out_by_hand():
    """p = 2, v = 2, m = 2; virtual stage j = c p + s. Stage 0 warms up with all four forwards (warm-up
    min((p - 1) 2 + (v - 1) p, m v) = 4): F00 F01 F10 F11 B10 B11 B00 B01 (F<chunk><microbatch>); stage
    1 with two: F00 F01 F10 B10 F11 B11 B00 B01. Every forward takes F, every backward B, every crossing
    c (a received pass starts at max(stage free, sender's end) + c). By hand, the pass ends:
        s1 F00 2F+c, s1 F01 3F+2c, s0 F10 3F+2c, s0 F11 4F+3c, s1 F10 4F+3c, s1 B10 4F+3c+B,
        s0 B10 4F+4c+2B, s1 F11 5F+4c+B, s1 B11 5F+4c+2B, s0 B11 5F+5c+3B, s1 B00 5F+5c+3B,
        s1 B01 5F+6c+4B, s0 B00 5F+6c+4B, s0 B01 5F+7c+5B.
    Stage 0's last backward ends at 5F + 5B + 7c; with c = 0 that is the closed form's
    (m - 1) x 2(F + B) + 2(F + B) + 2(F + B) / v = 5(F + B)."""
    F, B, c = 1.0, 2.0, 0.25
    assert play_interleaved([F] * 4, [B] * 4, [c] * 4, [c] * 4, 2, 2) == pytest.approx(5 * F + 5 * B + 7 * c)
    assert play_interleaved([F] * 4, [B] * 4, [0.0] * 4, [0.0] * 4, 2, 2) == pytest.approx(5 * (F + B))
    # the last virtual stage's forward (one layer and the loss) F' > F: from s1 F10 on, each pass of it
    # paces the rest: s1 F10 ends 3F+3c+F', s1 B10 3F+3c+F'+B, s0 B10 3F+4c+F'+2B, s1 F11 3F+4c+2F'+B,
    # s1 B11 3F+4c+2F'+2B, then as above with 5F -> 3F + 2F': 3F + 2F' + 5B + 7c
    heavy = 3.0
    assert play_interleaved([F, F, F, heavy], [B] * 4, [c] * 4, [c] * 4, 2, 2) == \
        pytest.approx(3 * F + 2 * heavy + 5 * B + 7 * c)


def test_a_wrong_shape_is_refused_in_one_line():
    with pytest.raises(ValueError, match="microbatches a multiple of the stages"):
        play_interleaved([1.0] * 4, [1.0] * 4, [0.0] * 4, [0.0] * 4, 2, 3)


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_the_estimate_plays_out_the_last_chunks_loss_as_the_simulator_runs_it(recompute):
    """Two T4 stages of 4 and 2 layers (of a T4 + V100-16GB cluster), m = p = 2, interleaved: the last
    stage's second chunk runs one layer and the LM head, which outweighs the two layers beside it. The
    closed form with the virtual-pipeline bound was 8.3 % (full recompute) and 8.0 % (selective) under the
    simulation; the play-out of the passes in the strategy's order gives the simulator's step."""
    from dist_lib.planner.evaluate import simulate_candidate
    from dist_lib.planner.step import _virtual_bound, steady_crossings, step_estimate
    from dist_lib.planner.search import Candidate, to_plan
    from dist_lib.planner.stage_space import StageSpace
    cluster, workload = Cluster.load("1x2xT4+1x1xV100-16GB"), Workload.load("gpt-350m:layers=6")
    sp = StageSpace(cluster, workload)
    placed = [(4, sp.options((0,), 6, recompute, 0)[0]), (2, sp.options((1,), 6, recompute, 0)[0])]
    seconds, memory = step_estimate(cluster, workload, placed, 2, "interleaved", 2)
    ran = simulate_candidate(cluster, workload, 12, Candidate(to_plan(placed, 6, 2, "interleaved", recompute, 0, 2),
                                                              seconds, memory, 0.0))
    assert seconds == pytest.approx(ran.simulated, rel=1e-6)
    # the virtual pipeline's bound is a lower bound of the play-out
    assert _virtual_bound(placed, 2, 2, steady_crossings(cluster, workload, placed, [(0, 1, 2), (1, 0, 1)])) < seconds

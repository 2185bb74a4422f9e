"""The crossing time ZB-H1 orders a plan by (`dist_lib.planner.messages.schedule_crossing`): one figure per
stage boundary that the planner's play-out and `strategies/planned.py` both count, so that the plan runs
the order the estimate played out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dist_lib import Cluster, Workload
from dist_lib.planner import contention, step
from dist_lib.planner.evaluate import run_plan
from dist_lib.planner.messages import schedule_crossing
from dist_lib.planner.plan import Stage
from dist_lib.planner.search import to_plan
from dist_lib.planner.stage_space import StageSpace
from strategies import planned
from strategies._plan import crossing_time

SAMPLE = 2048 * 1024 * 2  # gpt-350m: one sample's activation, s x h 16-bit values
NIC_LATENCY = 14e-6  # a NIC's alpha (hardware/cluster.py)


def _stage(ranks, tp, shares) -> Stage:
    return Stage(tuple(ranks), tp, ((0, 1),), tuple(shares))


def test_between_one_replica_stages_of_one_tp_degree_it_is_zero_bubbles_own_figure():
    """Two stages of one TP-2 replica on two nodes: each TP rank sends its half of the activation alone on
    the NIC, `_plan.crossing_time` as `zero_bubble` counts it."""
    cluster, workload = Cluster.load("2x2xV100-32GB:nics=1x0.3"), Workload.load("gpt-350m:layers=2")
    got = schedule_crossing(cluster, workload, _stage((0, 1), 2, (4,)), _stage((2, 3), 2, (4,)))
    assert got == crossing_time(SimpleNamespace(cluster=cluster, workload=workload), 0, 2, 4, 2)
    assert got == pytest.approx(NIC_LATENCY + 4 * SAMPLE / 2 / 0.3e9, rel=1e-12)


def test_between_stages_of_different_widths_it_is_the_slowest_message_alone():
    """Stage a: two one-GPU replicas of one sample each on an A100 node (1.25 GB/s NIC); stage b: a V100
    node of a 0.3 GB/s NIC and one of a 5 GB/s NIC, one sample each. Each message is one sample: a[0] to
    b[0] crosses the 0.3 GB/s NIC (the slowest), a[1] to b[1] the 1.25 GB/s one. Between a TP-2 replica
    and a TP-1 one the messages go whole: two samples over the 0.3 GB/s NIC, the gradient from the one
    rank to both TP ranks."""
    cluster = Cluster.load("1x2xA100-80GB:nics=1x1.25+1x1xV100-32GB:nics=1x0.3+1x1xV100-32GB:nics=1x5")
    workload = Workload.load("gpt-350m:layers=2")
    a, b = _stage((0, 1), 1, (1, 1)), _stage((2, 3), 1, (1, 1))
    assert schedule_crossing(cluster, workload, a, b) == pytest.approx(NIC_LATENCY + SAMPLE / 0.3e9, rel=1e-12)
    assert schedule_crossing(cluster, workload, b, a) == schedule_crossing(cluster, workload, a, b)
    whole = schedule_crossing(cluster, workload, _stage((0, 1), 2, (2,)), _stage((2,), 1, (2,)))
    assert whole == pytest.approx(NIC_LATENCY + 2 * SAMPLE / 0.3e9, rel=1e-12)


def test_counting_the_crossing_changes_the_order_and_the_estimate_is_the_simulated_step(monkeypatch):
    """gpt-350m of 2 layers on two one-GPU V100 nodes of a 0.1 GB/s NIC, a layer a stage, 4 microbatches
    of 2 (ZB-H1 holds at most p = 2 microbatches awaiting W). A crossing is C = alpha + 2 samples / 0.1
    GB/s = 83.9 ms; stage 0's passes take f0, i0, w0, stage 1's f1 (with the loss), i1. Stage 0 sends A0
    at f0 and A1 at 2 f0; over its one link A1 crosses after A0 and arrives at f0 + 2C, while stage 1 is
    free after F0 and I0 at f0 + C + f1 + i1: a wait of C + f0 - f1 - i1, about 55 ms, in which W0 fits,
    and so on for each microbatch: stage 1 runs each W right after its I. Counted as free, the crossing
    leaves no wait, and W1 runs only when memory needs it, after I2. The planner's play-out counts the
    crossing as planned.py does, so the estimate is the simulated step; the order that counts it is also
    the faster here (507.2 against 516.8 ms)."""
    cluster, workload = Cluster.load("2x1xV100-32GB:nics=1x0.1"), Workload.load("gpt-350m:layers=2")
    space = StageSpace(cluster, workload)
    placed = [(1, space.options((r,), 2, "none", 0)[0]) for r in range(2)]
    c = NIC_LATENCY + 2 * SAMPLE / 0.1e9
    assert schedule_crossing(cluster, workload, placed[0][1], placed[1][1]) == pytest.approx(c, rel=1e-12)

    seen = {}

    def spy(seconds, m):
        seen["seconds"] = [dict(t) for t in seconds]
        seen["orders"] = found = contention.zero_bubble_posted(seconds, m)
        return found

    monkeypatch.setattr(step, "zero_bubble_posted", spy)
    estimate, _ = step.step_estimate(cluster, workload, placed, 4, "zero-bubble", 1)
    (s0, s1), orders = seen["seconds"], seen["orders"][0]
    assert s0["C"] == pytest.approx(c, rel=1e-12) and "C" not in s1
    assert c + s0["F"] - s1["F"] - s1["I"] > s1["W"]
    counted = [("F", 0), ("I", 0), ("W", 0), ("F", 1), ("I", 1), ("W", 1), ("F", 2), ("I", 2), ("W", 2),
               ("F", 3), ("I", 3), ("W", 3)]
    free = [("F", 0), ("I", 0), ("F", 1), ("I", 1), ("W", 0), ("F", 2), ("I", 2), ("W", 1), ("F", 3),
            ("I", 3), ("W", 2), ("W", 3)]
    assert list(orders[1]) == counted
    assert contention.zero_bubble_orders(*([t[k] for t in (s0, s1)] for k in "FIW"), 4)[1] == free
    plan = to_plan(placed, 2, 4, "zero-bubble", "none", 0)
    simulated = run_plan(cluster, workload, 8, plan).time_s
    assert estimate == pytest.approx(simulated, rel=1e-9)
    assert simulated * 1e3 == pytest.approx(507.16, abs=0.01)
    monkeypatch.setattr(planned, "schedule_crossing", lambda *a: 0.0)  # planned.py as it ran before
    assert run_plan(cluster, workload, 8, plan).time_s * 1e3 == pytest.approx(516.77, abs=0.01)

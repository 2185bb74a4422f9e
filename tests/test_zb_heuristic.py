"""Zero Bubble's heuristic order (`dist_lib/schedules/zero_bubble.py`, via `zero_bubble.greedy_orders`):
ZB-H1's step at ZB-H1's memory, never 1F1B's bubble exceeded, memory and order always valid, crossing
times counted as the reference counts them."""

from __future__ import annotations

import hashlib
import random

import pytest

from dist_lib.schedules.actions import check_schedule
from dist_lib.schedules.zero_bubble import zb_orders
from dist_lib.schedules.one_f_one_b import schedule as one_f_one_b
from strategies.zero_bubble import greedy_orders

ONE = {"F": 1, "I": 1, "W": 1}


def _makespan(orders: list, times: list[dict], comm: list[float] | None = None) -> float:
    """The step of `orders` (actions or (kind, mb) pairs) with stage s's passes taking `times[s]`, each
    pass's dependencies (F from the stage before, I from the stage after or the last stage's F, W after
    its I) and an output for another stage crossing `comm[boundary]` after its pass ends and after the
    stage's earlier outputs have crossed, one at a time (default 0: free messages). A whole backward B
    (1F1B's) is an I that takes I + W."""
    p, end, clock, at = len(orders), {}, [0.0] * len(orders), [0] * len(orders)
    arrives, link_free = {}, [0.0] * len(orders)
    while any(at[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while at[s] < len(orders[s]):
                kind, mb = orders[s][at[s]][0], orders[s][at[s]][-1]
                took = times[s]["I"] + times[s]["W"] if kind == "B" else times[s][kind]
                kind = "I" if kind == "B" else kind
                need = ((s - 1, "F") if s else None) if kind == "F" else \
                    ((s + 1, "I") if s < p - 1 else (s, "F")) if kind == "I" else (s, "I")
                if need is not None and (need[0], need[1], mb) not in end:
                    break
                ready = 0.0 if need is None else \
                    end[(need[0], need[1], mb)] if need[0] == s else arrives[(need[0], need[1], mb)]
                clock[s] = end[(s, kind, mb)] = max(clock[s], ready) + took
                to = s + 1 if kind == "F" and s < p - 1 else s - 1 if kind == "I" and s else None
                if to is not None:
                    link_free[s] = max(clock[s], link_free[s]) + (comm[min(s, to)] if comm else 0.0)
                    arrives[(s, kind, mb)] = link_free[s]
                at[s] += 1
                moved = True
        assert moved, "the orders deadlock"
    return max(clock)


def _1f1b(p: int, m: int) -> list:
    """1F1B's orders (`strategies/one_f_one_b.py`): its bubble is (p - 1)(F + I + W)."""
    return [one_f_one_b(s, p, m) for s in range(p)]


def _awaiting_w(order) -> int:
    """The most microbatches of one stage's order that have run F but not yet W at any point."""
    held = most = 0
    for a in order:
        held += (a.kind == "F") - (a.kind == "W")
        most = max(most, held)
    return most


@pytest.mark.parametrize("p, m", [(2, 2), (4, 4), (4, 8), (8, 8), (8, 24), (16, 64), (32, 96)])
def test_equal_passes_at_zb_h1_memory_take_zb_h1s_step(p, m):
    """F = I = W = 1, m >= p: the handcrafted ZB-H1 takes 3m + p - 1 (Qi et al. 2024, sec. 3.1), 1F1B
    3m + 3(p - 1). 3m + p - 1 is also a floor for any order: the last stage's first F starts at p - 1 and
    it then runs 3m passes. So both memories give exactly it."""
    times = [ONE] * p
    assert _makespan(_1f1b(p, m), times) == 3 * m + 3 * (p - 1)
    for limit in (p, 2 * p - 1):
        orders = greedy_orders(p, m, limit)
        assert _makespan(orders, times) == 3 * m + p - 1
        assert max(map(_awaiting_w, orders)) <= limit


def test_the_first_stage_of_zb_h1_by_hand():
    """p = 4, m = 8, F = I = W = 1: stage 0 runs its 4 warm-up Fs (0..4); microbatch 0's gradient reaches
    it at 7 (F0 on stage 3 ends at 4, then I0 on stages 3, 2, 1 end at 5, 6, 7), so it fills 4..7 with
    nothing it may run (memory is full: 4 awaiting W, none of them past I). From then on F and I take
    turns, a W before each F to make room (stage 0's F never waits for input), the last W at the end."""
    stage0 = [f"{a.kind}{a.mb}" for a in greedy_orders(4, 8, 4)[0]]
    assert stage0 == ["F0", "F1", "F2", "F3", "I0", "W0", "F4", "I1", "W1", "F5", "I2", "W2", "F6", "I3", "W3",
                      "F7", "I4", "W4", "I5", "W5", "I6", "W6", "I7", "W7"]


def test_unequal_passes_never_take_longer_than_1f1b_and_stay_valid():
    """Random per-stage times and memories: the order is never slower than 1F1B's with the same times
    (whenever memory holds 1F1B's min(m, p) microbatches), never holds more than `limit` microbatches
    awaiting W, and every stage's order is a valid schedule."""
    rng = random.Random(11)
    for trial in range(400):
        p, m = rng.randint(1, 9), rng.randint(1, 20)
        pick = (lambda: rng.choice([0.5, 1.0, 2.0])) if trial % 2 else (lambda: rng.uniform(0.1, 3.0))
        times = [{"F": pick(), "I": pick(), "W": pick()} for _ in range(p)]
        limit = rng.choice([1, max(1, p - 1), p, p + 1, 2 * p - 1])
        orders = greedy_orders(p, m, limit, times)
        for order in orders:
            check_schedule(order, 1, m)
            assert _awaiting_w(order) <= limit
        if limit >= min(m, p):
            assert _makespan(orders, times) <= _makespan(_1f1b(p, m), times) * (1 + 1e-12)


def test_every_rank_gets_its_own_copy_of_the_pipelines_orders():
    """`schedule` works the orders out once per pipeline (each rank asks): a rank's list is its own, and
    an unhashable or invalid `max_in_flight` is refused by name, not by a cache's TypeError."""
    from strategies.zero_bubble import schedule

    first = schedule(0, 4, 8)
    first.clear()
    assert [f"{a.kind}{a.mb}" for a in schedule(0, 4, 8)][:6] == ["F0", "F1", "F2", "F3", "I0", "W0"]
    for bad in ([4], 0, True):
        with pytest.raises(ValueError, match="max_in_flight"):
            schedule(0, 4, 8, max_in_flight=bad)


def _names(orders) -> list[str]:
    return [" ".join(f"{a.kind}{a.mb}" for a in order) for order in orders]


def test_a_slow_crossing_by_hand():
    """p = 2, m = 4, limit 4, F = I = W = 1, a crossing of c = 2 each way. Compute-only, microbatch 0's
    gradient is back at stage 0 at 3 (s1 F0 1-2, I0 2-3): two warm-up Fs fit after F0 (1-2, 2-3), then
    I0, F3, W0. With the crossing it is back at 7 (s1 F0 3-4, I0 4-5, + 2), so every F fits first
    (0-4). Stage 1 then never waits after its first F (A1..A3 arrive at 4, 5, 6, while it is busy):
    F0 3-4, I0, F1, I1, F2, I2, F3, I3 4-11, W0..W3 11-15; stage 0's I0 7-8, W0, I1 (G1 sent 7, here 9)
    9-10, W1, I2 11-12, W2, I3 13-14, W3 14-15: 15, the floor (stage 1 starts at F + c = 3 and runs 3m
    passes). The compute-only order under the same crossings: stage 0 sends F3 only at 9 (after I0
    7-8 and F3 8-9), stage 1 idles 10-11 for it, I3 ends at 13, stage 0's I3 15-16, W3 16-17: 17.
    1F1B (B = I + W = 2): s0 F0, F1 0-2; s1 F0 3-4, B0 4-6, F1 6-7, B1 7-9; s0 B0 8-10, F2 10-11,
    B1 11-13, F3 13-14; s1 F2 13-14, B2 14-16, F3 16-17, B3 17-19; s0 B2 18-20, B3 21-23: 23."""
    times, comm = [ONE] * 2, [2.0]
    plain = greedy_orders(2, 4, 4)
    aware = greedy_orders(2, 4, 4, [dict(ONE, C=2.0), dict(ONE, C=7.0)])  # the last stage's "C" is not used
    assert _names(plain) == ["F0 F1 F2 I0 F3 W0 I1 W1 I2 W2 I3 W3", "F0 I0 F1 I1 F2 I2 F3 I3 W0 W1 W2 W3"]
    assert _names(aware) == ["F0 F1 F2 F3 I0 W0 I1 W1 I2 W2 I3 W3", "F0 I0 F1 I1 F2 I2 F3 I3 W0 W1 W2 W3"]
    assert _makespan(aware, times, comm) == 15
    assert _makespan(plain, times, comm) == 17
    assert _makespan(_1f1b(2, 4), times, comm) == 23
    assert _makespan(plain, times) == 3 * 4 + 2 - 1  # compute-only, the plain order is ZB-H1's


# The orders the heuristic gave before it took crossing times (300 random cases below, hashed): with all
# crossings 0 it must give exactly these, and the planner's twin (no `comm`) relies on it.
COMPUTE_ONLY_ORDERS = "ab7736056dddb37b3250100c00dcb9957e7c0cb5250ea14e4c13cbfb05dffd62"


def test_zero_crossings_give_the_compute_only_orders_exactly():
    rng, digest = random.Random(2024), hashlib.sha256()
    for trial in range(300):
        p, m = rng.randint(1, 8), rng.randint(1, 16)
        pick = (lambda: rng.choice([0.5, 1.0, 2.0])) if trial % 2 else (lambda: rng.uniform(0.1, 3.0))
        f, i, w = ([pick() for _ in range(p)] for _ in range(3))
        limit = rng.choice([1, max(1, p - 1), p, 2 * p - 1])
        orders = zb_orders(f, i, w, m, limit, comm=[0.0] * (p - 1))
        assert orders == zb_orders(f, i, w, m, limit)
        times = [{"F": a, "I": b, "W": c, "C": 0.0} for a, b, c in zip(f, i, w)]
        assert [[(a.kind, a.mb) for a in order] for order in greedy_orders(p, m, limit, times)] == orders
        digest.update(repr(orders).encode())
    assert digest.hexdigest() == COMPUTE_ONLY_ORDERS


def test_with_crossings_never_slower_than_1f1b_and_still_valid():
    """Random pass and crossing times (up to several passes long): the order's step, crossings counted,
    is never longer than 1F1B's with the same crossings when memory holds 1F1B's microbatches."""
    rng = random.Random(5)
    for trial in range(300):
        p, m = rng.randint(2, 8), rng.randint(1, 16)
        pick = (lambda: rng.choice([0.5, 1.0, 2.0])) if trial % 2 else (lambda: rng.uniform(0.1, 3.0))
        times = [{"F": pick(), "I": pick(), "W": pick()} for _ in range(p)]
        comm = [rng.choice([0.0, 0.3, 1.0, 3.0, 8.0]) * rng.random() for _ in range(p - 1)]
        limit = rng.choice([1, max(1, p - 1), p, p + 1, 2 * p - 1])
        orders = greedy_orders(p, m, limit, [dict(t, C=c) for t, c in zip(times, comm + [0.0])])
        for order in orders:
            check_schedule(order, 1, m)
            assert _awaiting_w(order) <= limit
        if limit >= min(m, p):
            assert _makespan(orders, times, comm) <= _makespan(_1f1b(p, m), times, comm) * (1 + 1e-12)


def test_crossing_times_are_checked():
    for bad in ([1.0], [1.0, -1.0, 0.0], [0.0, float("nan"), 0.0], [0.0, "1", 0.0]):
        with pytest.raises(ValueError, match="comm must list 3 crossing times"):
            zb_orders([1] * 4, [1] * 4, [1] * 4, 4, 4, comm=bad)


# ---- the reference runtime's memory count and objective (Qi et al. 2024, Tables 5 and 6) -------------------

# Table 6's profiled F, B (input gradient), W and T_comm in microseconds, with p, m, and h and a of Table 3
# (the rows of the reference's own Table 5 script: megatron/core/pipeline_parallel/efficiency.py, arxiv branch)
TABLE6 = [(8, 24, 18522, 18086, 9337, 601, 2304, 24), (8, 32, 18513, 18086, 9331, 626, 2304, 24),
          (8, 64, 18546, 18097, 9321, 762, 2304, 24), (8, 24, 29718, 29444, 19927, 527, 4096, 32),
          (8, 32, 29802, 29428, 19530, 577, 4096, 32), (8, 64, 29935, 29621, 19388, 535, 4096, 32),
          (16, 48, 11347, 11248, 8132, 377, 5120, 40), (16, 64, 11307, 11254, 8101, 379, 5120, 40),
          (16, 128, 11325, 11308, 8109, 378, 5120, 40), (32, 96, 10419, 10207, 7715, 408, 6144, 48),
          (32, 128, 10408, 10204, 7703, 408, 6144, 48), (32, 256, 10402, 10248, 7698, 460, 6144, 48)]
# Table 5's ZB-1p and ZB-2p bubble rates, same order
TABLE5 = [(0.1585, 0.0433), (0.1242, 0.0039), (0.0674, 0.0026), (0.1323, 0.0029), (0.1045, 0.0022),
          (0.0554, 0.0010), (0.1397, 0.0066), (0.1088, 0.0054), (0.0576, 0.0028), (0.1421, 0.0038),
          (0.1106, 0.0029), (0.0594, 0.0018)]


def _spans(orders, f, i, w, c) -> float:
    """The longest stage span (first pass's start to last pass's end) of uniform stages' orders."""
    from dist_lib.schedules.timing import replay
    from dist_lib.schedules.actions import Action
    spans = replay([[Action(kind, 0, mb) for kind, mb in order] for order in orders],
                   [{"F": f, "I": i, "W": w, "C": c}] * len(orders))
    return max(stage[-1][1] - stage[0][0] for stage in spans)


@pytest.mark.parametrize("row, rates", list(zip(TABLE6, TABLE5)))
def test_the_runtimes_memory_count_and_span_give_back_table_5(row, rates):
    # memory in M_B with the I giving back all but 32h of 34h + 5as per token, the limit p or 2p M_B, and
    # the order with the shortest longest stage span: each ZB-1p and ZB-2p bubble rate of Table 5
    p, m, f, i, w, c, h, a = row
    share = 32 * h / (34 * h + 5 * a * 1024)
    for limit, rate in zip((p, 2 * p), rates):
        orders = zb_orders([f] * p, [i] * p, [w] * p, m, limit, comm=[c] * (p - 1), w_share=share,
                           objective="span")
        assert 1 - m * (f + i + w) / _spans(orders, f, i, w, c) == pytest.approx(rate, abs=5e-5)


def test_an_input_gradient_that_frees_memory_lets_more_microbatches_await_their_w():
    # 8 stages, 24 microbatches, 2p = 16 M_B: counting whole microbatches until W, no stage ever holds more
    # than 16; with the I giving back 1 - r, the first stage holds more than 16 awaiting their W at once,
    # and its held memory F - (1 - r) I - r W never passes 16 M_B
    p, m, f, i, w, c, h, a = TABLE6[0]
    share = 32 * h / (34 * h + 5 * a * 1024)
    whole = greedy_orders(p, m, 2 * p, [{"F": f, "I": i, "W": w, "C": c}] * p)
    freed = greedy_orders(p, m, 2 * p, [{"F": f, "I": i, "W": w, "C": c}] * p, w_share=share)
    assert max(_awaiting_w(order) for order in whole) <= 2 * p
    assert _awaiting_w(freed[0]) > 2 * p
    for order in freed:
        check_schedule(order, 1, m)
        held = most = 0.0
        for action in order:
            held += {"F": 1.0, "I": -(1 - share), "W": -share}[action.kind]
            most = max(most, held)
        assert most <= 2 * p + 1e-9


def test_the_span_objective_trades_the_isolated_step_for_the_overlapping_period():
    # the step objective's order ends first; the span objective's has the shorter longest stage span (1.5B,
    # 24 microbatches, ZB-2p: 1152.6 ms, Table 5's 4.33 % bubble, against 1154.1 ms)
    p, m, f, i, w, c, h, a = TABLE6[0]
    share = 32 * h / (34 * h + 5 * a * 1024)
    step = zb_orders([f] * p, [i] * p, [w] * p, m, 2 * p, comm=[c] * (p - 1), w_share=share)
    span = zb_orders([f] * p, [i] * p, [w] * p, m, 2 * p, comm=[c] * (p - 1), w_share=share, objective="span")
    times = [{"F": f, "I": i, "W": w}] * p
    assert _makespan(step, times, [c] * (p - 1)) <= _makespan(span, times, [c] * (p - 1))
    assert _spans(span, f, i, w, c) < _spans(step, f, i, w, c)


def test_w_share_and_objective_are_checked():
    with pytest.raises(ValueError, match="w_share must be a number in"):
        zb_orders([1.0], [1.0], [1.0], 2, 1, w_share=0)
    with pytest.raises(ValueError, match="objective must be 'step' or 'span'"):
        zb_orders([1.0], [1.0], [1.0], 2, 1, objective="period")


def test_uniform_times_are_each_kinds_upper_median():
    # three stages: F 1, 3, 2 -> 2; I 2, 1, 5 -> 2; W 3, 1, 2 -> 2; the crossings 0.5 and 0.1 of the two
    # stages that have one -> the upper of two, 0.5 (the runtime takes sorted(...)[len // 2])
    from strategies.zero_bubble import median_times
    times = [{"F": 1, "I": 2, "W": 3, "C": 0.5}, {"F": 3, "I": 1, "W": 1, "C": 0.1}, {"F": 2, "I": 5, "W": 2}]
    assert median_times(times) == [{"F": 2, "I": 2, "W": 2, "C": 0.5}] * 3

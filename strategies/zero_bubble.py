"""ZB-H1: 1F1B with the backward split into input gradient (I) and weight gradient (W).

Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (ICLR 2024), sec. 3. Only I is on the critical path
between stages: W has no consumer before the optimizer step, so it can fill the gaps where 1F1B sits
idle. The schedule is built the way the paper's heuristic builds it: simulate the pipeline with each
stage's F, I and W durations (from costs.py, as a profiler would measure them) and let each stage, whenever it is free, run the first of
  1. an I whose output gradient has arrived,
  2. the next F whose input has arrived, if fewer than `max_in_flight` microbatches await their W,
  3. a deferred W,
then hand each stage its resulting order. With `max_in_flight = p` (the first stage's 1F1B memory;
ZB-H1) the bubble drops from 1F1B's (p - 1)(F + I + W) toward (p - 1)(F + I - W), about a third when
F = I = W; with 2p - 1 (ZB-H2's memory) it reaches that bound. Here the stash of a microbatch lives
until its W, so later stages hold up to p microbatches instead of 1F1B's p - s.

Receives are posted where the paper's reference implementation posts them (sail-sg/zero-bubble-pipeline-
parallelism, megatron/core/pipeline_parallel/auto_schedule.py, `ilp_results`): the orders are replayed with the
same pass times (`_replay.py`), and each stage posts the receive of a message before the pass during which
the sending pass is predicted to end, or, if the stage is idle then, before its next pass (`_early_receives.py`,
`posted_schedule`); the pass that takes the message awaits that receive. A crossing then starts as soon as
it is sent, overlapping the deferred W a stage runs meanwhile, rather than after it. `schedule` gives the
orders alone (what `planned` runs, receiving each input as its pass begins).

This rule is simpler than the paper's: at `max_in_flight = p` it does not reach the handcrafted ZB-H1's
bubble. With F = I = W = 1 the step takes 81 units at p = 8, m = 24 (ZB-H1's 3m + p - 1 = 79, 1F1B's 93)
and 331 at p = 32, m = 96 (319 and 381), the gap growing with p.
"""

from __future__ import annotations

from dist_lib import Model

from ._early_receives import run_posted_stage, with_posted_receives
from ._pipeline import Action
from ._plan import build_plan


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1, times=None,
             max_in_flight: int | None = None) -> list[Action]:
    """Stage `stage`'s order; `times[s]` maps "F", "I", "W" to stage s's durations (default all 1)."""
    if chunks != 1:
        raise ValueError("zero_bubble (ZB-H1) runs one model chunk per rank; set chunks=1")
    return greedy_orders(stages, microbatches, stages if max_in_flight is None else max_in_flight, times)[stage]


def greedy_orders(p: int, m: int, limit: int, times=None) -> list[list[Action]]:
    """Every stage's action order from simulating the greedy rule above."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_in_flight must be a whole number >= 1, got {limit!r}")
    times = times or [{"F": 1, "I": 1, "W": 1}] * p
    clock = [0.0] * p
    next_f, next_i = [0] * p, [0] * p
    f_end: dict[tuple[int, int], int] = {}
    i_end: dict[tuple[int, int], int] = {}
    deferred: list[list[int]] = [[] for _ in range(p)]
    orders: list[list[Action]] = [[] for _ in range(p)]
    for _ in range(3 * m * p):
        best = None  # (start, priority, stage, kind)
        for s in range(p):
            options = []
            i = next_i[s]
            if i < next_f[s]:
                ready = f_end[(s, i)] if s == p - 1 else i_end.get((s + 1, i))
                if ready is not None:
                    options.append((max(clock[s], ready), 0, s, "I"))
            if next_f[s] < m and next_f[s] - (next_i[s] - len(deferred[s])) < limit:
                ready = 0 if s == 0 else f_end.get((s - 1, next_f[s]))
                if ready is not None:
                    options.append((max(clock[s], ready), 1, s, "F"))
            if deferred[s]:
                options.append((clock[s], 2, s, "W"))
            if options:
                choice = min(options)
                best = choice if best is None or choice < best else best
        start, _, s, kind = best
        if kind == "F":
            mb = next_f[s]
            next_f[s] += 1
            f_end[(s, mb)] = start + times[s]["F"]
        elif kind == "I":
            mb = next_i[s]
            next_i[s] += 1
            i_end[(s, mb)] = start + times[s]["I"]
            deferred[s].append(mb)
        else:
            mb = deferred[s].pop(0)
        clock[s] = start + times[s][kind]
        orders[s].append(Action(kind, 0, mb))
    return orders


def posted_schedule(stage: int, stages: int, microbatches: int, chunks: int = 1, times=None,
                    max_in_flight: int | None = None) -> list[Action]:
    """Stage `stage`'s order with its receives posted where the reference implementation posts them
    (`_early_receives.py`): before the pass during which the sending pass is predicted to end."""
    if chunks != 1:
        raise ValueError("zero_bubble (ZB-H1) runs one model chunk per rank; set chunks=1")
    times = times or [{"F": 1, "I": 1, "W": 1}] * stages
    orders = greedy_orders(stages, microbatches, stages if max_in_flight is None else max_in_flight, times)
    return with_posted_receives(orders, times)[stage]


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, max_in_flight: int | None = None,
                partition=None, recompute: bool = False) -> None:
    def zb_h1(stage: int, stages: int, microbatches: int, chunks: int, times=None) -> list[Action]:
        return posted_schedule(stage, stages, microbatches, chunks, times, max_in_flight)

    plan = build_plan(model, zb_h1, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      partition=partition, recompute=recompute)
    await run_posted_stage(model, plan)

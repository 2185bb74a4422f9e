"""ZB-H1: 1F1B with the backward split into input gradient (I) and weight gradient (W).

Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (ICLR 2024), sec. 3. Only I is on the critical path
between stages: W has no consumer before the optimizer step, so it can fill the gaps where 1F1B sits
idle. The order comes from the paper's automatic-scheduling heuristic (sec. 3.1, `_zb_heuristic.py`),
laid out with each stage's F, I and W durations (from costs.py, as a profiler would measure them) and
each boundary's crossing time (one microbatch's message alone on the link between the stages' ranks, as
the simulator charges it; `_plan.crossing_time`), counted as the reference's `cost_comm` is (and, which the
reference leaves out, one message at a time over a stage's link, so that on a slow link a stage's later
messages wait for its earlier ones): as many
warm-up Fs as memory allows and fit before the first I can start, then F and I in turn, Ws in the waits
(a wait shorter than a W too when leaving it would make the stage the idlest), before an F when memory
is full, and the rest at the end; of a few variants of those choices, an event-driven list rule's order
and 1F1B's own, the one with the shortest step, crossings included. On a slow link the crossings
lengthen the wait for the first gradient, so the stages before the last run more warm-up Fs (up to
`max_in_flight`) instead of holding later activations back behind a round trip. Memory is
`max_in_flight` microbatches awaiting their W per stage: with `max_in_flight = p` (the first stage's
1F1B memory; ZB-H1) and F = I = W (free crossings) the step is the handcrafted ZB-H1's 3m + p - 1 passes
for m >= p microbatches (1F1B's 3m + 3(p - 1)): the bubble drops from (p - 1)(F + I + W) to
(p - 1)(F + I - W), a third. 2p - 1 (ZB-H2's memory) reaches the same. In the heuristic's arithmetic
the step is never longer than 1F1B's with the same pass and crossing times when memory holds 1F1B's
min(m, p) microbatches. Here the stash of a microbatch lives until its W, so later stages may hold up to
`max_in_flight` microbatches instead of 1F1B's p - s.

Receives are posted where the paper's reference implementation posts them (sail-sg/zero-bubble-pipeline-
parallelism, megatron/core/pipeline_parallel/auto_schedule.py, `ilp_results`): the orders are replayed with the
same pass and crossing times (`_replay.py`), and each stage posts the receive of a message before the pass
during which the sending pass is predicted to end, or, if the stage is idle then, before its next pass
(`_early_receives.py`, `posted_schedule`); the pass that takes the message awaits that receive. A crossing
then starts as soon as it is sent, overlapping the deferred W a stage runs meanwhile, rather than after it.
`schedule` gives the orders alone, each pass receiving its input as it begins.
"""

from __future__ import annotations

from functools import lru_cache

from dist_lib import Model

from ._early_receives import run_posted_stage, with_posted_receives
from ._actions import Action
from ._plan import build_plan
from ._zb_heuristic import zb_orders


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1, times=None,
             max_in_flight: int | None = None) -> list[Action]:
    """Stage `stage`'s order; `times[s]` maps "F", "I", "W" to stage s's durations (default all 1) and,
    optionally, "C" to a message's crossing between stage s and s + 1 (default 0)."""
    return list(_pipeline_orders(*_pipeline(stages, microbatches, chunks, times, max_in_flight))[stage])


def posted_schedule(stage: int, stages: int, microbatches: int, chunks: int = 1, times=None,
                    max_in_flight: int | None = None) -> list[Action]:
    """Stage `stage`'s order with its receives posted where the reference implementation posts them
    (`_early_receives.py`): before the pass during which the sending pass is predicted to end."""
    return list(_posted_orders(*_pipeline(stages, microbatches, chunks, times, max_in_flight))[stage])


def greedy_orders(p: int, m: int, limit: int, times=None) -> list[list[Action]]:
    """Every stage's action order by Zero Bubble's heuristic (`_zb_heuristic.py`), at most `limit`
    microbatches awaiting W on any stage; `times[s]` maps "F", "I", "W" to stage s's durations and,
    optionally, "C" to the seconds a message takes between stage s and s + 1 (the heuristic's `comm[s]`;
    absent: 0; the last stage's is not used)."""
    limit = _checked_limit(limit)
    if m < 1:
        return [[] for _ in range(p)]
    times = times or [{"F": 1, "I": 1, "W": 1}] * p
    comm = [t.get("C", 0.0) for t in times[:-1]]
    orders = zb_orders([t["F"] for t in times], [t["I"] for t in times], [t["W"] for t in times], m, limit,
                       comm=comm)
    return [[Action(kind, 0, mb) for kind, mb in order] for order in orders]


def _pipeline(stages: int, microbatches: int, chunks: int, times, max_in_flight) -> tuple:
    """(stages, microbatches, memory limit, times as a key): what a pipeline's orders are cached by."""
    if chunks != 1:
        raise ValueError("zero_bubble (ZB-H1) runs one model chunk per rank; set chunks=1")
    limit = _checked_limit(stages if max_in_flight is None else max_in_flight)
    times = times or [{"F": 1, "I": 1, "W": 1}] * stages
    return stages, microbatches, limit, tuple((t["F"], t["I"], t["W"], t.get("C", 0.0)) for t in times)


def _times(key: tuple) -> list[dict[str, float]]:
    return [{"F": f, "I": i, "W": w, "C": c} for f, i, w, c in key]


@lru_cache(maxsize=32)
def _pipeline_orders(p: int, m: int, limit: int, key: tuple) -> tuple[tuple[Action, ...], ...]:
    """`greedy_orders` once per pipeline: every rank of a plan asks for the same orders."""
    return tuple(map(tuple, greedy_orders(p, m, limit, _times(key))))


@lru_cache(maxsize=32)
def _posted_orders(p: int, m: int, limit: int, key: tuple) -> tuple[tuple[Action, ...], ...]:
    """`with_posted_receives` of `_pipeline_orders`, once per pipeline."""
    return tuple(map(tuple, with_posted_receives(_pipeline_orders(p, m, limit, key), _times(key))))


def _checked_limit(limit) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_in_flight must be a whole number >= 1, got {limit!r}")
    return limit


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, max_in_flight: int | None = None,
                partition=None, recompute: bool = False) -> None:
    def zb_h1(stage: int, stages: int, microbatches: int, chunks: int, times=None) -> list[Action]:
        return posted_schedule(stage, stages, microbatches, chunks, times, max_in_flight)

    plan = build_plan(model, zb_h1, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      partition=partition, recompute=recompute)
    await run_posted_stage(model, plan)

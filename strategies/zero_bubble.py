"""ZB-H1: 1F1B with the backward split into input gradient (I) and weight gradient (W).

Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (ICLR 2024), sec. 3. Only I is on the critical path
between stages: W has no consumer before the optimizer step, so it can fill the gaps where 1F1B sits
idle. The order comes from the paper's automatic-scheduling heuristic (sec. 3.1, `dist_lib/schedules/zero_bubble.py`),
laid out with each stage's F, I and W durations (from costs/, as a profiler would measure them) and
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
min(m, p) microbatches. Here a microbatch's stash lives until its I, and what its W needs (the linear
layers' inputs and output gradients, `costs.weight_pass_bytes`) until its W, so later stages may hold up to
`max_in_flight` microbatches awaiting W instead of 1F1B's p - s.

Two options run the schedule as the paper's reference runtime does (zb_schedules.py,
`get_zero_bubble_forward_backward_func`; auto_schedule.py, `initial_solution`): `w_share` r counts memory as
it does, an I giving back all of a microbatch's activations but the share r its W still needs (32h of
34h + 5as per token; the limit then holds more microbatches after their I: ZB-2p's 2p M_B), and
`objective="span"` keeps the order whose longest stage span (its first pass's start to its last pass's end)
is shortest rather than the one whose step ends first: with the optimizer's post-validation (sec. 4 of the
paper) a stage starts the next step as soon as it is done, so steps overlap and that span is their period.
With both, the heuristic's arithmetic gives back every ZB-1p and ZB-2p bubble rate of the paper's Table 5
from its Table 6 pass times. By default memory is counted in whole microbatches until their W, which
the stash the simulator frees at I (above) makes an upper bound; and the simulator runs one step, so the
step it reports is the isolated step's, longer than that period.

Receives are posted where the paper's reference implementation posts them (sail-sg/zero-bubble-pipeline-
parallelism, megatron/core/pipeline_parallel/auto_schedule.py, `ilp_results`): the orders are replayed with the
same pass and crossing times (`dist_lib/schedules/timing.py`), and each stage posts the receive of a message before the pass
during which the sending pass is predicted to end, or, if the stage is idle then, before its next pass
(`_early_receives.py`, `posted_schedule`); the pass that takes the message awaits that receive. A crossing
then starts as soon as it is sent, overlapping the deferred W a stage runs meanwhile, rather than after it.
`schedule` gives the orders alone, each pass receiving its input as it begins.
"""

from __future__ import annotations

from functools import lru_cache

from dist_lib import Model

from dist_lib.schedules.posted import with_posted_receives

from ._early_receives import run_posted_stage
from dist_lib.schedules.actions import Action
from ._layout import declared_grid
from ._plan import build_plan
from dist_lib.schedules.zero_bubble import checked_options, zb_orders


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1, times=None,
             max_in_flight: int | None = None, w_share: float = 1.0, objective: str = "step") -> list[Action]:
    """Stage `stage`'s order; `times[s]` maps "F", "I", "W" to stage s's durations (default all 1) and,
    optionally, "C" to a message's crossing between stage s and s + 1 (default 0)."""
    key = _pipeline(stages, microbatches, chunks, times, max_in_flight, w_share, objective)
    return list(_pipeline_orders(*key)[stage])


def posted_schedule(stage: int, stages: int, microbatches: int, chunks: int = 1, times=None,
                    max_in_flight: int | None = None, w_share: float = 1.0, objective: str = "step") -> list[Action]:
    """Stage `stage`'s order with its receives posted where the reference implementation posts them
    (`_early_receives.py`): before the pass during which the sending pass is predicted to end."""
    key = _pipeline(stages, microbatches, chunks, times, max_in_flight, w_share, objective)
    return list(_posted_orders(*key)[stage])


def greedy_orders(p: int, m: int, limit: int, times=None, w_share: float = 1.0,
                  objective: str = "step") -> list[list[Action]]:
    """Every stage's action order by Zero Bubble's heuristic (`dist_lib/schedules/zero_bubble.py`), at most `limit`
    microbatches' activations held on any stage (each until its W; with `w_share` r < 1, all but r of them
    only until its I); `times[s]` maps "F", "I", "W" to stage s's durations and, optionally, "C" to the
    seconds a message takes between stage s and s + 1 (the heuristic's `comm[s]`; absent: 0; the last
    stage's is not used); `objective` "step" (the earliest end) or "span" (the shortest longest stage span)."""
    limit = _checked_limit(limit)
    if m < 1:
        return [[] for _ in range(p)]
    times = times or [{"F": 1, "I": 1, "W": 1}] * p
    comm = [t.get("C", 0.0) for t in times[:-1]]
    orders = zb_orders([t["F"] for t in times], [t["I"] for t in times], [t["W"] for t in times], m, limit,
                       comm=comm, w_share=w_share, objective=objective)
    return [[Action(kind, 0, mb) for kind, mb in order] for order in orders]


def _pipeline(stages: int, microbatches: int, chunks: int, times, max_in_flight, w_share: float = 1.0,
              objective: str = "step") -> tuple:
    """(stages, microbatches, memory limit, times as a key, W's memory share, objective): what a pipeline's
    orders are cached by."""
    if chunks != 1:
        raise ValueError("zero_bubble (ZB-H1) runs one model chunk per rank; set chunks=1")
    limit = _checked_limit(stages if max_in_flight is None else max_in_flight)
    w_share = checked_options(w_share, objective)
    times = times or [{"F": 1, "I": 1, "W": 1}] * stages
    return (stages, microbatches, limit, tuple((t["F"], t["I"], t["W"], t.get("C", 0.0)) for t in times),
            w_share, objective)


def _times(key: tuple) -> list[dict[str, float]]:
    return [{"F": f, "I": i, "W": w, "C": c} for f, i, w, c in key]


@lru_cache(maxsize=32)
def _pipeline_orders(p: int, m: int, limit: int, key: tuple, w_share: float = 1.0,
                     objective: str = "step") -> tuple[tuple[Action, ...], ...]:
    """`greedy_orders` once per pipeline: every rank of a plan asks for the same orders."""
    return tuple(map(tuple, greedy_orders(p, m, limit, _times(key), w_share, objective)))


@lru_cache(maxsize=32)
def _posted_orders(p: int, m: int, limit: int, key: tuple, w_share: float = 1.0,
                   objective: str = "step") -> tuple[tuple[Action, ...], ...]:
    """`with_posted_receives` of `_pipeline_orders`, once per pipeline."""
    orders = _pipeline_orders(p, m, limit, key, w_share, objective)
    return tuple(map(tuple, with_posted_receives(orders, _times(key))))


def _checked_limit(limit) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_in_flight must be a whole number >= 1, got {limit!r}")
    return limit


def median_times(times):
    """Every stage given the same pass and crossing times, each the median (the upper one of an even count) of
    the stages' own: how the paper's runtime schedules, from the profiled times all ranks gather (zb_schedules.py,
    `update_schedule`: `sorted(...)[len // 2]` of F, B and W)."""
    if not times:
        return times
    middle = {}
    for kind in ("F", "I", "W", "C"):  # (the last stage has no crossing of its own without chunks)
        values = sorted(t[kind] for t in times if kind in t)
        if values:
            middle[kind] = values[len(values) // 2]
    return [dict(middle) for _ in times]


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, max_in_flight: int | None = None,
                partition=None, recompute: bool = False, w_share: float = 1.0, objective: str = "step",
                uniform_times: bool = False) -> None:
    def zb_h1(stage: int, stages: int, microbatches: int, chunks: int, times=None) -> list[Action]:
        if uniform_times:
            times = median_times(times)
        return posted_schedule(stage, stages, microbatches, chunks, times, max_in_flight, w_share, objective)

    plan = build_plan(model, zb_h1, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      partition=partition, recompute=recompute)
    await run_posted_stage(model, plan)


def replica_grid(world_size: int, global_batch_size: int, **options):
    """Its replicas run one program, each over its share of the batch: they fold (`_layout.declared_grid`)."""
    return declared_grid(train, world_size, options)

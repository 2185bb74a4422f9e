"""The 1F1B order of one stage (PipeDream-Flush; Narayanan et al. 2021, sec. 2.2.1): warm-up forwards, then
one forward / one backward, then the cool-down backwards (`strategies/one_f_one_b.py` runs it)."""

from __future__ import annotations

from functools import lru_cache
from itertools import chain

from dist_lib.schedules.actions import Action


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Action]:
    if chunks != 1:
        raise ValueError("one_f_one_b runs one model chunk per rank; use the interleaved schedule for chunks > 1")
    m = microbatches
    forwards, backwards = _passes("F", m), _passes("B", m)
    warmup = min(stages - stage - 1, m)  # 1. fill the pipeline: later stages need fewer
    actions = list(forwards[:warmup])
    actions += chain.from_iterable(zip(forwards[warmup:], backwards))  # 2. steady state: one forward, one backward
    actions += backwards[m - warmup:]  # 3. cool-down: drain the backwards
    return actions


@lru_cache(maxsize=8)
def _passes(kind: str, microbatches: int) -> tuple[Action, ...]:
    """`kind` of chunk 0 for each microbatch in order, made once for every stage of a pipeline."""
    return tuple(Action(kind, 0, i) for i in range(microbatches))

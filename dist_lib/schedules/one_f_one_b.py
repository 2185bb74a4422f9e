"""The 1F1B order of one stage (PipeDream-Flush; Narayanan et al. 2021, sec. 2.2.1): warm-up forwards, then
one forward / one backward, then the cool-down backwards (`strategies/one_f_one_b.py` runs it)."""

from __future__ import annotations

from dist_lib.schedules.actions import Action


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Action]:
    if chunks != 1:
        raise ValueError("one_f_one_b runs one model chunk per rank; use the interleaved schedule for chunks > 1")
    m = microbatches
    warmup = min(stages - stage - 1, m)  # 1. fill the pipeline: later stages need fewer
    actions = [Action("F", 0, i) for i in range(warmup)]
    # 2. steady state: one forward, one backward
    actions += [pass_ for i in range(m - warmup) for pass_ in (Action("F", 0, warmup + i), Action("B", 0, i))]
    actions += [Action("B", 0, i) for i in range(m - warmup, m)]  # 3. cool-down: drain the backwards
    return actions

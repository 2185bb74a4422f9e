"""1F1B (PipeDream-Flush): warm-up forwards, then one forward / one backward, then cool-down.

Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training" (PipeDream-2BW/Flush) and
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", sec. 2.2.1.
Same bubble as GPipe, (p - 1) / (m + p - 1) of the step, but stage s holds at most p - s microbatches
of activations (p on the first stage) instead of m, because each backward frees one as soon as the
pipeline is full. Ranks beyond `pp` become data-parallel replicas.
"""

from __future__ import annotations

from dist_lib import Model

from ._actions import Action
from ._pipeline import run_stage
from ._plan import build_plan


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Action]:
    if chunks != 1:
        raise ValueError("one_f_one_b runs one model chunk per rank; use the interleaved schedule for chunks > 1")
    m = microbatches
    warmup = min(stages - stage - 1, m)  # 1. fill the pipeline: later stages need fewer
    actions = [Action("F", 0, i) for i in range(warmup)]
    for i in range(m - warmup):  # 2. steady state: one forward, one backward
        actions += [Action("F", 0, warmup + i), Action("B", 0, i)]
    actions += [Action("B", 0, i) for i in range(m - warmup, m)]  # 3. cool-down: drain the backwards
    return actions


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, partition=None,
                recompute: bool = False) -> None:
    plan = build_plan(model, schedule, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      partition=partition, recompute=recompute)
    await run_stage(model, plan)

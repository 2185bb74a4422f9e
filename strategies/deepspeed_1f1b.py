"""DeepSpeed's pipeline schedule: 1F1B in lock step, with blocking point-to-point messages.

DeepSpeed's `PipelineEngine` (deepspeed/runtime/pipe/schedule.py, `TrainSchedule`; Microsoft DeepSpeed
0.3-0.5, the engine AMP and early Megatron-DeepSpeed ran) cuts a batch of m microbatches on p stages
into 2(m + p - 1) steps. At every step each stage runs one forward or one backward (or idles in the
fill and drain), alternating: a stage runs forwards on the steps whose parity matches its own. Each
step opens with the messages to the one neighbour it talks to that step, the previous step's output
going out and this step's input coming in:

* a forward step receives the microbatch's activation from the previous stage and sends it the
  gradient the previous (backward) step produced;
* a backward step sends the next stage the activation the previous (forward) step produced and
  receives this microbatch's output gradient from it.

Every message is a blocking `broadcast` in a two-rank group (deepspeed/runtime/pipe/p2p.py forces
`async_op=False`), so a stage waits for its neighbour at every step and never computes while a message
is in flight: neighbours run in lock step, and a step lasts as long as the slower of the two. Pairing a
forward step on one stage with a backward step on its neighbour makes each send meet a receive
posted in the same order, so the schedule cannot deadlock.

The forward and backward microbatch of step t on stage s are t // 2 - s // 2 and
t // 2 - p + 1 + s // 2 (the same ids DeepSpeed's step-to-microbatch mapping gives for either parity).

Bubble and memory are 1F1B's: (p - 1) / (m + p - 1) of the step idle with balanced stages, and stage s
holds at most p - s microbatches of activations; on top of that every message is exposed, since no
stage computes while one is in flight.
"""

from __future__ import annotations

from dist_lib import Model

from dist_lib.schedules.actions import Action
from ._pipeline import run_stage
from ._layout import declared_grid
from ._plan import build_plan


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Action]:
    """The stage's actions: `F`/`B` computations and the blocking messages around them, `RA`/`SA`
    (receive/send an activation) and `RG`/`SG` (receive/send a gradient), each naming its microbatch."""
    if chunks != 1:
        raise ValueError("the DeepSpeed schedule runs one model chunk per rank; use chunks=1")
    m, p, s = microbatches, stages, stage
    first, last = s == 0, s == p - 1
    actions: list[Action] = []
    previous = -1  # the microbatch of the previous step (its output is sent at the start of this step)
    for step in range(2 * (m + p - 1)):
        forward = step % 2 == s % 2
        mb = step // 2 - s // 2 if forward else step // 2 - p + 1 + s // 2
        this, prior = 0 <= mb < m, 0 <= previous < m
        if forward:
            if this and not first:
                actions.append(Action("RA", 0, mb))
            if prior and not first:
                actions.append(Action("SG", 0, previous))
            if this:
                actions.append(Action("F", 0, mb))
        else:
            if prior and not last:
                actions.append(Action("SA", 0, previous))
            if this and not last:
                actions.append(Action("RG", 0, mb))
            if this:
                actions.append(Action("B", 0, mb))
        previous = mb
    return actions


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, partition=None,
                recompute: bool = False) -> None:
    plan = build_plan(model, schedule, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      partition=partition, recompute=recompute)
    await run_stage(model, plan)


def replica_grid(world_size: int, global_batch_size: int, **options):
    """Its replicas run one program, each over its share of the batch: they fold (`_layout.declared_grid`)."""
    return declared_grid(train, world_size, options)

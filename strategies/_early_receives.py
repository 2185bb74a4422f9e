"""Where a pipeline stage posts each receive: early, so that the crossing overlaps its compute.

A point-to-point message is a rendezvous: it starts only once the receiver has posted its receive. A stage
that posts the receive only when the pass needing the input begins makes the crossing wait behind
whatever the stage runs first (with a split backward, the deferred weight-gradient passes W), which on a
slow link is exposed on the critical path.

The Zero Bubble reference implementation (sail-sg/zero-bubble-pipeline-parallelism,
megatron/core/pipeline_parallel/auto_schedule.py, `ilp_results`) places its receives from the schedule's
own timing model: each F (or B) pass gets a RECV node on the receiving stage stamped with the sending
pass's predicted completion time; a stage's nodes are sorted by time, communication first on ties, and a
RECV that falls within the preceding compute pass (its time at most that pass's completion time) is moved
ahead of that pass, "so that recv is executed before computation and hence can be overlapped".

Here the same rule runs on a replay of the stages' orders (`dist_lib/schedules/timing.py`) with the times the orders were made
with: a pass starts when its stage's previous pass has ended and its input has arrived (its producing pass's
end plus the boundary's crossing time, times[s]["C"], when given). The receive of a message is
posted before the first pass of the receiving stage predicted to end at or after the sending pass's end:
the pass during which the message is predicted to be sent, or, if the stage is idle then, its next pass.
Either is at or before the pass that takes the message, which starts no earlier than the send.
`_PostedStage` runs such a plan: a post action calls `model.recv` (non-blocking), and the pass that takes
the message awaits that receive (and, with scatter-gather, all-gathers the pieces then).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from dist_lib import Model
from dist_lib.tensors import range_mask

from dist_lib.schedules.actions import POSTS, Action
from ._pipeline import StagePlan, _Stage


def run_posted_stage(model: Model, plan: StagePlan) -> Coroutine[Any, Any, None]:
    """This rank's part of a pipeline whose schedule posts its receives (`POSTS`), to await."""
    return _PostedStage(model, plan).run()


def post_target(stage: _Stage, action: Action) -> tuple[tuple, int]:
    """(the key under which the pass that takes it finds the receive, the virtual stage the message comes
    from) of `stage`'s post action; a post from a stage that does not exist is refused."""
    what, k = POSTS[action.kind], stage.virtuals[action.chunk]
    virtual = k - 1 if action.kind == "PA" else k + 1
    if not 0 <= virtual < stage.virtual:
        raise ValueError(f"rank {stage.model.rank}: {action!r} posts the receive of the {what} of virtual stage "
                         f"{k} from virtual stage {virtual}, which does not exist (stages 0..{stage.virtual - 1})")
    layers = stage.plan.chunks[action.chunk]
    return (what, layers.start if action.kind == "PA" else layers.stop, stage.plan.microbatches[action.mb]), virtual


class _PostedStage(_Stage):
    """A pipeline stage whose passes take the receives its schedule posted. Only schedules with posts run
    it, so the other schedules' receive path does no extra work per message."""

    __slots__ = ("posted",)

    def __init__(self, model: Model, plan: StagePlan):
        super().__init__(model, plan)
        self.posted: dict = {}  # (what, layer, samples) -> the posted receive's Work, until a pass takes it

    def post(self, action: Action) -> None:
        key, virtual = post_target(self, action)
        src = self._peer(virtual)
        if src != self.model.rank:  # (one stage holding both chunks hands the tensor to itself)
            self.posted[key] = self.model.recv(src)

    async def _receive_from(self, virtual: int, layer: int, samples: range, what: str):
        work = self.posted.pop((what, layer, samples), None)
        if work is None:  # not posted: received now
            return await super()._receive_from(virtual, layer, samples, what)
        x = await work
        src = self._peer(virtual)
        if x.layer != layer or x.samples != range_mask(samples.start, samples.stop):
            self._unexpected(x, src, layer, samples, what)
        if self.scatter_gather:
            x = await self.model.all_gather(x, self.tp_group)
        return x

"""Run rank coroutines to completion, or report that they hang (every unfinished rank waits and
nothing moves for many loop turns), which is what the originals do on a deadlock."""

from __future__ import annotations

import asyncio
from typing import Any

PROGRESS = [0]  # bumped by every op of the oracle libraries


class Hang(Exception):
    """The ranks stopped making progress: the original would wait forever."""


async def run_ranks(coroutines: list) -> list:
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    idle, seen = 0, PROGRESS[0]
    while not all(t.done() for t in tasks):
        for t in tasks:
            if t.done() and t.exception() is not None:
                for other in tasks:
                    other.cancel()
                raise t.exception()
        await asyncio.sleep(0)
        idle = idle + 1 if PROGRESS[0] == seen else 0
        seen = PROGRESS[0]
        if idle > 5000:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise Hang("no rank can proceed")
    return [t.result() for t in tasks]


class SharedStateDist:
    """The originals' collectives: each rank folds its value into shared state, then three barrier
    waits (read, reset by rank 0, leave); `barrier` is an event-driven asyncio.Barrier here."""

    reduce: Any
    gather: Any
    mtime: float
    barrier: asyncio.Barrier

    async def _shared(self, attr: str, rank: int, inp: Any, time: float, merge) -> tuple:
        held = getattr(self, attr)
        setattr(self, attr, inp if held is None else merge(held, inp))
        self.mtime = max(time, self.mtime)
        await self.barrier.wait()
        out, mtime = getattr(self, attr), self.mtime
        await self.barrier.wait()
        if rank == 0:
            setattr(self, attr, None)
            self.mtime = 0
        await self.barrier.wait()
        PROGRESS[0] += 1
        return out, mtime

    async def _reduce(self, rank, inp, time):
        return await self._shared("reduce", rank, inp, time, lambda a, b: a + b)

    async def _gather(self, rank, inp, time):
        def merge(a, b):
            assert type(a) == type(b)
            return a.combine(b)
        return await self._shared("gather", rank, inp, time, merge)


def check_final_weights(models, layers: int) -> None:
    """The originals' check: every layer's final weights, combined, complete and at step 1."""
    for layer in range(layers):
        weight = None
        for m in models:
            if layer in m.final_weights:
                assert m.final_weights[layer].step == 1
                w = m.final_weights[layer]
                weight = w if weight is None else weight.combine(w)
        assert weight is not None and weight.is_complete()

"""Run rank coroutines to completion, or report that they hang (every unfinished rank waits and
nothing moves for many loop turns), which is what the originals do on a deadlock."""

from __future__ import annotations

import asyncio

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

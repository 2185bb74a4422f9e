"""Wall time per collective: the compat puzzles API against a polling-barrier implementation of the
old API (the design the original puzzles and lab `lib.py` use: ranks spin on `asyncio.sleep(0.01)`
until a counter reaches the world size, three barriers per collective).

    python benchmarks/compat_speed.py [--ranks 4] [--old 20] [--new 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from dist_lib.compat import puzzles


class PollingBarrier:
    """A barrier that polls: each waiter sleeps 10 ms at a time until everyone has arrived."""

    def __init__(self, n: int):
        self.n, self.arrived, self.leaving = n, 0, 0

    async def wait(self) -> None:
        while self.leaving:  # the previous round is still draining
            await asyncio.sleep(0.01)
        self.arrived += 1
        while self.arrived < self.n:
            await asyncio.sleep(0.01)
        self.leaving += 1
        if self.leaving == self.n:
            self.arrived = self.leaving = 0
        else:
            while self.leaving:
                await asyncio.sleep(0.01)


class PollingDist:
    """The old all-reduce: accumulate, barrier, read, barrier, reset, barrier."""

    def __init__(self, n: int):
        self.barrier, self.total, self.clock = PollingBarrier(n), None, 0.0

    async def allreduce(self, rank: int, value, now: float):
        self.total = value if self.total is None else self.total + value
        self.clock = max(self.clock, now)
        await self.barrier.wait()
        out, clock = self.total, self.clock
        await self.barrier.wait()
        if rank == 0:
            self.total, self.clock = None, 0.0
        await self.barrier.wait()
        return out, clock


def grad(rank: int, n: int) -> puzzles.WeightGrad:
    return puzzles.WeightGrad(0, 1, frozenset({rank}), n)


async def old_api(n: int, k: int) -> float:
    dist = PollingDist(n)

    async def rank_loop(rank: int) -> None:
        clock = 0.0
        for _ in range(k):
            _, clock = await dist.allreduce(rank, grad(rank, n), clock)
            clock += 0.3

    start = time.perf_counter()
    await asyncio.gather(*[rank_loop(r) for r in range(n)])
    return (time.perf_counter() - start) / k


async def new_api(n: int, k: int) -> float:
    dist = puzzles.Dist(n)
    models = [puzzles.Model(r, dist, 1, n) for r in range(n)]

    async def rank_loop(model: puzzles.Model) -> None:
        for _ in range(k):
            await model.allreduce(grad(model.rank, n), 0)

    start = time.perf_counter()
    await asyncio.gather(*[rank_loop(m) for m in models])
    return (time.perf_counter() - start) / k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--old", type=int, default=20, help="collectives timed on the polling baseline")
    parser.add_argument("--new", type=int, default=5000, help="collectives timed on dist_lib.compat")
    args = parser.parse_args()
    old = asyncio.run(old_api(args.ranks, args.old))
    new = asyncio.run(new_api(args.ranks, args.new))
    print(f"{'implementation':<28}{'ranks':>6}{'collectives':>13}{'wall per collective':>22}")
    print(f"{'polling barrier (old API)':<28}{args.ranks:>6}{args.old:>13}{old * 1e3:>19.2f} ms")
    print(f"{'dist_lib.compat.puzzles':<28}{args.ranks:>6}{args.new:>13}{new * 1e6:>19.2f} us")
    print(f"speed-up: {old / new:,.0f}x")


if __name__ == "__main__":
    main()

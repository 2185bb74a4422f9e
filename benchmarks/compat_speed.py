"""Wall time of the compat layer against the designs of the original puzzles and lab `lib.py`.

1. Per collective: the compat puzzles API against a polling barrier (the originals' design: ranks spin
   on `asyncio.sleep(0.01)` until a counter reaches the world size, three barriers per collective).
2. A large lab file (32 ranks, 64 layers by default) run whole: through dist_lib.compat (memory kept
   as a running total) and on tests/compat_oracle, a reimplementation of the lab library that sums
   every stored tensor's size at every event as the original does (with an event-driven barrier, so
   it is faster than the original, which also polls).

    python benchmarks/compat_speed.py [--ranks 4] [--old 20] [--new 5000]
                                      [--lab-ranks 32] [--lab-layers 64] [--lab-batch 256] [--microbatch 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import sys
import time
from pathlib import Path

from dist_lib.compat import puzzles, run_file
from dist_lib.compat.loader import modules_as

ROOT = Path(__file__).resolve().parents[1]
LAB_FILE = ROOT / "tests" / "compat_solutions" / "lab_course_styles.py"
LAB_FUNCTIONS = ("train_ddp", "part1_training_loop", "part3_training_loop")  # += DDP, ZeRO dropping late, 1F1B


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


def lab_compat(function: str, ranks: int, layers: int, batch: int, microbatch: int) -> tuple[float, int]:
    """CPU seconds to run `function` of the large lab file through dist_lib.compat (loading and
    reporting included), and its event count."""
    start = time.process_time()
    result = run_file(LAB_FILE, function=function, ranks=ranks, layers=layers, batches=batch,
                      batch_size=microbatch, check=False)
    return time.process_time() - start, len(result.raw_events)


def lab_summing(function: str, ranks: int, layers: int, batch: int, microbatch: int) -> float:
    """CPU seconds for the same run on the oracle library, which sums storage at every event."""
    sys.path.insert(0, str(ROOT))
    from tests.compat_oracle import _common as _hang, lab_lib, lab_utils
    with modules_as({"lib": lab_lib, "utils": lab_utils}):
        spec = importlib.util.spec_from_file_location("_bench_lab", LAB_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, function)
        start = time.process_time()
        dist = lab_lib.Dist(ranks)
        models = [lab_lib.Model(r, dist, layers, batch) for r in range(ranks)]
        kwargs = {"batch_size": microbatch} if function != "part2_training_loop" else {}
        asyncio.run(_hang.run_ranks([fn(m, **kwargs) for m in models]))
        return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--old", type=int, default=20, help="collectives timed on the polling baseline")
    parser.add_argument("--new", type=int, default=5000, help="collectives timed on dist_lib.compat")
    parser.add_argument("--lab-ranks", type=int, default=32)
    parser.add_argument("--lab-layers", type=int, default=64)
    parser.add_argument("--lab-batch", type=int, default=256, help="global batch of the large lab file")
    parser.add_argument("--microbatch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="large lab runs: best of this many")
    args = parser.parse_args()
    old = asyncio.run(old_api(args.ranks, args.old))
    new = asyncio.run(new_api(args.ranks, args.new))
    print(f"{'implementation':<28}{'ranks':>6}{'collectives':>13}{'wall per collective':>22}")
    print(f"{'polling barrier (old API)':<28}{args.ranks:>6}{args.old:>13}{old * 1e3:>19.2f} ms")
    print(f"{'dist_lib.compat.puzzles':<28}{args.ranks:>6}{args.new:>13}{new * 1e6:>19.2f} us")
    print(f"speed-up: {old / new:,.0f}x")
    print()
    print(f"large lab file ({LAB_FILE.name}): {args.lab_ranks} ranks, {args.lab_layers} layers, global batch "
          f"{args.lab_batch}, microbatch {args.microbatch} (train_ddp: one per rank); CPU time, best of {args.repeats}")
    print(f"{'function':<22}{'events':>8}{'sum every event':>18}{'dist_lib.compat':>18}")
    for function in LAB_FUNCTIONS:
        # the course's += DDP is correct with one microbatch per rank (the sum keeps only the last one's)
        micro = args.lab_batch // args.lab_ranks if function == "train_ddp" else args.microbatch
        shape = (args.lab_ranks, args.lab_layers, args.lab_batch, micro)
        with contextlib.redirect_stdout(io.StringIO()):
            runs = [lab_compat(function, *shape) for _ in range(args.repeats)]
            summing = min(lab_summing(function, *shape) for _ in range(args.repeats))
        compat, events = min(runs)
        print(f"{function:<22}{events:>8}{summing:>16.2f} s{compat:>16.2f} s")


if __name__ == "__main__":
    main()

"""What grading by re-execution costs: record in the sandbox, replay in the grader, against a live split.

    python -m benchmarks.replay
    python -m benchmarks.replay --repeats 5

For each run: the plain simulation, the same simulation while recording the program (what the
sandboxed worker does), the replay of that program (what the grader does), the program's size, and
its number of ops (entries other than drops). The live-split column is the other sound design, the
strategy in the sandbox and the engine in the grader: each op crosses a pipe and waits for its answer
(a tensor's fields, a time), so it costs at least one measured pipe round trip per op on top of the
simulation. Times are medians of `--repeats` runs on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from dist_lib import simulate
from dist_lib.run.recording import DROP, record
from dist_lib.run.replay import _ARITY, replay

RUNS = [
    ("ddp", "1x8xA100-80GB", "gpt-1.3b", 32, {"microbatch_size": 2}),
    ("zero", "1x8xA100-80GB", "gpt-1.3b", 32, {"stage": 3, "microbatch_size": 2}),
    ("one_f_one_b", "1x8xA100-80GB", "gpt-1.3b", 32, {"microbatch_size": 1}),
    ("hybrid", "4x8xA100-80GB", "gpt-1.3b", 64, {"dp": 4, "pp": 4, "tp": 2, "microbatch_size": 1}),
    ("ddp", "16x8xA100-80GB", "gpt-1.3b", 256, {"microbatch_size": 1}),
]


def _median(fn, repeats: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def pipe_round_trip(rounds: int = 20000) -> float:
    """Seconds for one 8-byte message to a child process and its 8-byte answer back (median of batches)."""
    there_r, there_w = os.pipe()
    back_r, back_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(there_w)
        os.close(back_r)
        while True:
            message = os.read(there_r, 8)
            if not message:
                os._exit(0)
            os.write(back_w, message)
    batches = []
    for _ in range(10):
        start = time.perf_counter()
        for _ in range(rounds // 10):
            os.write(there_w, b"12345678")
            os.read(back_r, 8)
        batches.append((time.perf_counter() - start) / (rounds // 10))
    for fd in (there_w, there_r, back_r, back_w):
        os.close(fd)
    os.waitpid(pid, 0)
    return statistics.median(batches)


def ops(programs) -> int:
    count = 0
    for program in programs:
        i = 0
        while i < len(program):
            op = program[i]
            count += op != DROP
            arity = _ARITY.get(op)
            i += 1 + (arity if arity is not None else (1 + 2 * program[i + 1] if op == 1 else 2 + program[i + 2]))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trip = pipe_round_trip()
    print(f"pipe round trip: {trip * 1e6:.1f} us\n")
    print("| strategy | cluster | simulate | record | replay | program | ops | live split (at least) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cluster, workload, batch, options in RUNS:
        path = f"strategies.{name}"
        plain, _ = _median(lambda: simulate(path, cluster, workload, batch, **options), args.repeats)
        recording, (_, programs) = _median(lambda: record(path, cluster, workload, batch, **options), args.repeats)
        replaying, _ = _median(lambda: replay(programs, cluster, workload, batch), args.repeats)
        n = ops(programs)
        size = sum(len(p) for p in programs) * 8
        print(f"| {name} | {cluster} | {plain * 1e3:.0f} ms | {recording * 1e3:.0f} ms | {replaying * 1e3:.0f} ms | "
              f"{size / 2**20:.2f} MiB | {n} | {(plain + n * trip) * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()

"""How the simulator's speed changes along one long step: ops per second and resident memory in equal
slices of the step's events.

    python benchmarks/step_rate.py                       # the 1T step cut to one replica (512 ranks)
    python benchmarks/step_rate.py --dp 6                # the full 3072-rank 1T step
    python benchmarks/step_rate.py --dp 6 --workers 2    # the same in two processes, three replicas each
    python benchmarks/step_rate.py --dp 2 --microbatches 64 --workers 2 --no-parting   # lock step once joined
    python benchmarks/step_rate.py --tp 1 --pp 8 --dp 1 --microbatches 512 --workload toy:layers=32 --schedule 1f1b

The step is `scale.py`'s pipeline row (`strategies/hybrid.py`, microbatch 1). Time is sampled whenever
the event log packs its newest events (every few thousand events), so the slices are of events, the
first includes the ranks' start, and a slice no pack ended in (a short step) is left out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def resident_mib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 >> 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=64)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--microbatches", type=int, default=512, help="per replica")
    parser.add_argument("--schedule", default="interleaved")
    parser.add_argument("--workload", default="gpt-1t")
    parser.add_argument("--no-recompute", action="store_true")
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--workers", type=int, choices=(1, 2), default=1,
                        help="processes; with 2, the second runs the second half of the replicas")
    parser.add_argument("--no-parting", action="store_true",
                        help="with --workers 2: lock step from the first collective between the halves to the end "
                             "(dist_lib/run/split_parting.py off)")
    args = parser.parse_args()
    if args.slices < 1:
        parser.error(f"--slices {args.slices}: give at least 1")

    from benchmarks.scale import pipeline_call, replica_ranks
    from dist_lib import simulate
    from dist_lib.engine import eventlog
    from dist_lib.errors import SimulationError

    samples: list[tuple[float, int, int]] = []  # (wall, events packed so far, resident MiB)
    pack = eventlog.EventLog.pack

    def timed_pack(log: eventlog.EventLog) -> None:
        samples.append((time.perf_counter(), len(log), resident_mib()))
        pack(log)

    eventlog.EventLog.pack = timed_pack  # type: ignore[method-assign]
    call = pipeline_call(args.tp, args.pp, args.dp, args.microbatches, args.schedule, args.workload,
                         not args.no_recompute)
    trips = [0, 0]  # (reports the first process waited for, times the halves parted)
    if args.workers == 2:
        from dist_lib.run import split, split_parting

        take, part = split.Coordinator._take_report, split_parting.part

        def counted_take(coordinator: split.Coordinator) -> None:
            trips[0] += 1
            take(coordinator)

        def counted_part(*given: object) -> None:
            trips[1] += 1
            part(*given)

        split.Coordinator._take_report = counted_take  # type: ignore[method-assign]
        split_parting.part = counted_part
        split_parting.ENABLED = not args.no_parting
        call["options"]["workers"] = 2
        call["options"]["worker_ranks"] = replica_ranks(args.tp, args.pp, args.dp, range(args.dp // 2, args.dp))
    start, cpu = time.perf_counter(), time.process_time()
    try:
        result = simulate(call["strategy"], call["cluster"], call["workload"], call["batch"], **call["options"])
    except SimulationError as error:
        sys.exit(f"the step failed: {error}")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    eventlog.EventLog.pack = pack  # type: ignore[method-assign]
    events = len(result.raw_events)
    samples = [(start, 0, samples[0][2] if samples else resident_mib())] + samples
    if args.workers == 2:  # (the packs timed are the first process's: its own events until the step ends)
        import resource

        child = resource.getrusage(resource.RUSAGE_CHILDREN)  # (the second process, ended and waited for)
        print(f"two processes: {len(samples)} packs timed in the first; {trips[0]:,} reports of the second "
              f"waited for, {trips[1]:,} partings; CPU {cpu:.1f} s in the first, "
              f"{child.ru_utime + child.ru_stime:.1f} s in the second")
    print(f"{call['cluster']} {call['workload']} tp {args.tp} pp {args.pp} dp {args.dp}, "
          f"{args.microbatches} microbatches: {events:,} events in {wall:.1f} s ({events / wall:,.0f} ops/s)")
    print(f"{'slice':>5} {'events':>12} {'wall s':>8} {'ops/s':>10} {'RSS MiB':>8}")
    bounds = [events * i // args.slices for i in range(args.slices + 1)]
    at = 0
    for i in range(args.slices):
        first = at
        while at + 1 < len(samples) and samples[at + 1][1] <= bounds[i + 1]:
            at += 1
        (t0, n0, _), (t1, n1, rss) = samples[first], samples[at]
        if n1 > n0 and t1 > t0:
            print(f"{i + 1:>5} {n1 - n0:>12,} {t1 - t0:>8.2f} {(n1 - n0) / (t1 - t0):>10,.0f} {rss:>8,}")


if __name__ == "__main__":
    main()

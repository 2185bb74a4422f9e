"""Fingerprints of a dozen simulated steps, to show that a change to the simulator's speed left its
results alone: step time, peak memory per rank, event count, and a digest of every event and of every
rank's memory log (sizes and kinds of each allocation and free, at their times).

    python benchmarks/fingerprint.py --save before.json      # on the old code
    python benchmarks/fingerprint.py --compare before.json   # on the new code: lists every difference

Each configuration also runs folded (`simulate(..., fold=True)`, the default), which must give the same
figures, memory logs and events of the ranks that ran (`fold_differences`); the saved fingerprints are the
unfolded step's.

Each configuration runs in this process (the memory logs and events are compared exactly, so the order
in which configurations run does not matter).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, strategy, cluster, workload, global batch, options)
CONFIGS: list[tuple[str, str, str, str, int, dict]] = [
    ("ddp 16", "strategies/ddp.py", "2x8xA100-80GB", "toy:layers=8", 64, {"microbatch_size": 2}),
    ("ddp buckets, shared NIC", "strategies/ddp.py", "2x4xV100-16GB:nics=1x1.25", "toy:layers=6", 16,
     {"microbatch_size": 1, "bucket_mb": 1.0}),
    ("zero-1", "strategies/zero.py", "1x4xA100-80GB", "toy:layers=6", 16, {"stage": 1, "microbatch_size": 2}),
    ("zero-3", "strategies/zero.py", "2x4xA100-80GB", "toy:layers=6", 16, {"stage": 3, "microbatch_size": 2}),
    ("1f1b", "strategies/one_f_one_b.py", "1x8xA100-80GB", "toy:layers=16", 32, {"pp": 8}),
    ("gpipe recompute", "strategies/gpipe.py", "1x4xA100-80GB", "toy:layers=8", 8, {"recompute": True}),
    ("interleaved", "strategies/interleaved.py", "1x4xA100-80GB", "toy:layers=16", 16, {"chunks": 2}),
    ("zero bubble", "strategies/zero_bubble.py", "1x4xA100-80GB", "toy:layers=8", 12, {}),
    ("hybrid tp2 pp2 dp2", "strategies/hybrid.py", "1x8xA100-80GB", "toy:layers=8", 16,
     {"tp": 2, "pp": 2, "dp": 2}),
    ("hybrid interleaved tp2 pp4 dp2, shared NICs", "strategies/hybrid.py", "2x8xA100-80GB:nics=2x25",
     "toy:layers=16", 32, {"tp": 2, "pp": 4, "dp": 2, "schedule": "interleaved", "recompute": True}),
    ("hybrid tp4 selective sp", "strategies/hybrid.py", "2x8xA100-80GB", "gpt-1.3b", 16,
     {"tp": 4, "pp": 2, "dp": 2, "selective_recompute": True, "sequence_parallel": True,
      "overlap_grad_reduce": False}),
    ("hetero", "strategies/hetero.py", "1x4xA100-80GB+1x4xT4", "toy:layers=8", 16, {"dp": 2, "pp": 4}),
    ("planned", "strategies/planned.py", "1x4xA100-80GB+1x4xV100-32GB", "toy:layers=8", 16, {}),
]


def fingerprint(strategy: str, cluster: str, workload: str, batch: int, options: dict) -> dict:
    from dist_lib import simulate
    result = simulate(ROOT / strategy, cluster, workload, batch, fold=False, **options)  # wherever it is run from
    folded = simulate(ROOT / strategy, cluster, workload, batch, **options)
    events = hashlib.sha256()
    for event in result.raw_events:
        events.update(repr(tuple(event)).encode())
    memory = hashlib.sha256()
    for rank, (times, live) in enumerate(result.timelines):
        memory.update(repr((rank, list(times), list(live))).encode())
    for rank, (signed_bytes, _buffer_ids, kinds) in enumerate(result.memory_log):  # ids are addresses
        memory.update(repr((rank, list(signed_bytes), list(kinds))).encode())
    return {"time_s": repr(result.time_s), "peaks": result.memory_bytes, "events": len(result.raw_events),
            "events_sha": events.hexdigest()[:16], "memory_sha": memory.hexdigest()[:16],
            "fold": fold_differences(result, folded)}


def fold_differences(full, folded) -> list[str]:
    """What a folded step (`simulate(..., fold=True)`) gives otherwise than the full one: its figures, every
    rank's memory log, the handed-in weights, and every event of the ranks that ran, but for the op ids (which
    number the other replicas' ops too). Empty when they agree, or when the step did not fold."""
    if folded.representatives is None:
        return []
    differ = [f"{key}: {getattr(full, key)!r} -> {getattr(folded, key)!r}"
              for key in ("time_s", "rank_times", "memory_bytes", "mfu", "hfu", "bubble_fraction", "correct",
                          "problems", "final_weights") if getattr(full, key) != getattr(folded, key)]
    for rank in range(full.cluster.world_size):
        if list(map(list, full.timelines[rank])) != list(map(list, folded.timelines[rank])) or \
                [list(a) for a in full.memory_log[rank][::2]] != [list(a) for a in folded.memory_log[rank][::2]]:
            differ.append(f"rank {rank}: memory log")
            break
    ran = set(folded.representatives)

    def ops(result) -> list[tuple]:
        return sorted(e[:10] + e[11:] for e in result.raw_events if e[0] in ran)

    if ops(full) != ops(folded):
        differ.append("events of the ranks that ran")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the fingerprints to this JSON file")
    parser.add_argument("--compare", type=Path, help="compare with fingerprints saved earlier")
    args = parser.parse_args()
    got = {}
    for name, strategy, cluster, workload, batch, options in CONFIGS:
        got[name] = fingerprint(strategy, cluster, workload, batch, options)
        f = got[name]
        print(f"{name:<45} {float(f['time_s']) * 1e3:>10.4f} ms {max(f['peaks']) / 2**20:>9.1f} MiB "
              f"{f['events']:>7} events  {f['events_sha']} {f['memory_sha']}"
              + (f"  FOLDED DIFFERS: {'; '.join(f['fold'])}" if f["fold"] else ""), flush=True)
    if args.save:
        args.save.write_text(json.dumps(got, indent=1))
    if args.compare:
        before = json.loads(args.compare.read_text())
        differ = [f"{name}: {key} {before[name][key]!r} -> {got[name][key]!r}"
                  for name in before for key in before[name] if got.get(name, {}).get(key) != before[name][key]]
        differ += [f"{name}: folded: {line}" for name in got for line in got[name]["fold"]]
        print("\n".join(differ) if differ else f"all {len(before)} fingerprints identical")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

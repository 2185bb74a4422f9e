"""Every bundled strategy on two default scenarios: step time, MFU, peak memory, bubble fraction.

    python -m benchmarks.strategies            # GPT 1.3B, global batch 32
    python -m benchmarks.strategies --workload gpt-2.7b --batch 64

Numbers come from running each strategy in the simulator; a configuration that does not fit (out of
memory) or is invalid is reported as such instead of a number.
"""

from __future__ import annotations

import argparse

from dist_lib import SimulationError, simulate

SCENARIOS = {"homogeneous 8xA100": "1x8xA100-80GB", "mixed 4xA100+4xV100": "1x4xA100-80GB+1x4xV100-32GB"}

RUNS = [
    ("ddp", {"microbatch_size": 2}),
    ("zero", {"stage": 1, "microbatch_size": 2}),
    ("zero", {"stage": 2, "microbatch_size": 2}),
    ("zero", {"stage": 3, "microbatch_size": 2}),
    ("gpipe", {"microbatch_size": 1}),
    ("one_f_one_b", {"microbatch_size": 1}),
    ("interleaved", {"microbatch_size": 1, "chunks": 3}),
    ("zero_bubble", {"microbatch_size": 1}),
    ("deepspeed_1f1b", {"microbatch_size": 1}),
    ("hybrid", {"dp": 4, "pp": 2, "tp": 1, "microbatch_size": 1}),
    ("hybrid", {"dp": 2, "pp": 2, "tp": 2, "microbatch_size": 1, "schedule": "interleaved"}),
    ("hetero", {"dp": 4, "pp": 2, "microbatch_size": 1}),
    ("planned", {}),  # no plan: the planner's best estimate
    ("moe", {"ep": 4}),  # a mixture-of-experts workload only (--workload mixtral-8x7b:layers=2)
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt-1.3b")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    print(f"workload {args.workload}, global batch {args.batch}\n")
    print("| scenario | strategy | options | step time | MFU | peak memory | bubble |")
    print("|---|---|---|---|---|---|---|")
    for scenario, cluster in SCENARIOS.items():
        for name, options in RUNS:
            label = " ".join(f"{k}={v}" for k, v in options.items()) or "(the planner's best estimate)"
            try:
                r = simulate(f"strategies.{name}", cluster, args.workload, args.batch, **options)
            except SimulationError as exc:
                reason = "out of memory" if "memory" in str(exc).lower() else str(exc).splitlines()[0][:60]
                print(f"| {scenario} | {name} | {label} | {reason} | | | |")
                continue
            print(f"| {scenario} | {name} | {label} | {r.time_s * 1e3:.1f} ms | {r.mfu * 100:.1f} % | "
                  f"{r.peak_memory_bytes / 2**30:.1f} GiB | {r.bubble_fraction * 100:.1f} % |")


if __name__ == "__main__":
    main()

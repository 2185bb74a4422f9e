"""The simulator's speed in two checkouts side by side: a few steps run alternately in each, every run in a
fresh process, as ratios in one run (the machine's load moves both alike). For a change that must leave
speed alone (a reorganisation):

    git worktree add --detach /tmp/before <revision>      # then build its C: python setup.py build_ext --inplace
    python benchmarks/compare_trees.py /tmp/before . --repeat 5

Each step's simulated time must be the same in both trees, or the script says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

# (name, strategy, cluster, workload, global batch, options)
STEPS = [
    ("ddp 256 ranks x 96 layers", "strategies/ddp.py", "32x8xA100-80GB", "toy:layers=96", 1024, {"microbatch_size": 1}),
    ("1f1b 8 stages x 256 mb", "strategies/one_f_one_b.py", "1x8xA100-80GB", "toy:layers=32", 256, {"pp": 8}),
    ("hybrid tp4 pp4 dp4", "strategies/hybrid.py", "8x8xA100-80GB", "toy:layers=16", 512,
     {"tp": 4, "pp": 4, "dp": 4, "schedule": "interleaved", "chunks": 2}),
    ("zero-3 64 ranks x 48 layers", "strategies/zero.py", "8x8xA100-80GB", "toy:layers=48", 256,
     {"stage": 3, "microbatch_size": 1}),
]

RUN = """
import inspect, json, sys, time
sys.path.insert(0, {root!r})
from dist_lib import simulate
strategy, cluster, workload, batch, options = {step!r}
if "fold" in inspect.signature(simulate).parameters:
    options = dict(options, fold=False)  # every rank, as a tree without folding runs it
simulate({root!r} + "/" + strategy, cluster, workload, batch, **options)  # warm: imports, caches
start = time.perf_counter()
result = simulate({root!r} + "/" + strategy, cluster, workload, batch, **options)
print(json.dumps([time.perf_counter() - start, result.time_s]))
"""


def run(root: str, step: tuple) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", RUN.format(root=root, step=step[1:])], capture_output=True,
                          text=True, cwd="/")
    if done.returncode:
        sys.exit(f"{root}: {step[0]} failed:\n{done.stderr[-2000:]}")
    wall, step_time = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, step_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the first checkout's folder")
    parser.add_argument("after", help="the second checkout's folder")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each step in each tree (median)")
    args = parser.parse_args()
    roots = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    print(f"{'step':30} {'before s':>9} {'after s':>9} {'after/before':>12}  same step time")
    for step in STEPS:
        walls: dict[str, list[float]] = {"before": [], "after": []}
        times: dict[str, float] = {}
        for i in range(args.repeat):
            for tree in (("before", "after") if i % 2 == 0 else ("after", "before")):
                wall, times[tree] = run(roots[tree], step)
                walls[tree].append(wall)
        b, a = statistics.median(walls["before"]), statistics.median(walls["after"])
        print(f"{step[0]:30} {b:9.3f} {a:9.3f} {a / b:12.3f}  {times['before'] == times['after']}")


if __name__ == "__main__":
    main()

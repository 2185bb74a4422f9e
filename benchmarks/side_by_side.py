"""Two or more source trees of the simulator timed side by side on the same steps: whether a change pays.

    python benchmarks/side_by_side.py /tmp/before . --rows 1f1b,1f1b-tp4 --rounds 5
    python benchmarks/side_by_side.py /tmp/before . --rows 1t-reduced --rounds 5

Each tree is a checkout with its C extension built in place (`python setup.py build_ext --inplace`). The
trees take turns, round after round and in alternating order, each run in a fresh process, so that a busy
spell of a shared machine falls on every tree alike; within a run a short step is repeated. A tree's time
is its best (the least disturbed) CPU time of `simulate()`, as `timeit` reports; wall time is listed too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scale import PIPELINES, pipeline_call  # noqa: E402

# name: (simulate() arguments, runs per process). The 1F1B rows are scale.py's; "1t-reduced" is its
# 3072-rank row with 64 microbatches per replica instead of 512.
ROWS = {
    "1f1b": (pipeline_call(*PIPELINES[0][1:]), 8),
    "1f1b-tp4": (pipeline_call(*PIPELINES[1][1:]), 3),
    "1t-reduced": (pipeline_call(*PIPELINES[2][1:4], 64, *PIPELINES[2][5:]), 1),
}

CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
from dist_lib import simulate
import dist_lib.memory
call, repeat = json.loads(sys.argv[2]), int(sys.argv[3])
best = None
for _ in range(repeat):
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(call["strategy"], call["cluster"], call["workload"], call["batch"], **call["options"])
    run = {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "events": len(result.raw_events),
           "time_s": result.time_s, "c": dist_lib.memory.ACCELERATED}
    del result
    if best is None or run["cpu"] < best["cpu"]:
        best = run
print(json.dumps(best))
"""


def run(tree: Path, row: str) -> dict:
    call, repeat = ROWS[row]
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), json.dumps(call), str(repeat)], cwd=tree,
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{tree} on {row} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="source trees; the first is the baseline")
    parser.add_argument("--rows", default="1f1b,1f1b-tp4", help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each tree on each row; the best counts")
    args = parser.parse_args()
    rows = args.rows.split(",")
    unknown = [row for row in rows if row not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    trees = [tree.resolve() for tree in args.trees]
    runs: dict[tuple[str, Path], list[dict]] = {(row, tree): [] for row in rows for tree in trees}
    for i in range(args.rounds):
        for row in rows:
            for tree in trees if i % 2 == 0 else trees[::-1]:
                runs[row, tree].append(run(tree, row))
    print(f"{'row':<11} {'tree':<32} {'C':>2} {'ops':>10} {'CPU s':>8} {'ops/s':>9} {'vs base':>8} {'wall s':>8} "
          f"{'step s':>8}")
    for row in rows:
        base = None
        for tree in trees:
            seen = runs[row, tree]
            best = min(seen, key=lambda r: r["cpu"])
            base = base or best["cpu"]
            steps = {r["time_s"] for r in seen}
            print(f"{row:<11} {str(tree)[-32:]:<32} {'y' if best['c'] else 'n':>2} {best['events']:>10,} "
                  f"{best['cpu']:>8.3f} {best['events'] / best['cpu']:>9,.0f} {best['cpu'] / base - 1:>+8.1%} "
                  f"{min(r['wall'] for r in seen):>8.3f} {'/'.join(f'{s:.4f}' for s in steps):>8}")


if __name__ == "__main__":
    main()

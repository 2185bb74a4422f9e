"""How much faster this checkout simulates than another one: the same steps run alternately in both.

    git archive main | tar -x -C /tmp/before             # the code to compare against, as files
    python benchmarks/speedup.py /tmp/before             # builds its C extension in place if need be
    python benchmarks/speedup.py /tmp/before --repeat 7 --rows 0,1

Each step runs in a fresh process (`scale.py`'s child), before and after in turn, `--repeat` times; the
table shows the fastest run of each, in wall seconds and in the process's CPU seconds. On a machine
shared with other work the wall time measures the neighbours too; the CPU time less so. A machine whose
speed drifts from one minute to the next (by 15 % between two runs in a row, seen here) is better
compared with `--together`, which runs before and after at the same time, one core each. The two trees
must agree on every step's event count and simulated time (else the comparison stops), so a change that
alters results does not pass for a faster one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scale import CHILD, pipeline_call  # noqa: E402

# scale.py's child, also reporting the CPU seconds the step took
TIMED_CHILD = CHILD.replace("start = time.perf_counter()", "start = time.perf_counter(); cpu = time.process_time()") \
    .replace('"wall": wall,', '"wall": wall, "cpu": time.process_time() - cpu,')

# (label, call): the two long 1F1B rows of `scale.py --table pipeline`, and its 3072-rank row cut to one
# replica of 64 microbatches (Megatron-LM's 1T model, TP 8 x PP 64, interleaved, full recompute: 512 ranks)
# and to two replicas (1024 ranks: the data-parallel all-reduces, and twice the state the ranks keep)
ROWS = [
    ("1F1B, 8 stages", pipeline_call(1, 8, 1, 512, "1f1b", "toy:layers=32", False)),
    ("1F1B, TP 4 x PP 8", pipeline_call(4, 8, 1, 256, "1f1b", "toy:layers=32", False)),
    ("1T, TP 8 x PP 64 x DP 1, 64 microbatches", pipeline_call(8, 64, 1, 64, "interleaved", "gpt-1t", True)),
    ("1T, TP 8 x PP 64 x DP 2, 64 microbatches", pipeline_call(8, 64, 2, 64, "interleaved", "gpt-1t", True)),
]


def start(tree: Path, call: dict) -> subprocess.Popen:
    code = TIMED_CHILD.format(root=str(tree), call=json.dumps(call))
    return subprocess.Popen([sys.executable, "-c", code], cwd=tree, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def result(tree: Path, child: subprocess.Popen) -> dict:
    out, err = child.communicate()
    if child.returncode:
        sys.exit(f"{tree}: the step failed:\n{err.strip()}")
    return json.loads(out)


def run_steps(trees: dict[str, Path], call: dict, together: bool) -> dict[str, dict]:
    """Each tree's run of the step: one after the other, or all at once (one core each)."""
    if together:
        children = {name: start(tree, call) for name, tree in trees.items()}
        return {name: result(trees[name], child) for name, child in children.items()}
    return {name: result(tree, start(tree, call)) for name, tree in trees.items()}


def ensure_built(tree: Path) -> None:
    """Build `tree`'s C extension in place unless it is there (a tree from `git archive` has none)."""
    if not any((tree / "dist_lib").glob("_buffers*.so")) and not any((tree / "dist_lib").glob("_buffers*.pyd")):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                       capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the other checkout's root (the code before the change)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each step in each tree; the fastest counts")
    parser.add_argument("--rows", default=",".join(str(i) for i in range(len(ROWS))),
                        help=f"which rows, by number (0-{len(ROWS) - 1}), comma-separated")
    parser.add_argument("--together", action="store_true",
                        help="run before and after at the same time, one core each, so that the machine's "
                             "slow and fast spells hit both alike (they share the memory bus and last-level cache)")
    args = parser.parse_args()
    before = args.before.resolve()
    if not (before / "dist_lib" / "__init__.py").is_file():
        sys.exit(f"{before}: not a checkout of this project (no dist_lib/__init__.py)")
    try:
        rows = [ROWS[int(i)] for i in args.rows.split(",")]
    except (ValueError, IndexError):
        sys.exit(f"--rows {args.rows}: expected row numbers from 0 to {len(ROWS) - 1}, e.g. 0,2")
    ensure_built(before)
    trees = {"before": before, "after": ROOT}
    best: dict[tuple[str, str], dict] = {}
    for _ in range(max(1, args.repeat)):  # in rounds, before and after in turn: a slow spell hits both
        for label, call in rows:
            for name, m in run_steps(trees, call, args.together).items():
                key = (label, name)
                if key in best and (m["events"], m["time_s"]) != (best[key]["events"], best[key]["time_s"]):
                    sys.exit(f"{label}: {name} gave different results from one run to the next")
                best[key] = {**m, "wall": min(m["wall"], best.get(key, m)["wall"]),
                             "cpu": min(m["cpu"], best.get(key, m)["cpu"])}
    print(f"best of {max(1, args.repeat)}{', run together' if args.together else ''}, before = {before}")
    print(f"{'step':<42} {'ops':>9} {'wall s before':>14} {'after':>6} {'ops/s before':>13} {'after':>8} "
          f"{'gain':>6} {'CPU s before':>13} {'after':>6} {'gain':>6}")
    for label, _ in rows:
        b, a = best[(label, "before")], best[(label, "after")]
        if (b["events"], b["time_s"]) != (a["events"], a["time_s"]):
            sys.exit(f"{label}: the trees disagree: {b['events']} ops, {b['time_s']!r} s before; "
                     f"{a['events']} ops, {a['time_s']!r} s after")
        print(f"{label:<42} {a['events']:>9,} {b['wall']:>14.2f} {a['wall']:>6.2f} {a['events'] / b['wall']:>13,.0f} "
              f"{a['events'] / a['wall']:>8,.0f} {b['wall'] / a['wall'] - 1:>6.1%} {b['cpu']:>13.2f} "
              f"{a['cpu']:>6.2f} {b['cpu'] / a['cpu'] - 1:>6.1%}")


if __name__ == "__main__":
    main()

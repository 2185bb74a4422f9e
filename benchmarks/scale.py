"""How fast the simulator runs: simulated ops per wall-clock second, memory per event, and scaling.

Each configuration runs in a fresh subprocess so its peak RSS is its own. Usage:

    python benchmarks/scale.py            # the table in the README
    python benchmarks/scale.py --quick    # a smaller sweep

Wall time is the best of `--repeat` runs (3 by default), as `timeit` reports: on a shared machine the
slower runs measure the neighbours. The runs go in rounds over all rows, so that a slow spell of the
machine does not fall on all of one row's runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, re, resource, sys, time
sys.path.insert(0, {root!r})
from dist_lib import simulate


def rss_kib(key):
    # Linux: the current (VmRSS) and peak (VmHWM) resident set. ru_maxrss would do for the peak, but a
    # spawned process starts with its parent's high-water mark, which hides a step smaller than that.
    try:
        with open("/proc/self/status") as f:
            return int(re.search(key + r":\s+(\d+)", f.read()).group(1))
    except (OSError, AttributeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


ranks, layers, microbatches = {ranks}, {layers}, {microbatches}
gc.collect()
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident set
except OSError:
    pass
base = rss_kib("VmRSS")
start = time.perf_counter()
result = simulate("strategies/ddp.py", f"{{ranks // 8}}x8xA100-80GB" if ranks >= 8 else f"{{ranks}}xA100-80GB",
                  f"toy:layers={{layers}}", ranks * microbatches, microbatch_size=1)
wall = time.perf_counter() - start
peak = rss_kib("VmHWM")
events = len(result.raw_events)
print(json.dumps({{"wall": wall, "events": events, "rss_kib": peak, "grew_kib": peak - base,
                  "time_s": result.time_s}}))
"""


def measure(ranks: int, layers: int, microbatches: int) -> dict:
    code = CHILD.format(root=str(ROOT), ranks=ranks, layers=layers, microbatches=microbatches)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller sweep")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the fastest counts")
    args = parser.parse_args()
    configs = [(8, 24, 4), (64, 24, 4), (512, 24, 1), (1024, 24, 1), (1024, 24, 4), (1024, 96, 1)]
    if args.quick:
        configs = [(8, 24, 4), (64, 24, 4), (512, 24, 1)]
    sys.path.insert(0, str(ROOT))
    import dist_lib.memory
    accelerated = dist_lib.memory.Buffer.__module__ == "dist_lib._buffers"
    print("DDP step (forward/backward per microbatch and layer, one all-reduce and update per layer), "
          f"toy layers, A100 nodes of 8; buffers in {'C' if accelerated else 'Python'}")
    print(f"{'ranks':>6} {'layers':>6} {'microbatches':>12} {'ops':>9} {'wall s':>8} {'ops/s':>10} {'us/op':>7} "
          f"{'peak RSS MiB':>13} {'B/event':>8}")
    # rounds over every row, rather than a row's runs back to back: a slow minute on a shared machine
    # then costs each row one run instead of all of one row's
    runs: list[list[dict]] = [[] for _ in configs]
    for _ in range(max(1, args.repeat)):
        for config, seen in zip(configs, runs):
            seen.append(measure(*config))
    for (ranks, layers, microbatches), seen in zip(configs, runs):
        m = min(seen, key=lambda m: m["wall"])
        rate = m["events"] / m["wall"]
        # a small run may fit in memory the interpreter already holds: then there is nothing to divide
        per_event = f"{m['grew_kib'] * 1024 / m['events']:.0f}" if m["grew_kib"] > 0 else "-"
        print(f"{ranks:>6} {layers:>6} {microbatches:>12} {m['events']:>9,} {m['wall']:>8.2f} {rate:>10,.0f} {1e6 / rate:>7.2f} "
              f"{m['rss_kib'] / 1024:>13.0f} {per_event:>8}")


if __name__ == "__main__":
    main()

"""How long a step's Chrome trace takes to write and to validate, against the step's own simulation.

Megatron-style hybrid steps (TP 4 x PP 8, 1F1B, toy layers) with 1, 4 and 8 data-parallel replicas: 0.2, 0.8
and 1.7 million events. Usage:

    python benchmarks/trace_speed.py                 # the three steps
    python benchmarks/trace_speed.py --quick         # the smallest only
    python benchmarks/trace_speed.py --gzip          # also write each trace as .json.gz

Times are the best of `--repeat` runs (1 by default; a long step's write and check take seconds each);
simulating is timed once.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (label, replicas): TP 4 x PP 8 x DP replicas on nodes of 8 A100s, 256 microbatches of 1 per replica
STEPS = [("TP4 PP8 DP1, 32 ranks", 1), ("TP4 PP8 DP4, 128 ranks", 4), ("TP4 PP8 DP8, 256 ranks", 8)]


def best_of(repeat: int, run) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest step only")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each write and check; the fastest counts")
    parser.add_argument("--gzip", action="store_true", help="also write each trace gzip-compressed")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    header = f"{'step':<26} {'events':>9} {'simulate s':>10} {'write s':>8} {'validate s':>10} {'MB':>7}"
    print(header + (f" {'.gz write s':>11} {'.gz MB':>7}" if args.gzip else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for label, dp in STEPS[:1] if args.quick else STEPS:
            print(row(label, dp, args.repeat, args.gzip, Path(tmp)), flush=True)


def row(label: str, dp: int, repeat: int, gzip: bool, folder: Path) -> str:
    """One step's line of the table: simulated once, its trace written and validated `repeat` times."""
    from dist_lib import simulate, validate_trace

    start = time.perf_counter()
    result = simulate(str(ROOT / "strategies" / "hybrid.py"), f"{4 * dp}x8xA100-80GB", "toy:layers=32", 256 * dp,
                      microbatch_size=1, tp=4, pp=8, dp=dp, schedule="1f1b")
    simulated = time.perf_counter() - start
    path = folder / "trace.json"
    write_s, _ = best_of(repeat, lambda: result.write_chrome_trace(path))
    check_s, problems = best_of(repeat, lambda: validate_trace(path))
    assert problems == [], problems[:3]
    line = (f"{label:<26} {len(result.raw_events):>9} {simulated:>10.2f} {write_s:>8.2f} {check_s:>10.2f} "
            f"{path.stat().st_size / 1e6:>7.1f}")
    if gzip:
        packed = folder / "trace.json.gz"
        gz_s, _ = best_of(repeat, lambda: result.write_chrome_trace(packed))
        line += f" {gz_s:>11.2f} {packed.stat().st_size / 1e6:>7.1f}"
    return line

if __name__ == "__main__":
    main()

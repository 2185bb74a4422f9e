"""Where a context-parallel torchtitan row's simulated step goes: the busiest rank's attention kernels, the work
PyTorch's context-parallel SDPA adds around them (merges, gradient accumulations, key/value copies and casts:
`dist_lib/costs/torch_context.py`), the rest of its compute, and what compute did not hide.

    python benchmarks/context_breakdown.py                         # T2 8B cp2, cp4, cp8 (seconds)
    python benchmarks/context_breakdown.py --rows "T6 405B cp8"    # a Table 6 row (a minute or two each)

`attention x` is how much longer than simulated the attention kernels would have to run for the step to be the
measured one, everything else as simulated: (measured - step + attention) / attention.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fidelity_torchtitan import TORCHTITAN, predict  # noqa: E402

KINDS = (("attention block", "attention"), ("attention merge", "merges"), ("gradient accumulation", "accumulation"),
         ("context-parallel K/V copies", "K/V copies"), ("context-parallel output cast", "casts"),
         ("context-parallel gradient casts", "casts"))
COLUMNS = ("attention", "merges", "accumulation", "K/V copies", "casts", "other")


def kind(detail: str) -> str:
    return next((name for prefix, name in KINDS if detail.startswith(prefix)), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="T2 8B cp2,T2 8B cp4,T2 8B cp8", help="comma-separated torchtitan rows")
    names = [name.strip() for name in parser.parse_args().rows.split(",") if name.strip()]
    runs = {r.name: r for r in TORCHTITAN if r.cp > 1}
    for name in names:
        if name not in runs:
            sys.exit(f"no context-parallel torchtitan row {name!r}; rows: {', '.join(runs)}")
    print(f"{'row':<16} {'measured':>8} {'step':>7} " + " ".join(f"{c:>12}" for c in COLUMNS)
          + f" {'exposed':>8} {'attention x':>11}")
    for name in names:
        run = runs[name]
        result = predict(run)
        busy = result.compute_busy()
        rank = max(range(len(busy)), key=busy.__getitem__)
        seconds = Counter()
        for event in result.events:
            if event.rank == rank and event.stream == "compute":
                seconds[kind(event.detail)] += event.duration
        exposed = result.time_s - sum(seconds.values())
        factor = (run.measured_s - result.time_s + seconds["attention"]) / seconds["attention"]
        print(f"{name:<16} {run.measured_s:>8.2f} {result.time_s:>7.2f} "
              + " ".join(f"{seconds[c]:>12.2f}" for c in COLUMNS) + f" {exposed:>8.2f} {factor:>11.2f}", flush=True)


if __name__ == "__main__":
    main()

"""The planner's answers on the benchmark inputs, to show that a change to the search's speed left them alone:
for each input, the plans the estimate ranks first with their estimates (to the last bit), and with
`--end-to-end` the plan `plan()` returns with its simulated step.

    python -m benchmarks.planner_answers --save before.json      # on the old code
    python -m benchmarks.planner_answers --compare before.json   # on the new code: lists every difference

Inputs: the peer settings, the scale clusters and the small clusters of `benchmarks/planners.py`, and the
1024-GPU cluster by the frameworks' rules. Besides the first plans, the number of candidates the estimate
ranked is printed (a new pruning bound lowers it; the first plans must not move).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dist_lib import Cluster, Workload
from dist_lib.planner import plan
from dist_lib.planner.search import generate
from benchmarks.planners import BOUNDS, END_TO_END, SCALE, SETTINGS

FIRST = 25  # distinct plans compared, in the estimate's order


def inputs() -> list[tuple[str, str, str, int, str]]:
    """(name, cluster, workload, batch, framework) of every input."""
    out = [(s.name, s.cluster, s.workload, s.batch, "any") for s in SETTINGS]
    out += [(name, spec, workload, batch, "any") for name, spec, workload, batch in SCALE]
    out += [(f"{spec} {workload}", spec, workload, batch, "any") for spec, workload, batch in BOUNDS]
    name, spec, workload, batch = SCALE[1]
    out += [(f"{name}, {framework}", spec, workload, batch, framework) for framework in ("megatron", "deepspeed")]
    return out


def answers(end_to_end: bool) -> dict:
    out = {}
    for name, spec, workload, batch, framework in inputs():
        started = time.perf_counter()
        cluster, model = Cluster.load(spec), Workload.load(workload)
        found, _ = generate(cluster, model, batch, framework=None if framework == "any" else framework)
        found.sort(key=lambda c: c.estimate)
        first, seen = [], set()
        for c in found:
            if c.plan not in seen and len(first) < FIRST:
                seen.add(c.plan)
                first.append([c.plan.describe(), repr(c.estimate), repr(c.memory)])
        entry = {"first": first, "estimated": len(found)}
        if end_to_end and (spec, workload, batch) in [(s, w, b) for _, s, w, b in END_TO_END] + \
                [(s.cluster, s.workload, s.batch) for s in SETTINGS]:
            result = plan(cluster, model, batch, framework=framework)
            entry["plan"] = [result.best.plan.describe(), repr(result.best.estimate), repr(result.best.simulated)]
        out[name] = entry
        print(f"{name}: {len(found)} estimated, {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the answers to this JSON file")
    parser.add_argument("--compare", type=Path, help="compare the answers with this JSON file")
    parser.add_argument("--end-to-end", action="store_true",
                        help="also run plan() whole on the peer settings and the 1024-GPU cluster")
    args = parser.parse_args()
    found = answers(args.end_to_end)
    if args.save:
        args.save.write_text(json.dumps(found, indent=1))
    if args.compare:
        before, differ = json.loads(args.compare.read_text()), 0
        for name, entry in found.items():
            old = before.get(name)
            if old is None:
                print(f"{name}: not in {args.compare}")
                continue
            for key in ("first", "plan"):
                if key in entry and key in old and entry[key] != old[key]:
                    differ += 1
                    print(f"{name}: {key} differs\n  before {old[key]}\n  now    {entry[key]}")
            print(f"{name}: candidates estimated {old['estimated']} before, {entry['estimated']} now")
        print("identical" if not differ else f"{differ} differences")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

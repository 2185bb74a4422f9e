"""The planner's closed-form estimate beside the simulator, plan by plan: two-stage pipelines at TP 1, 2
and 4 on per-GPU NICs (A100 nodes) and behind one 10 Gb/s NIC a node (V100 nodes), under 1F1B, ZB-H1,
full recompute and interleaving with selective recompute, each stage one node.

    python -m benchmarks.planner_estimate

Prints one row per plan (estimated and simulated step, their ratio, estimated memory share against the
simulated peak share) and the mean and largest |estimate / simulated - 1|. The estimate must never count
less memory than the simulator holds; its time is what ranks the search's candidates before the
simulator runs the best few (`dist_lib/planner/estimate.py`, `partition.py`, `messages.py`).
"""

from __future__ import annotations

from dist_lib import Cluster, Workload
from dist_lib.planner.evaluate import simulate_candidate
from dist_lib.planner.partition import step_estimate
from dist_lib.planner.search import Candidate, _Space, to_plan

SETTINGS = [("toy:layers=4", "2x2xA100-80GB", 8), ("gpt-1.3b:layers=8", "2x2xA100-80GB", 8),
            ("gpt-350m", "2x4xA100-80GB", 16), ("gpt-1.3b:layers=8", "2x4xV100-32GB:nics=1x1.25", 16)]
VARIANTS = [("1f1b", "none"), ("zero-bubble", "none"), ("1f1b", "full"), ("interleaved", "selective")]


def rows():
    """(workload, cluster, tp, schedule, recompute, estimate s, simulated s, estimated memory share,
    simulated peak share) of every plan."""
    for name, spec, batch in SETTINGS:
        workload, cluster = Workload.load(name), Cluster.load(spec)
        gpus = cluster.nodes[0].gpus
        stages = (tuple(range(gpus)), tuple(range(gpus, 2 * gpus)))
        for tp in sorted({1, 2, gpus}):
            microbatch = 2 * gpus // tp  # two samples a replica
            for schedule, recompute in VARIANTS:
                options = _Space(cluster, workload)
                placed = [(workload.num_layers // 2,
                           {o.tp: o for o in options.options(ranks, microbatch, recompute, 0)}[tp])
                          for ranks in stages]
                m, chunks = batch // microbatch, 2 if schedule == "interleaved" else 1
                seconds, memory = step_estimate(cluster, workload, placed, m, schedule, chunks)
                plan = to_plan(placed, microbatch, m, schedule, recompute, 0, chunks)
                ran = simulate_candidate(cluster, workload, batch, Candidate(plan, seconds, memory, 0.0))
                yield name, spec, tp, schedule, recompute, seconds, ran.simulated, memory, ran.peak_fraction


def main() -> None:
    print("| workload | cluster | tp | schedule | recompute | estimate | simulated | estimate / simulated "
          "| memory: estimate / simulated peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for name, spec, tp, schedule, recompute, seconds, simulated, memory, peak in rows():
        errors.append(abs(seconds / simulated - 1))
        print(f"| {name} | {spec} | {tp} | {schedule} | {recompute} | {seconds * 1e3:.1f} ms | "
              f"{simulated * 1e3:.1f} ms | {seconds / simulated:.3f} | {memory:.3f} / {peak:.3f} |")
    print(f"\nmean |estimate / simulated - 1| {sum(errors) / len(errors) * 100:.1f} %, "
          f"largest {max(errors) * 100:.1f} % over {len(errors)} plans")


if __name__ == "__main__":
    main()

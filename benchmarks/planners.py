"""Our planner beside Metis, AMP and FASOP on each one's published setting, every plan simulated here.

    python -m benchmarks.planners              # the five peer settings
    python -m benchmarks.planners --scale      # plus 64- and 1024-GPU three-type clusters (search time)
    python -m benchmarks.planners --bounds     # plus what the pruning bounds cost on small clusters
    python -m benchmarks.planners --end-to-end # only plan() as a user calls it on 1024 GPUs, timed whole
    python -m benchmarks.planners --end-to-end --frontier   # and on 16,384 GPUs
    python -m benchmarks.planners --end-to-end --growth     # and on 2048, 4096 and 8192 GPUs

For each setting: the peer's chosen plan (the plan the peer chose when run on that setting, as a `Plan`)
and our planner's best, both run through this sandbox's simulator, and the search wall times (the peers'
as measured on a 2-core machine; ours on this one). The peers' models are written as the sandbox's GPT
shapes with their layer counts, hidden sizes, sequence lengths and vocabularies (BERT-large as a GPT of
its shape); durations come from costs/, not from the peers' profiles. AMP's and FASOP's clouds give each
node one NIC that its four GPUs share (`nics=1xGBps`); Metis gives its figure per GPU.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, replace

from dist_lib import Cluster, SimulationError, Workload
from dist_lib.planner import Plan, Stage, plan
from dist_lib.planner.evaluate import run_plan, simulate_all, simulate_candidate
from dist_lib.planner.search import generate


@dataclass
class Setting:
    name: str
    peer: str
    cluster: str
    workload: str
    batch: int
    peer_plan: Plan
    peer_search_s: float


def _uniform(stage_ranks: list[tuple[int, ...]], tp: int, counts: list[int], microbatch: int, m: int) -> Plan:
    stages, start = [], 0
    for ranks, n in zip(stage_ranks, counts):
        dp = len(ranks) // tp
        stages.append(Stage(ranks, tp, ((start, start + n),), (microbatch // dp,) * dp))
        start += n
    return Plan(tuple(stages), microbatch, m)


GPT_1_5B = "gpt-6.7b:layers=8,seq=1024,vocab=51200"  # Metis' example model: 8 blocks of h 4096
METIS_A100, METIS_V100 = "A100-80GB:intra=46:inter=10", "V100-16GB:intra=50:inter=10"
# one NIC a node: p3.8xlarge 10 Gb/s, g4dn.12xlarge 50 Gb/s (NVLink 170 Gb/s and PCIe 50 Gb/s inside)
AMP_V100, AMP_T4 = "V100-16GB:intra=21.25:nics=1x1.25", "T4:intra=6.25:nics=1x6.25"
# one 40 Gb/s NIC a node as FASOP models p4d and g5 (NVLink 1840 Gb/s, PCIe 128 Gb/s inside)
FASOP_A100, FASOP_A10 = "A100-40GB:intra=230:nics=1x5", "A10:intra=16:nics=1x5"

SETTINGS = [
    # Metis (a): one stage, dp 8, 4 microbatches of 4 per replica
    Setting("Metis (a) GPT 1.5B", "Metis", f"2x4x{METIS_A100}", GPT_1_5B, 128,
            _uniform([tuple(range(8))], 1, [8], 32, 4), 1.0),
    # Metis (b): V100s first, stage 0 = 4 V100 dp 2 tp 2 (embedding + 2 blocks), stage 1 = 4 A100 dp 4
    Setting("Metis (b) GPT 1.5B", "Metis", f"1x4x{METIS_A100}+1x4x{METIS_V100}", GPT_1_5B, 128,
            Plan((Stage((4, 5, 6, 7), 2, ((0, 2),), (2, 2)), Stage((0, 1, 2, 3), 1, ((2, 8),), (1, 1, 1, 1))), 4, 32),
            1.0),
    # AMP: node-major ranks, dp 4, pp 4, blocks 5/7/6/6, microbatch 1 per replica
    Setting("AMP GPT-2 medium", "AMP", f"3x4x{AMP_V100}+1x4x{AMP_T4}", "gpt-350m:seq=1024,vocab=52256", 32,
            _uniform([tuple(range(4 * s, 4 * s + 4)) for s in range(4)], 1, [5, 7, 6, 6], 4, 8), 1437.0),
    # FASOP BERT-large: A100 node first, dp 4, pp 4, profiled partition [14, 5, 5, 2] of embedding + 24 + head
    Setting("FASOP BERT-large", "FASOP", f"1x4x{FASOP_A100}+3x4x{FASOP_A10}", "gpt-350m:seq=512,vocab=30522", 256,
            _uniform([tuple(range(4 * s, 4 * s + 4)) for s in range(4)], 1, [13, 5, 5, 1], 32, 8), 10.0),
    # FASOP GPT-2 XL: dp 2, pp 16 (stages of 2 GPUs), A100 node last, 3 blocks a stage, microbatch 1
    Setting("FASOP GPT-2 XL", "FASOP", f"1x4x{FASOP_A100}+7x4x{FASOP_A10}",
            "gpt-1.3b:layers=48,hidden=1600,heads=25,seq=1024,vocab=50257", 64,
            _uniform([(4 + 2 * s, 5 + 2 * s) for s in range(14)] + [(0, 1), (2, 3)], 1, [3] * 16, 2, 32), 35.0),
]

SCALE = [("64 GPUs: 2x8 H100 + 2x8 A100 + 4x8 V100", "2x8xH100-80GB+2x8xA100-80GB+4x8xV100-32GB", "gpt-13b", 512),
         ("1024 GPUs: 32x8 H100 + 32x8 A100 + 64x8 V100", "32x8xH100-80GB+32x8xA100-80GB+64x8xV100-32GB",
          "gpt-175b", 2048)]


# plan() end to end, as `python -m grader plan` runs it: (label, cluster, workload, batch)
END_TO_END = [SCALE[1]]
FRONTIER = [("16,384 GPUs: 512x8 H100 + 512x8 A100 + 1024x8 V100", "512x8xH100-80GB+512x8xA100-80GB+1024x8xV100-32GB",
             "gpt-175b", 16384)]
# the same mix at the sizes between, a sample a GPU: how the search grows
GROWTH = [(f"{n:,} GPUs: {n // 32}x8 H100 + {n // 32}x8 A100 + {n // 16}x8 V100",
           f"{n // 32}x8xH100-80GB+{n // 32}x8xA100-80GB+{n // 16}x8xV100-32GB", "gpt-175b", n) for n in (2048, 4096, 8192)]


def end_to_end_table(rows: list[tuple[str, str, str, int]]) -> None:
    """`plan()` with its defaults (the best 10 estimates simulated in order until the next cannot win, the
    winner refined on the simulator), timed whole, and how much of it each phase took."""
    print("| cluster | workload, batch | best plan | simulated step | finalists simulated | estimate (wall / CPU) | "
          "end to end (wall / CPU) |")
    print("|---|---|---|---|---|---|---|")
    for name, spec, workload, batch in rows:
        marks: dict[str, tuple[float, float]] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase == "simulate" and "simulate" not in marks:
                marks["simulate"] = (time.perf_counter() - started, time.process_time() - cpu)

        started, cpu = time.perf_counter(), time.process_time()
        found = plan(Cluster.load(spec), Workload.load(workload), batch, progress=progress)
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        est_wall, est_cpu = marks.get("simulate", (took, cpu))
        ran = sum(c.simulated is not None for c in found.simulated)
        simulated = f"{found.best.simulated * 1e3:.1f} ms" if found.best.simulated is not None else \
            f"not simulated (estimate {found.best.estimate * 1e3:.1f} ms)"
        print(f"| {name} | {workload}, {batch} | {found.best.plan.describe()} | {simulated} | "
              f"{ran}{', refined' if found.refined_from else ''} | {est_wall:.1f} s / {est_cpu:.1f} s | "
              f"{took:.1f} s / {cpu:.1f} s |", flush=True)


# Small clusters on which every plan of the unpruned space can be simulated
BOUNDS = [("1x2xA100-80GB+1x2xT4", "toy:layers=4", 4), ("1x1xA100-80GB+1x1xV100-16GB+1x1xT4", "toy:layers=3", 4),
          ("1x2xA100-80GB+1x2xV100-32GB", "gpt-350m:layers=8", 16), ("1x2xT4", "gpt-1.3b:layers=8", 8),
          ("1x2xA10+1x2xT4", "gpt-760m", 8), ("1x4xA100-80GB+1x4xV100-32GB", "gpt-1.3b", 32)]


def bounds_table() -> None:
    """Per small cluster: the plans the default bounds (20 % slack, 16 stages) estimate against the
    unpruned space, every unpruned plan simulated, how often the estimate orders two of them differently
    from the simulator, where the simulator's best stands in the estimate's order, whether the bounds
    kept it, and the planner's answer (with its refinement) beside it."""
    print("\n| cluster | workload, batch | estimated: bounded / unpruned | pairs the estimate misorders | "
          "simulated best's estimate rank | kept by the bounds | simulated best | planner's best |")
    print("|---|---|---|---|---|---|---|---|")
    for spec, name, batch in BOUNDS:
        cluster, workload = Cluster.load(spec), Workload.load(name)
        bounded, _ = generate(cluster, workload, batch)
        every, _ = generate(cluster, workload, batch, prune_slack=math.inf, max_stages=64)
        distinct = sorted({c.plan: c for c in every}.values(), key=lambda c: c.estimate)
        ran = [c for c in simulate_all(cluster, workload, batch, distinct) if c.simulated is not None]
        best = min(ran, key=lambda c: c.simulated)
        pairs = [(a, b) for i, a in enumerate(ran) for b in ran[i + 1:]]
        wrong = sum((a.estimate - b.estimate) * (a.simulated - b.simulated) < 0 for a, b in pairs)
        ours = plan(cluster, workload, batch).best.simulated
        print(f"| {spec} | {name}, {batch} | {len(bounded)} / {len(every)} | {wrong} of {len(pairs)} "
              f"({wrong / len(pairs) * 100:.0f} %) | {ran.index(best) + 1} of {len(ran)} | "
              f"{'yes' if best.plan in {c.plan for c in bounded} else 'no'} | {best.simulated * 1e3:.1f} ms | "
              f"{ours * 1e3:.1f} ms |")


def _misorders(cluster: Cluster, workload: Workload, batch: int, candidates: list, top: int) -> tuple[int, int]:
    """(pairs ordered differently, pairs) among the `top` distinct plans the estimate ranks first, every one
    simulated (the search itself stops simulating once the next estimate could not win)."""
    distinct = list({c.plan: c for c in reversed(candidates)}.values())
    best = sorted(distinct, key=lambda c: c.estimate)[:top]
    ran = [c for c in simulate_all(cluster, workload, batch, [replace(c) for c in best]) if c.simulated is not None]
    pairs = [(a, b) for i, a in enumerate(ran) for b in ran[i + 1:]]
    return sum((a.estimate - b.estimate) * (a.simulated - b.simulated) < 0 for a, b in pairs), len(pairs)


def _simulated(cluster: Cluster, workload: Workload, batch: int, plan_: Plan) -> str:
    try:
        return f"{run_plan(cluster, workload, batch, plan_).time_s * 1e3:.1f} ms"
    except SimulationError as exc:
        return str(exc).splitlines()[0][:60]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="plans our planner simulates (default 10)")
    parser.add_argument("--scale", action="store_true", help="also time the search on 64 and 1024 GPUs")
    parser.add_argument("--bounds", action="store_true", help="also compare the pruning bounds with the unpruned "
                                                               "space on small clusters")
    parser.add_argument("--end-to-end", action="store_true",
                        help="only time plan() whole (estimate, simulation of the finalists, refinement) at scale")
    parser.add_argument("--frontier", action="store_true", help="with --end-to-end: also on 16,384 GPUs")
    parser.add_argument("--growth", action="store_true",
                        help="with --end-to-end: also on 2048, 4096 and 8192 GPUs of the same mix")
    args = parser.parse_args()
    if args.end_to_end:
        end_to_end_table(END_TO_END + (GROWTH if args.growth else []) + (FRONTIER if args.frontier else []))
        return
    print("| setting | peer's plan | peer's plan, simulated | our plan | ours, simulated | speed-up | "
          "peer search | our search (wall / CPU) | estimate misorders | among its best 10 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in SETTINGS:
        cluster, workload = Cluster.load(s.cluster), Workload.load(s.workload)
        s.peer_plan.check(cluster.world_size, workload.num_layers, s.batch, cluster)
        peer = _simulated(cluster, workload, s.batch, s.peer_plan)
        started, cpu = time.perf_counter(), time.process_time()
        found = plan(cluster, workload, s.batch, top=args.top)
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        ours = found.best.simulated
        speedup = f"{float(peer.split()[0]) / (ours * 1e3):.2f}x" if peer.endswith(" ms") else "-"
        wrong, pairs = _misorders(cluster, workload, s.batch, found.candidates, args.top)
        print(f"| {s.name} | {s.peer_plan.describe()} | {peer} | {found.best.plan.describe()} | "
              f"{ours * 1e3:.1f} ms | {speedup} | {s.peer_search_s:g} s ({s.peer}) | {took:.2f} s / {cpu:.2f} s | "
              f"{found.order_disagreements} of {found.order_pairs} pairs | {wrong} of {pairs} pairs |")
    if args.bounds:
        bounds_table()
    if args.scale:
        # The estimate ranks every candidate; the simulator then runs the winner once (a 1024-rank
        # pipeline step is millions of events), timed apart.
        print("\n| cluster | workload, batch | candidates estimated | best plan | estimated step | search (wall / CPU) "
              "| simulated step | simulation (wall / CPU) |")
        print("|---|---|---|---|---|---|---|---|")
        for name, spec, workload, batch in SCALE:
            cluster, model = Cluster.load(spec), Workload.load(workload)
            started, cpu = time.perf_counter(), time.process_time()
            found = plan(cluster, model, batch, top=0)
            took, cpu = time.perf_counter() - started, time.process_time() - cpu
            started, sim_cpu = time.perf_counter(), time.process_time()
            best = simulate_candidate(cluster, model, batch, found.best)
            sim_took, sim_cpu = time.perf_counter() - started, time.process_time() - sim_cpu
            simulated = f"{best.simulated * 1e3:.0f} ms" if best.simulated is not None else best.error[:60]
            print(f"| {name} | {workload}, {batch} | {found.estimated_count} | {best.plan.describe()} | "
                  f"{best.estimate * 1e3:.0f} ms | {took:.1f} s / {cpu:.1f} s | {simulated} | "
                  f"{sim_took:.1f} s / {sim_cpu:.1f} s |")


if __name__ == "__main__":
    main()

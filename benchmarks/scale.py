"""How fast the simulator runs: simulated ops per wall-clock second, memory per event, and scaling.

Each configuration runs in a fresh subprocess so its peak RSS is its own. Usage:

    python benchmarks/scale.py                      # the tables in the README
    python benchmarks/scale.py --quick              # a smaller sweep
    python benchmarks/scale.py --table pipeline     # only the pipeline rows (the 3072-rank step in one process and in two)
    python benchmarks/scale.py --table long         # 8-stage 1F1B steps of 512 and 4,096 microbatches
    python benchmarks/scale.py --table long --cpu   # the same, with CPU seconds and ops per CPU second
    python benchmarks/scale.py --table replicas     # the 1T step with 1, 3 and 6 data-parallel replicas
    python benchmarks/scale.py --table frontier     # folded steps: 1T on 3072 ranks, Llama 3 405B on 16384

The engine's rows (ddp, pipeline, replicas) run every rank (`fold=False`): they measure the engine. The
frontier rows fold identical data-parallel replicas (`simulate(..., fold=True)`, the default), with the same
step time as the unfolded run, which the 1T rows run beside them for the ratio.

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


call = json.loads({call!r})
gc.collect()
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident set
except OSError:
    pass
base = rss_kib("VmRSS")
start, cpu_start = time.perf_counter(), time.process_time()
result = simulate(call["strategy"], call["cluster"], call["workload"], call["batch"], **call["options"])
wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
peak = rss_kib("VmHWM")
events = len(result.raw_events)
print(json.dumps({{"wall": wall, "cpu": cpu, "events": events, "rss_kib": peak, "grew_kib": peak - base,
                  "time_s": result.time_s}}))
"""


def ddp_call(ranks: int, layers: int, microbatches: int) -> dict:
    cluster = f"{ranks // 8}x8xA100-80GB" if ranks >= 8 else f"{ranks}xA100-80GB"
    return {"strategy": "strategies/ddp.py", "cluster": cluster, "workload": f"toy:layers={layers}",
            "batch": ranks * microbatches, "options": {"microbatch_size": 1, "fold": False}}


# Pipelines, rank for rank: (label, tp, pp, dp, microbatches per replica, schedule, workload, recompute
# [, processes]). The last rows are Megatron-LM's 1T configuration (Narayanan et al. 2021, Table 1: 3072
# GPUs, TP 8 x PP 64 x DP 6, batch 3072 of microbatch 1, interleaved), with full recompute so that it fits
# in 80 GB, in one process and in two (`workers=2`, replicas 3 to 5 in the second).
PIPELINES = [
    ("1F1B, 8 stages", 1, 8, 1, 512, "1f1b", "toy:layers=32", False),
    ("1F1B, TP 4 x PP 8", 4, 8, 1, 256, "1f1b", "toy:layers=32", False),
    ("interleaved 1T", 8, 64, 6, 512, "interleaved", "gpt-1t", True),
    ("1T, 2 processes", 8, 64, 6, 512, "interleaved", "gpt-1t", True, 2),
]

# Long pipelines (the `long` table): an 8-stage 1F1B step of 512 and of 4,096 microbatches, four toy layers a
# stage: what a simulator's speed on one long op graph per rank comes to, when no replica folds.
LONG = [(f"1F1B, 8 stages, {m} mb", 1, 8, 1, m, "1f1b", "toy:layers=32", False) for m in (512, 4096)]

# The 1T step with fewer data-parallel replicas (512 ranks each): the replicas do the same work, so a
# simulator whose cost per op did not grow with the simulated state would take time in proportion
REPLICAS = [(f"1T, {dp} replica{'s' if dp > 1 else ''}", 8, 64, dp, 512, "interleaved", "gpt-1t", True)
            for dp in (1, 3, 6)]


# Folded steps (the frontier table): Megatron-LM's 1T configuration as above, folded and not (in two
# processes, the faster unfolded run); and Llama 3 405B's 16,384-GPU layout (Llama Team 2024, "The Llama 3 Herd
# of Models", Table 4, sec. 3.3: TP 8 x PP 16 x DP 128 on H100s, 16 sequences of 8,192 tokens a replica, FSDP
# without resharding after the forward, one layer fewer on the first and last stages, interleaved), as
# `benchmarks/fidelity_llama3.py` runs it: memory is reported, not enforced.
LLAMA_405B = "llama-3-405b:grad_bytes_per_element=4"  # (FP32 gradient reduce-scatters, sec. 3.3)
FRONTIER = [
    ("1T folded", 8, 64, 6, 512, "interleaved", "gpt-1t", True, 1, True),
    ("1T unfolded, 2 procs", 8, 64, 6, 512, "interleaved", "gpt-1t", True, 2),
    ("Llama 3 405B folded", 8, 16, 128, 16, "interleaved", LLAMA_405B, False, 1, True),
]


def pipeline_call(tp: int, pp: int, dp: int, microbatches: int, schedule: str, workload: str, recompute: bool,
                  workers: int = 1, fold: bool = False) -> dict:
    ranks = tp * pp * dp
    device = "H100-80GB" if workload == LLAMA_405B else "A100-80GB"
    cluster = f"{ranks // 8}x8x{device}" if ranks >= 8 else f"1x{ranks}x{device}"  # (as `ddp_call`)
    options = {"microbatch_size": 1, "tp": tp, "pp": pp, "dp": dp, "schedule": schedule, "recompute": recompute,
               "fold": fold}
    if workload == LLAMA_405B:  # Table 4's options (`fidelity_llama3.Llama3Run.options`), with these degrees
        from benchmarks.fidelity_llama3 import LLAMA3_TABLE4
        options.update({k: v for k, v in LLAMA3_TABLE4[1].options().items() if k not in options})
    if workers == 2:  # the second half of the replicas in the second process
        options.update(workers=2, worker_ranks=replica_ranks(tp, pp, dp, range(dp // 2, dp)))
    return {"strategy": "strategies/hybrid.py", "cluster": cluster, "workload": workload,
            "batch": dp * microbatches, "options": options}


def replica_ranks(tp: int, pp: int, dp: int, replicas: range) -> list[int]:
    """The ranks of `replicas` in `hybrid.py`'s layout, rank = (stage * dp + replica) * tp + tp_rank: what a
    two-process run (`workers=2`) gives its second process, so that the two meet only in collectives."""
    return [(stage * dp + d) * tp + t for stage in range(pp) for d in replicas for t in range(tp)]


def measure(call: dict) -> dict:
    code = CHILD.format(root=str(ROOT), call=json.dumps(call))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller sweep")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the fastest counts")
    parser.add_argument("--table", choices=("ddp", "pipeline", "long", "replicas", "frontier", "all"), default="all",
                        help="which rows to run")
    parser.add_argument("--cpu", action="store_true",
                        help="pipeline rows: also the CPU seconds of the run that took fewest, and ops per CPU second "
                             "(on a shared machine, less disturbed by the neighbours than wall time)")
    args = parser.parse_args()
    configs = [(8, 24, 4), (64, 24, 4), (512, 24, 1), (1024, 24, 1), (1024, 24, 4), (1024, 96, 1)]
    pipelines = PIPELINES
    if args.quick:
        configs, pipelines = [(8, 24, 4), (64, 24, 4), (512, 24, 1)], PIPELINES[:1]
    sys.path.insert(0, str(ROOT))
    import dist_lib.memory.tracker
    accelerated = dist_lib.memory.tracker.Buffer.__module__ == "dist_lib._buffers"
    if args.table in ("ddp", "all"):
        ddp_table(configs, args.repeat, accelerated)
    if args.table in ("pipeline", "all"):
        pipeline_table(pipelines, args.repeat, accelerated, args.cpu)
    if args.table == "long":
        pipeline_table(LONG, args.repeat, accelerated, args.cpu)
    if args.table == "replicas":  # (not in "all": five minutes)
        pipeline_table(REPLICAS, 1, accelerated, args.cpu)
    if args.table == "frontier":  # (not in "all": the unfolded 1T row takes minutes)
        pipeline_table(FRONTIER, 1, accelerated, args.cpu)


def ddp_table(configs: list[tuple[int, int, int]], repeat: int, accelerated: bool) -> None:
    print("DDP step (forward/backward per microbatch and layer, one all-reduce and update per layer), "
          f"toy layers, A100 nodes of 8; buffers in {'C' if accelerated else 'Python'}")
    print(f"{'ranks':>6} {'layers':>6} {'microbatches':>12} {'ops':>9} {'wall s':>8} {'ops/s':>10} {'us/op':>7} "
          f"{'peak RSS MiB':>13} {'B/event':>8}")
    # rounds over every row, rather than a row's runs back to back: a slow minute on a shared machine
    # then costs each row one run instead of all of one row's
    runs: list[list[dict]] = [[] for _ in configs]
    for _ in range(max(1, repeat)):
        for config, seen in zip(configs, runs):
            seen.append(measure(ddp_call(*config)))
    for (ranks, layers, microbatches), seen in zip(configs, runs):
        m = min(seen, key=lambda m: m["wall"])
        rate = m["events"] / m["wall"]
        # a small run may fit in memory the interpreter already holds: then there is nothing to divide
        per_event = f"{m['grew_kib'] * 1024 / m['events']:.0f}" if m["grew_kib"] > 0 else "-"
        print(f"{ranks:>6} {layers:>6} {microbatches:>12} {m['events']:>9,} {m['wall']:>8.2f} {rate:>10,.0f} {1e6 / rate:>7.2f} "
              f"{m['rss_kib'] / 1024:>13.0f} {per_event:>8}")



def pipeline_table(rows: list[tuple], repeat: int, accelerated: bool, cpu: bool = False) -> None:
    print()
    once = "each row runs once" if repeat == 1 else "rows of more than 1024 ranks run once"
    print(f"Pipeline steps with strategies/hybrid.py on A100 nodes of 8, microbatch 1; {once}; "
          f"buffers in {'C' if accelerated else 'Python'}")
    print(f"{'pipeline':<20} {'ranks':>6} {'microbatches':>12} {'ops':>11} {'wall s':>8} {'ops/s':>9} "
          f"{'peak RSS MiB':>13} {'step s':>8}" + (f" {'CPU s':>6} {'ops/CPU s':>10}" if cpu else "")
          + "  (a folded row's ops are its representatives')")
    for label, tp, pp, dp, microbatches, schedule, workload, recompute, *workers in rows:
        call = pipeline_call(tp, pp, dp, microbatches, schedule, workload, recompute, *workers)
        runs = 1 if tp * pp * dp > 1024 else max(1, repeat)
        seen = [measure(call) for _ in range(runs)]
        m, least = min(seen, key=lambda m: m["wall"]), min(seen, key=lambda m: m["cpu"])
        extra = f" {least['cpu']:>6.3f} {least['events'] / least['cpu']:>10,.0f}" if cpu else ""
        print(f"{label:<20} {tp * pp * dp:>6} {microbatches:>12} {m['events']:>11,} {m['wall']:>8.1f} "
              f"{m['events'] / m['wall']:>9,.0f} {m['rss_kib'] / 1024:>13.0f} {m['time_s']:>8.2f}{extra}",
              flush=True)


if __name__ == "__main__":
    main()

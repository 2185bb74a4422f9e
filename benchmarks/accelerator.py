"""What each C twin gains: every C file of `dist_lib/native/`, its lines, and the speed-up of realistic steps
with that twin on against off (`DIST_SANDBOX_C_OFF=<twin>`, the other twins on).

    python benchmarks/accelerator.py                    # the table in docs/explanation/accelerator.md
    python benchmarks/accelerator.py --repeat 3 --configs ddp,1f1b
    python benchmarks/accelerator.py --twins drive,p2p
    python benchmarks/accelerator.py --twins events+drive --no-pure   # two twins off together

Every run is a fresh process (the twins are installed at import). For each configuration and twin, one
round runs the step with every twin on and with that twin off, one after the other, and takes the ratio of
their CPU seconds (the step's `time.process_time`, which a busy neighbour disturbs less than the wall
clock does); the table shows the median ratio over `--repeat` rounds (in every other round the run with the
twin off goes first). `buffers` is the twin the others
build on (the ops make and read tensors as C buffers), so switching it off switches those off too: its
column is the gain of the C buffers with the events, transfers and drive twins on. The last rows are every
twin against pure Python (`DIST_SANDBOX_PURE_PYTHON=1`). Every run must give the same events and step time
as the run with every twin on (else the script stops): a switch changes speed, never results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scale import ddp_call, pipeline_call  # noqa: E402
from dist_lib.native import TWINS  # noqa: E402

NATIVE = ROOT / "dist_lib" / "native"

CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, {root!r})
from dist_lib import simulate

call = json.loads({call!r})
gc.collect()
cpu, wall = time.process_time(), time.perf_counter()
result = simulate(call["strategy"], call["cluster"], call["workload"], call["batch"], **call["options"])
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({{"cpu": cpu, "wall": wall, "events": len(result.raw_events), "time_s": result.time_s}}))
"""


def zero3_call(ranks: int, layers: int, microbatches: int) -> dict:
    """ZeRO-3 (FSDP) data parallelism on A100 nodes of 8: per layer an all-gather in forward and in backward
    and a reduce-scatter of the gradient (`strategies/zero.py`)."""
    return {"strategy": "strategies/zero.py", "cluster": f"{ranks // 8}x8xA100-80GB", "workload": f"toy:layers={layers}",
            "batch": ranks * microbatches, "options": {"stage": 3, "microbatch_size": 1}}


# (key, label, call): each one to a few CPU seconds with every twin on
CONFIGS = [
    ("ddp", "DDP, 1024 ranks x 96 layers, 1 microbatch each (strategies/ddp.py)", ddp_call(1024, 96, 1)),
    ("1f1b", "1F1B, PP 32, 2048 microbatches, 64 layers (strategies/hybrid.py)",
     pipeline_call(1, 32, 1, 2048, "1f1b", "toy:layers=64", False)),
    ("hybrid", "GPT-3 175B, TP 8 x PP 16 x DP 4 interleaved, 32 microbatches per replica, recompute "
               "(strategies/hybrid.py)", pipeline_call(8, 16, 4, 32, "interleaved", "gpt-175b", True)),
    ("zero3", "ZeRO-3, 1024 ranks x 48 layers, 1 microbatch each (strategies/zero.py)", zero3_call(1024, 48, 1)),
]

# Which C files serve which twin (`dist_lib/native/`); headers go with the twins that include them.
FILES = {
    "buffers": ("_buffers.c", "_buffers.h"),
    "events": ("_events.c",),
    "transfers": ("_transfers.c",),
    "ops": ("_ops.c", "_ops.h"),
    "weight_ops": ("_weight_ops.c",),
    "comm": ("_comm_ops.c", "_comm_resolve.c", "_comm_end.c", "_work.c", "_comm.h"),
    "p2p": ("_p2p_ops.c",),
    "drive": ("_drive.c",),
}


def unserved() -> list[str]:
    """C files of dist_lib/native/ that no twin of `FILES` names (the table would leave them out)."""
    named = {name for names in FILES.values() for name in names}
    return sorted(p.name for p in NATIVE.glob("_*.[ch]") if p.name not in named)


def lines(names: tuple[str, ...]) -> int:
    return sum(len((NATIVE / name).read_text().splitlines()) for name in names if (NATIVE / name).exists())


def run(call: dict, env: dict[str, str]) -> dict:
    code = CHILD.format(root=str(ROOT), call=json.dumps(call))
    environ = {k: v for k, v in os.environ.items() if k not in ("DIST_SANDBOX_C_OFF", "DIST_SANDBOX_PURE_PYTHON")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env={**environ, **env})
    if out.returncode:
        sys.exit(f"the step failed with {env}:\n{out.stderr.strip()}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds of on/off pairs; the median ratio counts")
    parser.add_argument("--configs", default=",".join(key for key, _, _ in CONFIGS),
                        help=f"which configurations, comma-separated ({', '.join(key for key, _, _ in CONFIGS)})")
    parser.add_argument("--twins", default=",".join(TWINS),
                        help=f"which twins, comma-separated ({', '.join(TWINS)}); a+b switches a and b off together")
    parser.add_argument("--no-pure", action="store_true", help="leave out the row against pure Python")
    args = parser.parse_args()
    configs = [c for c in CONFIGS if c[0] in args.configs.split(",")]
    twins = [t for t in args.twins.split(",") if t]
    if not configs or {name for t in twins for name in t.split("+")} - set(TWINS):
        sys.exit(f"--configs {args.configs} --twins {args.twins}: choose from {[c[0] for c in CONFIGS]} and {TWINS}")
    if unserved():
        sys.exit(f"benchmarks/accelerator.py: FILES does not say which twin {', '.join(unserved())} serve")
    from dist_lib.native import EXTENSION
    if EXTENSION is None:
        sys.exit("the C accelerator is not built (or DIST_SANDBOX_PURE_PYTHON is set): nothing to compare")
    switches = {twin: {"DIST_SANDBOX_C_OFF": twin.replace("+", ",")} for twin in twins}
    if not args.no_pure:
        switches["all"] = {"DIST_SANDBOX_PURE_PYTHON": "1"}
    ratios: dict[tuple[str, str], list[float]] = {(t, key): [] for t in switches for key, _, _ in configs}
    on_cpu: dict[str, list[float]] = {key: [] for key, _, _ in configs}
    events: dict[str, int] = {}
    for round_ in range(max(1, args.repeat)):
        for key, label, call in configs:
            for name, env in switches.items():  # on and off close in time, in turn first
                if round_ % 2 == 0:
                    on, off = run(call, {}), run(call, env)
                else:
                    off, on = run(call, env), run(call, {})
                if (on["events"], on["time_s"]) != (off["events"], off["time_s"]):
                    sys.exit(f"{label}: {env} changed the results: {on['events']} events, {on['time_s']!r} s "
                             f"on; {off['events']} events, {off['time_s']!r} s off")
                ratios[(name, key)].append(off["cpu"] / on["cpu"])
                on_cpu[key].append(on["cpu"])
                events[key] = on["events"]
            print(f"  round done: {label}", file=sys.stderr, flush=True)
    print(f"speed-up with the twin on against off (the other twins on): median of {max(1, args.repeat)} on/off pairs "
          f"of CPU seconds, each run a fresh process, on a shared machine (one pair can be off by a quarter; medians move by several %)")
    print()
    for key, label, _ in configs:
        print(f"- {key}: {label}: {events[key]:,} events, {statistics.median(on_cpu[key]):.2f} CPU s with every twin on")
    print()
    header = f"| {'twin':<20} | {'C files':<50} | {'lines':>5} | " + " | ".join(f"{key:>7}" for key, _, _ in configs) + " |"
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for name in switches:
        files = ("every file",) if name == "all" else tuple(f for t in name.split("+") for f in FILES[t])
        count = sum(lines(f) for f in FILES.values()) if name == "all" else lines(files)
        label = "all (vs pure Python)" if name == "all" else name
        cells = " | ".join(f"{statistics.median(ratios[(name, key)]):>6.2f}x" for key, _, _ in configs)
        print(f"| {label:<20} | {', '.join(files):<50} | {count:>5} | {cells} |")


if __name__ == "__main__":
    main()

"""The engine beside a bare loop: how many times longer a DDP step takes to simulate than the least a
Python simulator must do for it.

    python benchmarks/engine_ratio.py                        # 1024 ranks x 96 layers, best of 3
    python benchmarks/engine_ratio.py --ranks 64 --layers 24 --repeat 5

The *bare loop* walks the same step's ops, rank by rank, and for each only looks up its duration in a
table (made from the simulated step's own events) and appends an event tuple to a list, advancing the
rank's clock: no tensors, memory, waits, link sharing or correctness check. It appends exactly as many
events as the full step records. Beside it, in the same process and in rounds (so that a slow spell of a
shared machine falls on every row alike), best of `--repeat`:

* the project's DDP (`strategies/ddp.py`, microbatch 1: gradients in 25 MB buckets, all-reduces
  overlapping the backward), rank for rank (`fold=False`) and folded (the default: one replica runs,
  `dist_lib/run/folding.py`);
* a user's blocking DDP (below): each layer's gradient all-reduced and awaited at once, as a first
  data-parallel step is often written. It declares no replica grid, so it never folds; the same file with
  the one-line declaration is the last row.

`engine_phases.py` runs the same rows in CPU seconds, which a shared machine's load moves less, and
splits each into the ranks' run, the event log's packing and the step's end.

The ratio is the row's wall time over the bare loop's. A folded step does not do the bare loop's work
(it runs one replica in 1024), so its ratio is below 1: the engine's own speed is the unfolded rows'.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dist_lib import ReplicaGrid, simulate  # noqa: E402
from dist_lib.native import ACCELERATED  # noqa: E402


async def blocking_ddp(model) -> None:
    """A user's data-parallel step: forward, backward, each layer's gradient all-reduced and awaited at
    once, then the updates."""
    layers, per = model.num_layers, model.global_batch_size // model.world_size
    weights = [model.load_weights(layer) for layer in range(layers)]
    x = model.get_input_activation(range(model.rank * per, (model.rank + 1) * per))
    inputs = []
    for layer in range(layers):
        inputs.append(x)
        x = model.forward(layer, x, weights[layer][0])
    grad = model.loss(x)
    del x
    reduced = [None] * layers
    for layer in reversed(range(layers)):
        weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
        reduced[layer] = await model.all_reduce(weight_grad)
        del weight_grad
    for layer in range(layers):
        weight, opt = weights[layer]
        new_weight, _ = model.update(layer, reduced[layer], weight, opt)
        model.set_final_weight(layer, new_weight)


async def blocking_ddp_declared(model) -> None:
    await blocking_ddp(model)


# the one line that lets a user's file fold: its replicas run one program over even shares of the batch
blocking_ddp_declared.replica_grid = lambda world_size, global_batch_size, **options: ReplicaGrid(world_size)


def bare_loop(program: list[tuple[str, int]], table: dict[tuple[str, int], float], ranks: int) -> list[tuple]:
    """Each rank's ops in order: the duration looked up, an event appended, the clock advanced."""
    events: list[tuple] = []
    append = events.append
    for rank in range(ranks):
        clock = 0.0
        for op, layer in program:
            end = clock + table[op, layer]
            append((rank, op, "compute", clock, end, layer, rank, 0, 0.0, None, 0, ""))
            clock = end
    return events


def timed(fn) -> tuple[float, object]:
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def step_options(description: str) -> tuple[argparse.Namespace, str, str]:
    """(the command line: --ranks, --layers, --repeat; the cluster; the workload) of a DDP step of toy layers on
    A100 nodes of 8, as this script and `engine_phases.py` set it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each row shows its fastest (default 3)")
    args = parser.parse_args()
    cluster = f"{args.ranks // 8}x8xA100-80GB" if args.ranks % 8 == 0 else f"{args.ranks}xA100-80GB"
    return args, cluster, f"toy:layers={args.layers}"


def bare_program(cluster: str, workload: str, ranks: int) -> tuple[list, dict, int]:
    """The bare loop's program and cost table (rank 0's ops of the project's DDP step, in order, and their
    durations) and the step's number of events."""
    reference = simulate("strategies/ddp.py", cluster, workload, ranks, fold=False, microbatch_size=1)
    mine = [e for e in reference.raw_events if e[0] == 0]
    program = [(e[1], e[5]) for e in mine]
    assert len(program) * ranks == len(reference.raw_events), "every rank of a DDP step records the same ops"
    return program, {(e[1], e[5]): e[4] - e[3] for e in mine}, len(reference.raw_events)


def main() -> None:
    args, cluster, workload = step_options(__doc__.splitlines()[0])
    ranks, layers = args.ranks, args.layers

    def run(strategy, fold: bool, **options):
        return lambda: simulate(strategy, cluster, workload, ranks, fold=fold, **options)

    rows = [
        ("project's DDP, rank for rank", run("strategies/ddp.py", False, microbatch_size=1)),
        ("project's DDP, folded", run("strategies/ddp.py", True, microbatch_size=1)),
        ("user's blocking DDP, rank for rank", run(blocking_ddp, False)),
        ("user's blocking DDP, folded (declared)", run(blocking_ddp_declared, True)),
    ]
    program, table, events = bare_program(cluster, workload, ranks)

    best: dict[str, float] = {}
    ops: dict[str, int] = {}
    for _ in range(args.repeat):
        took, out = timed(lambda: bare_loop(program, table, ranks))
        best["bare loop"] = min(best.get("bare loop", took), took)
        ops["bare loop"] = len(out)
        del out
        for label, fn in rows:
            took, result = timed(fn)
            best[label] = min(best.get(label, took), took)
            ops[label] = len(result.raw_events)
            del result
    engine = "C accelerator" if ACCELERATED else "Python alone (DIST_SANDBOX_PURE_PYTHON)"
    print(f"{ranks} ranks x {layers} layers, microbatch 1, {events:,} ops a full step; {engine}; "
          f"best of {args.repeat}, rows run in rounds in one process")
    print(f"{'':40} {'events run':>11} {'wall s':>8} {'x bare loop':>12}")
    for label in ["bare loop"] + [label for label, _ in rows]:
        print(f"{label:40} {ops[label]:>11,} {best[label]:>8.3f} {best[label] / best['bare loop']:>12.2f}")


if __name__ == "__main__":
    main()

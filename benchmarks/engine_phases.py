"""Where the time of `engine_ratio.py`'s rows goes: the ranks' run, the event log's packing, the step's end,
the quiescences, and the strategy's own Python with every op a stub.

    python benchmarks/engine_phases.py                       # 1024 ranks x 96 layers, best of 3
    python benchmarks/engine_phases.py --ranks 64 --layers 24 --repeat 5

Each row is timed in CPU seconds of this process (`time.process_time`), so that the other processes of a
shared machine count less than in wall time; rows run in rounds, best of `--repeat` (the best round of
each row, its phases from that round). Columns:

* `total`: the whole `simulate` call, as `engine_ratio.py` times it;
* `ranks run`: `Engine.run`, every rank's coroutine from its start to its return, the ops, waits,
  wake-ups, transfers and collectives included;
* `packing`: the event log packing its newest tuples into columns (`EventLog.pack`), during the run and
  at its end (so part of the columns before and after it);
* `step's end`: the books of every rank (folded: relabelled from the representatives') and the end-of-step
  check, and the `Result`;
* `quiescences`: how many times every unfinished rank was blocked and the engine ended transfers;
* `strategy alone`: the same program's coroutines, rank by rank, with every op of `Model` a stub that
  returns at once (no tensor, memory, event, wait or check): the least any simulator that runs the
  strategy's Python can take. The bare loop is `engine_ratio.py`'s.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.engine_ratio import (bare_loop, bare_program, blocking_ddp, blocking_ddp_declared,  # noqa: E402
                                     step_options)
from dist_lib import simulate  # noqa: E402
from dist_lib.engine import eventlog  # noqa: E402
from dist_lib.engine.core import Engine  # noqa: E402
from dist_lib.native import ACCELERATED  # noqa: E402
from dist_lib.run import simulator  # noqa: E402


class _Clock:
    """CPU seconds spent in a few of the simulator's functions, patched to be timed (for this process's
    life), and the quiescences counted."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.quiescences = 0

    def time(self, owner: object, name: str, label: str) -> None:
        original, spent = getattr(owner, name), self.spent

        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - start
        setattr(owner, name, timed)

    def install(self) -> None:
        self.time(eventlog.EventLog, "pack", "packing")
        self.time(simulator, "_finish", "end")
        self.time(simulator, "_books", "end")
        self.time(simulator, "expand_books", "end")
        run, advance, clock = Engine.run, Engine.advance, self

        async def timed_run(engine, *args, **kwargs):
            start = time.process_time()
            try:
                return await run(engine, *args, **kwargs)
            finally:
                clock.spent["run"] = clock.spent.get("run", 0.0) + time.process_time() - start

        def counted_advance(engine):  # (the C block path calls it by name, so it sees this one too)
            clock.quiescences += 1
            return advance(engine)
        Engine.run, Engine.advance = timed_run, counted_advance

    def reset(self) -> None:
        self.spent.clear()
        self.quiescences = 0


class _Stub:
    """A tensor, a weight, a work: everything an op returns, with the attributes the programs read."""

    __slots__ = ()
    nbytes = 1 << 20

    def __add__(self, other: object) -> _Stub:
        return self

    def __await__(self):
        return _STUB
        yield  # (a generator: `await stub` returns the stub without suspending)


_STUB = _Stub()
_PAIR = (_STUB, _STUB)


class _StubModel:
    """`Model`'s ops as stubs that return at once."""

    def __init__(self, rank: int, world_size: int, layers: int, batch: int):
        self.rank, self.world_size, self.num_layers, self.global_batch_size = rank, world_size, layers, batch

    def load_weights(self, layer, *args, **kwargs):
        return _PAIR

    def get_input_activation(self, samples):
        return _STUB

    def forward(self, layer, x, weight, *args, **kwargs):
        return _STUB

    def loss(self, x):
        return _STUB

    def backward(self, layer, x, grad, weight, *args, **kwargs):
        return _PAIR

    def all_reduce(self, tensor, *args, **kwargs):
        return _STUB

    def update(self, layer, grad, weight, opt, *args, **kwargs):
        return _PAIR

    def set_final_weight(self, layer, weight):
        return None


def strategy_alone(train, ranks: int, layers: int, **options) -> float:
    """CPU seconds to run `train` on every rank with stub ops."""
    start = time.process_time()
    for rank in range(ranks):
        coroutine = train(_StubModel(rank, ranks, layers, ranks), **options)
        try:
            coroutine.send(None)
        except StopIteration:
            continue
        raise RuntimeError("a stub op suspended the strategy")
    return time.process_time() - start


def main() -> None:
    args, cluster, workload = step_options(__doc__.splitlines()[0])
    ranks, layers = args.ranks, args.layers
    from strategies.ddp import train as ddp_train

    ddp = str(ROOT / "strategies" / "ddp.py")
    rows = [
        ("project's DDP, rank for rank", ddp, False, {"microbatch_size": 1}),
        ("project's DDP, folded", ddp, True, {"microbatch_size": 1}),
        ("user's blocking DDP, rank for rank", blocking_ddp, False, {}),
        ("user's blocking DDP, folded (declared)", blocking_ddp_declared, True, {}),
    ]
    alone = [("project's DDP, strategy alone", ddp_train, {"microbatch_size": 1}),
             ("user's blocking DDP, strategy alone", blocking_ddp, {})]
    program, table, _ = bare_program(cluster, workload, ranks)

    clock = _Clock()
    clock.install()
    best: dict[str, tuple] = {}
    for _ in range(args.repeat):
        gc.collect()
        start = time.process_time()
        bare_loop(program, table, ranks)
        took = time.process_time() - start
        if took < best.get("bare loop", (float("inf"),))[0]:
            best["bare loop"] = (took, {}, None)
        for label, train, options in alone:
            gc.collect()
            took = strategy_alone(train, ranks, layers, **options)
            if took < best.get(label, (float("inf"),))[0]:
                best[label] = (took, {}, None)
        for label, strategy, fold, options in rows:
            gc.collect()
            clock.reset()
            start = time.process_time()
            simulate(strategy, cluster, workload, ranks, fold=fold, **options)
            took = time.process_time() - start
            if took < best.get(label, (float("inf"),))[0]:
                best[label] = (took, dict(clock.spent), clock.quiescences)
    engine = "C accelerator" if ACCELERATED else "Python alone (DIST_SANDBOX_PURE_PYTHON)"
    print(f"{ranks} ranks x {layers} layers, microbatch 1; {engine}; CPU seconds, best of {args.repeat}, rows run "
          f"in rounds in one process")
    bare = best["bare loop"][0]
    print(f"{'':40} {'total':>7} {'x bare':>7} {'ranks run':>10} {'packing':>8} {'step end':>9} {'quiescences':>12}")
    order = ["bare loop"] + [label for label, *_ in alone] + [label for label, *_ in rows]
    for label in order:
        took, spent, quiescences = best[label]
        phases = "" if quiescences is None else (
            f" {spent.get('run', 0.0):>10.3f} {spent.get('packing', 0.0):>8.3f} {spent.get('end', 0.0):>9.3f} "
            f"{quiescences:>12,}")
        print(f"{label:40} {took:>7.3f} {took / bare:>7.2f}{phases}")


if __name__ == "__main__":
    main()

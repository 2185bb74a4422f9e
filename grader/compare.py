"""`dist-sandbox compare`: every built-in strategy on one cluster, workload and batch, each at the best
options the planner's estimate finds for it (`compare_space.py`; `planned` runs the planner's own best
plan), on one board ranked by step time, with one line for each strategy that cannot run and why.

The built-in strategies are the project's own code: they run in this process (`dist_lib.simulate`), one
after the other, without the sandbox untrusted submissions get. A strategy's choices are simulated in
the estimate's order until one runs (at most `TRIES`); the board shows the simulated figures.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dist_lib import Cluster, OutOfMemoryError, SimulationError, SpecError, Workload, simulate
from dist_lib.run.simulator import DEFAULT_CLUSTER, DEFAULT_GLOBAL_BATCH, DEFAULT_WORKLOAD
from dist_lib.workload.transformer import check_global_batch

from .errors import InputError
from .report_terminal import literal

TRIES = 3  # choices simulated per strategy before it is reported as not running
PLAN_TOP = 3  # plans the planner simulates for `planned` (`plan(top=...)`; `dist-sandbox plan` takes 10)
ZERO_STAGES = (2, 3)  # tried by the simulator when no ZeRO-1 layout fits (the planner models ZeRO-1 only)
SCORE_LINE = ("ranked by step time (less is better); MFU: model FLOPs / (step time x the peak of every GPU "
              "in the cluster); peak memory: the fullest rank's, of its GPU's memory")


@dataclass
class Entry:
    strategy: str
    options: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    time_s: float | None = None
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_rank: int | None = None
    capacity_bytes: int | None = None
    reason: str = ""  # why it cannot run (status "cannot")
    tried: int = 0

    @property
    def ok(self) -> bool:
        return self.time_s is not None


def add_compare_parser(sub: Any, batch_type: Any) -> None:
    compare = sub.add_parser("compare", help="every built-in strategy at its best options on one board")
    compare.add_argument("--cluster", help=f"cluster spec or file (default {DEFAULT_CLUSTER})")
    compare.add_argument("--workload", help=f"workload spec or file (default {DEFAULT_WORKLOAD})")
    compare.add_argument("--batch", type=batch_type, help=f"global batch size (default {DEFAULT_GLOBAL_BATCH})")
    compare.add_argument("--only", help="comma-separated built-in strategies to compare (default: all)")
    compare.add_argument("--json", action="store_true", help="print one JSON object")


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from .paths import builtin_names
    names = builtin_names()
    wanted = names if not args.only else [n.strip().removesuffix(".py") for n in args.only.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown or not wanted:
        raise InputError(f"--only {args.only!r}: {', '.join(unknown) or 'no name'} is not a built-in strategy "
                         f"(built-in: {', '.join(names)})")
    cluster_text, workload_text = args.cluster or DEFAULT_CLUSTER, args.workload or DEFAULT_WORKLOAD
    batch = DEFAULT_GLOBAL_BATCH if args.batch is None else args.batch
    try:
        cluster, workload = Cluster.load(cluster_text), Workload.load(workload_text)
        check_global_batch(batch, "--batch")
    except SpecError as exc:
        raise InputError(str(exc).splitlines()[0]) from None
    started = time.perf_counter()
    entries = []
    with console.status("", spinner="dots") as status:
        for name in wanted:
            status.update(literal(f"comparing: {name} ({len(entries) + 1} of {len(wanted)})"))
            entries.append(best_run(name, cluster, workload, batch))
    entries.sort(key=lambda e: (not e.ok, e.time_s if e.ok else 0.0, e.strategy))
    if args.json:
        print(json.dumps({"cluster": cluster_text, "workload": workload_text, "global_batch": batch,
                          "strategies": [_as_json(e) for e in entries]}))
        return 0
    console.print(literal(f"{len(entries)} built-in strategies on {cluster_text}, {workload_text}, batch {batch} "
                          f"({time.perf_counter() - started:.0f} s)"), soft_wrap=True)
    console.print(board(entries))
    console.print(f"[dim]{SCORE_LINE}[/]", soft_wrap=True)
    for entry in entries:
        if not entry.ok:
            console.print(literal(f"{entry.strategy}: cannot run: {entry.reason}"), soft_wrap=True)
    if any(e.ok for e in entries):
        console.print(literal(f"each run's options in full (--set key=value of `{args.prog} run NAME`): add --json"),
                      soft_wrap=True)
    return 0


def board(entries: list[Entry]) -> Table:
    """Runs first, fastest first: rank, strategy with its options below it, step time, MFU, peak memory.
    Five narrow columns and the options on a line of their own keep it readable at 80 columns."""
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name, justify in (("#", "right"), ("strategy / options", "left"), ("step", "right"), ("MFU", "right"),
                          ("peak memory", "right")):
        table.add_column(name, justify=justify, no_wrap=name != "strategy / options")
    rank = 0
    for entry in entries:
        if entry.ok:
            rank += 1
            capacity = f" of {entry.capacity_bytes / 2**30:.0f}" if entry.capacity_bytes else ""
            table.add_row(str(rank), Text(entry.strategy, style="bold") + Text("\n" + entry.summary, style="dim"),
                          _seconds(entry.time_s), f"{entry.mfu * 100:.1f} %",
                          f"{entry.peak_memory_bytes / 2**30:.1f}{capacity} GiB")
        else:
            table.add_row("-", Text(entry.strategy, style="bold"), Text("cannot run", style="red"), "", "")
    return table


def _seconds(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def _as_json(entry: Entry) -> dict[str, Any]:
    options = {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in entry.options.items()}  # a Plan
    return {"strategy": entry.strategy, "status": "ok" if entry.ok else "cannot", "options": options,
            "summary": entry.summary, "time_s": entry.time_s, "mfu": entry.mfu,
            "peak_memory_bytes": entry.peak_memory_bytes, "peak_memory_rank": entry.peak_memory_rank,
            "reason": entry.reason}


def best_run(name: str, cluster: Cluster, workload: Workload, batch: int) -> Entry:
    """`name` at the first of its choices (fastest estimate first) that runs in the simulator."""
    from .paths import BUILTIN_STRATEGIES
    path = BUILTIN_STRATEGIES / f"{name}.py"
    entry = Entry(name)
    choices, reason = _choices(name, cluster, workload, batch)
    last_error = ""
    for options, summary in choices[:TRIES if name != "zero" else TRIES + 3]:
        entry.tried += 1
        try:
            result = simulate(path, cluster, workload, batch, **options)
        except (SimulationError, ValueError) as exc:
            last_error = f"{summary}: {_first_line(exc)}"
            continue
        capacity = cluster.device_of(result.peak_memory_rank).memory_bytes
        entry.options, entry.summary = options, summary
        entry.time_s, entry.mfu = result.time_s, result.mfu
        entry.peak_memory_bytes, entry.peak_memory_rank = result.peak_memory_bytes, result.peak_memory_rank
        entry.capacity_bytes = capacity
        return entry
    if last_error:
        entry.reason = (f"the simulator refuses its {entry.tried} best estimated layouts; the last, {last_error}"
                        if entry.tried > 1 else f"the simulator refuses its best estimated layout, {last_error}")
    else:
        entry.reason = reason
    return entry


def _first_line(exc: BaseException) -> str:
    """The error's first line; of an out-of-memory error, up to the breakdown of what was live."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line.split("; ", 1)[0] if isinstance(exc, OutOfMemoryError) else line


def _choices(name: str, cluster: Cluster, workload: Workload, batch: int) -> tuple[list[tuple[dict, str]], str]:
    """A strategy's options to try, in order, and why there are none."""
    if name == "planned":
        from dist_lib.planner import plan
        try:
            found = plan(cluster, workload, batch, top=PLAN_TOP)
        except SpecError as exc:
            return [], _first_line(exc)
        return [({"plan": found.best.plan}, found.best.plan.describe())], ""
    from .compare_space import FAMILIES, search
    if name not in FAMILIES:
        return [({}, "its default options")], ""
    found = search(name, cluster, workload, batch)
    choices = [(c.options, c.summary) for c in found.choices]
    if name == "zero" and not choices:
        choices = _zero_fallback(cluster, workload, batch)
        if not choices:
            return [], (f"no ZeRO stage fits: even ZeRO-3 spreads {workload.total_params * 16 / 2**30:.0f} GiB of "
                        f"model state (16 bytes a parameter) to more than the smallest GPU's memory")
    return choices, found.reason


def _zero_fallback(cluster: Cluster, workload: Workload, batch: int) -> list[tuple[dict, str]]:
    """ZeRO-2 and -3 (Rajbhandari et al. 2020, sec. 5: 2 + 14/N and 16/N bytes a parameter of model
    state), the stages whose state fits beside some activations on the smallest GPU, each at microbatch
    sizes from the largest (up to 4, the strategy's default) down: the simulator decides which runs."""
    world = cluster.world_size
    if batch % world:
        return []
    share = batch // world
    smallest = min(node.device.memory_bytes for node in cluster.nodes)
    params = workload.total_params
    state = {2: params * (2 + 14 / world), 3: params * 16 / world}
    sizes = sorted((b for b in range(1, min(4, share) + 1) if share % b == 0), reverse=True)
    return [({"stage": stage, "microbatch_size": b}, f"dp{world} ZeRO-{stage} b{b}")
            for stage in ZERO_STAGES if state[stage] < 0.9 * smallest for b in sizes]

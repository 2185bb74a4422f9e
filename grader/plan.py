"""`python -m grader plan`: search plans, print the best, write the winner as a plan file and the Pareto plot."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dist_lib import Cluster, SpecError, Workload
from dist_lib.planner import plan
from dist_lib.planner.evaluate import Runner
from dist_lib.planner.framework_rules import runners_note
from dist_lib.planner.framework_run import launch_cluster
from dist_lib.planner.report import check_plot_path, front, plot_pareto, table
from dist_lib.run.simulator import DEFAULT_CLUSTER, DEFAULT_GLOBAL_BATCH, DEFAULT_WORKLOAD

from .paths import output_path
from .errors import InputError
from .memory_headroom import headroom
from .jobs import Backend, JobFailed, backend_from_args, parallelism, run_jobs, session
from .report_terminal import literal

# where `plan --framework X` suggests writing X's settings (beside the plan file)
SETTINGS_SUFFIX = {"megatron": ".megatron.args", "torchtitan": ".torchtitan.toml", "deepspeed": ".deepspeed.json"}


def _runner(backend: Backend) -> Runner:
    """The plan search's simulations as jobs on `backend`; one that could not finish is a candidate that
    failed, with the reason."""
    def run(fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        for index, out in run_jobs(fn, items, backend):
            yield index, replace(items[index], error=f"not simulated: {out.reason}") if isinstance(out, JobFailed) \
                else out
    return run


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    output_path(args.out, "--out", folder=False, example="plan.json")  # before the search, not after it
    if args.plot:
        try:
            check_plot_path(args.plot, "--plot")
        except SpecError as exc:
            raise InputError(str(exc)) from None
        output_path(args.plot, "--plot", folder=False, example="pareto.png")
    backend = backend_from_args(args)
    reserve = headroom(args.memory_headroom)
    cluster_text, workload_text = args.cluster or DEFAULT_CLUSTER, args.workload or DEFAULT_WORKLOAD
    try:
        cluster = Cluster.load(cluster_text)
        workload = Workload.load(workload_text)
        batch = DEFAULT_GLOBAL_BATCH if args.batch is None else args.batch
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as bar:
            tasks: dict[str, int] = {}

            def progress(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(f"{phase:<9}", total=total)
                bar.update(tasks[phase], completed=done, total=total)

            with session(backend):
                search = plan(cluster, workload, batch, top=args.top, objective=args.objective, budget=args.budget,
                              progress=progress, runner=_runner(backend), width=parallelism(backend),
                              simulation_limit=args.simulation_limit, memory_reserve=reserve,
                              framework=args.framework)
    except SpecError as exc:
        raise InputError(str(exc).splitlines()[0]) from None
    console.print(table(search, cluster))
    for note in search.notes:
        console.print(literal(note))
    if args.framework == "any":  # which runtime executes the winner
        console.print(literal("best plan " + runners_note(search.best.plan, cluster, workload)))
    if search.order_pairs:
        console.print(f"estimate vs simulator: {search.order_disagreements} of {search.order_pairs} pairs of "
                      f"simulated plans ordered differently")
    if search.refined_from is not None:
        console.print(f"moving layers between stages on the simulator: {search.refined_from.seconds * 1e3:.2f} -> "
                      f"{search.best.seconds * 1e3:.2f} ms")
    tokens = batch * workload.seq_len
    console.print("Pareto front (time per step, $ per step, $ per million tokens): " + ", ".join(
        f"{c.seconds * 1e3:.2f} ms ${c.dollars_per_step:.5f} ${c.dollars_per_step / tokens * 1e6:.3f}"
        for c in front(search)))
    if args.plot:
        note = plot_pareto(search, args.plot)
        console.print(literal(note or f"Pareto plot: {args.plot}"))
    from dist_lib.planner.hardware import hardware_of
    try:  # with the hardware it was made for: each node's device and ranks
        replace(search.best.plan, hardware=hardware_of(cluster)).save(args.out)
    except OSError as exc:
        raise InputError(f"--out {args.out}: cannot be written ({exc.strerror})") from None
    # the cluster and workload as given: a file's path, or a spec with its link options, runs the same
    # cluster again, where the cluster's name or the workload's would not
    # `planned` is the built-in strategy by name, found from any folder
    # paths made absolute, so that the line runs from any folder
    from pathlib import Path

    from dist_lib.specs import absolute_spec
    run = shlex.join([*getattr(args, "prog", "python -m grader").split(), "run", "planned", "--set",
                      f"plan={Path(args.out).resolve()}", "--cluster", absolute_spec(cluster_text),
                      "--workload", absolute_spec(workload_text), "--batch", str(batch),
                      *(["--memory-headroom", args.memory_headroom] if args.memory_headroom != "default" else [])])
    if args.framework != "any":  # the framework's own settings, and their run here: the step the table shows
        prog = shlex.split(getattr(args, "prog", "python -m grader"))
        settings = Path(args.out).with_suffix(SETTINGS_SUFFIX[args.framework]).resolve()
        launched = launch_cluster(search.best.plan, cluster)
        # the plan's nodes in launch order: the cluster's spec where the launch keeps its nodes as they are
        spec = absolute_spec(cluster_text) if launched == cluster else launched.name
        if Cluster.load(spec) != launched:  # nodes with their own links: no spec string names them in order
            spec = "CLUSTER_IN_HOSTFILE_ORDER"
        run = shlex.join([*prog, "export", str(Path(args.out).resolve()), "--to", args.framework, "--cluster",
                          absolute_spec(cluster_text), "--workload", absolute_spec(workload_text), "--out",
                          str(settings)]) + " && " + shlex.join(
            [*prog, "run", "--from", args.framework, str(settings), "--cluster", spec, "--workload",
             absolute_spec(workload_text),
             *(["--memory-headroom", args.memory_headroom] if args.memory_headroom != "default" else [])])
    console.print(literal(f"best plan: {search.best.plan.describe()} -> {args.out}  (run it: {run})"), soft_wrap=True)
    return 0

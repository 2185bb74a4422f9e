"""`dist-sandbox` (or `python -m grader`): run one strategy file, rank many on a suite, compare the built-in
strategies on a cluster, or search for a breaking config or the best plan.

    dist-sandbox                                   # every built-in strategy on the default suite
    dist-sandbox run FILE|NAME [--cluster SPEC] [--workload SPEC] [--batch N] [--set k=v ...] [--json]
                     [--memory-headroom SPEC]
    dist-sandbox leaderboard PATH... [--suite SUITE.toml] [--jobs N] [--ray [ADDRESS]] [--out DIR] [--trusted]
    dist-sandbox check FILE|NAME [--examples N]
    dist-sandbox plan [--cluster SPEC] [--workload SPEC] [--batch N] [--top K] [--objective time|cost]
                      [--budget USD_PER_HOUR] [--simulation-limit PASSES] [--memory-headroom SPEC]
                      [--framework any|megatron|torchtitan|deepspeed] [--out plan.json] [--plot pareto.png]
                      [--jobs N] [--ray [ADDRESS]]
    dist-sandbox compare [--cluster SPEC] [--workload SPEC] [--batch N] [--only NAME,...] [--json]
    dist-sandbox profile --workload SPEC [--device cpu|cuda] [--tp N] [--microbatch M] [--out DIR]
    dist-sandbox profile --from-trace FILE --workload SPEC [--out DIR]
    dist-sandbox export-chakra FILE|NAME [--cluster SPEC] [--workload SPEC] [--batch N] [--set k=v ...] [--out DIR]

FILE is resolved from the current folder; NAME is a built-in strategy (`ddp`, `hybrid`, ...: strategies/).

Exit codes: 0 success, 1 a strategy failed (its own exception, a syntax error included) or was flagged
invalid, 2 bad input (an option, a spec, a file without an `async def train`), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from dist_lib import SpecError
from dist_lib.planner.api import SIMULATION_LIMIT
from dist_lib.planner.framework_rules import CHOICES as FRAMEWORK_CHOICES
from dist_lib.run.simulator import DEFAULT_CLUSTER, DEFAULT_GLOBAL_BATCH, DEFAULT_WORKLOAD
from dist_lib.specs import number, whole
from dist_lib.workload.transformer import MAX_GLOBAL_BATCH

from .paths import BUILTIN_STRATEGIES, builtin_names, output_path, trains_dense
from .errors import InputError
from .jobs import add_backend_options, backend_from_args
from .memory_headroom import add_headroom_option, headroom
from .runner import Limits
from .scenario import Scenario, parse_set

ROOT = Path(__file__).resolve().parents[1]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise InputError(f"{self.prog}: {message}")


def _ranged(low: float, high: float, *, integer: bool = False, unit: str = "") -> Any:
    """An argparse type: a whole number or a finite number within [low, high] (`low` excluded for
    numbers: a timeout of 0 is no timeout), else one line naming the flag and the range."""
    def parse(text: str) -> float:
        try:
            return whole(text, "", int(low), int(high)) if integer else number(text, "", low, high, above=True,
                                                                             unit=unit)
        except SpecError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(": ")) from None
    return parse


MAX_TIMEOUT_S = 86_400.0  # a day
MAX_JOBS = 256
MAX_EXAMPLES = 100_000
MAX_TOP = 100_000  # plans a search simulates
MAX_BUDGET = 1e9  # USD per hour


def build_parser(prog: str = "python -m grader") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    run = sub.add_parser("run", help="one strategy file on one scenario")
    run.add_argument("file", help="the strategy file (async def train(model, **options)) or a built-in "
                                  "strategy's name (ddp, hybrid, ...)")
    run.add_argument("--cluster", help=f"cluster spec or file (default {DEFAULT_CLUSTER})")
    run.add_argument("--workload", help=f"workload spec or file (default {DEFAULT_WORKLOAD})")
    run.add_argument("--batch", type=_ranged(1, MAX_GLOBAL_BATCH, integer=True),
                     help=f"global batch size (default {DEFAULT_GLOBAL_BATCH})")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="a strategy option (repeatable)")
    run.add_argument("--trace", help="trace path (default traces/<strategy>.json)")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--timeout", type=_ranged(0, MAX_TIMEOUT_S, unit=" s"), default=300.0,
                     help="wall-clock seconds (default 300)")
    run.add_argument("--no-plots", action="store_true", help="write no .schedule.png and .memory.png")
    run.add_argument("--no-enforce-memory", action="store_true", help="report memory instead of failing on OOM")
    add_headroom_option(run)
    run.add_argument("--api", choices=("puzzles", "lab"), help="run a file written for another API")
    run.add_argument("--function", help="the function to run with --api")
    run.add_argument("--timing", choices=("original", "unit", "real"),
                     help="with --api: the original library's cost model (default) or this simulator's device "
                          "costs ('real', on --cluster)")
    run.add_argument("--from", dest="from_framework", choices=("megatron", "torchtitan", "deepspeed"),
                     help="FILE is that framework's settings, simulated with the strategy that runs as it does")
    run.add_argument("--main", action="store_true",
                     help="with --api: run the file's own main() (its ranks, layers and batch); by default it runs "
                          "when no --function or --set ranks/layers/batches is given")
    board = sub.add_parser("leaderboard", help="many submissions on a suite")
    board.add_argument("paths", nargs="+", help="strategy files, or folders of them")
    board.add_argument("--suite", default=None, help="suite TOML file or shipped name (default: default)")
    add_backend_options(board, jobs_type=_ranged(1, MAX_JOBS, integer=True))
    board.add_argument("--out", default="traces/leaderboard",
                       help="folder for leaderboard.json, leaderboard.csv, results.jsonl and, under runs/, "
                            "each submission's traces and plots (default traces/leaderboard)")
    board.add_argument("--no-plots", action="store_true", help="write no schedule and memory plots")
    board.add_argument("--fresh", action="store_true", help="ignore results saved by an earlier run")
    board.add_argument("--trusted", action="store_true",
                       help="run the submissions without the OS sandbox (only for code you trust)")
    check = sub.add_parser("check", help="property-based search for a configuration that breaks a strategy")
    check.add_argument("file", help="the strategy file to check, or a built-in strategy's name")
    check.add_argument("--examples", type=_ranged(1, MAX_EXAMPLES, integer=True), default=40,
                       help="configurations to try (default 40)")
    check.add_argument("--seed", type=int, default=0,
                       help="the search's seed (default 0): one seed tries the same configurations every time")
    planning = sub.add_parser("plan", help="search the fastest (or cheapest) plan for a model on a cluster")
    planning.add_argument("--cluster", help=f"cluster spec or file (default {DEFAULT_CLUSTER})")
    planning.add_argument("--workload", help=f"workload spec or file (default {DEFAULT_WORKLOAD})")
    planning.add_argument("--batch", type=_ranged(1, MAX_GLOBAL_BATCH, integer=True),
                          help=f"global batch size (default {DEFAULT_GLOBAL_BATCH})")
    planning.add_argument("--top", type=_ranged(0, MAX_TOP, integer=True), default=10,
                          help="plans to simulate (default 10; 0: estimate only)")
    planning.add_argument("--objective", choices=("time", "cost"), default="time",
                          help="minimise the step time (default) or the USD per step")
    planning.add_argument("--budget", type=_ranged(0, MAX_BUDGET, unit=" USD/h"),
                          help="USD per hour the GPUs may cost at most")
    planning.add_argument("--simulation-limit", type=_ranged(1, 2**40, integer=True), default=SIMULATION_LIMIT,
                          metavar="PASSES", help="simulate only plans of at most this many layer passes a step "
                          f"(microbatches x each stage's simulated GPUs x its layers, one replica a stage when the "
                          f"replicas fold; default {SIMULATION_LIMIT:,}); larger ones keep their estimate")
    add_headroom_option(planning)
    planning.add_argument("--framework", choices=FRAMEWORK_CHOICES, default="any",
                          help="search only plans this framework runs, simulated as its exported settings run "
                               "(default any: every plan, mixed stage widths and uneven shares included)")
    planning.add_argument("--out", default="plan.json", help="where to write the best plan (default plan.json)")
    planning.add_argument("--plot", default="traces/pareto.png", help="Pareto plot PNG (default traces/pareto.png)")
    add_backend_options(planning, jobs_type=_ranged(1, MAX_JOBS, integer=True))
    from .launch_cli import add_export_parser
    add_export_parser(sub, DEFAULT_CLUSTER, DEFAULT_WORKLOAD)
    from .profile_cli import add_chakra_parser, add_profile_parser
    add_profile_parser(sub)
    add_chakra_parser(sub, DEFAULT_CLUSTER, DEFAULT_WORKLOAD, _ranged(1, MAX_GLOBAL_BATCH, integer=True))
    from .compare import add_compare_parser
    add_compare_parser(sub, _ranged(1, MAX_GLOBAL_BATCH, integer=True))
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m grader") -> int:
    from .report_terminal import grader_console
    console = grader_console()
    command = None
    try:
        args = build_parser(prog).parse_args(argv)
        args.prog = prog
        command = args.command
        if args.command == "run":
            return cmd_run(args, console)
        if args.command == "leaderboard":
            return cmd_leaderboard(args, console)
        if args.command == "plan":
            from .plan import cmd_plan
            return cmd_plan(args, console)
        if args.command == "export":
            from .launch_cli import cmd_export
            return cmd_export(args)
        if args.command == "profile":
            from .profile_cli import cmd_profile
            return cmd_profile(args)
        if args.command == "export-chakra":
            from .profile_cli import cmd_export_chakra
            return cmd_export_chakra(args, strategy_file(args.file))
        if args.command == "check":
            from .check import cmd_check
            return cmd_check(str(strategy_file(args.file)), args.examples, args.seed, console)
        if args.command == "compare":
            from .compare import cmd_compare
            return cmd_compare(args, console)
        return main_job(console)
    except (InputError, SpecError) as exc:  # SpecError: a description found wanting after the checks up front
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # only a leaderboard (the default job is one) keeps its finished runs and resumes from them
        resumes = command in ("leaderboard", None)
        print("interrupted" + ("; finished runs are saved, run the same command again to resume" if resumes else ""),
              file=sys.stderr)
        return 130


def strategy_file(text: str) -> Path:
    """A strategy file from the current folder (`mine.py`, or `mine` for it), or else a built-in strategy
    by its name (`ddp` or `ddp.py`): a file of one's own of that name comes first."""
    path = Path(text)
    if path.is_file():
        return path
    if not path.suffix and path.with_name(path.name + ".py").is_file():  # `mine` for mine.py
        return path.with_name(path.name + ".py")
    if not path.exists() and path.parent == Path(".") and path.stem in builtin_names() \
            and path.suffix in ("", ".py"):
        return BUILTIN_STRATEGIES / f"{path.stem}.py"
    if path.exists():
        raise InputError(f"{text}: not a file")
    hint = f"; built-in strategies: {', '.join(builtin_names())}" if path.parent == Path(".") else ""
    raise InputError(f"strategy file {text}: not found{hint}")


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    launched: dict[str, Any] = {}
    if args.from_framework:  # the file is a framework's settings: run the strategy that runs them
        from .launch_cli import settings_run
        args.file, launched, args.workload, batch = settings_run(
            args.from_framework, args.file, args.cluster or DEFAULT_CLUSTER, args.workload)
        args.batch = batch if args.batch is None else args.batch
    path = strategy_file(str(args.file))
    if args.api:
        try:
            import dist_lib.compat  # noqa: F401
        except ImportError:
            raise InputError("--api needs the puzzles/lab compatibility layer (dist_lib.compat), "
                             "which this installation does not have") from None
    elif path.suffix == ".ipynb":
        raise InputError(f"{path.name}: a notebook runs with --api puzzles|lab (the native API takes a .py file "
                         f"with async def train)")
    else:
        for flag, given_flag in (("--function", args.function), ("--timing", args.timing), ("--main", args.main)):
            if given_flag:
                raise InputError(f"{flag} only applies with --api puzzles|lab")
    options = {**launched, **parse_set(args.set)}
    if args.timing:
        options["timing"] = args.timing
    if args.main:
        options["main"] = True
    # A puzzles or lab file sets up its own ranks and model: only what the user names is passed on.
    given = [name for name in ("cluster", "workload", "batch") if getattr(args, name) is not None]
    scenario = Scenario(name="run", cluster=DEFAULT_CLUSTER if args.cluster is None else args.cluster,
                        workload=DEFAULT_WORKLOAD if args.workload is None else args.workload,
                        global_batch=DEFAULT_GLOBAL_BATCH if args.batch is None else args.batch,
                        options=options, enforce_memory=not args.no_enforce_memory, given=tuple(given),
                        memory_reserve=None if args.api or (reserve := headroom(args.memory_headroom)) is None
                        else reserve.to_dict())
    scenario.load()
    from .grade import grade_run
    trace = str(output_path(args.trace, "--trace", folder=False)) if args.trace is not None \
        else str(default_trace(path))
    from .runner import sandbox_problem
    from .trusted_run import is_builtin, run_trusted
    if is_builtin(path) and not args.api:  # the project's own code: simulated here, without a program cap
        row, result = run_trusted(path, scenario, trace, not args.no_plots)
    else:
        row, result = grade_run(str(path), scenario.to_dict(), {"timeout_s": args.timeout,
                                                                 "address_space_bytes": Limits().address_space_bytes},
                                trace, plots=not args.no_plots, api=args.api, function=args.function,
                                confine=sandbox_problem() is None)  # your own file: the sandbox only if it is here
    if row["status"] == "bad_input":
        raise InputError(row["error"].splitlines()[0])
    if args.api:
        _report_compat(args, row, result, console)
        if _unverified(row):  # (on stderr: the --json line on stdout stays one object)
            from .report_terminal import visible
            print(visible(f"warning: {path.name}: unverified: its figures are as the run reported them, not "
                          f"re-executed by the grader (its calls could not be recorded: {_unverified(row)})"),
                  file=sys.stderr)
    elif args.json:
        keys = ("strategy", "cluster", "workload", "global_batch", "status", "error", "time_s", "peak_memory_bytes",
                "peak_memory_rank", "memory_bytes", "fullest_rank", "memory_fraction", "mfu", "hfu", "bubble_fraction",
                "correct", "problems", "trace", "plots")
        # every figure of a native run comes from the grader's replay of its recorded program
        print(json.dumps({**{k: row.get(k) for k in keys}, "verified": row["time_s"] is not None}))
    else:
        from .report_terminal import print_run
        print_run(console, row, result)
    return 0 if row["status"] == "ok" else 1


def default_trace(path: Path) -> Path:
    """`traces/<stem>.json`, or `traces/<stem>.run.json` where that is a file a leaderboard writes in its
    output folder (the main job's is traces/: `run leaderboard.py` must not replace its board)."""
    from .leaderboard import BOARD_FILES
    name = f"{path.stem}.json"
    return Path("traces") / (f"{path.stem}.run.json" if name in BOARD_FILES else name)


def _unverified(row: dict[str, Any]) -> str:
    """Why a `--api` run's figures are unverified (its calls could not be recorded), or '' when the grader
    re-executed them."""
    options = row.get("options") or {}
    if options.get("verified") is False:
        reason = options.get("unverified")
        return reason if isinstance(reason, str) and reason else "no reason given"
    return ""


def _report_compat(args: argparse.Namespace, row: dict[str, Any], result: Any, console: Console) -> None:
    """A puzzles or lab run in the original library's figures and units (dist_lib.compat.report)."""
    from dist_lib.compat.report import notebook

    from .report_terminal import compat_lines, literal
    name = result.strategy if result is not None else row["strategy"] + (f".{args.function}" if args.function else "")
    if args.json:
        figures = notebook(row)
        keys = ("strategy", "status", "error", "time_s", "peak_memory_bytes", "peak_memory_rank", "memory_bytes",
                "correct", "problems", "trace", "cluster")
        ran = result is not None or args.cluster is not None  # else the row names the unused native cluster
        print(json.dumps({**{k: row.get(k) for k in keys}, "strategy": name, "cluster": row["cluster"] if ran else None,
                          "api": args.api,
                          "timing": (row.get("options") or {}).get("timing", args.timing or "original"),
                          "notebook_time": figures.get("time"), "notebook_memory": figures.get("memory"),
                          "time_unit": figures.get("time_unit"),
                          "memory_unit": figures.get("memory_unit"), "mfu": figures.get("mfu", row.get("mfu")),
                          # figures the grader re-executed, or (false) took as the run reported them
                          "verified": row.get("time_s") is not None and not _unverified(row)}))
        return
    for line in compat_lines({**row, "strategy": name}, args.api, args.timing):
        console.print(line, highlight=False)
    if result is not None and (row.get("options") or {}).get("timing") == "real":  # seconds and bytes
        from .report_terminal import legend, schedule_view, timeline_width
        console.print(schedule_view(result, timeline_width(console)))
        console.print(legend())
    if row.get("trace"):
        console.print(f"  trace         {literal(row['trace'])} (open in https://ui.perfetto.dev)")


def cmd_leaderboard(args: argparse.Namespace, console: Console) -> int:
    from .intake import gather
    from .leaderboard import run_leaderboard
    from .suites import load_suite
    backend = backend_from_args(args)  # a missing Ray or an address where nothing answers: before any folder
    output_path(args.out, "--out", folder=True)
    from .runner import sandbox_problem
    suite = load_suite(args.suite)
    intake = gather(args.paths)
    # on Ray the sandbox is needed on the nodes that run the submissions, and each node checks for itself
    problem = None if args.trusted or backend.ray is not None else sandbox_problem()
    if problem:
        raise InputError(f"leaderboard: cannot confine untrusted submissions: {problem}; "
                         f"pass --trusted to run them unconfined")
    from .report_terminal import literal
    for line in intake.skipped:  # a poisoned entry never stops the board: one line each
        console.print(f"[yellow]note[/]: {literal(line)}", highlight=False)
    summary = run_leaderboard(intake.submissions, suite, Path(args.out), jobs=backend.workers,
                              plots=not args.no_plots, console=console, fresh=args.fresh, confine=not args.trusted,
                              ray=backend.ray, skipped=tuple(intake.skipped))
    _print_board(console, summary, Path(args.out), suite.rubric)
    return 0


def _print_board(console: Console, summary: dict[str, Any], out: Path, rubric: Any = None) -> None:
    from .report_terminal import leaderboard_table, literal, rubric_line
    console.print(leaderboard_table(summary["ranked"], summary["scenarios"]))
    if rubric is not None:
        console.print(f"[dim]{literal(rubric_line(rubric))}[/]", soft_wrap=True)
    for entry in summary["ranked"]:
        for name, run in entry["runs"].items():
            if run["status"] != "ok":
                console.print(f"[red]{literal(entry['submission'])} / {literal(name)}: {literal(run['status'])}[/] — "
                              f"{literal(run['error'].splitlines()[0]) if run['error'] else ''}", highlight=False)
    from .leaderboard import RUNS
    console.print(f"results: {literal(out / 'leaderboard.json')}, {literal(out / 'leaderboard.csv')}; traces and plots "
                  f"under {literal(out / RUNS)}/")


def main_job(console: Console) -> int:
    """Every built-in strategy on the default suite; the winner's schedule; files under traces/."""
    from .leaderboard import run_leaderboard
    from .report_terminal import literal
    from .suites import load_suite
    suite = load_suite(None)
    every = sorted(p for p in BUILTIN_STRATEGIES.glob("*.py") if not p.name.startswith("_"))
    builtins = [p for p in every if trains_dense(p)]  # the default suite's models are dense
    console.print(f"[bold]grading {len(builtins)} built-in strategies on suite '{literal(suite.name)}' "
                  f"({len(suite.scenarios)} scenarios)[/]")
    for path in sorted(set(every) - set(builtins)):
        console.print(f"{path.stem} is left out: it trains mixtures of experts, and the default suite's models are "
                      f"dense (docs/explanation/moe.md)", highlight=False)
    out = Path("traces")
    from .runner import sandbox_problem
    summary = run_leaderboard(builtins, suite, out, jobs=min(2, os.cpu_count() or 1), console=console,
                              confine=sandbox_problem() is None)  # the project's own strategies
    _print_board(console, summary, out, suite.rubric)
    best = next((e for e in summary["ranked"] if e["rank"] == 1), None)
    if best:
        name, row = next(((n, r) for n, r in best["runs"].items() if r["status"] == "ok"), (None, None))
        if row and row.get("trace"):
            _show_schedule(console, best, name, row, suite)
    return 0


def _show_schedule(console: Console, entry: dict[str, Any], name: str, row: dict[str, Any], suite: Any) -> None:
    from .grade import grade_run
    from .report_terminal import legend, literal, schedule_view, timeline_width
    scenario = next(s for s in suite.scenarios if s.name == name)
    from dataclasses import asdict
    from .runner import sandbox_problem
    _, result = grade_run(entry["path"], scenario.to_dict(), asdict(suite.limits), None,
                          confine=sandbox_problem() is None)
    if result is not None:
        console.print(f"\n[bold]best: {literal(entry['submission'])} on {literal(name)}[/]")
        console.print(schedule_view(result, timeline_width(console)))
        console.print(legend())

"""Grade one strategy file on one scenario: run it isolated, re-execute what it decided, write trace and plots.

`grade_one` is a plain function of picklable arguments returning a plain dict (a "row"), so the
leaderboard can hand it to a process pool, or to Ray or Dask workers, unchanged. The grader's own work on
a run's untrusted program (replay, checks, trace, plots) runs in a child under the run's memory and time
limits (`bounded.py`): a forged program that is costly to replay is an `invalid` row, not a grader at
gigabytes.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

from .bounded import run_bounded
from .compat_payload import PayloadError, reported
from .deadline import RowTimeout, alarm_at, capped, capped_list
from .runner import Limits, Outcome, run_isolated
from .scenario import Scenario

# statuses: ok | incorrect | invalid (a malformed recorded program: never ranked) | failed | timeout | crashed
# | bad_input
RANKABLE = ("ok", "incorrect", "failed", "timeout", "crashed")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def grade_one(strategy: str, scenario_data: dict[str, Any], limits_data: dict[str, Any], trace_path: str | None,
              plots: bool = True, api: str | None = None, function: str | None = None,
              confine: bool = True) -> dict[str, Any]:
    """The row for one submission x scenario; never raises for anything the submission does."""
    return grade_run(strategy, scenario_data, limits_data, trace_path, plots, api, function, confine,
                     keep_result=False)[0]


def _replayed(outcome: Outcome, scenario: Scenario, cluster: Any, workload: Any, limits: Limits,
              name: str, deadline: float) -> tuple[Any, str, str]:
    """(result, status, error) of re-executing the run's recorded program in this process: the result
    when the program replays (correct or not), else the status and one-line reason."""
    from dist_lib.run.replay import replay
    result, status, error = _replay_row(
        lambda: replay(outcome.programs or [], cluster, workload, scenario.global_batch,
                       enforce_memory=scenario.enforce_memory, deadline_s=deadline - time.monotonic(),
                       memory_reserve=scenario.memory_reserve), limits)
    if result is None:
        return result, status, error
    accepted = (outcome.header or {}).get("options")
    names = set(accepted) if isinstance(accepted, list) and all(isinstance(k, str) for k in accepted) else set()
    result.options = {k: v for k, v in scenario.options_for(Path(name).stem).items() if k in names}
    result.strategy = Path(name).stem
    return result, "", ""


def _compat_graded(outcome: Outcome, scenario: Scenario, cluster: Any, workload: Any, limits: Limits, name: str,
                   api: str, function: str | None, deadline: float) -> tuple[Any, str, str]:
    """(result, status, error) of a `--api` run: its program replayed against a fresh compat runtime, or
    (for a run the worker could not record) its reported figures, unverified."""
    from dist_lib.compat.replay import replay
    compat = (outcome.header or {}).get("compat")
    if not (isinstance(compat, dict) and "program" in compat):
        try:
            return reported(compat), "", ""
        except PayloadError as exc:
            return None, "invalid", f"the worker wrote a result of the wrong shape: {exc}"
    given, options = scenario.given, scenario.options_for(Path(name).stem)  # what the worker passed to run_file
    setup = {key: options.get(key) for key in ("ranks", "layers", "batches", "main")}
    return _replay_row(
        lambda: replay(compat["program"], name, api, function, cluster=cluster if "cluster" in given else None,
                       workload=workload if "workload" in given else None,
                       global_batch_size=scenario.global_batch if "batch" in given else None,
                       timing=options.get("timing"), deadline_s=deadline - time.monotonic(), **setup),
        limits)


def _replay_row(run: Any, limits: Limits) -> tuple[Any, str, str]:
    """(result, "", "") of `run()`, a replay of a recorded program (native or `--api`: both raise
    `dist_lib.run.replay`'s errors), or (None, status, one-line reason)."""
    from dist_lib import ResourceError, SimulationError
    from dist_lib.run.replay import ProgramError, ReplayTimeout
    try:
        return run(), "", ""
    except ProgramError as exc:
        return None, "invalid", f"the recorded program is malformed: {exc}"
    except ReplayTimeout as exc:
        return None, "timeout", f"{_too_long(limits)} ({exc})"
    except ResourceError as exc:  # the simulator's own word for real memory running out: as a MemoryError below
        return None, "invalid", f"the recorded program exhausted the grader while replaying ({exc})"
    except SimulationError as exc:
        return None, "failed", f"{type(exc).__name__}: {exc}"
    except (MemoryError, RecursionError) as exc:
        return None, "invalid", f"the recorded program exhausted the grader while replaying ({type(exc).__name__})"
    except Exception as exc:  # noqa: BLE001 - a simulator bug a program reached: this row, not the board
        return None, "crashed", f"replaying the recorded program raised {type(exc).__name__}: {exc}"


def grade_run(strategy: str, scenario_data: dict[str, Any], limits_data: dict[str, Any], trace_path: str | None,
              plots: bool = True, api: str | None = None, function: str | None = None,
              confine: bool = True, keep_result: bool = True) -> tuple[dict[str, Any], Any]:
    """`grade_one`, also returning the replayed `Result` (None when the run produced none, or when
    `keep_result` is False). `confine=False` runs the strategy without the OS sandbox (trusted code); its
    program is replayed all the same."""
    scenario = Scenario.from_dict(scenario_data)
    cluster, workload = scenario.load()
    row: dict[str, Any] = {"submission": str(strategy), "strategy": Path(strategy).stem, "scenario": scenario.name,
                           "cluster": cluster.name, "workload": workload.name, "global_batch": scenario.global_batch,
                           "status": "", "error": "", "time_s": None, "peak_memory_bytes": None,
                           "peak_memory_rank": None, "memory_bytes": None, "mfu": None, "hfu": None,
                           "bubble_fraction": None, "correct": False, "problems": [], "trace": None, "plots": [],
                           "wall_s": 0.0}
    limits = Limits(**limits_data)
    outcome = run_isolated(strategy, scenario, limits, api=api, function=function, confine=confine)
    row["wall_s"] = round(outcome.wall_s, 3)
    if outcome.status != "ok":
        row["status"] = outcome.status
        row["error"] = f"{outcome.kind}: {outcome.message}" if outcome.kind and outcome.status == "failed" \
            else outcome.message
        return _capped(row), None
    # the grader's own work on the run (replay, end-of-step checks, result, trace, plots) has the same limits:
    # in a process of its own, its memory bounded by the run's address space and its time by the run's
    started = time.monotonic()
    deadline = started + limits.timeout_s
    blank = dict(row)

    def work() -> dict[str, Any]:
        try:
            _graded(row, outcome, scenario, cluster, workload, limits, strategy, trace_path, plots, api,
                    deadline, started, function)
        except RowTimeout:
            _stopped(row, blank, limits, started, trace_path)
        return row

    bounded = run_bounded(work, limits.address_space_bytes, deadline)
    if bounded.status == "error":  # the grader's own failure: the caller's to report, as in this process
        raise RuntimeError(f"grading the recorded program raised {bounded.detail.strip()}")
    if bounded.status == "ok":
        row = bounded.value
    elif bounded.status == "timeout":
        _stopped(row, blank, limits, started, trace_path)
    else:
        _discard(trace_path)
        row.clear()
        why = f" ({bounded.detail})" if bounded.detail else ""
        row.update(blank, status="invalid",
                   error=f"the recorded program exhausted the grader while replaying it: over the "
                         f"{limits.address_space_bytes / 2**30:g} GiB of memory the grader's work on a run may "
                         f"take{why}")
    result = None
    if keep_result and row["time_s"] is not None:
        # the run's Result for the caller to show, built again here: the child proved it fits the limits
        result = _result_again(outcome, scenario, cluster, workload, limits, strategy, api, function)
    return _capped(row), result


def _stopped(row: dict[str, Any], blank: dict[str, Any], limits: Limits, started: float,
             trace_path: str | None) -> None:
    """`row` as a run whose grading passed its time limit: no figures, no trace."""
    _discard(trace_path)
    row.clear()
    row.update(blank, status="timeout", error=f"{_too_long(limits)} (stopped after {time.monotonic() - started:.1f} s)")


def _result_again(outcome: Outcome, scenario: Scenario, cluster: Any, workload: Any, limits: Limits, strategy: str,
                  api: str | None, function: str | None) -> Any:
    """The `Result` of a run whose row the bounded child filled, replayed in this process (None when that
    fails after all)."""
    deadline = time.monotonic() + limits.timeout_s
    if api:
        result = _compat_graded(outcome, scenario, cluster, workload, limits, strategy, api, function, deadline)[0]
    else:
        result = _replayed(outcome, scenario, cluster, workload, limits, strategy, deadline)[0]
    return result


def _graded(row: dict[str, Any], outcome: Outcome, scenario: Scenario, cluster: Any, workload: Any, limits: Limits,
            strategy: str, trace_path: str | None, plots: bool, api: str | None, deadline: float,
            started: float, function: str | None = None) -> Any:
    """Fill `row` from the run's outcome; the result, or None when there is none (`row` says why). Raises
    `RowTimeout` past `deadline`."""
    if api:
        # a puzzles or lab run: its recorded toy-API calls re-executed here (`dist_lib.compat.replay`), or the
        # figures of one that could not be recorded, checked field by field (`compat_payload.py`)
        result, status, error = _compat_graded(outcome, scenario, cluster, workload, limits, strategy, api,
                                               function, deadline)
        if result is None:
            row["status"], row["error"] = status, error
            return None
        row.update(cluster=result.cluster.name, workload=result.workload.name, global_batch=result.global_batch_size)
    else:
        # the replay checks its deadline itself (interrupting the simulator's engine would leave it halfway)
        result, status, error = _replayed(outcome, scenario, cluster, workload, limits, strategy, deadline)
        if result is None:
            row["status"], row["error"] = status, error
            return None
    if time.monotonic() > deadline:
        raise RowTimeout
    with alarm_at(deadline, time.monotonic()):
        _fill(row, result, scenario, trace_path, plots)
        if time.monotonic() > deadline:  # (where no alarm can be set)
            raise RowTimeout
    return result


def _fill(row: dict[str, Any], result: Any, scenario: Scenario, trace_path: str | None, plots: bool) -> None:
    """The row's measures, verdict, trace and plots from `result`."""
    row.update({"time_s": result.time_s, "peak_memory_bytes": result.peak_memory_bytes,
                "peak_memory_rank": result.peak_memory_rank, "memory_bytes": result.memory_bytes,
                "mfu": result.mfu, "hfu": result.hfu, "bubble_fraction": result.bubble_fraction,
                "correct": result.correct, "problems": result.problems, "options": result.options,
                "memory_capacity_bytes": result.cluster.device_of(result.peak_memory_rank).memory_bytes,
                # the fullest GPU's share of its memory (the runtime reserve included when the run has one):
                # on a mixed cluster not always the one with most bytes
                "memory_fraction": result.memory_fraction(result.fullest_rank),
                "fullest_rank": result.fullest_rank, "fullest": result.fullest_text()})
    row["status"] = "ok" if result.correct else "incorrect"
    if not result.correct:
        row["error"] = "incorrect step: " + "; ".join(result.problems[:3])
    limit = scenario.memory_limit_bytes
    if limit is not None and result.peak_memory_bytes > limit and row["status"] == "ok":
        row["status"] = "failed"
        row["error"] = (f"peak memory {result.peak_memory_bytes / 2**30:.2f} GiB on rank {result.peak_memory_rank} "
                        f"exceeds the scenario's limit of {limit / 2**30:.2f} GiB per rank")
    if trace_path:
        path = result.write_chrome_trace(trace_path)
        row["trace"] = str(path)
        if plots:
            from .report_plots import write_plots
            row["plots"], row["plot_note"] = write_plots(result, path)


def _too_long(limits: Limits) -> str:
    return (f"grading the recorded program (replaying it, checking the step, writing its trace and plots) took "
            f"over {limits.timeout_s:g} s, the time limit")


PLOT_SUFFIXES = (".schedule.png", ".memory.png")  # what `report_plots.write_plots` writes beside the trace


def _discard(trace_path: str | None) -> None:
    """Remove what a run stopped at its time limit may have written halfway: its trace and plots, and
    matplotlib's open figures."""
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
    if not trace_path:
        return
    base = Path(trace_path).with_suffix("")
    for path in (Path(trace_path), *(base.with_name(base.name + suffix) for suffix in PLOT_SUFFIXES)):
        path.unlink(missing_ok=True)


def _capped(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its error text and problems bounded (`deadline.capped`)."""
    row["error"] = capped(row["error"])
    if isinstance(row.get("problems"), list):
        row["problems"] = capped_list(row["problems"])
    return row

"""`run` of a built-in strategy: the project's own code, simulated in this process, trusted.

A file of one's own runs in the sandbox and hands back only its recorded program, capped in bytes
(`Limits.file_bytes`, 128 MiB), which the grader replays. A built-in strategy (strategies/, by name or by
path) is not an adversary: its step is simulated here once, with no sandbox, no recording and so no cap on
the program's size; a plan of a thousand GPUs (`run planned --set plan=...`) runs whatever its length.
The figures are the simulator's own, as a replay's are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dist_lib import SimulationError, SpecError, simulate

from .errors import InputError
from .grade import _capped, _fill
from .paths import BUILTIN_STRATEGIES
from .scenario import Scenario


def is_builtin(path: Path) -> bool:
    """Whether `path` is one of the built-in strategies' files (not a helper `_x.py`)."""
    resolved = path.resolve()
    return resolved.parent == BUILTIN_STRATEGIES.resolve() and not resolved.name.startswith("_") \
        and resolved.suffix == ".py"


def run_trusted(path: Path, scenario: Scenario, trace_path: str | None, plots: bool) -> tuple[dict[str, Any], Any]:
    """(row, result) of a built-in strategy on `scenario`, as `grade.grade_run` gives them (status `ok`,
    `incorrect` or `failed` with the error in one line; bad options raise `InputError`)."""
    cluster, workload = scenario.load()
    row: dict[str, Any] = {"submission": str(path), "strategy": path.stem, "scenario": scenario.name,
                           "cluster": cluster.name, "workload": workload.name, "global_batch": scenario.global_batch,
                           "status": "", "error": "", "time_s": None, "peak_memory_bytes": None,
                           "peak_memory_rank": None, "memory_bytes": None, "mfu": None, "hfu": None,
                           "bubble_fraction": None, "correct": False, "problems": [], "trace": None, "plots": [],
                           "wall_s": 0.0}
    try:
        result = simulate(path, cluster, workload, scenario.global_batch, check=False,
                          enforce_memory=scenario.enforce_memory, memory_reserve=scenario.memory_reserve,
                          **scenario.options)
    except SpecError as exc:
        raise InputError(str(exc).splitlines()[0]) from None
    except SimulationError as exc:
        row["status"], row["error"] = "failed", f"{type(exc).__name__}: {exc}"
        return _capped(row), None
    result.strategy = path.stem
    _fill(row, result, scenario, trace_path, plots)
    return _capped(row), result

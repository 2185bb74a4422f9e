"""Suites: TOML files of scenarios, limits and a scoring rubric (see grader/suites/*.toml).

    name = "default"
    [limits]
    timeout_s = 60                      # wall clock per run
    address_space_GiB = 4               # real memory of the worker process
    [defaults]                          # merged into every scenario
    options = { microbatch_size = 2 }
    [[scenarios]]
    name = "a100x8"
    cluster = "1x8xA100-80GB"
    workload = "gpt-1.3b"
    global_batch = 32
    memory_limit_GB = 80                # optional, per rank (decimal GB)
    options = { ... }                   # given to a strategy only if its train() takes them
    [scenarios.strategy_options.gpipe]  # per strategy file name
    num_microbatches = 8
    [scoring] ...                       # see scoring.py
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .runner import Limits
from .scenario import Scenario
from .scoring import Rubric, parse_rubric

SUITES_DIR = Path(__file__).parent / "suites"
SCENARIO_FIELDS = {"name", "cluster", "workload", "global_batch", "options", "strategy_options", "memory_limit_GB",
                   "enforce_memory"}


@dataclass(frozen=True)
class Suite:
    name: str
    scenarios: tuple[Scenario, ...]
    rubric: Rubric
    limits: Limits
    path: str


def find_suite(spec: str | Path | None) -> Path:
    """A suite file path, or the name of a shipped suite (`default`, `classic`)."""
    if spec is None:
        return SUITES_DIR / "default.toml"
    path = Path(spec)
    if not path.exists() and (SUITES_DIR / f"{spec}.toml").exists():
        return SUITES_DIR / f"{spec}.toml"
    return path


def load_suite(spec: str | Path | None = None) -> Suite:
    path = find_suite(spec)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        shipped = ", ".join(p.stem for p in sorted(SUITES_DIR.glob("*.toml")))
        raise InputError(f"suite {spec}: cannot read it ({exc.strerror}); shipped suites: {shipped}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"suite {path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"suite {path}: not a text file") from None
    where = f"suite {path}"
    unknown = set(data) - {"name", "description", "limits", "defaults", "scenarios", "scoring"}
    if unknown:
        raise InputError(f"{where}: unknown top-level field(s) {', '.join(sorted(unknown))}")
    defaults = data.get("defaults", {})
    entries = data.get("scenarios")
    if not isinstance(defaults, dict):
        raise InputError(f"{where}: [defaults] must be a table")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{where}: needs at least one [[scenarios]] table")
    scenarios, names = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InputError(f"{where}: scenarios[{i}] must be a table")
        per = {**defaults.get("strategy_options", {})}
        for name, values in entry.get("strategy_options", {}).items():
            per[name] = {**per.get(name, {}), **values}
        merged = {**defaults, **entry, "options": {**defaults.get("options", {}), **entry.get("options", {})},
                  "strategy_options": per}
        scenario = _scenario(merged, f"{where}: scenarios[{i}]")
        if scenario.name in names:
            raise InputError(f"{where}: two scenarios are named {scenario.name!r}")
        names.add(scenario.name)
        scenario.load()  # unknown cluster or workload: say so now, not once per submission
        scenarios.append(scenario)
    limits = data.get("limits", {})
    if not isinstance(limits, dict) or set(limits) - {"timeout_s", "address_space_GiB"}:
        raise InputError(f"{where}: [limits] takes timeout_s and address_space_GiB")
    try:
        lim = Limits(float(limits.get("timeout_s", 120)), int(float(limits.get("address_space_GiB", 4)) * 2**30))
    except (TypeError, ValueError):
        raise InputError(f"{where}: [limits] values must be numbers") from None
    rubric = parse_rubric(data.get("scoring"), where)
    return Suite(str(data.get("name", path.stem)), tuple(scenarios), rubric, lim, str(path))


def _scenario(entry: dict[str, Any], where: str) -> Scenario:
    unknown = set(entry) - SCENARIO_FIELDS
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for key in ("name", "cluster", "workload"):
        if not isinstance(entry.get(key), str):
            raise InputError(f"{where}: {key} must be a string")
    batch = entry.get("global_batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InputError(f"{where}: global_batch must be a whole number >= 1, got {batch!r}")
    options, per = entry.get("options", {}), entry.get("strategy_options", {})
    if not isinstance(options, dict) or not isinstance(per, dict) or any(not isinstance(v, dict) for v in per.values()):
        raise InputError(f"{where}: options and strategy_options.<name> must be tables")
    limit = entry.get("memory_limit_GB")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
        raise InputError(f"{where}: memory_limit_GB must be a positive number")
    return Scenario(name=entry["name"], cluster=entry["cluster"], workload=entry["workload"], global_batch=batch,
                    options=dict(options), strategy_options={k: dict(v) for k, v in per.items()},
                    strict_options=False, memory_limit_bytes=limit * 1e9 if limit else None,
                    enforce_memory=bool(entry.get("enforce_memory", True)))

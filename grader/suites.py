"""Suites: TOML files of scenarios, limits and a scoring rubric (see grader/suites/*.toml).

    name = "default"
    [limits]
    timeout_s = 60                      # wall clock per run, more than 0 and at most 86400
    address_space_GiB = 4               # real memory of the worker process, 1 to 1024
    [defaults]                          # merged into every scenario
    options = { microbatch_size = 2 }
    [[scenarios]]
    name = "a100x8"
    cluster = "1x8xA100-80GB"
    workload = "gpt-1.3b"
    global_batch = 32
    memory_limit_GiB = 74.5             # optional, per rank (or memory_limit_GB, decimal: 80)
    options = { ... }                   # given to a strategy only if its train() takes them
    [scenarios.strategy_options.gpipe]  # per strategy file name
    num_microbatches = 8
    [scoring] ...                       # see scoring.py
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dist_lib import SpecError
from dist_lib.specs import number, read_toml, shown, table, text
from dist_lib.workload.transformer import check_global_batch

from .errors import InputError
from .grade import slug
from .runner import Limits
from .scenario import Scenario
from .scoring import Rubric, parse_rubric

SUITES_DIR = Path(__file__).parent / "suites"
# [limits]: a run gets at most a day; the worker process 1 to 1024 GiB of address space (Python and numpy
# alone take about half a GiB; 0 must not read as "no limit").
MAX_TIMEOUT_S = 86_400.0
ADDRESS_SPACE_GIB = (1.0, 1024.0)
MAX_MEMORY_LIMIT_GB = 1e4  # memory_limit_GB per rank (and as many bytes in memory_limit_GiB)
SUMMARY_ROW = "ALL"  # leaderboard.csv's scenario cell of a submission's overall row
SCENARIO_FIELDS = {"name", "cluster", "workload", "global_batch", "options", "strategy_options", "memory_limit_GB",
                   "memory_limit_GiB", "enforce_memory"}


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
        data = read_toml(path, "suite")
    except SpecError as exc:
        shipped = ", ".join(p.stem for p in sorted(SUITES_DIR.glob("*.toml")))
        hint = "" if path.exists() else f"; shipped suites: {shipped}"
        raise InputError(f"suite {exc}{hint}") from None
    try:
        return _suite(data, path)
    except SpecError as exc:  # the shared validators' one line, naming the field and its range
        raise InputError(str(exc)) from None


def _suite(data: dict[str, Any], path: Path) -> Suite:
    where = f"suite {path}"
    table(data, where, {"name", "description", "limits", "defaults", "scenarios", "scoring"})
    name = text(data.get("name", path.stem), f"{where}: name")
    text(data.get("description", ""), f"{where}: description")
    defaults = table(data.get("defaults", {}), f"{where}: [defaults]", SCENARIO_FIELDS - {"name"})
    entries = data.get("scenarios")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{where}: needs at least one [[scenarios]] table")
    shared_per = _tables(defaults.get("strategy_options", {}), f"{where}: defaults.strategy_options")
    shared_options = table(defaults.get("options", {}), f"{where}: defaults.options")
    scenarios: list[Scenario] = []
    names: dict[str, str] = {}
    for i, entry in enumerate(entries):
        at = f"{where}: scenarios[{i}]"
        entry = table(entry, at, SCENARIO_FIELDS)
        per = dict(shared_per)
        for stem, values in _tables(entry.get("strategy_options", {}), f"{at}.strategy_options").items():
            per[stem] = {**per.get(stem, {}), **values}
        options = {**shared_options, **table(entry.get("options", {}), f"{at}.options")}
        # a scenario's memory limit, in either unit, replaces the defaults' (in either unit)
        inherited = {k: v for k, v in defaults.items()
                     if not (k.startswith("memory_limit_") and any(key.startswith("memory_limit_") for key in entry))}
        scenario = _scenario({**inherited, **entry, "options": options, "strategy_options": per}, at)
        if not scenario.name.strip():
            raise InputError(f"{at}.name: must not be empty")
        if scenario.name == SUMMARY_ROW:
            raise InputError(f"{at}.name: {SUMMARY_ROW!r} is the scenario column of each submission's summary row "
                             f"in leaderboard.csv; name the scenario otherwise")
        first = names.get(slug(scenario.name))  # a scenario's trace file is named by its slug
        if first == scenario.name:
            raise InputError(f"{where}: two scenarios are named {scenario.name!r}")
        if first is not None:
            raise InputError(f"{where}: scenarios {first!r} and {scenario.name!r} would share the trace file "
                             f"{slug(first)}.json; rename one")
        names[slug(scenario.name)] = scenario.name
        try:
            scenario.load()  # unknown cluster or workload: say so now, not once per submission
        except InputError as exc:
            raise InputError(f"{at}: {exc}") from None
        scenarios.append(scenario)
    limits = table(data.get("limits", {}), f"{where}: [limits]", {"timeout_s", "address_space_GiB"})
    timeout = _number(limits.get("timeout_s", 120), f"{where}: limits.timeout_s", 0, MAX_TIMEOUT_S, above=True,
                      unit=" s")
    memory = _number(limits.get("address_space_GiB", 4), f"{where}: limits.address_space_GiB", *ADDRESS_SPACE_GIB,
                     unit=" GiB")
    rubric = parse_rubric(data.get("scoring"), where)
    return Suite(name, tuple(scenarios), rubric, Limits(timeout, int(memory * 2**30)), str(path))


def _number(value: Any, where: str, *bounds: float, **how: Any) -> float:
    """`specs.number` of a TOML number: the shared range check also reads spec text ("60"), which in a
    suite is a type mistake (`timeout_s = "60"`)."""
    if isinstance(value, str):
        raise InputError(f"{where}: expected a number, got the string {shown(value)}")
    return number(value, where, *bounds, **how)


def _tables(value: Any, where: str) -> dict[str, dict]:
    """A table of tables (per-strategy options keyed by the strategy file's stem)."""
    return {key: table(inner, f"{where}.{key}") for key, inner in table(value, where).items()}


def _scenario(entry: dict[str, Any], where: str) -> Scenario:
    for key in ("name", "cluster", "workload"):
        text(entry.get(key), f"{where}.{key}")
    batch = check_global_batch(entry.get("global_batch"), f"{where}.global_batch")
    if "memory_limit_GB" in entry and "memory_limit_GiB" in entry:
        raise InputError(f"{where}: memory_limit_GB and memory_limit_GiB say the same thing; give one")
    limit = entry.get("memory_limit_GB")
    if limit is not None:
        limit = _number(limit, f"{where}.memory_limit_GB", 0, MAX_MEMORY_LIMIT_GB, above=True, unit=" GB")
    elif entry.get("memory_limit_GiB") is not None:  # in GB, as the bytes below are made
        limit = _number(entry["memory_limit_GiB"], f"{where}.memory_limit_GiB", 0, MAX_MEMORY_LIMIT_GB * 1e9 / 2**30,
                        above=True, unit=" GiB") * 2**30 / 1e9
    enforce = entry.get("enforce_memory", True)
    if not isinstance(enforce, bool):
        raise InputError(f"{where}.enforce_memory: expected true or false, got {shown(enforce)}")
    per = {stem: dict(values) for stem, values in entry["strategy_options"].items()}
    return Scenario(name=entry["name"], cluster=entry["cluster"], workload=entry["workload"], global_batch=batch,
                    options=dict(entry["options"]), strategy_options=per, strict_options=False,
                    memory_limit_bytes=limit * 1e9 if limit else None, enforce_memory=enforce)

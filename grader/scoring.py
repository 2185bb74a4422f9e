"""Scoring rubrics are data: a list of weighted components, each turning one metric into points.

    [[scoring.components]]
    metric = "mfu"                 # any number in a graded row: mfu, hfu, time_s, peak_memory_bytes,
    weight = 0.75                  #   memory_fraction, bubble_fraction, samples_per_s
    higher_is_better = true
    steps = [[0.80, 5], [0.70, 4], [0.60, 3], [0.50, 2], [0.40, 1]]   # first threshold met wins (best first)
    otherwise = 0

or, instead of steps, a linear component: `scale = 100` (points = metric x scale, clipped to [min, max] if
given).
A run that did not finish correctly scores 0; a submission's score is the mean over scenarios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import InputError

METRICS = ("mfu", "hfu", "time_s", "peak_memory_bytes", "memory_fraction", "bubble_fraction", "samples_per_s")


@dataclass(frozen=True)
class Component:
    metric: str
    weight: float
    higher_is_better: bool = True
    steps: tuple[tuple[float, float], ...] = ()
    otherwise: float = 0.0
    scale: float | None = None
    min: float | None = None
    max: float | None = None

    def points(self, value: float) -> float:
        if self.scale is not None:
            pts = value * self.scale
            if self.min is not None:
                pts = max(self.min, pts)
            if self.max is not None:
                pts = min(self.max, pts)
            return pts
        for threshold, pts in self.steps:
            if (value >= threshold) if self.higher_is_better else (value <= threshold):
                return pts
        return self.otherwise


@dataclass(frozen=True)
class Rubric:
    components: tuple[Component, ...]

    def score(self, row: dict[str, Any]) -> float:
        if row.get("status") != "ok":
            return 0.0
        return sum(c.weight * c.points(metric(row, c.metric)) for c in self.components)


def metric(row: dict[str, Any], name: str) -> float:
    if name == "samples_per_s":
        return row["global_batch"] / row["time_s"] if row["time_s"] else 0.0
    return float(row[name])


def parse_rubric(data: Any, where: str) -> Rubric:
    if data is None:
        raise InputError(f"{where}: no [scoring] section: a suite scores its runs with [[scoring.components]] "
                         f"tables (see grader/suites/default.toml)")
    if not isinstance(data, dict) or not isinstance(data.get("components"), list) or not data["components"]:
        raise InputError(f"{where}: [scoring] needs at least one [[scoring.components]] table")
    unknown = set(data) - {"components"}
    if unknown:  # a misspelt key would otherwise be ignored without a word
        raise InputError(f"{where}: [scoring]: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                         f"(known: components)")
    components = []
    for i, c in enumerate(data["components"]):
        at = f"{where}: scoring.components[{i}]"
        if not isinstance(c, dict):
            raise InputError(f"{at}: expected a table")
        unknown = set(c) - {"metric", "weight", "higher_is_better", "steps", "otherwise", "scale", "min", "max", "name"}
        if unknown:
            raise InputError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
        if c.get("metric") not in METRICS:
            raise InputError(f"{at}: metric must be one of {', '.join(METRICS)}, got {c.get('metric')!r}")
        if not isinstance(c.get("name", ""), str):
            raise InputError(f"{at}.name: expected a string, got {c['name']!r}")
        weight = _number(c.get("weight", 1.0), f"{at}.weight")
        if weight <= 0:  # 0 would drop the component silently, a negative weight rank the worst run first
            raise InputError(f"{at}.weight: must be more than 0, got {c.get('weight')!r}")
        steps = c.get("steps", [])
        if not isinstance(steps, list) or any(not isinstance(s, list) or len(s) != 2 for s in steps):
            raise InputError(f"{at}.steps: expected a list of [threshold, points] pairs")
        if not isinstance(c.get("higher_is_better", True), bool):
            raise InputError(f"{at}.higher_is_better: expected true or false, got {c['higher_is_better']!r}")
        if bool(steps) == ("scale" in c):
            raise InputError(f"{at}: give either steps = [[threshold, points], ...] or scale = number")
        if "scale" not in c and ("min" in c or "max" in c):
            raise InputError(f"{at}: min and max clip a linear (scale) component; steps give their own points")
        if "min" in c and "max" in c and _number(c["min"], f"{at}.min") > _number(c["max"], f"{at}.max"):
            raise InputError(f"{at}: min {c['min']!r} is above max {c['max']!r}")
        higher = c.get("higher_is_better", True)
        pairs = tuple((_number(t, f"{at}.steps"), _number(p, f"{at}.steps")) for t, p in steps)
        _check_reachable(pairs, higher, f"{at}.steps")
        components.append(Component(
            metric=c["metric"], weight=weight, higher_is_better=higher, steps=pairs,
            otherwise=_number(c.get("otherwise", 0), f"{at}.otherwise"),
            scale=_number(c["scale"], f"{at}.scale") if "scale" in c else None,
            min=_number(c["min"], f"{at}.min") if "min" in c else None,
            max=_number(c["max"], f"{at}.max") if "max" in c else None))
    return Rubric(tuple(components))


def _check_reachable(steps: tuple[tuple[float, float], ...], higher_is_better: bool, where: str) -> None:
    """The first threshold met wins, so the thresholds must run from the best value down (up, when lower is
    better): a step after one whose threshold it does not beat could never apply."""
    for (before, _), (threshold, _) in zip(steps, steps[1:]):
        if (threshold >= before) if higher_is_better else (threshold <= before):
            order = "decreasing" if higher_is_better else "increasing"
            raise InputError(f"{where}: threshold {threshold:g} comes after {before:g}, so it can never apply (the "
                             f"first threshold met wins); list the thresholds in {order} order")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: expected a finite number, got {value!r}")
    return float(value)

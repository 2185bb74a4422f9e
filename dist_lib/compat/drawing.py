"""Stand-ins for the puzzles' `drawing.py` so files importing it run without a plotting dependency.

`draw(models)` returns the numbers the puzzles' diagram shows instead of a picture."""

from __future__ import annotations

from typing import Any


def draw(models: Any) -> dict:
    """{'steps': the diagram's time axis (latest start of a rank's last event), 'time': when the last
    op ends, 'memory': the largest memory any event recorded}."""
    models = list(models)
    return {"steps": max(m.log[-1].time for m in models if m.log),
            "time": max(float(m.time) for m in models),
            "memory": max((e.memory for m in models for e in m.log), default=0)}


def draw_group(group: Any) -> None:
    return None


def draw_network(*args: Any, **kwargs: Any) -> None:
    return None

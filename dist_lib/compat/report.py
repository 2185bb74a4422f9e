"""How a puzzles or lab run reads on the terminal: in the original library's units and figures.

The grader's worker hands a run back as a plain row (and a rebuilt `Result`); the figures the
notebooks print travel in `options['notebook']`. This module reads them and writes them in the
original's units: the step as the notebook reports it (steps for the puzzles, seconds for the lab),
the peak in the API's memory units. `grader.report_terminal.compat_lines` makes them the lines
`python -m grader run FILE --api ...` prints.
"""

from __future__ import annotations

from typing import Any


def notebook(row: dict[str, Any]) -> dict[str, Any]:
    """The notebook figures of a row: time, time_unit, memory_unit, and mfu where the API defines one."""
    return dict((row.get("options") or {}).get("notebook") or {})


def time_text(value: float, unit: str) -> str:
    return f"{value * 1e3:.3f} ms" if unit == "s" else f"{value:g} {unit}"


def memory_text(value: float, unit: str) -> str:
    """Bytes in GiB; the toy units whole, or to two decimals where a share of a sharded tensor makes the
    original's figure a fraction (a third of a 512 x 512 weight is 87,381.33 units)."""
    if unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    return f"{value:,.0f} {unit}" if abs(value - round(value)) < 1e-6 else f"{value:,.2f} {unit}"

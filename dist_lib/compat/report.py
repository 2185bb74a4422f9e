"""How a puzzles or lab run reads on the terminal: in the original library's units and figures.

The grader's worker hands a run back as a plain row (and a rebuilt `Result`); the figures the
notebooks print travel in `options['notebook']`. This module turns them into the lines
`python -m grader run FILE --api ...` prints: the step as the notebook reports it (steps for the
puzzles, seconds for the lab), the peak in the API's memory units, the lab's MFU.
"""

from __future__ import annotations

from typing import Any


def notebook(row: dict[str, Any]) -> dict[str, Any]:
    """The notebook figures of a row: time, time_unit, memory_unit, and mfu where the API defines one."""
    return dict((row.get("options") or {}).get("notebook") or {})


def _time(value: float, unit: str) -> str:
    return f"{value * 1e3:.3f} ms" if unit == "s" else f"{value:g} {unit}"


def _memory(value: float, unit: str) -> str:
    return f"{value / 2**30:.2f} GiB" if unit == "bytes" else f"{value:,.0f} {unit}"


def run_lines(row: dict[str, Any], api: str, timing: str | None) -> list[str]:
    """Rich-markup lines for one run: a header naming the file, API and timing (not the native
    scenario, which a puzzles or lab file does not use), then the figures or the error."""
    status = row["status"]
    colour = {"ok": "green", "incorrect": "yellow"}.get(status, "red")
    options = row.get("options") or {}
    timing = options.get("timing") or timing or "original"
    where = f" on {row['cluster']}" if timing == "real" and row.get("time_s") is not None else ""
    lines = [f"[bold]{row['strategy']}[/] — {api} API, {timing} timing{where} — [{colour}]{status}[/]"]
    figures = notebook(row)
    if row.get("time_s") is not None:
        time_unit, memory_unit = figures.get("time_unit", "s"), figures.get("memory_unit", "bytes")
        lines.append(f"  step          {_time(figures.get('time', row['time_s']), time_unit)} as the notebook reports "
                     f"it (the last op ends at {_time(row['time_s'], time_unit)})")
        lines.append(f"  peak memory   {_memory(row['peak_memory_bytes'], memory_unit)} on rank "
                     f"{row['peak_memory_rank']}")
        mfu = figures.get("mfu", row.get("mfu") if timing == "real" else None)
        if mfu is not None:
            lines.append(f"  MFU           {mfu * 100:.1f} %" + (" (the lab's formula)" if "mfu" in figures else ""))
        lines.append(f"  correct       {'yes' if row['correct'] else 'NO'}")
    if row.get("error"):
        lines.append(f"  [red]error[/]         {row['error']}")
    return lines

"""Terminal reports (rich): a run's summary and schedule view, and the leaderboard table.

The schedule view has one row per rank and time in buckets; each cell shows what dominated the
bucket: F forward, B backward (input), W weight gradient, L loss, U update, o any other compute op (the
copies of split_samples and join_samples, a lab file's load_weights), C communication with an idle compute
stream, and a dim dot for idle. Readable up to 64 ranks; peak memory closes each row.

Every string printed here is read as rich markup, so text the grader did not write itself (a submission's
error message, file or strategy name, an option's value, a path, a scenario or cluster name) goes
through `literal` and prints as it is: `[/x]` in an error message is text, not a closing tag, and a
control character is its backslash escape.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

CELLS = {"forward": ("F", "black on green"), "backward": ("B", "black on blue"),
         "backward_input": ("B", "black on blue"), "backward_weight": ("W", "black on cyan"),
         "loss": ("L", "black on magenta"), "update": ("U", "black on red"), "other": ("o", "black on white"),
         "comm": ("C", "black on yellow"), "idle": ("·", "dim")}


def literal(value: Any) -> str:
    """`value` as markup that prints exactly `str(value)`: for every piece of text the grader did not
    write itself. (The grader's consoles also leave `:name:` emoji codes as they are.) The bytes of a
    file name that is not UTF-8 print as backslash escapes (`\\xff`), and so do the characters that are
    not printable but line breaks (`\\x1b`, `\\u202e`): rich passes an escape sequence to the terminal as
    it is, so a file named with one could move the cursor and overwrite other rows of the board."""
    text = str(value).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return escape(visible(text))


def visible(text: str) -> str:
    """`text` with each character that is neither printable nor a line break as its backslash escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii") for c in text)


def grader_console() -> Console:
    """The grader's console: no emoji codes or highlighting read into the text it prints."""
    return Console(highlight=False, emoji=False)


def schedule_view(result: Any, width: int = 72) -> Table:
    world, span = result.cluster.world_size, result.time_s or 1e-12
    bucket = span / width
    busy = [[dict() for _ in range(width)] for _ in range(world)]
    for e in result.raw_events:
        rank, op, stream, start, end = e[:5]
        key = "comm" if stream != "compute" else op if op in CELLS else "other"
        first, last = int(start / bucket), min(int(end / bucket), width - 1)
        for b in range(max(first, 0), last + 1):
            overlap = min(end, (b + 1) * bucket) - max(start, b * bucket)
            if overlap > 0:
                cell = busy[rank][b]
                cell[key] = cell.get(key, 0.0) + overlap
    peaks = result.memory_bytes
    top = max(peaks) or 1
    table = Table(title=f"schedule: {span * 1e3:.2f} ms, one column = {bucket * 1e6:.0f} us", show_edge=False,
                  pad_edge=False, box=None, title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("timeline", no_wrap=True)
    table.add_column("peak memory", justify="right", no_wrap=True)
    # a folded step has events for its representatives only: each other rank ran as its representative did
    representatives = getattr(result, "representatives", None) or range(world)
    for rank in range(world):
        line = Text()
        for cell in busy[representatives[rank]]:
            compute = {k: v for k, v in cell.items() if k != "comm"}
            if compute and max(compute.values()) >= bucket * 0.25:
                key = max(compute, key=compute.get)
            elif cell.get("comm", 0) >= bucket * 0.25:
                key = "comm"
            else:
                key = max(compute, key=compute.get) if compute else "idle"
            char, style = CELLS[key]
            line.append(char, style=style)
        bar = "█" * round(6 * peaks[rank] / top)
        label = str(rank) if representatives[rank] == rank else f"{rank}={representatives[rank]}"
        table.add_row(label, line, f"{peaks[rank] / 2**30:6.2f} GiB {bar:<6}")
    if representatives is not None and any(r != rep for r, rep in enumerate(representatives)):
        table.caption = "r=k: rank r is a folded replica of rank k (identical replicas, simulated once)"
    return table


def timeline_width(console: Console) -> int:
    return max(16, min(120, console.width - 26))


def legend() -> Text:
    text = Text("  ")
    names = {"backward_weight": "weight grad", "other": "other compute", "comm": "comm only"}
    for key in ("forward", "backward", "backward_weight", "loss", "update", "other", "comm", "idle"):
        char, style = CELLS[key]
        text.append(f" {char} ", style=style)
        text.append(f" {names.get(key, key)} ")
    return text


def print_run(console: Console, row: dict[str, Any], result: Any | None, schedule: bool = True) -> None:
    status = row["status"]
    colour = {"ok": "green", "incorrect": "yellow"}.get(status, "red")
    console.print(f"[bold]{literal(row['strategy'])}[/] on {literal(row['cluster'])}, {literal(row['workload'])}, "
                  f"batch {row['global_batch']} — [{colour}]{literal(status)}[/]")
    options = row.get("options") or {}
    if row["time_s"] is not None and options.get("timing") == "unit":  # a puzzles file on its own unit costs
        console.print(f"  step time     {row['time_s']:.1f} steps (the puzzles' unit costs)")
        console.print(f"  peak memory   {row['peak_memory_bytes']:,} units on rank {row['peak_memory_rank']}")
    elif row["time_s"] is not None:
        cap = row.get("memory_capacity_bytes") or 0
        console.print(f"  step time     {row['time_s'] * 1e3:.2f} ms")
        console.print(f"  peak memory   {row['peak_memory_bytes'] / 2**30:.2f} GiB on rank {row['peak_memory_rank']}"
                      + (f" (of {cap / 2**30:.0f} GiB)" if cap else ""))
        if row.get("fullest"):
            console.print(f"  fullest GPU   {literal(row['fullest'])}", highlight=False)
        console.print(f"  MFU / HFU     {row['mfu'] * 100:.1f} % / {row['hfu'] * 100:.1f} %")
    if row["time_s"] is not None:
        console.print(f"  bubble        {row['bubble_fraction'] * 100:.1f} % of compute idle")
        console.print(f"  correct       {'yes' if row['correct'] else 'NO'}")
        if options.get("verified") is False:
            console.print(f"  [dim]{literal(unverified_line(options))}[/]")
    if row["error"]:
        console.print(f"  [red]error[/]         {literal(row['error'])}", highlight=False)
    if result is not None and schedule:
        console.print(schedule_view(result, timeline_width(console)))
        console.print(legend())
    if row.get("trace"):
        console.print(f"  trace         {literal(row['trace'])} (open in https://ui.perfetto.dev)")
    for plot in row.get("plots") or []:
        console.print(f"  plot          {literal(plot)}")
    if row.get("plot_note"):
        console.print(f"  [dim]{literal(row['plot_note'])}[/]")


def unverified_line(options: dict[str, Any]) -> str:
    """The line of a `--api` run graded on the figures it reported: its calls could not be recorded, and why."""
    reason = options.get("unverified")
    return ("verified      no: the run's calls could not be recorded for the grader to re-execute"
            + (f" ({reason})" if isinstance(reason, str) else "") + "; its figures are as it reported them")


def compat_lines(row: dict[str, Any], api: str, timing: str | None) -> list[str]:
    """The lines of a puzzles or lab run in the original library's figures and units
    (`dist_lib.compat.report`): a header naming the file, API and timing (not the native scenario,
    which a puzzles or lab file does not use), then the figures or the error."""
    from dist_lib.compat.report import memory_text, notebook, time_text
    status = row["status"]
    colour = {"ok": "green", "incorrect": "yellow"}.get(status, "red")
    options = row.get("options") or {}
    timing = options.get("timing") or timing or "original"
    where = f" on {literal(row['cluster'])}" if timing == "real" and row.get("time_s") is not None else ""
    lines = [f"[bold]{literal(row['strategy'])}[/] — {literal(api)} API, {literal(timing)} timing{where} — "
             f"[{colour}]{literal(status)}[/]"]
    figures = notebook(row)
    if row.get("time_s") is not None:
        time_unit, memory_unit = figures.get("time_unit", "s"), figures.get("memory_unit", "bytes")
        step, last = time_text(figures.get("time", row["time_s"]), time_unit), time_text(row["time_s"], time_unit)
        lines.append(f"  step          {literal(step)} as the notebook reports it "
                     f"(the last op ends at {literal(last)})")
        lines.append(f"  peak memory   {literal(memory_text(figures.get('memory', row['peak_memory_bytes']), memory_unit))} on rank "
                     f"{literal(row['peak_memory_rank'])}")
        mfu = figures.get("mfu", row.get("mfu") if timing == "real" else None)
        if mfu is not None:
            lines.append(f"  MFU           {mfu * 100:.1f} %" + (" (the lab's formula)" if "mfu" in figures else ""))
        lines.append(f"  correct       {'yes' if row['correct'] else 'NO'}")
        if options.get("verified") is False:
            lines.append(f"  [dim]{literal(unverified_line(options))}[/]")
    if row.get("error"):
        lines.append(f"  [red]error[/]         {literal(row['error'])}")
    return lines


def rubric_line(rubric: Any) -> str:
    """The board's score in one line, from the suite's rubric (`scoring.Rubric`): what each component adds."""
    parts = []
    for c in rubric.components:
        name = getattr(c, "name", "") or c.metric
        if c.scale is not None:
            clip = "".join(f", {k} {v:g}" for k, v in (("at least", c.min), ("at most", c.max)) if v is not None)
            what = f"{c.scale:g} x {c.metric}" + (f" ({clip[2:]})" if clip else "")
        else:
            better = "more" if c.higher_is_better else "less"
            what = f"{name} points ({c.metric}: {better} is better, in {len(c.steps)} steps)"
        parts.append(what if c.weight == 1 else f"{c.weight:g} x {what}")
    return (f"score: {' + '.join(parts)}, per scenario (a run that is not ok scores 0); a submission's is the mean "
            f"over the scenarios")


def leaderboard_table(ranked: list[dict[str, Any]], scenarios: list[str]) -> Table:
    table = Table(title="leaderboard (per scenario: score, MFU · peak memory)")
    table.add_column("#", justify="right")
    table.add_column("submission")
    table.add_column("score", justify="right")
    for name in scenarios:
        table.add_column(name, justify="right")
    for entry in ranked:
        cells = []
        for name in scenarios:
            run = entry["runs"].get(name)
            if run is None:
                cells.append("[dim]-[/]")
            elif run["status"] == "ok":
                cells.append(f"{run['score']:.2f}\n[dim]{run['mfu'] * 100:.0f}% · "
                             f"{run['peak_memory_bytes'] / 2**30:.1f} GiB[/]")
            else:
                cells.append(f"[red]{literal(run['status'])}[/]")
        place = str(entry["rank"]) if entry["rank"] else "[red]—[/]"
        score = f"{entry['score']:.2f}" if entry["rank"] else "[red]invalid[/]"
        table.add_row(place, literal(entry["submission"]), score, *cells)
    return table

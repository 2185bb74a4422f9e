"""Terminal reports (rich): a run's summary and schedule view, and the leaderboard table.

The schedule view has one row per rank and time in buckets; each cell shows what dominated the
bucket: F forward, B backward (input), W weight gradient, L loss, U update, C communication with an
idle compute stream, and a dim dot for idle. Readable up to 64 ranks; peak memory closes each row.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

CELLS = {"forward": ("F", "black on green"), "backward": ("B", "black on blue"),
         "backward_input": ("B", "black on blue"), "backward_weight": ("W", "black on cyan"),
         "loss": ("L", "black on magenta"), "update": ("U", "black on red"), "comm": ("C", "black on yellow"),
         "idle": ("·", "dim")}


def schedule_view(result: Any, width: int = 72) -> Table:
    world, span = result.cluster.world_size, result.time_s or 1e-12
    bucket = span / width
    busy = [[dict() for _ in range(width)] for _ in range(world)]
    for e in result.raw_events:
        rank, op, stream, start, end = e[:5]
        key = op if stream == "compute" else "comm"
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
    for rank in range(world):
        line = Text()
        for cell in busy[rank]:
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
        table.add_row(str(rank), line, f"{peaks[rank] / 2**30:6.2f} GiB {bar:<6}")
    return table


def timeline_width(console: Console) -> int:
    return max(16, min(120, console.width - 26))


def legend() -> Text:
    text = Text("  ")
    for key in ("forward", "backward", "backward_weight", "loss", "update", "comm", "idle"):
        char, style = CELLS[key]
        text.append(f" {char} ", style=style)
        text.append(f" {'comm only' if key == 'comm' else key.replace('backward_weight', 'weight grad')} ")
    return text


def print_run(console: Console, row: dict[str, Any], result: Any | None, schedule: bool = True) -> None:
    status = row["status"]
    colour = {"ok": "green", "incorrect": "yellow"}.get(status, "red")
    console.print(f"[bold]{row['strategy']}[/] on {row['cluster']}, {row['workload']}, batch {row['global_batch']}"
                  f" — [{colour}]{status}[/]")
    options = row.get("options") or {}
    if row["time_s"] is not None and options.get("timing") == "unit":  # a puzzles file on its own unit costs
        console.print(f"  step time     {row['time_s']:.1f} steps (the puzzles' unit costs)")
        console.print(f"  peak memory   {row['peak_memory_bytes']:,} units on rank {row['peak_memory_rank']}")
    elif row["time_s"] is not None:
        cap = row.get("memory_capacity_bytes") or 0
        console.print(f"  step time     {row['time_s'] * 1e3:.2f} ms")
        console.print(f"  peak memory   {row['peak_memory_bytes'] / 2**30:.2f} GiB on rank {row['peak_memory_rank']}"
                      + (f" (of {cap / 2**30:.0f} GiB)" if cap else ""))
        console.print(f"  MFU / HFU     {row['mfu'] * 100:.1f} % / {row['hfu'] * 100:.1f} %")
    if row["time_s"] is not None:
        console.print(f"  bubble        {row['bubble_fraction'] * 100:.1f} % of compute idle")
        console.print(f"  correct       {'yes' if row['correct'] else 'NO'}")
        if options.get("verified") is False:
            console.print("  [dim]verified      no: puzzles/lab runs keep their own clocks and memory rules; they run "
                          "sandboxed but are not re-executed[/]")
    if row["error"]:
        console.print(f"  [red]error[/]         {row['error']}", markup=True, highlight=False)
    if result is not None and schedule:
        console.print(schedule_view(result, timeline_width(console)))
        console.print(legend())
    if row.get("trace"):
        console.print(f"  trace         {row['trace']} (open in https://ui.perfetto.dev)")
    for plot in row.get("plots") or []:
        console.print(f"  plot          {plot}")
    if row.get("plot_note"):
        console.print(f"  [dim]{row['plot_note']}[/]")


def leaderboard_table(ranked: list[dict[str, Any]], scenarios: list[str]) -> Table:
    table = Table(title="leaderboard (per scenario: score, MFU · peak memory per rank)")
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
                             f"{run['peak_memory_bytes'] / 1e9:.0f} GB[/]")
            else:
                cells.append(f"[red]{run['status']}[/]")
        place = str(entry["rank"]) if entry["rank"] else "[red]—[/]"
        score = f"{entry['score']:.2f}" if entry["rank"] else "[red]invalid[/]"
        table.add_row(place, entry["submission"], score, *cells)
    return table

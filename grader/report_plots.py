"""PNG schedule diagram and memory-over-time plot per run, written next to the trace.

matplotlib is the optional extra `plot`; it is imported only here and only when needed, and its
absence is reported in one line instead of failing the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {"forward": "#4caf50", "backward": "#2196f3", "backward_input": "#2196f3", "backward_weight": "#00bcd4",
           "loss": "#9c27b0", "update": "#e91e63", "collective": "#ff9800", "p2p": "#ffc107"}
LABELS = {"forward": "F", "backward": "B", "backward_input": "B (input)", "backward_weight": "W",
          "loss": "loss", "update": "update", "collective": "collective", "p2p": "send/recv"}


def write_plots(result: Any, trace_path: str | Path) -> tuple[list[str], str]:
    """Write `<trace>.schedule.png` and `<trace>.memory.png`; returns (paths, note)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install 'dist-sandbox[plot]')"
    base = Path(trace_path).with_suffix("")
    schedule, memory = base.with_name(base.name + ".schedule.png"), base.with_name(base.name + ".memory.png")
    _schedule(plt, result, schedule)
    _memory(plt, result, memory)
    return [str(schedule), str(memory)], ""


def _schedule(plt: Any, result: Any, path: Path) -> None:
    world = result.cluster.world_size
    height = min(0.35 * world + 1.5, 14)
    fig, ax = plt.subplots(figsize=(11, height))
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in result.raw_events:
        rank, op, stream, start, end = e[:5]
        key = op if stream == "compute" else stream
        bars.setdefault((rank, key), []).append((start * 1e3, (end - start) * 1e3))
    # a folded step has events for its representatives only: each other rank ran as its representative did
    representatives = getattr(result, "representatives", None) or range(world)
    seen = set()
    for rank in range(world):
        for (owner, key), spans in bars.items():
            if owner != representatives[rank]:
                continue
            comm = key in ("collective", "p2p")
            y = rank + (0.05 if comm else -0.4)
            label = _plain(LABELS.get(key, key.replace("_", " "))) if key not in seen else None  # compat logs
            # load_weights too
            seen.add(key)
            ax.broken_barh(spans, (y, 0.35), facecolors=COLOURS.get(key, "grey"), label=label)
    ax.set_ylim(world, -1)
    ax.set_yticks(range(world))
    ax.set_yticklabels([f"{r}{'' if representatives[r] == r else f'={representatives[r]}'} "
                        f"{result.cluster.device_of(r).name}" for r in range(world)],
                       fontsize=max(4, 9 - world // 16))
    ax.set_xlabel("time (ms)")
    ax.set_title(_plain(f"{result.strategy} on {result.cluster.name}, {result.workload.name}, batch "
                        f"{result.global_batch_size}: {result.time_s * 1e3:.1f} ms, MFU {result.mfu * 100:.1f} %"))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=8, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plain(text: str) -> str:
    """`text` as matplotlib draws it literally: a `$` would start mathtext, and a file named `x$\\foo$.py`
    (an unknown symbol) would make drawing its title fail."""
    return text.replace("$", r"\$")


def _memory(plt: Any, result: Any, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 4))
    world = result.cluster.world_size
    for rank, (times, values) in enumerate(result.timelines):
        if not len(times):
            continue
        xs = [t * 1e3 for t in times] + [result.time_s * 1e3]
        ys = [v / 2**30 for v in values] + [values[-1] / 2**30]
        ax.step(xs, ys, where="post", linewidth=1, label=f"rank {rank}" if world <= 16 else None)
    peak = result.fullest_rank  # by share of its capacity: on a mixed cluster not always the most bytes
    capacity = result.usable_memory(peak) / 2**30
    ax.axhline(capacity, color="red", linestyle="--", linewidth=1,
               label=f"{'usable memory' if result.memory_reserve is not None else 'capacity'} of rank {peak}")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("live memory (GiB)")
    ax.set_title(f"memory per rank: fullest GPU {result.fullest_text()}")
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""What a search shows: the table of the best plans, the Pareto front of time against cost per step
(FASOP's question, Hwang et al. HPDC'24: which mix of GPUs to rent), and its plot."""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.text import Text

from dist_lib.errors import SpecError
from dist_lib.hardware.cluster import Cluster
from dist_lib.planner.framework_rules import NAMES, batch_settings
from dist_lib.planner.search import Candidate, Search


SHORT = {"interleaved": "interl.", "zero-bubble": "ZB-H1"}
RECOMPUTE = {"selective": "sel.", "full": "full", "op": "op"}


def pareto(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates no other is both faster and cheaper per step than, fastest first."""
    front: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.seconds, c.dollars_per_step)):
        if not front or c.dollars_per_step < front[-1].dollars_per_step:
            front.append(c)
    return front


def simulated_plans(search: Search) -> list[Candidate]:
    """The plans the simulator ran: the best K, and the winner moving layers made of one of them."""
    ran = {id(c): c for c in [*search.simulated, search.best] if c.simulated is not None}
    return list(ran.values())


def front(search: Search) -> list[Candidate]:
    """The Pareto front of the simulated plans (of the estimates, when nothing was simulated)."""
    return pareto(simulated_plans(search) or search.candidates)


def short_names(cluster: Cluster) -> dict[str, str]:
    """Each device type's name up to its first '-', or whole where that would name two of the cluster's
    types alike (A100-80GB beside A100-40GB) or nothing at all (a custom device named "-x")."""
    names = {node.device.name for node in cluster.nodes}
    short = {name: name.split("-")[0] for name in names}
    return {name: cut if cut and list(short.values()).count(cut) == 1 else name for name, cut in short.items()}


def layout(candidate: Candidate, cluster: Cluster) -> str:
    """Each stage as `<dp>x<tp> <device>`, with context parallelism `<dp>x<cp>x<tp>` (several devices: joined by
    '+' in the stage's rank order, so two plans that order one stage's GPUs differently read differently; names
    as `short_names`)."""
    short = short_names(cluster)
    parts = []
    cp = candidate.plan.cp
    for stage in candidate.plan.stages:
        names = dict.fromkeys(short[cluster.device_of(r).name] for r in stage.ranks)  # in rank order
        grid = f"{len(stage.shares)}x{cp}x{stage.tp}" if cp > 1 else f"{stage.dp}x{stage.tp}"
        parts.append(f"{grid} {'+'.join(names)}")
    return " | ".join(parts)


def table(search: Search, cluster: Cluster, rows: int = 10) -> Group:
    """The simulated candidates (winner first), with the estimate beside the simulated time: one line of
    figures per plan, fixed-width so that none is cut at 80 columns, and its stages and layers on the line
    below. Every cell is `Text`, never markup: a device's name from a cluster file, or an error, prints as
    it is (`[red]` and `[/x]` included)."""
    shown = sorted({id(c): c for c in [search.best, *search.simulated]}.values(),
                   key=lambda c: (c.simulated is None, c.seconds))[:rows]
    ran = sum(not c.error.startswith("not simulated") for c in search.simulated)  # failures included
    lines = [Text(f"plans ({search.estimated_count} estimated, {ran} simulated, {search.seconds:.1f} s)", style="bold"),
             Text(f"{'#':>2}  {'schedule':<15} {'m x b':>7} {'est. ms':>9} {'sim. ms':>9} {'fullest GPU':>11} "
                  f"{'used MFU':>8} {'$/step':>8}", style="bold")]
    short = short_names(cluster)
    for i, c in enumerate(shown, 1):
        plan = c.plan
        schedule = " ".join(v for v in (SHORT.get(plan.schedule, plan.schedule), RECOMPUTE.get(plan.recompute, ""),
                                         {1: "Z1", 3: "FSDP" if plan.replicate == 1 else f"HSDP{plan.replicate}"}.get(
                                             plan.zero, ""),
                                         f"ep{plan.ep}" if plan.ep > 1 else "", f"cp{plan.cp}" if plan.cp > 1 else "",
                                         f"etp{plan.etp}" if plan.etp else "")
                              if v)
        simulated = f"{c.simulated * 1e3:.2f}" if c.simulated is not None else "-"
        free = "-" if c.peak_fraction is None else \
            f"{short[cluster.device_of(c.fullest_rank).name][:6]} {c.peak_fraction * 100:.0f}%"
        mfu = f"{c.mfu * 100:.1f} %" if c.mfu is not None else "-"
        lines.append(Text(f"{i:>2}  {schedule:<15} {f'{plan.microbatches}x{plan.microbatch_size}':>7} "
                          f"{c.estimate * 1e3:>9.2f} {simulated:>9} {free:>11} {mfu:>8} {c.dollars_per_step:>8.5f}"))
        detail = f"    stages {layout(c, cluster)}; layers {'/'.join(str(s.layers) for s in plan.stages)}"
        if c.simulated is None and c.error:
            detail += f"; {c.error}"
        lines.append(Text(detail, style="dim"))
        if search.framework != "any":  # the per-GPU micro batch and the accumulation, as the framework names them
            lines.append(Text(f"    {NAMES[search.framework]}: "
                              f"{batch_settings(plan, search.framework, sum(s.layers for s in plan.stages))}",
                              style="dim"))
    recompute = "op/full: per-op selective or full" if search.framework == "torchtitan" else "sel./full: selective or full"
    sharding = "Z1: ZeRO-1; HSDPr: FSDP in r groups, replicated across them" if search.framework == "torchtitan" \
        else "Z1: ZeRO-1"
    lines.append(Text(f"stages: dp x tp (with cp: dp x cp x tp) and device of each; {recompute} recompute; {sharding}; used "
                      "MFU and $/step: of the GPUs the plan uses (idle GPUs not counted)", style="dim"))
    if search.framework != "any":
        lines.append(Text(f"plans {NAMES[search.framework]} runs, each simulated as its exported settings run "
                          f"(python -m grader run --from {search.framework})", style="dim"))
    lines.append(Text("fullest GPU: the GPU whose memory is fullest at the simulated peak, by share of its capacity, "
                      "runtime reserve included", style="dim"))
    return Group(*lines)


# image formats matplotlib writes with its own backends (and Pillow, which it requires), by file suffix;
# without one of them it would fail after the search, or write `name.png` for a bare `name`
PLOT_FORMATS = (".png", ".pdf", ".svg", ".eps", ".ps", ".jpg", ".jpeg", ".tif", ".tiff")


def check_plot_path(path: str | Path, source: str = "plot") -> None:
    """Raise `SpecError` naming `source` unless `path` ends in one of `PLOT_FORMATS`."""
    if Path(path).suffix.lower() not in PLOT_FORMATS:
        raise SpecError(f"{source} {path}: the Pareto plot is an image; give a name ending in "
                        f"{', '.join(PLOT_FORMATS)}")


def plot_pareto(search: Search, path: str | Path) -> str:
    """An image (PNG, or another of `PLOT_FORMATS` by the suffix) of every candidate's time and cost
    per step, the simulated ones and the Pareto front; returns a one-line note when matplotlib (the
    optional `plot` extra) is missing."""
    check_plot_path(path)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Pareto plot skipped: matplotlib is not installed (pip install 'dist-sandbox[plot]')"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([c.estimate * 1e3 for c in search.candidates], [c.estimate * c.price_per_hour / 3.6
                                                               for c in search.candidates],
               s=6, c="#bbbbbb", label="estimated")
    ran = simulated_plans(search)
    ax.scatter([c.seconds * 1e3 for c in ran], [c.dollars_per_step * 1e3 for c in ran], s=16, c="#2196f3",
               label="simulated")
    best = front(search)
    ax.plot([c.seconds * 1e3 for c in best], [c.dollars_per_step * 1e3 for c in best], "-o", c="#e91e63",
            ms=4, label="Pareto front")
    ax.set_xlabel("time per step (ms)")
    ax.set_ylabel("cost per step (USD x 1000)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return ""

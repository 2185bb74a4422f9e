"""`plan(cluster, workload, global_batch_size)`: the fastest (or cheapest) plan, estimated then simulated."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..errors import SpecError
from ..hardware import Cluster
from ..workload import Workload
from .evaluate import Runner, refine, run_here, simulate_all
from .search import Candidate, Search, generate

OBJECTIVES = ("time", "cost")


def plan(cluster: Cluster | str | Path, workload: Workload | str | Path, global_batch_size: int, *,
         top: int = 10, objective: str = "time", budget: float | None = None, refine_rounds: int = 8,
         max_stages: int = 64, progress: Callable[[str, int, int], None] | None = None,
         runner: Runner = run_here) -> Search:
    """Search plans for one training step: every candidate estimated, the best `top` by the estimate
    simulated, the winner refined on the simulator. `objective` ranks by step time or by dollars per
    step; `budget` (USD per hour) leaves out device mixes that cost more. `top=0` trusts the estimate
    alone (no simulation). `runner` runs the simulations, which are independent (default: one after another
    in this process). Raises `SpecError` with one line when no plan fits."""
    if objective not in OBJECTIVES:
        raise SpecError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise SpecError(f"top must be a whole number >= 0, got {top!r}")
    if budget is not None and not budget > 0:
        raise SpecError(f"budget must be a positive number of USD per hour, got {budget!r}")
    cluster, workload = Cluster.load(cluster), Workload.load(workload)
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise SpecError(f"global_batch_size must be a whole number >= 1, got {global_batch_size!r}")
    started = time.perf_counter()
    report = (lambda i, n: progress("estimate", i, n)) if progress else None
    candidates, reasons = generate(cluster, workload, global_batch_size, budget=budget, max_stages=max_stages,
                                   progress=report)
    if not candidates:
        raise SpecError(reasons[0])

    def key(c: Candidate) -> float:
        return c.seconds if objective == "time" else c.dollars_per_step

    candidates.sort(key=key)
    estimated = len(candidates)
    chosen = _distinct(candidates, top)
    if progress:
        progress("simulate", 0, len(chosen))
    simulated = simulate_all(cluster, workload, global_batch_size, chosen, runner,
                             (lambda n: progress("simulate", n, len(chosen))) if progress else None)
    ran = [c for c in simulated if c.simulated is not None]
    if top and not ran:
        raise SpecError(f"no plan fits: the {len(chosen)} best estimates all fail in the simulator "
                        f"({chosen[0].error})")
    best = min(ran, key=key) if ran else candidates[0]
    search = Search(candidates, simulated, best, estimated, 0.0)
    if ran and refine_rounds:
        refined, _ = refine(cluster, workload, global_batch_size, best, refine_rounds, key, runner)
        if refined is not best:
            search.refined_from, search.best = best, refined
    search.order_pairs, search.order_disagreements = _disagreements(ran)
    search.seconds = time.perf_counter() - started
    return search


def _distinct(candidates: list[Candidate], top: int) -> list[Candidate]:
    seen, out = set(), []
    for c in candidates:
        if len(out) >= top:
            break
        if c.plan not in seen:
            seen.add(c.plan)
            out.append(c)
    return out


def _disagreements(ran: list[Candidate]) -> tuple[int, int]:
    """(pairs, pairs the estimate orders differently from the simulator) among simulated candidates."""
    pairs = wrong = 0
    for i, a in enumerate(ran):
        for b in ran[i + 1:]:
            pairs += 1
            if (a.estimate - b.estimate) * (a.simulated - b.simulated) < 0:
                wrong += 1
    return pairs, wrong

"""`plan(cluster, workload, global_batch_size)`: the fastest (or cheapest) plan, estimated then simulated."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.reserve import memory_reserve as read_reserve
from dist_lib.workload.transformer import Workload, check_global_batch
from dist_lib.planner.evaluate import Runner, refine, run_here, simulate_all, simulated_passes
from dist_lib.planner import framework_rules
from dist_lib.planner.search import PRUNE_SLACK, Candidate, Search, generate

OBJECTIVES = ("time", "cost")
# Layer passes (`simulated_passes`: of one replica a stage when the step folds its replicas, else of every GPU)
# of the largest plan the search simulates. The simulator takes about 5 to 25 microseconds of CPU a pass (more
# on wider stages), so a plan at the limit simulates in about 5 to 25 s; the winner of 1024 GPUs, gpt-175b
# and a batch of 2048 in README runs 950,272 rank for rank and 59,392 folded. A larger plan (a batch of a
# million samples makes 32768 microbatches on 8 GPUs: 6.3 million) keeps its estimate.
SIMULATION_LIMIT = 2**20


def plan(cluster: Cluster | str | Path, workload: Workload | str | Path, global_batch_size: int, *,
         top: int = 10, objective: str = "time", budget: float | None = None, refine_rounds: int = 8,
         max_stages: int = 16, progress: Callable[[str, int, int], None] | None = None,
         runner: Runner = run_here, width: int = 1, prune_slack: float = PRUNE_SLACK,
         simulation_limit: int = SIMULATION_LIMIT, memory_reserve: Any = True, framework: str = "any") -> Search:
    """Search plans for one training step: every candidate estimated, the best `top` by the estimate
    simulated, the winner refined on the simulator. `objective` ranks by step time or by dollars per
    step; `budget` (USD per hour) leaves out device mixes that cost more. `top=0` trusts the estimate
    alone (no simulation). `runner` runs the simulations, `width` at a time (default: one after another in
    this process). The estimate skips groupings whose lower bound is `prune_slack` above the best estimate
    so far, and pipelines of more than `max_stages` stages. A plan of more than `simulation_limit` layer
    passes a step in the simulator (`simulated_passes`: one replica a stage's when its replicas fold) is not
    simulated: its estimate stands, and `Search.notes` says so. `memory_reserve` is
    what a real run's runtime keeps of each GPU (`hardware.reserve`; True: the cited default, None or
    "off": none), left out of every device in the estimate and in the simulations. `framework`
    ("megatron", "torchtitan", "deepspeed") searches only the plans that framework runs, each simulated as
    its settings run (`framework_rules`, `framework_run`); "any" (the default) every plan. Raises
    `SpecError` with one line when no plan fits."""
    framework_rules.rules(framework)  # a known framework, or one line naming the choices
    if objective not in OBJECTIVES:
        raise SpecError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    for name, value, low in (("top", top, 0), ("refine_rounds", refine_rounds, 0), ("width", width, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"{name} must be a whole number >= {low}, got {value!r}")
    if isinstance(prune_slack, bool) or not isinstance(prune_slack, (int, float)) or not prune_slack >= 0:
        raise SpecError(f"prune_slack must be a number >= 0 (math.inf: no pruning), got {prune_slack!r}")
    for name, value in (("progress", progress), ("runner", runner)):
        if value is not None and not callable(value) or name == "runner" and value is None:
            raise SpecError(f"{name} must be a function{' or None' if name == 'progress' else ''}, got {value!r}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0):
        raise SpecError(f"budget must be a positive number of USD per hour, got {budget!r}")
    if isinstance(max_stages, bool) or not isinstance(max_stages, int) or max_stages < 1:
        raise SpecError(f"max_stages must be a whole number >= 1, got {max_stages!r}")
    if isinstance(simulation_limit, bool) or not isinstance(simulation_limit, int) or simulation_limit < 1:
        raise SpecError(f"simulation_limit must be a whole number >= 1, got {simulation_limit!r}")
    cluster, workload = Cluster.load(cluster), Workload.load(workload)
    reserve = read_reserve(memory_reserve, "memory_reserve")
    if runner is run_here and _loop_running():
        runner = _in_a_thread  # (a notebook's cell runs in an event loop, which `simulate` cannot share)
    if objective == "cost" or budget is not None:
        _check_prices(cluster, "objective 'cost'" if objective == "cost" else "a budget")
    check_global_batch(global_batch_size)  # as simulate checks it, before a search whose plans it would refuse
    started = time.perf_counter()
    report = (lambda i, n: progress("estimate", i, n)) if progress else None
    candidates, reasons = generate(cluster, workload, global_batch_size, budget=budget, objective=objective,
                                   max_stages=max_stages, progress=report, prune_slack=prune_slack,
                                   memory_reserve=reserve, framework=framework)
    if not candidates:
        raise SpecError(reasons[0])

    def key(c: Candidate) -> float:
        return c.seconds if objective == "time" else c.dollars_per_step

    candidates.sort(key=key)
    estimated = len(candidates)
    chosen = _distinct(candidates, top)
    passes = {id(c): simulated_passes(cluster, workload, global_batch_size, c.plan, framework) for c in chosen}
    within = [c for c in chosen if passes[id(c)] <= simulation_limit]
    skipped = [c for c in chosen if passes[id(c)] > simulation_limit]
    for c in skipped:
        c.error = "not simulated: too large"
    simulated = _simulate_in_order(cluster, workload, global_batch_size, within, objective, runner, width, progress,
                                   reserve, framework)
    ran = [c for c in simulated if c.simulated is not None]
    if within and not ran and not skipped:
        raise SpecError(f"no plan fits: the {len(chosen)} best estimates all fail in the simulator "
                        f"({chosen[0].error})")
    # a plan too large to simulate competes with its estimate
    best = min(ran + skipped, key=key) if ran or skipped else candidates[0]
    search = Search(candidates, simulated + skipped, best, estimated, 0.0, framework=framework)
    if skipped:
        largest = max(passes[id(c)] for c in skipped)
        search.notes.append(
            f"{len(skipped)} of the {len(chosen)} best estimates not simulated: a step of up to {largest:,} layer "
            f"passes (microbatches x each stage's simulated GPUs x its layers) is above the simulation limit of "
            f"{simulation_limit:,} (a pass simulates in about 5 to 25 us; --simulation-limit raises it): their "
            f"times are the estimate's")
    if best.simulated is not None and refine_rounds:
        # within the framework's own layer splits: DeepSpeed's is fixed (uniform)
        keep = None if framework == "any" else \
            (lambda p: not framework_rules.why_not(p, framework, cluster, workload))
        refined, _ = refine(cluster, workload, global_batch_size, best, refine_rounds, key, runner,
                            limit=simulation_limit, reserve=reserve, keep=keep, framework=framework)
        if refined is not best:
            search.refined_from, search.best = best, refined
    search.order_pairs, search.order_disagreements = _disagreements(ran)
    search.seconds = time.perf_counter() - started
    return search


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_a_thread(fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """`run_here` from a thread that runs an event loop: each simulation in a thread of its own, where
    `simulate` can run its own loop, one after another."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        for item in enumerate(items):
            yield item[0], pool.submit(fn, item[1]).result()


def _check_prices(cluster: Cluster, needs: str) -> None:
    """Refuse to rank by dollars when a device has no price: it would count as free, so the cheapest plan
    and the budget's device mixes would be the ones that use it most."""
    unpriced = sorted({node.device.name for node in cluster.nodes if not node.device.price_per_hour > 0})
    if unpriced:
        raise SpecError(f"{needs} needs every device's price per GPU-hour, and {', '.join(unpriced)} "
                        f"{'has' if len(unpriced) == 1 else 'have'} none: "
                        f"give price_per_hour (USD) in its [devices.{unpriced[0]}] table of the cluster file")


def _simulate_in_order(cluster: Cluster, workload: Workload, global_batch: int, chosen: list[Candidate],
                       objective: str, runner: Runner, width: int,
                       progress: Callable[[str, int, int], None] | None,
                       reserve: Any = None, framework: str | None = None) -> list[Candidate]:
    """The chosen candidates simulated in estimate order, stopping once even an estimate as wrong as the
    worst seen so far could not make the next one win (step time only). `width` candidates are simulated
    at a time through `runner`, and their results are taken in order under the same rule, so the
    candidates kept are the same at any width (a wider batch may simulate a few that are then left out)."""
    simulated: list[Candidate] = []
    error = 0.0

    def hopeless(candidate: Candidate) -> bool:
        ran = [c.simulated for c in simulated if c.simulated is not None]
        return bool(ran) and objective == "time" and candidate.estimate > min(ran) * (1 + 2 * error)

    position = 0
    while position < len(chosen) and not hopeless(chosen[position]):
        if progress:
            progress("simulate", position, len(chosen))
        batch = simulate_all(cluster, workload, global_batch, chosen[position:position + max(1, width)], runner,
                             reserve=reserve, framework=framework)
        for candidate in batch:
            if candidate is not batch[0] and hopeless(candidate):
                return simulated
            simulated.append(candidate)
            if candidate.simulated is not None:
                error = max(error, abs(candidate.estimate - candidate.simulated) / candidate.simulated)
        position += len(batch)
    if progress and chosen:
        progress("simulate", len(chosen), len(chosen))
    return simulated


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

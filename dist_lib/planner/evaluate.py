"""The simulator's word on the best candidates: run each plan rank for rank (`strategies/planned.py`),
keep those that are correct and fit memory, and improve the winner by moving one layer at a time across a
block boundary (a block a stage, or a chunk when interleaved) while the simulated step gets shorter (a
local search on the simulator's own time, in the spirit of Aceso's bottleneck relief; Liu et al.,
EuroSys'24, sec. 4)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from dist_lib.errors import OutOfMemoryError, SimulationError, SpecError
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.reserve import MemoryReserve
from dist_lib.run.folding import plan_fold
from dist_lib.run.simulator import load_strategy, simulate
from dist_lib.workload.transformer import Workload
from dist_lib.planner.framework_run import framework_call, framework_run
from dist_lib.planner.plan import Plan, Stage
from dist_lib.planner.search import Candidate


# How a list of independent simulations is run: `runner(fn, items)` yields `(index, fn(items[index]))` for
# every item, in any order (in this process by default; the grader hands in a process pool or Ray tasks).
Runner = Callable[[Callable[[Any], Any], Sequence[Any]], Iterable[tuple[int, Any]]]


def run_here(fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterable[tuple[int, Any]]:
    return enumerate(map(fn, items))


def simulate_all(cluster: Cluster, workload: Workload, global_batch: int, candidates: Sequence[Candidate],
                 runner: Runner = run_here, done: Callable[[int], None] | None = None,
                 reserve: MemoryReserve | None = None, framework: str | None = None) -> list[Candidate]:
    """`simulate_candidate` of each candidate through `runner`, in the candidates' order; `done(n)` after
    each of the n that finished."""
    out: list[Candidate | None] = [None] * len(candidates)
    for count, (index, candidate) in enumerate(runner(partial(simulate_candidate, cluster, workload, global_batch,
                                                              reserve=reserve, framework=framework),
                                                      candidates), 1):
        out[index] = candidate
        if done:
            done(count)
    return out  # type: ignore[return-value]


# The strategy that runs any plan, named as a user names one: the planner runs it as it runs any strategy,
# and the strategies, which import the planner, stay above it.
PLANNED = "strategies.planned"


def run_plan(cluster: Cluster, workload: Workload, global_batch: int, plan: Plan,
             reserve: MemoryReserve | None = None):
    """The simulator's `Result` of one step of `plan` (memory enforced, less `reserve` when given;
    correctness checked)."""
    return simulate(PLANNED, cluster, workload, global_batch, plan=plan, memory_reserve=reserve)


def _runs_as_planned(workload: Workload, framework: str | None) -> bool:
    """Whether a candidate runs as `planned` (any framework, a dense model), else as its framework's launch
    (an MoE plan as Megatron-LM's, hybrid's EP x PP x DP)."""
    return framework in (None, "any") and workload.moe is None


def _launch_framework(framework: str | None) -> str:
    return "megatron" if framework in (None, "any") else framework


def simulate_candidate(cluster: Cluster, workload: Workload, global_batch: int, candidate: Candidate,
                       reserve: MemoryReserve | None = None, framework: str | None = None) -> Candidate:
    """Fill in the simulated time, memory and MFU of a candidate (or why it failed); with a `framework`
    (not "any"), the step as that framework runs the plan (`framework_run`)."""
    try:
        if _runs_as_planned(workload, framework):
            result, rank_of = run_plan(cluster, workload, global_batch, candidate.plan, reserve), None
        else:
            result, rank_of = framework_run(cluster, workload, global_batch, candidate.plan,
                                            _launch_framework(framework), reserve)
    except OutOfMemoryError as exc:
        candidate.error = "out of memory: " + str(exc).splitlines()[0]
        return candidate
    except SimulationError as exc:
        candidate.error = str(exc).splitlines()[0]
        return candidate
    used = candidate.plan.ranks
    # the result's rank of each cluster rank (the framework's launch renumbers the plan's ranks)
    own = {r: r for r in used} if rank_of is None else {r: g for g, r in enumerate(rank_of)}
    busy = result.compute_busy()
    candidate.stage_busy = [max(busy[own[r]] for r in stage.ranks) for stage in candidate.plan.stages]
    candidate.simulated = result.time_s
    # the fullest GPU by share of its capacity, the runtime reserve included
    candidate.fullest_rank = max(used, key=lambda r: (result.memory_fraction(own[r]), -r))  # the first on a tie
    candidate.peak_fraction = result.memory_fraction(own[candidate.fullest_rank])
    candidate.mfu = result.model_flops / (result.time_s * sum(cluster.device_of(r).peak_flops for r in used))
    return candidate


def neighbours(candidate: Candidate) -> list[Plan]:
    """Plans with one layer moved out of the stage whose compute was busiest in the simulation, from one
    of its blocks into the next or previous block along the pipeline. With interleaving the blocks run
    chunk-major (chunk c of stage s is virtual stage c x p + s, Narayanan et al. 2021, sec. 2.2), so a
    block's neighbours may sit on the other end of the pipeline; every block keeps a layer."""
    plan = candidate.plan
    if not candidate.stage_busy:
        return []
    pp = len(plan.stages)
    counts = virtual_counts(plan)
    worst = candidate.stage_busy.index(max(candidate.stage_busy))
    out = []
    for chunk in range(plan.chunks):
        block = chunk * pp + worst
        if counts[block] < 2:
            continue
        for other in (block - 1, block + 1):
            if 0 <= other < len(counts):
                new = counts[:]
                new[block] -= 1
                new[other] += 1
                out.append(with_counts(plan, new))
    return out


def layer_passes(plan: Plan) -> int:
    """The passes of one layer over one microbatch on one GPU a step of `plan` runs (microbatches x each
    stage's GPUs x its layers): what a simulation's work grows with."""
    return plan.microbatches * sum(len(stage.ranks) * stage.layers for stage in plan.stages)


def simulated_passes(cluster: Cluster, workload: Workload, global_batch: int, plan: Plan,
                     framework: str | None = None) -> int:
    """The layer passes the simulation of `plan` runs: one replica a stage's when the step folds its identical
    replicas (`run.folding.plan_fold`, the simulator's own test, on the strategy and options
    `simulate_candidate` runs), else every GPU's (`layer_passes`)."""
    try:
        strategy, on, options = (PLANNED, cluster, {"plan": plan}) if _runs_as_planned(workload, framework) \
            else framework_call(cluster, workload, plan, _launch_framework(framework))
        fold = plan_fold(load_strategy(strategy)[0], on, global_batch, options, workload.moe)
    except SpecError:  # (a plan its framework cannot run, such as DeepSpeed with an uneven layer split: its
        fold = None    # simulation, if it is tried, says why)
    # folded, one in `copies` of every stage's ranks runs: a replica's tp ranks, its cp x tp with context
    # parallelism, or an EP group's replicas with experts
    return layer_passes(plan) if fold is None else layer_passes(plan) // fold.copies


def virtual_counts(plan: Plan) -> list[int]:
    """Layers of each block in pipeline order (chunk-major: chunk c of stage s at c x p + s)."""
    return [stop - start for c in range(plan.chunks) for start, stop in (st.blocks[c] for st in plan.stages)]


def with_counts(plan: Plan, counts: list[int]) -> Plan:
    """`plan` with its blocks re-cut to `counts` layers each, in `virtual_counts` order."""
    pp = len(plan.stages)
    blocks: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    start = 0
    for k, n in enumerate(counts):
        blocks[k % pp].append((start, start + n))
        start += n
    return replace(plan, stages=tuple(Stage(st.ranks, st.tp, tuple(blocks[s]), st.shares)
                                      for s, st in enumerate(plan.stages)))


def refine(cluster: Cluster, workload: Workload, global_batch: int, best: Candidate, rounds: int,
           key: Callable[[Candidate], float], runner: Runner = run_here,
           limit: int | None = None, reserve: MemoryReserve | None = None,
           keep: Callable[[Plan], bool] | None = None, framework: str | None = None) -> tuple[Candidate, int]:
    """Hill-climb from `best` over `neighbours` for at most `rounds` improvements; (winner, plans run).
    A round's neighbours (those whose simulation runs at most `limit` layer passes, `simulated_passes`, and
    that `keep` keeps) are simulated
    together through `runner` (as `framework` runs them, given one)."""
    runs = 0
    for _ in range(rounds):
        improved = None
        trials = simulate_all(cluster, workload, global_batch,
                              [Candidate(plan, best.estimate, best.memory, best.price_per_hour)
                               for plan in neighbours(best)
                               if (limit is None or simulated_passes(cluster, workload, global_batch, plan,
                                                                     framework) <= limit)
                               and (keep is None or keep(plan))],
                              runner, reserve=reserve, framework=framework)
        for trial in trials:
            runs += 1
            if trial.simulated is not None and key(trial) < key(improved or best) * (1 - 1e-9):
                improved = trial
        if improved is None:
            break
        best = improved
    return best, runs

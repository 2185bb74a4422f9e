"""The planner: enumerate device groupings, per-stage (dp, tp), microbatch sizes, schedules, recompute and
ZeRO; rank them with the closed-form estimate (`estimate.py`), each with its best layer partition; then
run the best K through the event simulator, rank for rank, and improve the winner by moving layers
between neighbouring stages while the simulator says it helps (Aceso's bottleneck relief, Liu et al.
EuroSys'24, sec. 4, here driven by simulated rather than estimated time). The partition of each
grouping is `partition.py`'s, its step estimate `step.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.reserve import MemoryReserve
from dist_lib.planner import context_cost, expert_modes_cost, framework_rules, options_cost, space
from dist_lib.planner.partition import chunk_sizes, fits, fixed_partition, partition
from dist_lib.planner.plan import Plan, Stage
from dist_lib.planner.stage_option import StageOption
from dist_lib.planner.stage_space import StageSpace
from dist_lib.planner.step import step_estimate
from dist_lib.workload.transformer import Workload

# Memory settings in order of the time they add: the first whose partition is not memory-bound ends the list;
# "selective" or (torchtitan's, Llama blocks) "op", never both (`framework_rules.settings`)
MEMORY_CONFIGS = tuple((r, z) for r in ("none", "selective", "op", "full") for z in (0, 1))
INTERLEAVE_CHUNKS = 2
# Candidates whose lower bound is this much above the best estimate are not estimated: the estimate
# orders simulated plans within about this margin (benchmarks/planners.py prints how often it errs).
PRUNE_SLACK = 0.2


@dataclass
class Candidate:
    plan: Plan
    estimate: float  # seconds per step
    memory: float  # the estimate's highest share of a device's usable memory (capacity less the runtime reserve)
    price_per_hour: float  # USD per hour of the GPUs the plan uses
    simulated: float | None = None
    # simulated: the fullest GPU's share of its capacity (peak and runtime reserve), and that GPU's rank
    peak_fraction: float | None = None
    fullest_rank: int | None = None
    mfu: float | None = None
    error: str = ""
    stage_busy: list[float] = field(default_factory=list)  # simulated: each stage's busiest compute stream

    @property
    def seconds(self) -> float:
        return self.simulated if self.simulated is not None else self.estimate

    @property
    def dollars_per_step(self) -> float:
        return self.seconds * self.price_per_hour / 3600


@dataclass
class Search:
    """Everything a search found: candidates ranked by the estimate, the simulated ones, the winner."""

    candidates: list[Candidate]
    simulated: list[Candidate]
    best: Candidate
    estimated_count: int
    seconds: float
    order_disagreements: int = 0  # pairs of simulated candidates the estimate and simulator rank differently
    order_pairs: int = 0
    refined_from: Candidate | None = None
    notes: list[str] = field(default_factory=list)
    framework: str = "any"  # the framework whose plans were searched ("any": every plan)


@lru_cache(maxsize=256)
def pipeline_partition(cluster: Cluster, workload: Workload, stage_ranks: tuple[int, ...], microbatch_size: int,
                       microbatches: int, recompute: str = "none") -> tuple[int, ...] | None:
    """Layers per stage of a pipeline of one rank a stage under 1F1B (AMP's replicas, Li et al.
    NeurIPS'22, sec. 4): the contiguous cut whose slowest stage per microbatch is least within every
    device's memory less its runtime reserve (`partition`); None when no cut fits in memory."""
    sp = StageSpace(cluster, workload)
    found = partition([sp.options((rank,), microbatch_size, recompute, 0) for rank in stage_ranks],
                      workload.num_layers, microbatches)
    return None if found is None else tuple(n for n, _ in found[1])


def pipeline_stage_seconds(cluster: Cluster, workload: Workload, stage_ranks: tuple[int, ...],
                           counts: Sequence[int], microbatch_size: int, recompute: str = "none") -> list[float]:
    """Seconds per microbatch (forward and backward, the loss on the last) of each stage of a pipeline
    of one rank a stage holding `counts` layers each, as the estimate times them."""
    sp = StageSpace(cluster, workload)
    out, start = [], 0
    for rank, n in zip(stage_ranks, counts):
        option = sp.options((rank,), microbatch_size, recompute, 0)[0]
        out.append(option.costs.total[start + n] - option.costs.total[start])
        start += n
    out[-1] += option.loss
    return out


def to_plan(placed: list[tuple[int, StageOption]], microbatch: int, microbatches: int, schedule: str,
            recompute: str, zero: int, chunks: int = 1, fp8: str = "", ep: int = 1, cp: int = 1,
            replicate: int = 1) -> Plan:
    """The `Plan` of a placed partition; with chunks, each stage's layers are cut into that many
    blocks in Megatron's interleaved order (virtual stage c * p + s)."""
    pp = len(placed)
    counts = [n for n, _ in placed]
    parts = [chunk_sizes(n, chunks) for n in counts]
    blocks: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    start = 0
    for c in range(chunks):
        for s in range(pp):
            blocks[s].append((start, start + parts[s][c]))
            start += parts[s][c]
    stages = tuple(Stage(o.ranks, o.tp, tuple(blocks[s]), o.shares) for s, (_, o) in enumerate(placed))
    return Plan(stages, microbatch, microbatches, schedule, recompute, zero, fp8, ep, cp, replicate=replicate)


def generate(cluster: Cluster, workload: Workload, global_batch: int, *, budget: float | None = None,
             objective: str = "time", max_stages: int = 16, progress: Callable[[int, int], None] | None = None,
             prune_slack: float = PRUNE_SLACK, memory_reserve: MemoryReserve | None = MemoryReserve(),
             framework: str | None = None) -> tuple[list[Candidate], list[str]]:
    """Every candidate the estimate finds feasible, each with its best partition, and (when there are
    none) why not, one reason per line. Each device holds its capacity less `memory_reserve` (None: all
    of it). With a `framework` (`framework_rules`), only plans it runs: stages of one width and TP degree,
    even shares, its schedules, memory settings and layer splits."""
    rules, refusal = framework_rules.with_experts(framework, workload)  # (experts: Megatron-LM's layout)
    if refusal:
        return [], [refusal]
    # the (recompute, zero) settings, and a framework's FP8 linear layers beside 16-bit ones where it has them
    memory_configs, fp8_choices = framework_rules.settings(rules, workload, cluster, MEMORY_CONFIGS)
    sp = StageSpace(cluster, workload, memory_reserve, even=rules is not None, kv_exchange=context_cost.exchange(rules))
    L = workload.num_layers
    # a search by cost, or within a budget, weighs renting part of each device type too
    rent = objective == "cost" or budget is not None
    orders = space.orders(cluster, budget, rent=rent)
    if rules is not None and orders:
        orders = [o for o in orders if rules.order_ok(o.ranks, cluster)]
        if not orders:
            return [], [f"no plan {rules.name} runs: every mix of the cluster's device types has nodes of different "
                        f"GPU counts, and its launcher starts the same number of processes on every node"]
    if not orders:
        # the least a plan can cost: the cheapest type's one node (renting), or all its nodes
        cost: dict[str, list[float]] = {}
        for node in cluster.nodes:
            gpus_price = cost.setdefault(node.device.name, [0, 0.0])
            if rent and gpus_price[0]:
                gpus_price[:] = min(gpus_price, [node.gpus, node.gpus * node.device.price_per_hour],
                                    key=lambda g: g[1])
                continue
            gpus_price[0] += node.gpus
            gpus_price[1] += node.gpus * node.device.price_per_hour
        name, (gpus, dollars) = min(cost.items(), key=lambda item: item[1][1])
        what = "one node of the cheapest type" if rent else "every GPU of each type it uses, and the cheapest type's"
        return [], [f"no device type's GPUs fit the budget of ${budget:.2f}/h (a plan uses at least {what}, "
                    f"{gpus:g} x {name}, at ${dollars:.2f}/h)"]
    why = {"memory": 0, "batch": 0}
    # Branch and bound: a lower bound of each (grouping, microbatch size) orders the work, and the work
    # stops where the bound exceeds the best estimate so far by more than the estimate's error could hide.
    def bounded(stages: tuple, microbatch: int, price: float, cp: int = 1) -> list[tuple]:
        """(bound, price, stages, microbatch, free options, TP degree, CP degree) of a layout and microbatch
        size: one entry, or with a framework one per TP degree every stage may take (TP None: any, stage by
        stage); none where some stage has no option (the batch does not split over its replicas)."""
        free = [sp.options(ranks, microbatch, "none", 0, "", 1, cp) for ranks in stages]
        if rules is not None and all(free):
            common = set.intersection(*({o.tp for o in options} for options in free))
            out = []
            for tp in sorted(t for t in common if rules.tp_ok(t, len(stages))):
                out += [e for e in bound_of(stages, microbatch, price, [[o for o in options if o.tp == tp]
                                                                         for options in free], tp, cp)]
            if not out:
                why["batch"] += 1
            return out
        if not all(free):
            why["batch"] += 1
            return []
        return bound_of(stages, microbatch, price, free, None)

    def bound_of(stages: tuple, microbatch: int, price: float, free: list, tp: int | None,
                 cp: int = 1) -> list[tuple]:
        # every stage s runs n_s layers of at least u_s seconds within the bound T, so
        # L = sum n_s <= T * sum 1/u_s, and the step takes at least m * T plus the fill, which
        # is the sum of the other stages' times (1F1B), at least a third of it with ZB-H1 or
        # interleaving: sum_s n_s u_s >= L min u_s
        fastest = [min(o.costs.per_layer for o in options) for options in free]
        for fp8 in fp8_choices[1:]:  # the bound holds for the faster of 16-bit and FP8 GEMMs
            fastest = [min([u] + [o.costs.per_layer for o in sp.options(ranks, microbatch, "none", 0, fp8, 1, cp)
                                  if tp in (None, o.tp)]) for u, ranks in zip(fastest, stages)]
        slowest_stage = L / sum(1 / u for u in fastest)
        bound = (global_batch // microbatch) * slowest_stage + max(0.0, L * min(fastest) - slowest_stage) / 3
        return [(bound * (price if objective == "cost" else 1.0), price, stages, microbatch, free, tp, cp)]

    work: list[tuple] = []
    thin: list[tuple] = []  # pipelines of fewer microbatches than half their stages
    for order in orders:
        price = sum(cluster.device_of(r).price_per_hour for r in order.ranks)
        for stages in space.layouts(order, L, max_stages, mixed_widths=rules is None):
            for microbatch in space.divisors(global_batch):
                if len(stages) > 1 and global_batch // microbatch < len(stages) // 2:
                    thin.append((stages, microbatch, price))  # a pipeline needs microbatches to fill it
                else:
                    work += bounded(stages, microbatch, price)
                    for cp in context_cost.cp_choices(workload, rules, len(stages[0])):  # entries of their own
                        work += bounded(stages, microbatch, price, cp)
    def split(options: list[list[StageOption]], m: int, memory: bool = True):
        """The best layer partition, or the framework's own fixed split (DeepSpeed's uniform)."""
        counts = rules.fixed_split(L, len(options)) if rules is not None else None
        return partition(options, L, m, memory=memory) if counts is None else fixed_partition(options, counts, m, memory)

    out: list[Candidate] = []
    incumbent = float("inf")
    done = 0  # entries looked at, for the progress display

    def _explore_precision(plain, fp8, m, stages, microbatch, price, tp, incumbent, ep=1, cp=1, etp=1):
        """The candidates of one entry with the linear layers' GEMMs in one precision; the new incumbent."""
        unconstrained = split(plain, m, memory=False)
        weight = price if objective == "cost" else 1.0
        if unconstrained is None or m * unconstrained[0] * weight > incumbent * (1 + prune_slack):
            return incumbent  # even without memory limits its slowest stage makes it lose
        for recompute, zero, replicate in ((recompute, zero, r) for recompute, zero in memory_configs
                                           for r in (options_cost.hsdp_choices(cluster, stages[0], tp, cp)
                                                     if zero == 3 else (1,))):
            if rules is not None and not rules.memory_ok(recompute, zero, len(stages), cp) \
                    or cp > 1 and recompute not in context_cost.RECOMPUTES:
                continue
            if zero == 3 and tp is not None and len(stages[0]) == tp:
                continue  # FSDP over one rank shards nothing (one stage: `options_cost.fsdp_option` has none)
            if (recompute, zero) == memory_configs[0] and fits(unconstrained[1], m):
                found = unconstrained  # the same options, and memory does not bind: the same partition
            else:
                options = [[o for o in sp.options(ranks, microbatch, recompute, zero, fp8, ep, cp, etp, replicate,
                                                  len(stages) > 1)
                            if tp in (None, o.tp)] for ranks in stages]
                found = split(options, m) if all(options) else None  # (FSDP: none where it shards nothing)
            if found is None:
                why["memory"] += 1
                continue
            # a ZB-H1 plan is played out only if its floor could beat the best so far (`step.py`);
            # an unpruned search (infinite slack) plays out every one
            new = _schedules(cluster, workload, found[1], microbatch, m, recompute, zero, price,
                             incumbent / weight if prune_slack < float("inf") else float("inf"), rules, fp8, ep, cp,
                             etp, replicate)
            for c in new:
                incumbent = min(incumbent, c.estimate * weight)
            out.extend(new)
            if found[0] <= unconstrained[0] * (1 + 1e-6):
                break  # memory did not bind: the slower settings cannot win
        return incumbent

    def explore(entries: list[tuple]) -> None:
        """Add the candidates of `entries` in the order of their bounds, until a bound cannot win."""
        nonlocal incumbent, done
        entries.sort(key=lambda w: w[0])
        for i, (bound, price, stages, microbatch, free, tp, cp) in enumerate(entries):
            if progress is not None and (done + i) % 64 == 0:
                progress(done + i, done + len(entries))
            if bound > incumbent * (1 + prune_slack):
                break
            m = global_batch // microbatch
            for fp8 in fp8_choices:
                plain = free if not fp8 else [[o for o in sp.options(ranks, microbatch, "none", 0, fp8, 1, cp)
                                               if tp in (None, o.tp)] for ranks in stages]
                incumbent = _explore_precision(plain, fp8, m, stages, microbatch, price, tp, incumbent, 1, cp)
            if cp > 1:  # (one EP degree: hybrid runs cp without experts)
                continue
            # an MoE workload's expert grids past ep = etp = 1 (just explored, it bounds them: its all-to-alls are
            # local copies; `expert_modes_cost.expert_grids`)
            for ep, etp in expert_modes_cost.expert_grids(workload, len(stages[0])):
                for fp8 in fp8_choices:
                    plain = [[o for o in sp.options(ranks, microbatch, "none", 0, fp8, ep, 1, etp)
                              if tp in (None, o.tp)] for ranks in stages]
                    if all(plain):  # (none where etp divides no TP degree the entry takes)
                        incumbent = _explore_precision(plain, fp8, m, stages, microbatch, price, tp, incumbent, ep, 1,
                                                       etp)
        done += len(entries)

    explore(work)
    if not out:
        # the thin pipelines, only where nothing else gives a plan (4 T4s, 7 heads and a batch of 1: the
        # one plan is four stages of one microbatch)
        explore([e for t in thin for e in bounded(*t)])
    if progress is not None:
        progress(done, done)
    reasons = []
    if not out:
        largest_gib = max(n.device.memory_bytes for n in cluster.nodes) / 2**30
        state_gib = workload.total_params * 16 / cluster.world_size / 2**30
        # to a tenth, or a hundredth where a tenth shows the two alike (a 2.4 GiB device must not read
        # "2 GiB" beside a 2.3 GiB state)
        digits = 1 if f"{state_gib:.1f}" != f"{largest_gib:.1f}" else 2
        state, largest = f"{state_gib:.{digits}f}", f"{largest_gib:.{digits}f}".rstrip("0").rstrip(".")
        gpus = f"all {cluster.world_size} GPUs" if cluster.world_size > 1 else "its one GPU"
        if why["memory"] and state_gib < largest_gib:
            # the even spread is a bound no plan may reach (17 GPUs in at most 16 stages), or it is the
            # activations (a long sequence) that do not fit beside the state
            reasons.append(f"no plan fits in memory: spread evenly over {gpus} the model state would take "
                           f"about {state} GiB a GPU, under the largest device's {largest} GiB, but no "
                           f"plan of at most {max_stages} stages with TP inside a node spreads it that evenly "
                           f"and leaves room for the activations (sequence length {workload.seq_len}), even with "
                           f"microbatches of one sample, full recompute and ZeRO-1")
        elif why["memory"]:
            reasons.append(f"no plan fits in memory: even spread over {gpus} with full "
                           f"recompute and ZeRO-1 the model state alone needs about {state} GiB a GPU, "
                           f"beside the activations; the largest device has {largest} GiB")
        else:
            reasons.append(f"no plan: a global batch of {global_batch} cannot give every data-parallel replica a "
                           f"sample, or {L} layers cannot fill the stages (a plan uses every GPU of each device "
                           f"type it uses; to leave some idle, plan on a cluster without them)")
    reasons = framework_rules.experts_reason(reasons, workload)
    if rules is not None and reasons:
        reasons = [f"no plan {rules.name} runs (stages of one width and TP degree, one micro batch per GPU, its "
                   f"schedules): {reasons[0]}" + ("; --framework any searches heterogeneous plans too" if workload.moe is None else "")]
    return out, reasons


def _schedules(cluster, workload, placed, microbatch, m, recompute, zero, price,
               cutoff: float = float("inf"), rules: framework_rules.Rules | None = None,
               fp8: str = "", ep: int = 1, cp: int = 1, etp: int = 1, replicate: int = 1) -> list[Candidate]:
    """The 1F1B plan of a partition, and its ZB-H1 and interleaved variants where they fit. ZB-H1 is
    left out under full recompute: its deferred weight-gradient pass needs the rebuilt stashes, so every
    layer's stash lives from the input-gradient pass to W, which the estimate does not count."""
    out = []
    pp = len(placed)
    variants = [("1f1b", 1)]
    if pp > 1:
        if recompute != "full" and workload.moe is None:  # (an MoE layer's backward is not split)
            variants.append(("zero-bubble", 1))
        if m % pp == 0 and all(n >= INTERLEAVE_CHUNKS for n, _ in placed):
            variants.append(("interleaved", INTERLEAVE_CHUNKS))
    if rules is not None:  # the framework's schedules; every plan checked as its export checks it
        variants = [(s, c) for s, c in variants if pp == 1 or rules.schedule_ok(s)]
    for schedule, chunks in variants:
        plan = to_plan(placed, microbatch, m, schedule, recompute, zero, chunks, fp8, ep, cp, replicate)
        plan = expert_modes_cost.with_etp(plan, workload, etp)
        if rules is not None and framework_rules.why_not(plan, rules.framework, cluster, workload):
            continue
        seconds, mem = step_estimate(cluster, workload, placed, m, schedule, chunks, cutoff)
        if mem <= 1.0:
            out.append(Candidate(plan, seconds, mem, price))
    return out

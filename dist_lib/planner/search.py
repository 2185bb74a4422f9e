"""The planner: enumerate device groupings, per-stage (dp, tp), microbatch sizes, schedules, recompute and
ZeRO; rank them with the closed-form estimate (`estimate.py`), each with its best layer partition; then
run the best K through the event simulator, rank for rank, and improve the winner by moving layers
between neighbouring stages while the simulator says it helps (Aceso's bottleneck relief, Liu et al.
EuroSys'24, sec. 4, here driven by simulated rather than estimated time).

Partition: for a bound T on every stage's time per microbatch, the stages take layers greedily in pipeline
order, each as many as fit in T and in its memory, over its TP options; a binary search finds the least T
that places every layer. This is the bottleneck-optimal contiguous partition AMP and Metis find by
dynamic programming (Li et al. NeurIPS'22, sec. 4), in O(p log L) per probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .. import costs
from ..hardware import Cluster
from ..workload import Workload
from . import space
from .estimate import TRANSIENT_ACTIVATIONS, LayerCosts, in_flight, layer_costs, max_layers
from .plan import Plan, Stage

MEMORY_HEADROOM = 0.92  # of each device, for buffers the estimate does not count
# Memory settings in order of the time they add: the first whose partition is not memory-bound ends the list
MEMORY_CONFIGS = (("none", 0), ("none", 1), ("selective", 0), ("selective", 1), ("full", 0), ("full", 1))
INTERLEAVE_CHUNKS = 2


@dataclass(frozen=True, slots=True)
class StageOption:
    """One stage at one TP degree for one microbatch size: per-layer costs of its slowest replica."""

    ranks: tuple[int, ...]
    tp: int
    shares: tuple[int, ...]
    costs: LayerCosts
    capacity: float  # usable bytes on its smallest device
    loss: float  # loss seconds per microbatch if it is the last stage
    transient: float  # bytes of in-flight buffers besides the stashes
    reduce: Callable[[float], float]  # seconds of the data-parallel gradient reduction of n bytes


@dataclass
class Candidate:
    plan: Plan
    estimate: float  # seconds per step
    memory: float  # the estimate's highest share of a device's memory
    price_per_hour: float  # USD per hour of the GPUs the plan uses
    simulated: float | None = None
    peak_fraction: float | None = None  # simulated: highest peak / capacity over the ranks
    mfu: float | None = None
    error: str = ""

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


class _Space:
    """Stage options for one cluster and workload, computed once and shared by every candidate."""

    def __init__(self, cluster: Cluster, workload: Workload):
        self.cluster, self.workload = cluster, workload
        self._options: dict = {}
        self._topos: dict = {}

    def topology(self, ranks: tuple[int, ...]) -> costs.Topology:
        topo = self._topos.get(ranks)
        if topo is None:
            topo = self._topos[ranks] = self.cluster.topology(ranks)
        return topo

    def options(self, ranks: tuple[int, ...], microbatch: int, recompute: str, zero: int) -> list[StageOption]:
        key = (ranks, microbatch, recompute, zero)
        found = self._options.get(key)
        if found is None:
            found = self._options[key] = [self._option(ranks, tp, microbatch, recompute, zero)
                                          for tp in space.tp_options(self.cluster, ranks)
                                          if len(ranks) // tp <= microbatch]
        return found

    def _option(self, ranks, tp, microbatch, recompute, zero) -> StageOption:
        cluster, workload = self.cluster, self.workload
        dp = len(ranks) // tp
        shares = space.shares(cluster, workload, ranks, tp, microbatch)
        replicas = {}
        for d in range(dp):
            group = ranks[d * tp:(d + 1) * tp]
            device = cluster.device_of(group[0])
            topo = self.topology(group) if tp > 1 else None
            replicas[(device, shares[d], topo)] = None
        per = [layer_costs(device, workload, n, tp, topo, recompute, dp if zero else 1)
               for device, n, topo in replicas]
        combined = per[0] if len(per) == 1 else _slowest(per)
        capacity = MEMORY_HEADROOM * min(cluster.device_of(r).memory_bytes for r in ranks)
        loss = max(costs.loss_time(device, workload, n) for device, n, _ in replicas)
        transient = TRANSIENT_ACTIVATIONS * max(shares) * workload.activation_bytes()
        dp_topo = self.topology(ranks[::tp]) if dp > 1 else None
        if dp_topo is None:
            reduce = _no_reduce
        else:
            reduce = _Reduction("reduce_scatter" if zero else "all_reduce", dp_topo, workload.num_layers)
        return StageOption(ranks, tp, shares, combined, capacity, loss, transient, reduce)


def _no_reduce(nbytes: float) -> float:
    return 0.0


class _Reduction:
    """Seconds to reduce a stage's gradients layer by layer over its replicas (ZeRO-1: reduce-scatter,
    then the all-gather of the updated weights, which moves as much again)."""

    __slots__ = ("op", "topo", "layers")

    def __init__(self, op: str, topo: costs.Topology, layers: int):
        self.op, self.topo, self.layers = op, topo, layers

    def __call__(self, nbytes: float) -> float:
        factor = 2.0 if self.op == "reduce_scatter" else 1.0
        return factor * costs.collective_time(self.op, nbytes, self.topo)


def _slowest(per: list[LayerCosts]) -> LayerCosts:
    """Per layer, the largest of each figure over the replicas, as prefix sums again."""
    fields = []
    for name in LayerCosts.__slots__:
        arrays = [getattr(c, name) for c in per]
        out, total = [0.0], 0.0
        for i in range(1, len(arrays[0])):
            total += max(a[i] - a[i - 1] for a in arrays)
            out.append(total)
        fields.append(tuple(out))
    return LayerCosts(*fields)


# ---- partition and step estimate --------------------------------------------------------------

def partition(stages: list[list[StageOption]], layers: int, microbatches: int, schedule: str = "1f1b",
              memory: bool = True) -> tuple[float, list[tuple[int, StageOption]]] | None:
    """(bound, [(layer count, option)] per stage): the least per-microbatch stage time for which every
    layer finds a place, or None when no bound does (memory)."""
    pp = len(stages)

    def place(bound: float):
        start, out = 0, []
        for s, options in enumerate(stages):
            flight = in_flight(schedule, s, pp, microbatches, 1)
            room = layers - start - (pp - s - 1)  # leave a layer for each later stage
            best, pick = 0, None
            for o in options:
                fixed = o.loss if s == pp - 1 else 0.0
                mem = o.capacity if memory else float("inf")
                n = min(room, max_layers(o.costs, start, bound, mem, fixed, o.transient, flight))
                if n > best or (n == best and pick is not None and n and _block_time(o, start, n) <
                                _block_time(pick, start, n)):
                    best, pick = n, o
            if best == 0:
                return None
            out.append((best, pick))
            start += best
        return out if start == layers else None

    hi = sum(max(_block_time(o, 0, layers) for o in options) for options in stages) + \
        max(o.loss for o in stages[-1])
    if place(hi) is None:
        return None
    lo = 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if place(mid) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-4 * hi:
            break
    return hi, place(hi)


def _block_time(o: StageOption, start: int, n: int) -> float:
    c = o.costs
    return c.forward[start + n] - c.forward[start] + c.backward[start + n] - c.backward[start]


def step_estimate(cluster: Cluster, workload: Workload, placed: list[tuple[int, StageOption]],
                  microbatches: int, schedule: str, chunks: int) -> tuple[float, float]:
    """(seconds per step, highest memory share) of a placed partition under a schedule."""
    pp, m = len(placed), microbatches
    times, backs, weights, tails, mem = [], [], [], [], 0.0
    start = 0
    for s, (n, o) in enumerate(placed):
        c, stop = o.costs, start + n
        forward, backward = c.forward[stop] - c.forward[start], c.backward[stop] - c.backward[start]
        if s == pp - 1:
            forward += o.loss
        times.append(forward + backward)
        backs.append(backward)
        weights.append(c.weight[stop] - c.weight[start])
        grads = c.grad_bytes[stop] - c.grad_bytes[start]
        reduce = o.reduce(grads)
        tails.append(max(reduce - backward, 0.0) + reduce / n + c.update[stop] - c.update[start])
        flight = in_flight(schedule, s, pp, m, chunks)
        used = c.state[stop] - c.state[start] + flight * (c.activation[stop] - c.activation[start]) + o.transient
        mem = max(mem, used / o.capacity * MEMORY_HEADROOM)
        start = stop
    slowest = max(times)
    fill = sum(times) - slowest
    if schedule == "zero-bubble":
        fill = max(0.0, sum(t - 2 * w for t, w in zip(times, weights)) - (slowest - 2 * weights[times.index(slowest)]))
    elif schedule == "interleaved":
        fill /= chunks
    for s in range(pp - 1):  # an activation and a gradient cross each boundary while the pipeline fills
        a, b = placed[s][1], placed[s + 1][1]
        nbytes = max(max(a.shares), max(b.shares)) * workload.activation_bytes()
        fill += 2 * costs.p2p_time(nbytes, cluster.p2p_link(a.ranks[0], b.ranks[0]))
    pipeline = m * slowest + fill
    step, before = 0.0, 0.0
    for s in range(pp):
        step = max(step, pipeline - before + tails[s])
        before += backs[s]
    return step, mem


def to_plan(placed: list[tuple[int, StageOption]], microbatch: int, microbatches: int, schedule: str,
            recompute: str, zero: int, chunks: int = 1) -> Plan:
    """The `Plan` of a placed partition; with chunks, each stage's layers are cut into that many
    blocks in Megatron's interleaved order (virtual stage c * p + s)."""
    pp = len(placed)
    counts = [n for n, _ in placed]
    parts = [[n // chunks + (c < n % chunks) for c in range(chunks)] for n in counts]
    blocks: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    start = 0
    for c in range(chunks):
        for s in range(pp):
            blocks[s].append((start, start + parts[s][c]))
            start += parts[s][c]
    stages = tuple(Stage(o.ranks, o.tp, tuple(blocks[s]), o.shares) for s, (_, o) in enumerate(placed))
    return Plan(stages, microbatch, microbatches, schedule, recompute, zero)


def generate(cluster: Cluster, workload: Workload, global_batch: int, *, budget: float | None = None,
             max_stages: int = 64, progress: Callable[[int, int], None] | None = None
             ) -> tuple[list[Candidate], list[str]]:
    """Every candidate the estimate finds feasible, each with its best partition, and (when there are
    none) why not, one reason per line."""
    sp = _Space(cluster, workload)
    L = workload.num_layers
    orders = space.orders(cluster, budget)
    if not orders:
        cheapest = min(n.device.price_per_hour for n in cluster.nodes)
        return [], [f"no device type's GPUs fit the budget of ${budget:.2f}/h (the cheapest GPU costs "
                    f"${cheapest:.2f}/h)"]
    work = [(order, stages) for order in orders for stages in space.layouts(order, L, max_stages)]
    out: list[Candidate] = []
    why = {"memory": 0, "batch": 0}
    for i, (order, stages) in enumerate(work):
        if progress is not None:
            progress(i, len(work))
        price = sum(cluster.device_of(r).price_per_hour for r in order.ranks if any(r in s for s in stages))
        for microbatch in space.divisors(global_batch):
            m = global_batch // microbatch
            if len(stages) > 1 and m < len(stages) // 2:  # a pipeline needs microbatches to fill it
                continue
            free = [sp.options(ranks, microbatch, "none", 0) for ranks in stages]
            if not all(free):
                why["batch"] += 1
                continue
            unconstrained = partition(free, L, m, memory=False)
            if unconstrained is None:
                continue
            for recompute, zero in MEMORY_CONFIGS:
                options = [sp.options(ranks, microbatch, recompute, zero) for ranks in stages]
                found = partition(options, L, m)
                if found is None:
                    why["memory"] += 1
                    continue
                bound, placed = found
                out += _schedules(cluster, workload, placed, microbatch, m, recompute, zero, price)
                if bound <= unconstrained[0] * (1 + 1e-6):
                    break  # memory did not bind: the slower settings cannot win
    if progress is not None:
        progress(len(work), len(work))
    reasons = []
    if not out:
        largest = max(n.device.memory_bytes for n in cluster.nodes) / 2**30
        state = workload.total_params * 16 / cluster.world_size / 2**30
        if why["memory"]:
            reasons.append(f"no plan fits in memory: even spread over all {cluster.world_size} GPUs with full "
                           f"recompute and ZeRO-1 the model state alone needs about {state:.1f} GiB a GPU, "
                           f"beside the activations; the largest device has {largest:.0f} GiB")
        else:
            reasons.append(f"no plan: a global batch of {global_batch} cannot give every data-parallel replica a "
                           f"sample, or {L} layers cannot fill the stages")
    return out, reasons


def _schedules(cluster, workload, placed, microbatch, m, recompute, zero, price) -> list[Candidate]:
    """The 1F1B plan of a partition, and its ZB-H1 and interleaved variants where they fit."""
    out = []
    pp = len(placed)
    variants = [("1f1b", 1)]
    if pp > 1:
        variants.append(("zero-bubble", 1))
        if m % pp == 0 and all(n >= INTERLEAVE_CHUNKS for n, _ in placed):
            variants.append(("interleaved", INTERLEAVE_CHUNKS))
    for schedule, chunks in variants:
        seconds, mem = step_estimate(cluster, workload, placed, m, schedule, chunks)
        if mem <= MEMORY_HEADROOM:
            out.append(Candidate(to_plan(placed, microbatch, m, schedule, recompute, zero, chunks), seconds, mem,
                                 price))
    return out

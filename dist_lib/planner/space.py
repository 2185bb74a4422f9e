"""The search space: which GPUs form each pipeline stage, and each stage's tensor-parallel options.

Device grouping follows Metis (Um et al., ATC'24, sec. 5.1) and FASOP (Hwang et al., HPDC'24): the
nodes of each device type are laid out in a chosen order along the pipeline (every order of every
non-empty subset of the types, so a type too slow or too small can be left idle), and the ordered GPUs
are cut into stages either all of one width (stages may then mix device types) or type by type, each
type into stages of its own width. A stage's TP groups are consecutive GPUs of one node (Megatron-LM,
Narayanan et al. 2021, sec. 3.3); its replicas share each microbatch in proportion to their speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations, product

from dist_lib.hardware.devices import Device
from dist_lib.hardware.cluster import Cluster
from dist_lib.costs.ops import compute_cost
from dist_lib.workload.transformer import Workload


@dataclass(frozen=True, slots=True)
class Order:
    """GPUs in pipeline order, and the (device name, GPU count) of each type's run."""

    ranks: tuple[int, ...]
    runs: tuple[tuple[str, int], ...]


def device_types(cluster: Cluster) -> dict[str, list[int]]:
    """Each device name's nodes, in cluster order."""
    types: dict[str, list[int]] = {}
    for i, node in enumerate(cluster.nodes):
        types.setdefault(node.device.name, []).append(i)
    return types


# Every order of every subset is 1956 orders of 6 device types but 13699 of 7 and 986409 of 9 (the
# catalog's count), each searched in full: beyond 6 types the orders are cut down (`type_sequences`).
EXHAUSTIVE_TYPES = 6


def type_sequences(names: list[str], speed: dict[str, float]) -> list[tuple[str, ...]]:
    """The device types' orders along the pipeline: every order of every non-empty subset up to
    `EXHAUSTIVE_TYPES` types; beyond, each type alone, and the fastest j types for every j > 1 (a type
    is left idle only when every slower one is too), fastest first and slowest first."""
    if len(names) <= EXHAUSTIVE_TYPES:
        return [seq for size in range(1, len(names) + 1) for seq in permutations(names, size)]
    ranked = sorted(names, key=lambda name: -speed[name])  # stable: ties keep the cluster's order
    out: list[tuple[str, ...]] = [(name,) for name in ranked]
    for j in range(2, len(ranked) + 1):
        out += [tuple(ranked[:j]), tuple(reversed(ranked[:j]))]
    return out


def rentable(count: int) -> list[int]:
    """How many of a device type's `count` nodes a plan may rent: all, then half as many, down to one."""
    out, k = [], count
    while k >= 1:
        out.append(k)
        k //= 2
    return out


def orders(cluster: Cluster, price_cap: float | None = None, *, rent: bool = False) -> list[Order]:
    """The orders of device types (`type_sequences`) whose GPUs cost at most `price_cap` $/h. A plan uses
    every GPU of each type in its order; with `rent`, also the first half, quarter, ... of each type's
    nodes (which mix of the cluster to rent, as FASOP searches it: Hwang et al. 2024)."""
    types = device_types(cluster)
    speed = {name: cluster.nodes[nodes[0]].device.tensor_flops * cluster.nodes[nodes[0]].device.max_efficiency
             for name, nodes in types.items()}
    out = []
    for names in type_sequences(list(types), speed):
        for counts in product(*((rentable(len(types[name])) if rent else [len(types[name])]) for name in names)):
            nodes = [n for name, k in zip(names, counts) for n in types[name][:k]]
            if price_cap is not None and sum(cluster.nodes[n].gpus * cluster.nodes[n].device.price_per_hour
                                             for n in nodes) > price_cap * (1 + 1e-12):
                continue
            ranks = tuple(r for n in nodes for r in cluster.ranks_of_node(n))
            runs = tuple((name, sum(cluster.nodes[n].gpus for n in types[name][:k])) for name, k in zip(names, counts))
            out.append(Order(ranks, runs))
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(order: Order, num_layers: int, max_stages: int,
            mixed_widths: bool = True) -> list[tuple[tuple[int, ...], ...]]:
    """Stage rank groups: equal widths over the whole order, and (with `mixed_widths`) type by type with
    per-type widths (each type cut into a power-of-two number of stages, as Metis' device groups are)."""
    ranks, found = order.ranks, set()
    for pp in divisors(len(ranks)):
        if pp <= min(num_layers, max_stages):
            w = len(ranks) // pp
            found.add(tuple(ranks[i * w:(i + 1) * w] for i in range(pp)))
    if mixed_widths and len(order.runs) > 1:
        splits: list[list[tuple[tuple[int, ...], ...]]] = []
        start = 0
        for _, count in order.runs:
            run = ranks[start:start + count]
            splits.append([tuple(run[i * (count // k):(i + 1) * (count // k)] for i in range(k))
                           for k in divisors(count) if k <= min(num_layers, max_stages) and not k & (k - 1)])
            start += count
        combos: list[tuple] = [()]
        for options in splits:
            combos = [c + o for c in combos for o in options if len(c) + len(o) <= min(num_layers, max_stages)]
        found.update(combos)
    return sorted(found, key=lambda stages: (len(stages), stages))


def tp_options(cluster: Cluster, ranks: tuple[int, ...], workload: Workload | None = None) -> list[int]:
    """TP degrees (powers of two) whose groups of consecutive ranks each sit in one node and, with a
    workload, split its attention heads evenly; with a workload built from profiles, only the degrees
    profiled for every device type among the ranks."""
    nodes = [cluster.node_of(r) for r in ranks]
    # a group of consecutive ranks sits in one node when no change of node falls inside it
    changes = [k for k in range(1, len(nodes)) if nodes[k] != nodes[k - 1]]
    profiled = None
    if workload is not None and workload.profile is not None:
        devices = {id(cluster.device_of(r)): cluster.device_of(r) for r in ranks}.values()
        profiled = set.intersection(*(workload.profile.tp_degrees(d) for d in devices))
    out, t = [], 1
    while t <= len(ranks):
        if len(ranks) % t == 0 and all(k % t == 0 for k in changes) and (profiled is None or t in profiled) \
                and (workload is None or workload.tp_problem(t) is None):
            out.append(t)
        t *= 2
    return out


def shares(cluster: Cluster, workload: Workload, ranks: tuple[int, ...], tp: int, microbatch: int) -> tuple[int, ...]:
    """Samples of each microbatch per replica: even on one device type, else in proportion to each
    replica's speed on a transformer layer (Metis' uneven data shares), every replica at least one."""
    dp = len(ranks) // tp
    devices = [cluster.device_of(ranks[d * tp]) for d in range(dp)]
    if len({d.name for d in devices}) == 1:
        base, extra = divmod(microbatch, dp)
        return tuple(base + (d < extra) for d in range(dp))
    n = max(1, microbatch // dp)
    layer = 1 if workload.num_layers > 1 else 0
    speed_of: dict[int, float] = {}  # by device (identity): a stage has a few kinds and many replicas
    for d in devices:
        if id(d) not in speed_of:
            speed_of[id(d)] = 1.0 / layer_seconds(d, workload, layer, n, tp)
    speed = [speed_of[id(d)] for d in devices]
    spare, total = microbatch - dp, sum(speed)
    ideal = [spare * s / total for s in speed]
    out = [1 + int(x) for x in ideal]
    for d in sorted(range(dp), key=lambda d: int(ideal[d]) - ideal[d])[:microbatch - sum(out)]:
        out[d] += 1
    return tuple(out)


@lru_cache(maxsize=None)
def layer_seconds(device: Device, workload: Workload, layer: int, samples: int, tp: int) -> float:
    """Forward + backward seconds of one layer (the cost model's, through `op_costs.compute_cost`)."""
    return (compute_cost(device, workload, "forward", layer, samples, tp)[0]
            + compute_cost(device, workload, "backward", layer, samples, tp)[0])

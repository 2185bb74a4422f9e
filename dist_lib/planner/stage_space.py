"""The stage options of one search: every (ranks, microbatch size, recompute, sharding, precision, parallel
degrees) a candidate's stage may take, each with its per-layer costs (`estimate.layer_costs`, `options_cost`,
`context_cost`, `expert_modes_cost`), built once per shape of stage and shared by every candidate."""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

import numpy as np

from dist_lib.costs import compute as costs
from dist_lib.costs import network
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.reserve import MemoryReserve
from dist_lib.hardware.topology import Topology
from dist_lib.planner import expert_modes_cost, options_cost, space
from dist_lib.planner.estimate import LayerCosts, layer_costs, rerun_stash, with_total
from dist_lib.planner.stage_option import Reduction, StageOption, TwoLevel, no_collective
from dist_lib.workload.transformer import Workload


class StageSpace:
    """Stage options for one cluster and workload, computed once and shared by every candidate.

    Two stages whose ranks make the same runs of (kind of node, GPUs on it) in the same order have the
    same options up to their rank numbers (TP degrees, shares, per-layer costs, memory, reduction), so
    the options are built once per such shape and per setting, and copied with each stage's ranks."""

    def __init__(self, cluster: Cluster, workload: Workload, reserve: MemoryReserve | None = MemoryReserve(),
                 even: bool = False, kv_exchange: str = "ring"):
        # even: every replica takes the same share of a microbatch (a framework's one micro batch per GPU);
        # kv_exchange: how a context-parallel stage's attention meets the other ranks' keys and values
        self.cluster, self.workload, self.reserve, self.even = cluster, workload, reserve, even
        self.kv_exchange = kv_exchange
        self._options: dict = {}
        self._templates: dict = {}
        self._shapes: dict = {}
        self._topos: dict = {}
        self._capacity: list[int] | None = None  # bytes/s of each link, by link id
        kinds: dict = {}
        self._node_kind = [kinds.setdefault(node, i) for i, node in enumerate(cluster.nodes)]

    def topology(self, ranks: tuple[int, ...]) -> Topology:
        topo = self._topos.get(ranks)
        if topo is None:
            topo = self._topos[ranks] = self.cluster.topology(ranks)
        return topo

    def concurrent_speed(self, groups: list[tuple[int, ...]]) -> float:
        """Share of its own speed the slowest of some collectives gets when all run at once: each wants
        its ring's bandwidth on the links it crosses (`Cluster.collective_usage`), and a link asked for
        more than it carries gives each its proportional share (`network.shared_speed`, as `engine/transfers.py`)."""
        if self._capacity is None:
            self._capacity = self.cluster.link_capacities()
        usages = [self.cluster.collective_usage(group) for group in groups]
        load: dict[int, int] = {}
        for usage in usages:
            for link, rate in usage:
                load[link] = load.get(link, 0) + rate
        return min(network.shared_speed(usage, self._capacity, load) for usage in usages)

    def shape(self, ranks: tuple[int, ...]) -> tuple:
        """The stage's runs of (node kind, GPU count) in rank order; the ranks themselves when a node
        comes back after another (then no other stage is known to be alike)."""
        found = self._shapes.get(ranks)
        if found is None:
            runs, nodes, node_of = [], [], self.cluster.node_of
            for r in ranks:
                node = node_of(r)
                if nodes and nodes[-1] == node:
                    runs[-1][1] += 1
                else:
                    nodes.append(node)
                    runs.append([self._node_kind[node], 1])
            found = tuple(map(tuple, runs)) if len(set(nodes)) == len(nodes) else ranks
            self._shapes[ranks] = found
        return found

    def options(self, ranks: tuple[int, ...], microbatch: int, recompute: str, zero: int,
                fp8: str = "", ep: int = 1, cp: int = 1, etp: int = 1, replicate: int = 1,
                pipelined: bool = False) -> list[StageOption]:
        """The stage's options at every TP degree it may take; `pipelined`: in a plan of two or more stages,
        where FSDP (zero 3) keeps its gathered weights through the step (`options_cost.fsdp_kept`)."""
        pipelined = pipelined and zero == 3
        key = (ranks, microbatch, recompute, zero, fp8, ep, cp, etp, replicate, pipelined)
        found = self._options.get(key)
        if found is None:
            shape_key = (self.shape(ranks), microbatch, recompute, zero, fp8, ep, cp, etp, replicate, pipelined)
            template = self._templates.get(shape_key)
            if template is None:
                found = self._templates[shape_key] = [o for o in (
                    self._option(ranks, tp, microbatch, recompute, zero, fp8, replicate, pipelined)
                    if ep == cp == 1 and not self.workload.moe
                    else expert_modes_cost.stage_option(self, ranks, tp, microbatch, ep, cp, recompute, zero, fp8,
                                                        Reduction, etp, pipelined, replicate)
                    for tp in space.tp_options(self.cluster, ranks, self.workload)
                    if options_cost.width_ok(self.workload, len(ranks), tp, cp, microbatch, self.even)) if o is not None]
            else:
                found = [replace(o, ranks=ranks) for o in template]
            self._options[key] = found
        return found

    def _option(self, ranks, tp, microbatch, recompute, zero, fp8="", replicate=1,
                pipelined=False) -> StageOption | None:
        """A stage's option at TP degree `tp`; with `replicate` > 1 (HSDP, zero 1 or 3) its ZeRO sharding inside
        each of `replicate` groups of dp / replicate replicas, the shards' gradients all-reduced across them."""
        cluster, workload = self.cluster, self.workload
        if zero == 3:  # FSDP (torchtitan's): weights and gradients sharded too, gathered a layer at a time
            return options_cost.fsdp_option(self, ranks, tp, microbatch, recompute, fp8, replicate,
                                            pipelined)
        dp = len(ranks) // tp
        if dp % replicate:
            return None
        size = dp // replicate  # the replicas a ZeRO shard group holds
        shares = (microbatch // dp,) * dp if self.even else space.shares(cluster, workload, ranks, tp, microbatch)
        replicas, keys = {}, []
        for d in range(dp):
            first = ranks[d * tp]
            # a TP group sits in one node (`space.tp_options`): its topology is its node kind's
            kind = self._node_kind[cluster.node_of(first)]
            keys.append((kind, shares[d]))
            replicas.setdefault(keys[-1], ranks[d * tp:(d + 1) * tp])
        per = [layer_costs(cluster.device_of(group[0]), workload, n, tp,
                           self.topology(group) if tp > 1 else None, recompute, size if zero else 1, fp8)
               for (_, n), group in replicas.items()]
        losses = [costs.loss_time(cluster.device_of(group[0]), workload, n, tp)
                  + (network.collective_time("all_reduce", n * workload.activation_bytes(), self.topology(group))
                     if tp > 1 else 0.0) for (_, n), group in replicas.items()]
        combined = per[0] if len(per) == 1 else _slowest(per)
        # every rank is in some replica, and a replica's ranks share a node; the runtime reserve counts the
        # communicators of a rank of this stage: its TP group, its data-parallel group, and two pipeline
        # neighbours (an upper bound: the first and last stage have one, a plan of one stage none)
        capacity = min(cluster.nodes[kind].device.memory_bytes for kind, _ in replicas)
        if self.reserve is not None:
            capacity = self.reserve.usable(capacity, (tp > 1) + (dp > 1) + 2)
        # the LM head is vocabulary-parallel over the TP group, and its input gradient all-reduced there
        loss = max(losses)
        unit = max(shares) * workload.activation_bytes()
        dp_topo = self.topology(ranks[::tp]) if dp > 1 else None
        if dp_topo is None:
            reduce = regather = no_collective
        else:
            # the stage's t data-parallel groups (one per tensor rank) reduce the same layers at once; they
            # can only meet on a node's shared NICs (else each rank's ring has its own port and NIC), and
            # there they share them as the simulator does
            shared = dp_topo.nodes > 1 and any(cluster.nodes[cluster.node_of(r)].nics for r in ranks)
            slowdown = 1 / self.concurrent_speed([ranks[j::tp] for j in range(tp)]) if tp > 1 and shared else 1.0
            reduce = Reduction("reduce_scatter" if zero else "all_reduce", dp_topo, slowdown)
            regather = Reduction("all_gather", dp_topo, slowdown) if zero else no_collective
            if zero and replicate > 1:  # HSDP: the shard groups' collectives, then the shards' across the groups
                inner = [ranks[g * size * tp + j:(g + 1) * size * tp:tp] for g in range(replicate) for j in range(tp)]
                outer = [ranks[p::size * tp] for p in range(size * tp)]
                speeds = [1 / self.concurrent_speed(groups) if shared else 1.0 for groups in (inner, outer)]
                regather = Reduction("all_gather", self.topology(inner[0]), speeds[0])
                reduce = TwoLevel(Reduction("reduce_scatter", self.topology(inner[0]), speeds[0]),
                                  Reduction("all_reduce", self.topology(outer[0]), speeds[1]), size)
        rerun = max(rerun_stash(cluster.device_of(group[0]), workload, n, tp)
                    for (_, n), group in replicas.items()) if recompute == "full" else 0.0
        # a message that arrives as TP pieces is all-gathered in the receiving replica's TP group
        gather = max(network.collective_time("all_gather", n * workload.activation_bytes(), self.topology(group))
                     for (_, n), group in replicas.items()) if tp > 1 else 0.0
        per_layer: dict[float, float] = {}  # alike layers have one gradient size
        reduced = tuple(accumulate((per_layer[g] if g in per_layer else per_layer.setdefault(g, reduce(g))
                                    for g in (b - a for a, b in zip(combined.grad_bytes, combined.grad_bytes[1:]))),
                                   initial=0.0))
        return StageOption(ranks, tp, shares, combined, capacity, loss, unit, reduce, rerun, gather, regather,
                           reduced, workload.profile is None, *self._per_replica(replicas, keys, per, losses))

    @staticmethod
    def _per_replica(replicas: dict, keys: list, per: list[LayerCosts],
                     losses: list[float]) -> tuple[tuple[LayerCosts, ...], tuple[float, ...]]:
        """Each replica's own costs and loss in rank order, for the stagger of its messages
        (`stagger.py`); none where every replica is of one kind (the stage's figures are its own)."""
        if len(per) == 1:
            return (), ()
        index = {key: k for k, key in enumerate(replicas)}
        return tuple(per[index[key]] for key in keys), tuple(losses[index[key]] for key in keys)


def _slowest(per: list[LayerCosts]) -> LayerCosts:
    """Per layer, the largest of each figure over the replicas, as prefix sums again (summed in layer
    order, as a loop would); every figure at once, as (figure, replica, layer) arrays."""
    names = LayerCosts.__slots__[:-1]
    prefixes = np.array([[getattr(c, name) for c in per] for name in names])
    steps = np.diff(prefixes, axis=2).max(axis=1)
    sums = np.concatenate((np.zeros((len(names), 1)), np.cumsum(steps, axis=1)), axis=1)
    return with_total(*map(tuple, sums.tolist()))

"""One stage of a candidate plan at one TP degree and microbatch size, with the per-layer costs of its
slowest replica: what the partitioner places layers on and the timing models play out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dist_lib.costs import network
from dist_lib.hardware.topology import Topology
from dist_lib.planner.estimate import LayerCosts


def no_collective(nbytes: float) -> float:
    """A collective a stage does not run, at no time: one replica has nothing to reduce, and without
    ZeRO-1 every replica updates whole weights, so nothing is gathered after the update."""
    return 0.0


@dataclass(frozen=True, slots=True)
class StageOption:
    """One stage at one TP degree for one microbatch size: per-layer costs of its slowest replica."""

    ranks: tuple[int, ...]
    tp: int
    shares: tuple[int, ...]
    costs: LayerCosts
    capacity: float  # usable bytes on its smallest device
    loss: float  # loss seconds per microbatch if it is the last stage
    unit: float  # bytes of one replica's share of a microbatch's activation (its largest share)
    reduce: Callable[[float], float]  # seconds of the data-parallel gradient reduction of n bytes
    rerun: float = 0.0  # full recompute: bytes of the largest layer stash a backward rebuilds, one at a time
    gather: float = 0.0  # seconds to all-gather one message's TP pieces in its slowest replica's TP group
    # ZeRO-1: seconds to all-gather n bytes of updated weight shards over the replicas; each layer's is
    # issued after its update, behind every gradient reduce-scatter on the same group, so none of it
    # overlaps the backward
    regather: Callable[[float], float] = no_collective
    # prefix sums over layers of `reduce` of each layer's gradient alone: the simulator reduces a layer
    # as soon as its last microbatch has passed backward, one collective a layer, in turn
    reduced: tuple[float, ...] = ()
    alike: bool = True  # the layers after the first cost alike (no measured profile)
    # per replica in rank order: its own per-layer costs and loss (the figures above are their largest);
    # empty where every replica costs the same
    replica_costs: tuple[LayerCosts, ...] = ()
    replica_loss: tuple[float, ...] = ()
    # prefix sums over layers of the routed experts' optimizer steps, which an expert stage runs after every
    # layer's dense update (`strategies/_expert_stage.update_all`); part of `costs.update`; empty: none apart
    expert_updates: tuple[float, ...] = ()


class Reduction:
    """Seconds of one collective over a stage's replicas on n bytes: the gradients' all-reduce (ZeRO-1:
    reduce-scatter) beside the backward, or ZeRO-1's all-gather of the updated weights after the update;
    `slowdown` times its time alone when the stage's other data-parallel groups share its links."""

    __slots__ = ("op", "topo", "slowdown")

    def __init__(self, op: str, topo: Topology, slowdown: float = 1.0):
        self.op, self.topo, self.slowdown = op, topo, slowdown

    def __call__(self, nbytes: float) -> float:
        return network.collective_time(self.op, nbytes, self.topo) * self.slowdown


class TwoLevel:
    """HSDP's gradient reduction (PyTorch FSDP2's `HSDP`): a reduce-scatter of n bytes inside the shard group of
    `size` ranks, then an all-reduce of the n / size bytes of the shard across the groups."""

    __slots__ = ("inner", "outer", "size")

    def __init__(self, inner: Reduction, outer: Reduction, size: int):
        self.inner, self.outer, self.size = inner, outer, size

    def __call__(self, nbytes: float) -> float:
        return self.inner(nbytes) + self.outer(nbytes / self.size)

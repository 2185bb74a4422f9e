"""Where a group's ranks sit on nodes, and the bandwidth a ring over them runs at: what the collective cost
model needs to know of the cluster (`dist_lib.costs.network`)."""

from __future__ import annotations

from dataclasses import dataclass

from dist_lib.hardware.devices import Link


@dataclass(frozen=True, slots=True)
class Topology:
    """How a group's ranks sit on nodes, as the collective cost model needs it.

    `ring` is the slowest hop of a flat ring over the ranks in order; `intra` the slowest intra-node
    link among the nodes spanned (None when no node holds two members); `inter` the slowest NIC
    (None within one node); `per_node` the members on each node when every node holds the same
    number, else 0 (then only the flat ring applies); `nics` the NICs the least provided node spanned
    drives: its members when each GPU has its own NIC, at most the node's NICs when they belong to the
    node. NCCL runs one ring channel per NIC, so a ring's node-crossing hop can use that many NICs
    side by side (tuning.cc: bus bandwidth = channels x per-channel bandwidth).
    """

    size: int
    nodes: int
    per_node: int
    ring: Link
    intra: Link | None = None
    inter: Link | None = None
    nics: int = 1


def ring_bandwidth(topo: Topology) -> float:
    """Per-rank bandwidth of a flat ring: its slowest intra-node hop, or the node-crossing hop spread
    over `nics` NICs, whichever is slower (a mixed group runs at its bottleneck)."""
    if topo.inter is None:
        return topo.ring.achieved_bandwidth
    crossing = topo.nics * topo.inter.achieved_bandwidth
    return crossing if topo.intra is None else min(topo.intra.achieved_bandwidth, crossing)

"""Durations and link use of the collectives beside all-reduce, all-gather and reduce-scatter: broadcast,
reduce, barrier and all-to-all (uneven per-peer sizes), as NCCL runs them.

* Broadcast and reduce: NCCL implements them only as a ring (a pipelined chain from or to the root; NCCL
  src/device/broadcast.h and reduce.h have no other algorithm), whose bus bandwidth equals its algorithm
  bandwidth (nccl-tests doc/PERFORMANCE.md: busbw = algbw for both, factor 1): n/B with B the ring's
  bandwidth, plus p-1 pipeline steps of latency, N-1 of which cross nodes.
* Barrier: NCCL has no barrier; PyTorch's ProcessGroupNCCL::barrier all-reduces a one-element float32
  tensor, so it costs that all-reduce.
* All-to-all: each member sends a piece to every other member at once (ncclSend/ncclRecv pairs in one
  group call, as torch.distributed.all_to_all_single issues them); nccl-tests' bus-bandwidth factor for
  even pieces is (p-1)/p (alltoall.cu). Here every link (a GPU's NVLink/PCIe port or NIC, or a node's
  shared NICs, each way) carries the bytes of the pieces that cross it, and the most loaded link sets the
  pace: max over links of bytes / capacity. For p members of n bytes each split evenly within one node,
  that is (p-1)/p * n/B; for uneven pieces it is the member that sends or receives the most, on its
  slowest link. Latency: one step per peer a member exchanges a non-empty piece with (pairwise exchange,
  Thakur et al. 2005), each that pair's link latency, the largest member total.
"""

from __future__ import annotations

from collections.abc import Sequence

from dist_lib.costs.network import collective_time
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.topology import Topology, ring_bandwidth
from dist_lib.workload.transformer import Workload

BARRIER_BYTES = 4  # ProcessGroupNCCL::barrier's one float32 element


def rooted_time(nbytes: float, topo: Topology) -> float:
    """Broadcast from, or reduce to, one root of an n-byte buffer over a pipelined ring: n/B + (p-1) steps."""
    p = topo.size
    if p <= 1:
        return 0.0
    intra = topo.intra.latency if topo.intra is not None else topo.ring.latency
    inter = topo.inter.latency if topo.inter is not None else topo.ring.latency
    crossing = topo.nodes - 1
    return nbytes / ring_bandwidth(topo) + (p - 1 - crossing) * intra + crossing * inter


def barrier_time(topo: Topology) -> float:
    """A barrier: the all-reduce of one float32 element (flat ring or hierarchical, whichever is faster)."""
    return collective_time("all_reduce", BARRIER_BYTES, topo)


def all_to_all_cost(cluster: Cluster, ranks: Sequence[int],
                    sizes: Sequence[Sequence[int]]) -> tuple[float, tuple[tuple[int, int], ...]]:
    """(seconds alone, link usage) of an all-to-all in which member i sends `sizes[i][j]` bytes to member j
    (members in the order of `ranks`; a member's piece to itself is a local copy and crosses no link).
    The usage lists each link the pieces cross with the bytes/s it needs to finish in the bandwidth term,
    so that the most loaded link is wanted at its full capacity (`engine.transfers` shares it from there)."""
    capacity = cluster.link_capacities()
    carried: dict[int, int] = {}
    latency = [0.0] * len(ranks)
    for i, src in enumerate(ranks):
        for j, dst in enumerate(ranks):
            if i == j or not (sizes[i][j] or sizes[j][i]):
                continue
            latency[i] += cluster.p2p_link(src, dst).latency
            if sizes[i][j]:
                for link, _ in cluster.p2p_usage(src, dst):
                    carried[link] = carried.get(link, 0) + sizes[i][j]
    if not carried:
        return 0.0, ()
    seconds = max(nbytes / capacity[link] for link, nbytes in carried.items())
    usage = tuple((link, round(nbytes / seconds)) for link, nbytes in sorted(carried.items()))
    return seconds + max(latency), usage


def probs_bytes(workload: Workload) -> int:
    """The bytes of one routing probability a token copy carries to its expert: Megatron-Core's
    `MoEAlltoAllTokenDispatcher.token_dispatch` all-to-alls the permuted probabilities after the tokens (the
    experts weight their outputs by them: `TEGroupedMLP`'s weighted activation and `_apply_bias`), and autograd
    all-to-alls their gradients back before the tokens' input gradients (megatron/core/transformer/moe/
    token_dispatcher.py at d98e8a6, `token_dispatch`: the tokens' `all_to_all`, then the probabilities' over the
    same EP group and splits). One element of the router's output, which is in the input's dtype unless
    `moe_router_dtype` says fp32 (router.py, `TopKRouter.gating`): the workload's 16-bit element."""
    return workload.bytes_per_element


def probs_sizes(sizes: Sequence[Sequence[int]], each: int, token: int) -> list[list[int]]:
    """The routing probabilities' pieces beside token pieces of `sizes` bytes: one probability of `each` bytes
    a token copy of `token` bytes (`probs_bytes`; the all-to-all that follows the tokens', `Model.all_to_all`'s
    `probs`)."""
    return [[int(n) // token * each for n in row] for row in sizes]

"""Duration and link use of an MoE token exchange run by a hierarchical dispatcher (DeepEP, HybridEP) rather
than a flat all-to-all.

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), sec. 3.2.2: a token bound for experts on
another node crosses InfiniBand once to that node, to the GPU with the same in-node index, which forwards it
over NVLink to each GPU there holding one of its experts; the combine runs the same way back (the outputs
gathered over NVLink on that GPU, then sent once over InfiniBand). Megatron-Core runs this as its `flex`
token dispatcher (`--moe-token-dispatcher-type flex` with `--moe-flex-dispatcher-backend deepep` or
`hybridep`; megatron/core/transformer/transformer_config.py). A flat all-to-all instead sends the token once
per remote expert GPU across the NICs; with top-8 of 128 experts over two nodes that is four sends where
the hierarchical dispatch makes one.

The logical exchange is the same (every piece reaches the member it is addressed to); what differs is the
flows on the links: for each token owner i and each other node B, `crossing[(i, B)]` bytes (its distinct
tokens for B's experts, `routing.tokens_reaching`) between i and its relay on B over the NICs, and each piece
between the relay and its member on B over NVLink. Within a node, pieces go directly, as in the flat
all-to-all. As there (`other_collectives.all_to_all_cost`), the most loaded link sets the pace; latency is
one step per same-node peer and one per other node a member exchanges with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dist_lib.hardware.cluster import Cluster


def relay_of(cluster: Cluster, ranks: Sequence[int], owner: int, node: int) -> int:
    """The member of `ranks` on `node` that relays `owner`'s tokens: the one with the same in-node index
    (DeepSeek-V3 sec. 3.2.2), else the member at that index modulo the members there."""
    there = [r for r in ranks if cluster.node_of(r) == node]
    index = owner - cluster.ranks_of_node(cluster.node_of(owner)).start
    start = cluster.ranks_of_node(node).start
    for r in there:
        if r - start == index:
            return r
    return there[index % len(there)]


def relayed_flows(cluster: Cluster, ranks: Sequence[int], sizes: Sequence[Sequence[int]],
                  crossing: Mapping[tuple[int, int], tuple[int, bool]]) -> list[tuple[int, int, int]]:
    """(source rank, destination rank, bytes) of each transfer. `crossing[(i, node)]` = (bytes, outgoing):
    member i's distinct tokens for `node`, sent from i (`outgoing`: dispatch, output gradients) or to i
    (combine, input gradients); the pieces between i and that node's members travel through the relay."""
    flows: list[tuple[int, int, int]] = []
    nodes = [cluster.node_of(r) for r in ranks]
    relays: dict[tuple[int, int], int] = {}
    for i, src in enumerate(ranks):
        for j, dst in enumerate(ranks):
            nbytes = sizes[i][j]
            if i == j or not nbytes:
                continue
            if nodes[i] == nodes[j]:
                flows.append((src, dst, nbytes))
                continue
            if crossing.get((i, nodes[j]), (0, False))[1]:  # i's tokens out to node j's experts
                owner, there, outgoing = i, nodes[j], True
            elif (j, nodes[i]) in crossing and not crossing[(j, nodes[i])][1]:  # back to their owner j
                owner, there, outgoing = j, nodes[i], False
            else:
                flows.append((src, dst, nbytes))  # not a relayed piece: sent directly
                continue
            key = (owner, there)
            relay = relays.get(key)
            if relay is None:
                relay = relays[key] = relay_of(cluster, ranks, ranks[owner], there)
                distinct = crossing[key][0]
                flows.append((ranks[owner], relay, distinct) if outgoing else (relay, ranks[owner], distinct))
            far = dst if outgoing else src
            if far != relay:  # the NVLink hop on the far node
                flows.append((relay, far, nbytes) if outgoing else (far, relay, nbytes))
    return flows


def relayed_all_to_all_cost(cluster: Cluster, ranks: Sequence[int], sizes: Sequence[Sequence[int]],
                            crossing: Mapping[tuple[int, int], tuple[int, bool]]
                            ) -> tuple[float, tuple[tuple[int, int], ...]]:
    """(seconds alone, link usage) of the exchange of `sizes` (member i to member j, bytes) with the pieces
    between a member and another node relayed as `crossing` says (`relayed_flows`)."""
    capacity = cluster.link_capacities()
    carried: dict[int, int] = {}
    peers: dict[int, set[int]] = {}
    far_nodes: dict[int, set[int]] = {}
    for src, dst, nbytes in relayed_flows(cluster, ranks, sizes, crossing):
        for link, _ in cluster.p2p_usage(src, dst):
            carried[link] = carried.get(link, 0) + nbytes
        if cluster.node_of(src) == cluster.node_of(dst):
            peers.setdefault(src, set()).add(dst)
            peers.setdefault(dst, set()).add(src)
        else:
            far_nodes.setdefault(src, set()).add(dst)
            far_nodes.setdefault(dst, set()).add(src)
    if not carried:
        return 0.0, ()
    seconds = max(nbytes / capacity[link] for link, nbytes in carried.items())
    latency = 0.0
    for member in ranks:
        steps = sum(cluster.p2p_link(member, peer).latency for peer in peers.get(member, ()))
        reached = {}
        for other in far_nodes.get(member, ()):
            reached.setdefault(cluster.node_of(other), cluster.p2p_link(member, other).latency)
        latency = max(latency, steps + sum(reached.values()))
    usage = tuple((link, round(nbytes / seconds)) for link, nbytes in sorted(carried.items()))
    return seconds + latency, usage

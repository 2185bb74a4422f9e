"""Pipeline messages between two neighbouring stages of a plan, as `strategies/planned.py` sends them,
and the time the estimate gives one crossing of the boundary.

Routing: replica r of the sending stage cuts its share of a microbatch by the receiving stage's shares
and sends each overlapping receiver replica its samples; tensor rank j of a receiver gets them from
tensor rank j mod t of the sender. Between stages of the same TP degree t > 1 each rank sends only its
1/t piece and the receiving TP group all-gathers it (Megatron-LM's scatter-gather, Narayanan et al.
2021, sec. 4.1); between other degrees messages go whole.

Time: the messages of one crossing start together and share the links they cross as the simulator
shares them (a GPU's port or NIC, or a node's NICs that its GPUs share; `Cluster.p2p_usage`,
`costs.shared_speed`), so a crossing takes as long as its slowest message at its share of its most
loaded link. On a node whose GPUs share one NIC, t pieces of n/t take as long as one whole message, and
t whole messages t times as long.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate
from math import gcd
from typing import TYPE_CHECKING

from .. import costs
from ..hardware import Cluster
from ..workload import Workload

if TYPE_CHECKING:
    from .partition import StageOption


def scatters(a: StageOption, b: StageOption) -> bool:
    """Whether messages between neighbouring stages go as TP pieces: both of one degree t > 1."""
    return a.tp == b.tp > 1


StageShape = tuple[tuple[int, ...], int, tuple[int, ...]]  # a stage's (ranks, TP degree, replica shares)


def transfers(sender: StageShape, receiver: StageShape, sample_bytes: float) -> Iterator[tuple[int, int, float]]:
    """(source rank, destination rank, bytes) of every message one microbatch's activation (or, from the
    later stage back, its gradient) makes from the `sender` stage to the `receiver` stage;
    `sample_bytes` is one sample's activation."""
    (ranks_s, ts, shares_s), (ranks_r, tr, shares_r) = sender, receiver
    piece = ts if ts == tr > 1 else 1
    starts = list(accumulate(shares_r, initial=0))
    lo = 0
    for r, share in enumerate(shares_s):
        hi = lo + share
        for e in range(len(shares_r)):
            samples = min(hi, starts[e + 1]) - max(lo, starts[e])
            if samples > 0:
                for j in range(tr):
                    yield ranks_s[r * ts + j % ts], ranks_r[e * tr + j], samples * sample_bytes / piece
        lo = hi


def crossing_seconds(cluster: Cluster, workload: Workload, sender: StageOption, receiver: StageOption) -> float:
    """Seconds until every message of one microbatch's crossing from `sender` to `receiver` has arrived,
    all started at once and sharing their links (the links' shares worked out once per cluster, pair of
    stages and proportions of their shares: a larger microbatch scales every message alike)."""
    _, capacity, patterns, pairs, seen = _for_cluster(cluster)
    # the search asks again and again about the same stage options: by identity first (the entry holds
    # both options, so their ids stay theirs)
    found = seen.get((id(sender), id(receiver)))
    if found is not None and found[0] is sender and found[1] is receiver and found[2] is workload:
        return found[3]
    scale = gcd(*sender.shares, *receiver.shares)
    key = (sender.ranks, sender.tp, tuple(n // scale for n in sender.shares), receiver.ranks, receiver.tp,
           tuple(n // scale for n in receiver.shares))
    pattern = patterns.get(key)
    if pattern is None:
        load = _Loads()
        messages = []
        for src, dst, samples in transfers(key[:3], key[3:], 1.0):
            pair = pairs.get((src, dst))
            if pair is None:
                pair = pairs[src, dst] = (cluster.p2p_usage(src, dst), cluster.p2p_link(src, dst))
            usage, link = pair
            for link_id, rate in usage:
                load[link_id] += rate
            messages.append((usage, link, samples))
        # the distinct (link, samples, share of its speed) of the crossing's messages
        pattern = patterns[key] = tuple({(link, samples, costs.shared_speed(usage, capacity, load))
                                         for usage, link, samples in messages})
    sample_bytes = scale * workload.activation_bytes()
    # alone a message takes costs.p2p_time; at a share s of its speed, 1/s as long (transfers.py)
    seconds = max(costs.p2p_time(samples * sample_bytes, link) / speed for link, samples, speed in pattern)
    seen[id(sender), id(receiver)] = (sender, receiver, workload, seconds)
    return seconds


class _Loads(dict):
    """Bytes/s the crossing's messages want on each link they use, 0 on the others (indexed by link id,
    as the simulator's load list)."""

    def __missing__(self, link: int) -> int:
        return 0


# Per cluster: (the cluster, its link capacities, each crossing's pattern by stage pair and proportions,
# (links used, link) by rank pair, seconds by the identity of a pair of stage options). Keyed by
# identity, as hashing a cluster of many nodes costs more than a crossing; the entry holds the cluster, so
# its id is not reused while the entry lives.
_CLUSTERS: dict[int, tuple[Cluster, list[int], dict, dict, dict]] = {}
_CLUSTERS_KEPT = 8


def _for_cluster(cluster: Cluster) -> tuple[Cluster, list[int], dict, dict, dict]:
    found = _CLUSTERS.get(id(cluster))
    if found is None:
        if len(_CLUSTERS) >= _CLUSTERS_KEPT:
            _CLUSTERS.clear()
        found = _CLUSTERS[id(cluster)] = (cluster, cluster.link_capacities(), {}, {}, {})
    return found

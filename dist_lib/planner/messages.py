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
from typing import TYPE_CHECKING

from .. import costs
from ..hardware import Cluster
from ..workload import Workload

if TYPE_CHECKING:
    from .partition import StageOption


def scatters(a: StageOption, b: StageOption) -> bool:
    """Whether messages between neighbouring stages go as TP pieces: both of one degree t > 1."""
    return a.tp == b.tp > 1


def transfers(sender: tuple[tuple[int, ...], int, tuple[int, ...]], receiver: tuple[tuple[int, ...], int, tuple[int, ...]],
              sample_bytes: float) -> Iterator[tuple[int, int, float]]:
    """(source rank, destination rank, bytes) of every message one microbatch's activation (or, from the
    later stage back, its gradient) makes from the `sender` stage to the `receiver` stage, each given as
    (ranks, TP degree, replica shares); `sample_bytes` is one sample's activation."""
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
    all started at once and sharing their links (computed once per cluster and pair of stages)."""
    _, capacity, known = _for_cluster(cluster)
    key = (workload.activation_bytes(), sender.ranks, sender.tp, sender.shares, receiver.ranks, receiver.tp,
           receiver.shares)
    seconds = known.get(key)
    if seconds is None:
        load = _Loads()
        messages = []
        for src, dst, nbytes in transfers((sender.ranks, sender.tp, sender.shares),
                                          (receiver.ranks, receiver.tp, receiver.shares), key[0]):
            usage = cluster.p2p_usage(src, dst)
            for link, rate in usage:
                load[link] += rate
            messages.append((usage, costs.p2p_time(nbytes, cluster.p2p_link(src, dst))))
        # a message alone takes p2p_time; at a share s of its speed it takes 1/s as long (transfers.py)
        seconds = known[key] = max(t / costs.shared_speed(usage, capacity, load) for usage, t in messages)
    return seconds


class _Loads(dict):
    """Bytes/s the crossing's messages want on each link they use, 0 on the others (indexed by link id,
    as the simulator's load list)."""

    def __missing__(self, link: int) -> int:
        return 0


# Per cluster: (the cluster, its link capacities, crossing seconds by stage pair). Keyed by identity, as
# hashing a cluster of many nodes costs more than a crossing; the entry holds the cluster, so its id is
# not reused while the entry lives.
_CLUSTERS: dict[int, tuple[Cluster, list[int], dict]] = {}
_CLUSTERS_KEPT = 8


def _for_cluster(cluster: Cluster) -> tuple[Cluster, list[int], dict]:
    found = _CLUSTERS.get(id(cluster))
    if found is None:
        if len(_CLUSTERS) >= _CLUSTERS_KEPT:
            _CLUSTERS.clear()
        found = _CLUSTERS[id(cluster)] = (cluster, cluster.link_capacities(), {})
    return found

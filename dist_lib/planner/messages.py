"""Pipeline messages between two neighbouring stages of a plan, as `strategies/planned.py` sends them,
and the time the estimate gives one crossing of the boundary.

Routing: replica r of the sending stage cuts its share of a microbatch by the receiving stage's shares
and sends each overlapping receiver replica its samples; tensor rank j of a receiver gets them from
tensor rank j mod t of the sender. Between stages of the same TP degree t > 1 each rank sends only its
1/t piece and the receiving TP group all-gathers it (Megatron-LM's scatter-gather, Narayanan et al.
2021, sec. 4.1); between other degrees messages go whole.

Time: a crossing is played out as the simulator plays it (`engine/transfers.py`), every sender ready at once:
a receiving rank takes its pieces one at a time, in the order of the sending replicas (`planned.py`
awaits each before it asks for the next, and a message moves only once it is asked for), and the
messages in flight share the links they cross in proportion to what each wants (a GPU's port or NIC,
or a node's NICs that its GPUs share; `Cluster.p2p_usage`, `network.shared_speed`), each speeding up as
others end. The crossing takes until its last message has arrived. On a node whose GPUs share one
NIC, t pieces of n/t take as long as one whole message, and t whole messages t times as long; twelve
replicas sending into four take the bytes of all twelve through the receiving node's NIC, not twelve
times the largest. In the steady state replicas that cost differently send at different moments
(`stagger.py`): `steady_crossing_seconds` plays the crossing out with each sending replica's messages
moving from its own offset on, sharing links only while they overlap.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate
from math import gcd, inf
from typing import Protocol

from dist_lib.costs import network
from dist_lib.hardware.devices import Link
from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload
from dist_lib.planner.independent import components, one_of_each
from dist_lib.planner.sharing import Job, PerCluster, Usage, play
from dist_lib.planner.stage_option import StageOption



def scatters(a: StageOption, b: StageOption) -> bool:
    """Whether messages between neighbouring stages go as TP pieces: both of one degree t > 1."""
    return a.tp == b.tp > 1


StageShape = tuple[tuple[int, ...], int, tuple[int, ...]]  # a stage's (ranks, TP degree, replica shares)


class Staged(Protocol):
    """What a crossing reads of a stage: a plan's `Stage` or a search's `StageOption`."""

    @property
    def ranks(self) -> tuple[int, ...]: ...
    @property
    def tp(self) -> int: ...
    @property
    def shares(self) -> tuple[int, ...]: ...


def routes(sender: StageShape, receiver: StageShape) -> Iterator[tuple[int, int, int, int]]:
    """(source rank, destination rank, samples, TP pieces the samples' activation is cut into) of every
    message one microbatch's activation (or, from the later stage back, its gradient) makes from the
    `sender` stage to the `receiver` stage, in the order of the sending replicas (the order each
    receiving rank takes its pieces in)."""
    (ranks_s, ts, shares_s), (ranks_r, tr, shares_r) = sender, receiver
    piece = ts if ts == tr > 1 else 1
    starts = list(accumulate(shares_r, initial=0))
    lo, first, last = 0, 0, len(shares_r)
    for r, share in enumerate(shares_s):
        hi = lo + share
        # the receivers overlapping lo..hi follow one another, from the first that ends past lo (both
        # stages' shares run over the microbatch in order: a walk, not a scan of every receiver)
        while first < last and starts[first + 1] <= lo:
            first += 1
        e = first
        while e < last and starts[e] < hi:
            samples = min(hi, starts[e + 1]) - max(lo, starts[e])
            if samples > 0:
                for j in range(tr):
                    yield ranks_s[r * ts + j % ts], ranks_r[e * tr + j], samples, piece
            e += 1
        lo = hi


def transfers(sender: StageShape, receiver: StageShape, sample_bytes: float) -> Iterator[tuple[int, int, float]]:
    """(source rank, destination rank, bytes) of each of `routes`' messages; `sample_bytes` is one
    sample's activation."""
    for src, dst, samples, piece in routes(sender, receiver):
        yield src, dst, samples * sample_bytes / piece


def schedule_crossing(cluster: Cluster, workload: Workload, a: Staged, b: Staged) -> float:
    """The crossing time of the boundary between neighbouring stages `a` and `b` (plan stages or stage
    options) that ZB-H1 orders its passes and posts its receives by (`comm[s]` of
    `strategies/_zb_heuristic.zb_orders`, `times[s]["C"]`): `network.pipeline_crossing_time` of every
    message of one microbatch both ways (`routes`), the longest of them alone on its link. Both the
    planner's play-out and `strategies/planned.py` order a plan by it, so they order it alike.

    Why this figure: the heuristic takes one number per boundary, the same both ways, and counts it as
    a plain delay between a pass and the pass that takes its output (Zero Bubble's `cost_comm`). A
    pass waits for the last of its input's messages; they leave together and a posted receive takes
    them together, so the slowest of them alone is when the input can be there at the earliest. It
    leaves out the sharing of links (`crossing_seconds`) as `zero_bubble`'s own figure does
    (`strategies/_plan.crossing_time`: one TP rank's message alone), and where both stages are one
    replica of the same TP degree on links alike it is that figure. Every rank of a plan works it out
    the same from the plan alone, so every replica of a stage runs one order. Between stages of
    different widths the slowest message is the one of most samples (whole, where the TP degrees
    differ) on the slowest link: a stage of one GPU feeding four replicas sends four quarter messages,
    four replicas feeding one GPU four quarters the other way, and a boundary across a node's NIC
    counts that NIC."""
    known = _schedule_crossings(cluster)
    key = (workload, a.ranks, a.tp, a.shares, b.ranks, b.tp, b.shares)
    seconds = known.get(key)
    if seconds is None:
        shapes = ((a.ranks, a.tp, a.shares), (b.ranks, b.tp, b.shares))
        seconds = network.pipeline_crossing_time(workload, (
            (samples, pieces, cluster.p2p_link(src, dst))
            for x, y in (shapes, shapes[::-1]) for src, dst, samples, pieces in routes(x, y) if src != dst))
        if len(known) > 1 << 12:
            known.clear()
        known[key] = seconds
    return seconds


Chain = tuple[tuple[Usage, Link, float], ...]  # one receiving rank's messages in turn: (usage, link, samples)


def drain(chains: Sequence[Chain], capacity: Sequence[int], sample_bytes: float) -> float:
    """Seconds until every message has arrived when each chain's first message starts at 0 and each
    further one as the one before it arrives; a message alone takes `network.p2p_time`, and those in
    flight share their links as in the simulator (`sharing.play`)."""
    jobs = []
    for chain in chains:
        for k, (usage, link, samples) in enumerate(chain):
            jobs.append(Job(network.p2p_time(samples * sample_bytes, link), usage, 0.0, (len(jobs) - 1,) if k else ()))
    return max(play(jobs, capacity), default=0.0)


def staggered_drain(chains: Sequence[Chain], senders: Sequence[Sequence[int]], ready: Sequence[float],
                    capacity: Sequence[int], sample_bytes: float) -> float:
    """`drain` when sending replica i's messages may move only from `ready[i]` seconds on (-inf: they
    never meet the others and are left out, `stagger.phases`): seconds from the latest ready sender to the
    last arrival, each further message of a chain starting once the one before it has arrived and its
    sender is ready. With every sender ready at 0 it is `drain`."""
    kept = [r for r in ready if r != -inf]
    if not kept:
        return 0.0
    base, latest = min(kept), max(kept)
    jobs: list[Job] = []
    waits: dict[int, int] = {}  # sending replica -> the job that ends when it is ready
    for chain, by in zip(chains, senders):
        previous = None
        for (usage, link, samples), i in zip(chain, by):
            if ready[i] == -inf:
                continue
            seconds = network.p2p_time(samples * sample_bytes, link)
            if previous is None:
                jobs.append(Job(seconds, usage, ready[i] - base))
            else:
                wait = waits.get(i)
                if wait is None:
                    wait = waits[i] = len(jobs)
                    jobs.append(Job(ready[i] - base))  # a wait: it shares nothing
                jobs.append(Job(seconds, usage, 0.0, (previous, wait)))
            previous = len(jobs) - 1
    return max(0.0, max(play(jobs, capacity), default=0.0) + base - latest)


def feeds(cluster: Cluster, workload: Workload, sender: StageOption, receiver: StageOption) -> tuple[tuple[int, ...], ...]:
    """Per receiving replica, the sending replicas whose messages it takes."""
    pattern, _ = _pattern(cluster, workload, sender, receiver)
    if pattern.feeds is None:
        # every TP rank of a receiving replica takes a message of each sending replica whose samples
        # overlap its own (`routes`): the replicas' samples alone say which
        out: list[list[int]] = [[] for _ in range(len(receiver.ranks) // receiver.tp)]
        for r, e, _, _ in routes((tuple(range(len(sender.shares))), 1, sender.shares),
                                 (tuple(range(len(receiver.shares))), 1, receiver.shares)):
            out[e].append(r)
        pattern.feeds = tuple(map(tuple, out))
    return pattern.feeds


def steady_crossing_seconds(cluster: Cluster, workload: Workload, sender: StageOption, receiver: StageOption,
                            ready: Sequence[float]) -> float:
    """`staggered_drain` of one microbatch's crossing when sending replica i is ready at `ready[i]`
    (`stagger.phases`); `crossing_seconds` when every sender is ready at once."""
    if all(r == 0.0 for r in ready):
        return crossing_seconds(cluster, workload, sender, receiver)
    pattern, sample_bytes = _pattern(cluster, workload, sender, receiver)
    key = (sample_bytes, *ready)  # the same stagger recurs: replicas that drift away, equal blocks
    seconds = pattern.seconds.get(key)
    if seconds is None:
        capacity = _for_cluster(cluster)[0]
        kept = one_of_each(pattern.parts(capacity), pattern.senders, ready)
        seconds = pattern.seconds[key] = staggered_drain([pattern.chains[i] for i in kept],
                                                         [pattern.senders[i] for i in kept], ready, capacity,
                                                         sample_bytes)
    return seconds


def crossing_seconds(cluster: Cluster, workload: Workload, sender: StageOption, receiver: StageOption) -> float:
    """Seconds until every message of one microbatch's crossing from `sender` to `receiver` has arrived
    (`drain`; the messages worked out once per cluster, pair of stages and proportions of their shares,
    and the crossing once per such pattern and bytes a share unit)."""
    capacity, _, _, seen = _for_cluster(cluster)
    # the search asks again and again about the same stage options: by identity first (the entry holds
    # both options, so their ids stay theirs)
    found = seen.get((id(sender), id(receiver)))
    if found is not None and found[0] is sender and found[1] is receiver and found[2] is workload:
        return found[3]
    pattern, sample_bytes = _pattern(cluster, workload, sender, receiver)
    seconds = pattern.seconds.get(sample_bytes)
    if seconds is None:
        # one set of each class of alike sets of chains that share no link (`independent.py`): the same end
        seconds = pattern.seconds[sample_bytes] = drain([pattern.chains[i] for i in pattern.representatives(capacity)],
                                                        capacity, sample_bytes)
    seen[id(sender), id(receiver)] = (sender, receiver, workload, seconds)
    return seconds


def crossing_usage(cluster: Cluster, workload: Workload, sender: StageOption,
                   receiver: StageOption) -> tuple[Usage, frozenset[int]]:
    """What one microbatch's crossing wants of its links while every receiving rank takes its first
    piece (the sum of those messages' `Cluster.p2p_usage`, each receiving rank taking one at a time),
    and every link any of its messages crosses."""
    seen = _for_cluster(cluster)[3]
    found = seen.get((id(sender), id(receiver), "usage"))
    if found is not None and found[0] is sender and found[1] is receiver:
        return found[2]
    pattern, _ = _pattern(cluster, workload, sender, receiver)
    if pattern.usage is None:
        heads: dict[int, int] = {}
        for chain in pattern.chains:
            for link, rate in chain[0][0]:
                heads[link] = heads.get(link, 0) + rate
        pattern.usage = tuple(heads.items())
    seen[id(sender), id(receiver), "usage"] = (sender, receiver, (pattern.usage, pattern.links))
    return pattern.usage, pattern.links


def crossing_sides(cluster: Cluster, workload: Workload, sender: StageOption,
                   receiver: StageOption) -> tuple[frozenset[int], frozenset[int]]:
    """(the links out of its senders, the links into its receivers) that a crossing's messages cross
    (`Cluster.p2p_usage`: a message wants its sender's port or NIC out, then its receiver's in)."""
    pattern, _ = _pattern(cluster, workload, sender, receiver)
    if pattern.sides is None:
        usages = [usage for chain in pattern.chains for usage, _, _ in chain]
        pattern.sides = (frozenset(u[0][0] for u in usages), frozenset(u[-1][0] for u in usages))
    return pattern.sides


class _Pattern:
    """One crossing's messages in units of a share (`_pattern`), worked out when first read, and what is
    worked out from them once. Its seconds are shared by every crossing of the same shape
    (`_shape`): the same messages between ranks placed alike on nodes alike take the same time."""

    __slots__ = ("source", "built", "seconds", "usage", "feeds", "sides", "found", "kept")

    def __init__(self, source: tuple, seconds: dict):
        self.source = source  # (cluster, rank pairs' links, key): what `_messages` reads
        self.built: tuple | None = None
        self.seconds = seconds  # by bytes a share unit (and the senders' stagger after it)
        self.usage: Usage | None = None  # `crossing_usage`
        self.feeds: tuple[tuple[int, ...], ...] | None = None  # `feeds`
        self.sides: tuple[frozenset[int], frozenset[int]] | None = None  # `crossing_sides`
        self.found: list[tuple[int, tuple[int, ...]]] | None = None  # `independent.components` of the chains
        self.kept: list[int] | None = None  # the chains of one component of each class

    @property
    def chains(self) -> tuple[Chain, ...]:  # per receiving rank, the messages it takes in turn
        return (self.built or self._build())[0]

    @property
    def links(self) -> frozenset[int]:  # every link a message crosses
        return (self.built or self._build())[1]

    @property
    def senders(self) -> tuple[tuple[int, ...], ...]:  # per chain, the sending replica of each message
        return (self.built or self._build())[2]

    @property
    def receivers(self) -> tuple[int, ...]:  # per chain, its receiving replica
        return (self.built or self._build())[3]

    def _build(self) -> tuple:
        cluster, pairs, key = self.source
        chains: dict[int, list] = {}
        senders: dict[int, list[int]] = {}  # per receiving rank: the sending replica of each piece
        replica = {rank: k // key[1] for k, rank in enumerate(key[0])}
        for src, dst, samples in transfers(key[:3], key[3:], 1.0):
            pair = pairs.get((src, dst))
            if pair is None:
                pair = pairs[src, dst] = (cluster.p2p_usage(src, dst), cluster.p2p_link(src, dst))
            chains.setdefault(dst, []).append((*pair, samples))
            senders.setdefault(dst, []).append(replica[src])
        links = frozenset(link for chain in chains.values() for usage, _, _ in chain for link, _ in usage)
        receiving = {rank: k // key[4] for k, rank in enumerate(key[3])}
        self.built = (tuple(map(tuple, chains.values())), links, tuple(tuple(v) for v in senders.values()),
                      tuple(receiving[d] for d in chains))
        return self.built

    def parts(self, capacity: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
        if self.found is None:
            self.found = components(self.chains, capacity)
        return self.found

    def representatives(self, capacity: Sequence[int]) -> list[int]:
        if self.kept is None:
            self.kept = one_of_each(self.parts(capacity))
        return self.kept


def _shape(cluster: Cluster, key: tuple, kinds: dict) -> tuple:
    """A crossing's key with its ranks replaced by where they sit: each rank's node, numbered in order of
    first appearance over the sender's ranks and then the receiver's, and each such node's kind (`kinds`:
    node index -> kind). Two crossings of one shape have the same messages (the same routes, between ranks
    in the same places) on links of the same kinds, a rank's own links or a node's shared NICs renumbered
    one for one; their plays (`drain`) make the same arithmetic on them."""
    node_of, local, places = cluster.node_of, {}, []
    for rank in key[0] + key[3]:
        node = node_of(rank)
        places.append(local.setdefault(node, len(local)))
    return (key[1], key[2], len(key[0]), key[4], key[5], tuple(places), tuple(kinds[node] for node in local))


def _pattern(cluster: Cluster, workload: Workload, sender: StageOption, receiver: StageOption) -> tuple[_Pattern, float]:
    """(the pattern, bytes a share unit) of a crossing: its messages in units of the shares' greatest
    common divisor, so that every microbatch size of the same proportions has the same ones."""
    _, patterns, pairs, _ = _for_cluster(cluster)
    scale = gcd(*sender.shares, *receiver.shares)
    key = (sender.ranks, sender.tp, tuple(n // scale for n in sender.shares), receiver.ranks, receiver.tp,
           tuple(n // scale for n in receiver.shares))
    pattern = patterns.get(key)
    if pattern is None:
        shapes, kinds = _shapes(cluster)
        pattern = patterns[key] = _Pattern((cluster, pairs, key), shapes.setdefault(_shape(cluster, key, kinds), {}))
    return pattern, scale * workload.activation_bytes()


def _node_kinds(cluster: Cluster) -> tuple[dict, list[int]]:
    """({}: seconds by crossing shape, each node's kind: nodes equal in every figure are one kind)."""
    kinds: dict = {}
    return {}, [kinds.setdefault(node, len(kinds)) for node in cluster.nodes]


# Per cluster: (its link capacities, each crossing's chains, its seconds by bytes a share unit, its links
# and its usage, by stage pair and proportions, (links used, link) by rank pair, seconds by the identity
# of a pair of stage options)
_for_cluster: PerCluster[tuple[list[int], dict, dict, dict]] = \
    PerCluster(lambda cluster: (cluster.link_capacities(), {}, {}, {}))
# Per cluster: `schedule_crossing` by workload and the two stages' shapes
_schedule_crossings: PerCluster[dict] = PerCluster(lambda cluster: {})
# Per cluster: seconds by crossing shape (`_shape`), and each node's kind
_shapes: PerCluster[tuple[dict, list[int]]] = PerCluster(_node_kinds)

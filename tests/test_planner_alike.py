"""The estimate's shortcuts that must not change a figure, bit for bit: a crossing played with one set of
each class of alike link-disjoint messages (`planner.independent`), and the receivers a sending replica
overlaps found by a walk (`messages.routes`)."""

from __future__ import annotations

from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from dist_lib import Cluster, Workload
from dist_lib.planner.independent import components, one_of_each
from dist_lib.planner.messages import _pattern, drain, feeds, routes, staggered_drain
from dist_lib.planner.stage_space import StageSpace


def _every_route(sender, receiver):
    """`routes` by its definition: every (sending replica, receiving replica) pair whose samples overlap."""
    (ranks_s, ts, shares_s), (ranks_r, tr, shares_r) = sender, receiver
    piece = ts if ts == tr > 1 else 1
    a, b = list(accumulate(shares_s, initial=0)), list(accumulate(shares_r, initial=0))
    for r in range(len(shares_s)):
        for e in range(len(shares_r)):
            samples = min(a[r + 1], b[e + 1]) - max(a[r], b[e])
            if samples > 0:
                for j in range(tr):
                    yield ranks_s[r * ts + j % ts], ranks_r[e * tr + j], samples, piece


def _cut(total: int, points: list[int]) -> tuple[int, ...]:
    edges = [0, *sorted(set(p for p in points if 0 < p < total)), total]
    return tuple(y - x for x, y in zip(edges, edges[1:]))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(1, 39), max_size=12), st.lists(st.integers(1, 39), max_size=12),
       st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]))
def test_routes_are_every_overlapping_pair_in_order(total, cuts_a, cuts_b, ts, tr):
    a, b = _cut(total, cuts_a), _cut(total, cuts_b)
    sender = (tuple(range(len(a) * ts)), ts, a)
    receiver = (tuple(range(1000, 1000 + len(b) * tr)), tr, b)
    assert list(routes(sender, receiver)) == list(_every_route(sender, receiver))


def test_alike_replicas_make_one_class_and_the_crossing_plays_one_of_them():
    """Stage a: 8 replicas of TP 2 on the first 2 nodes of 8 H100s; stage b: 4 replicas of TP 4 on the
    next 2 nodes, even shares of 8 samples. Receiving replica e takes the samples of sending replicas 2e
    and 2e + 1, its TP rank j from their TP rank j mod 2, so those two sending ranks feed j and j + 2 and
    nobody else: 8 components of 2 chains (one a receiving rank), on GPUs of their own NICs, all alike.
    Played alone, one of them ends exactly when all eight do."""
    cluster, workload = Cluster.load("4x8xH100-80GB"), Workload.load("gpt-1.3b:layers=4")
    sp = StageSpace(cluster, workload)
    a = next(o for o in sp.options(tuple(range(16)), 8, "none", 0) if o.tp == 2)
    b = next(o for o in sp.options(tuple(range(16, 32)), 8, "none", 0) if o.tp == 4)
    pattern, sample_bytes = _pattern(cluster, workload, a, b)
    capacity = cluster.link_capacities()
    found = components(pattern.chains, capacity)
    assert [len(chains) for _, chains in found] == [2] * 8 and {cls for cls, _ in found} == {0}
    kept = one_of_each(found)
    assert kept == list(found[0][1])
    assert drain([pattern.chains[i] for i in kept], capacity, sample_bytes) == \
        drain(pattern.chains, capacity, sample_bytes)


@st.composite
def _crossings(draw):
    """Chains of messages on a few links of a few capacities, some sets repeated on fresh link ids."""
    capacity = draw(st.lists(st.sampled_from([10, 25, 40]), min_size=6, max_size=6))
    base = draw(st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.sampled_from([10, 25]),
                                            st.integers(1, 4)), min_size=1, max_size=3), min_size=1, max_size=4))
    copies = draw(st.integers(1, 4))
    chains, senders = [], []
    for c in range(copies):  # copy c uses links 6c..6c+5, of the same capacities
        for chain in base:
            chains.append(tuple((((6 * c + x, rate), (6 * c + y, rate)) if x != y else ((6 * c + x, rate),),
                                 rate, samples) for x, y, rate, samples in chain))
            senders.append(tuple(draw(st.integers(0, 2)) for _ in chain))
    ready = draw(st.lists(st.sampled_from([0.0, -0.5, -1.0]), min_size=3, max_size=3))
    return chains, senders, ready, capacity * copies


class _Link:
    """What `network.p2p_time` reads of a link: a latency and a bandwidth (here: the rate given)."""

    def __init__(self, rate: float):
        self.latency, self.achieved_bandwidth = 0.001, float(rate)

    def __eq__(self, other):
        return isinstance(other, _Link) and other.achieved_bandwidth == self.achieved_bandwidth

    def __hash__(self):
        return hash(self.achieved_bandwidth)


@settings(max_examples=300, deadline=None)
@given(_crossings())
def test_one_set_of_each_class_ends_when_all_do(crossing):
    chains, senders, ready, capacity = crossing
    chains = [tuple((usage, _Link(rate), samples) for usage, rate, samples in chain) for chain in chains]
    found = components(chains, capacity)
    kept = one_of_each(found)
    assert drain([chains[i] for i in kept], capacity, 1.0) == drain(chains, capacity, 1.0)
    kept = one_of_each(found, senders, ready)
    assert staggered_drain([chains[i] for i in kept], [senders[i] for i in kept], ready, capacity, 1.0) == \
        staggered_drain(chains, senders, ready, capacity, 1.0)


def test_crossings_placed_alike_share_their_seconds_and_take_them():
    """On 4 nodes of 8 H100s, two stages of 4 TP-2 replicas on nodes 0 and 1 cross as stages of the same
    widths on nodes 2 and 3: the same messages between ranks in the same places on nodes alike, so one
    shape, whose seconds each crossing's own play gives to the bit; the same stages on nodes 1 and 2 sit
    alike too. Stages that each straddle two nodes (ranks 4 to 11 into 12 to 19) have another shape."""
    cluster, workload = Cluster.load("4x8xH100-80GB"), Workload.load("gpt-1.3b:layers=4")
    sp = StageSpace(cluster, workload)

    def option(first: int, tp: int):
        return next(o for o in sp.options(tuple(range(first, first + 8)), 8, "none", 0) if o.tp == tp)

    capacity = cluster.link_capacities()
    first, sample_bytes = _pattern(cluster, workload, option(0, 2), option(8, 4))
    for a, b in ((16, 24), (8, 16)):
        other, _ = _pattern(cluster, workload, option(a, 2), option(b, 4))
        assert other.seconds is first.seconds and other.chains != first.chains
        assert drain(other.chains, capacity, sample_bytes) == drain(first.chains, capacity, sample_bytes)
    apart, _ = _pattern(cluster, workload, option(4, 2), option(12, 4))  # each stage on two nodes
    assert apart.seconds is not first.seconds


def test_feeds_are_the_replicas_whose_samples_overlap():
    """Stage a: an A100 node and a T4 node (uneven shares by speed); stage b: 2 replicas of TP 2. Each
    receiving replica takes the messages of the sending replicas its samples overlap, as its chains say."""
    cluster, workload = Cluster.load("1x4xA100-80GB+1x4xT4+1x4xV100-32GB"), Workload.load("gpt-350m:layers=4")
    sp = StageSpace(cluster, workload)
    a = next(o for o in sp.options(tuple(range(8)), 16, "none", 0) if o.tp == 1)
    b = next(o for o in sp.options(tuple(range(8, 12)), 16, "none", 0) if o.tp == 2)
    assert len(set(a.shares)) > 1
    pattern, _ = _pattern(cluster, workload, a, b)
    by_chains: list[set[int]] = [set(), set()]
    for senders, replica in zip(pattern.senders, pattern.receivers):
        by_chains[replica].update(senders)
    assert feeds(cluster, workload, a, b) == tuple(tuple(sorted(s)) for s in by_chains)

"""Crossings of different stage boundaries that meet on a link, for the estimate of 1F1B and ZB-H1.

The estimate times each boundary's crossing alone (`messages.py`, `stagger.py`). Where stages of two
boundaries sit on one node behind its shared NIC and both boundaries cross nodes, their crossings go
through that NIC: in the simulator, on 3x4xV100-32GB:nics=1x1.25 with stages of 4, 2, 2 and 4 GPUs,
the middle node's NIC carries the activations from stage 2 to stage 3 out while it carries the
gradients from stage 1 to stage 0, and the activations from stage 0 to stage 1 in while it carries
the gradients from stage 3 to stage 2. Where they overlap, each gets half the NIC: the activation of
the third microbatch into stage 3 takes 87.1 ms, not the 53.7 ms it takes alone, and stage 3 waits for
it (the NIC is full duplex, `Cluster.p2p_usage`: only messages of one direction meet).

Which crossings can meet (`shared_links`): two crossings into one stage never do (a stage posts one
receive at a time, when its pass needs the input, and a message moves only once its receive is posted,
`dist_lib/engine.py`), and two out of one stage in practice do not (its activation to s + 1 has arrived
before s + 1 can send the gradient that lets s send on to s - 1; only the last warm-up activation
could still be moving, and its crossing is as long as the gradient's coming back). So only crossings
with different senders and different receivers count, and those share a link only through a NIC that
GPUs of two stages share: on clusters of a NIC per GPU no plan needs anything here.

For a plan with such links, the pipeline is played out pass by pass as the simulator runs it
(`strategies/_pipeline.py`), first in plain arithmetic with every crossing alone (`play_alone`): a pass
starts once its stage's pass before it has ended and, for a forward past the first stage or a backward
before the last, once its input has crossed; a crossing starts once the sending pass has ended and the
receiving stage has ended the pass before the one it feeds (a rendezvous: the receive is posted then).
Only if two crossings that share a link overlap in that play-out is it played again with every
crossing a transfer on the shared links (`sharing.play`; one job wanting what its receiving ranks'
first pieces want, at its time alone, as `tail.py` plays the last gradients). The estimate adds the
difference, the delay the sharing alone causes (`play_ends`).

Under ZB-H1 the play-out alone also catches what the closed form misses: the schedule is ordered from
compute times alone (`strategies/zero_bubble.py`), so a stage whose input gradient has not arrived
runs a deferred weight-gradient pass first, and posts the receive only after it; the crossing then
starts only as W ends. On the plan above, stage 0 posts its receive of microbatch 1's gradient at
606.8 ms, as its W of microbatch 0 ends, and stage 0's last pass ends at 861.5 ms in the simulator,
860.8 ms in the play-out, 784.8 ms by the closed form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..hardware import Cluster
from ..workload import Workload
from .messages import crossing_seconds, crossing_sides
from .sharing import Job, PerCluster, play
from .tail import _for_cluster as _tails

if TYPE_CHECKING:
    from .partition import StageOption

Order = Sequence[tuple[str, int]]  # one stage's passes in turn: ("F" | "B" | "I" | "W", microbatch)
Crossing = tuple[int, int]  # (sending stage, receiving stage)


def _multi_rank_links(cluster: Cluster) -> frozenset[int]:
    """Links that more than one rank's messages may cross: the NICs a node's GPUs share (`nics=`)."""
    links: set[int] = set()
    if len(cluster.nodes) < 2:
        return frozenset()
    for n, node in enumerate(cluster.nodes):
        if node.nics and node.gpus > 1:
            rank, other = cluster.ranks_of_node(n)[0], cluster.ranks_of_node((n + 1) % len(cluster.nodes))[0]
            links.add(cluster.p2p_usage(rank, other)[0][0])  # its NIC out
            links.add(cluster.p2p_usage(other, rank)[1][0])  # and in
    return frozenset(links)


class _Links:
    """Per cluster: its links that several ranks share, and `shared_links` by the stage options' identities."""

    __slots__ = ("multi", "seen")

    def __init__(self, cluster: Cluster):
        self.multi = _multi_rank_links(cluster)
        self.seen: dict = {}


_for_cluster: PerCluster[_Links] = PerCluster(_Links)


def shared_links(cluster: Cluster, workload: Workload,
                 placed: Sequence[tuple[int, StageOption]]) -> dict[frozenset[Crossing], frozenset[int]]:
    """{pair of crossings: the links both cross} over the pairs of crossings between neighbouring stages
    with different senders and different receivers that share a link (see the module); empty when none
    do, as on every cluster of a NIC per GPU."""
    known = _for_cluster(cluster)
    if not known.multi or len(placed) < 2:
        return {}
    options = tuple(o for _, o in placed)
    key = tuple(map(id, options))
    found = known.seen.get(key)
    if found is not None and found[0] == options and found[1] is workload:
        return found[2]
    sides = {}  # crossing -> (its links out of senders, into receivers) among the shared NICs' links
    for s in range(len(options) - 1):
        for x, y in ((s, s + 1), (s + 1, s)):
            out, into = crossing_sides(cluster, workload, options[x], options[y])
            out, into = out & known.multi, into & known.multi
            if out or into:
                sides[x, y] = (out, into)
    pairs: dict[frozenset[Crossing], frozenset[int]] = {}
    listed = list(sides.items())
    for i, ((a, b), (out, into)) in enumerate(listed):
        for (c, d), (out2, into2) in listed[i + 1:]:
            if a != c and b != d:
                common = (out & out2) | (into & into2)
                if common:
                    pairs[frozenset(((a, b), (c, d)))] = common
    if len(known.seen) > 1 << 14:
        known.seen.clear()
    known.seen[key] = (options, workload, pairs)
    return pairs


def one_f_one_b_orders(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's passes under 1F1B: `strategies/one_f_one_b.py`'s own schedule (stage s runs
    min(m, p - s) forwards, then a backward and a forward in turn, then the backwards left)."""
    from strategies.one_f_one_b import schedule  # (the strategies import dist_lib: not at load time)
    return [[(a.kind, a.mb) for a in schedule(s, stages, microbatches)] for s in range(stages)]


def zero_bubble_orders(forward: Sequence[float], inputs: Sequence[float], weights: Sequence[float],
                       microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's passes under ZB-H1, as `strategies/zero_bubble.py` orders them (Zero Bubble's
    heuristic, `strategies/_zb_heuristic.py`, at most p microbatches awaiting W) from the stages' forward,
    input-gradient and weight-gradient seconds: the heuristic itself on the plain lists, without the
    schedule's actions."""
    from strategies._zb_heuristic import zb_orders  # (the strategies import dist_lib: not at load time)
    return zb_orders(forward, inputs, weights, microbatches, len(forward))


def _source(orders: Sequence[Order], s: int, kind: str, mb: int, split: bool) -> tuple[int, str, int] | None:
    """The pass whose output the pass (s, kind, mb) takes in from another stage, if any."""
    if kind == "F" and s > 0:
        return s - 1, "F", mb
    if kind in ("B", "I") and s < len(orders) - 1:
        return s + 1, "I" if split else "B", mb
    return None


def play_alone(orders: Sequence[Order], seconds: Sequence[dict[str, float]], onward: Sequence[float],
               back: Sequence[float]) -> tuple[dict[tuple[int, str, int], float],
                                               dict[Crossing, list[tuple[float, float]]]]:
    """(each pass's end by (stage, kind, microbatch), each crossing's (start, end) per microbatch by
    (sender, receiver)) of the play-out the module describes with every crossing alone: `seconds[s][kind]`
    a pass of stage s, `onward[s]` (the first microbatch's, a later one's) crossing of the activation from
    s to s + 1, `back[s]` the same of the gradient from s + 1 to s. A backward ("B") or input-gradient pass ("I") sends the gradient on; a
    weight-gradient pass ("W") sends nothing."""
    pp = len(orders)
    split = any(kind == "I" for kind, _ in orders[0])
    ends: dict[tuple[int, str, int], float] = {}
    spans: dict[Crossing, list[tuple[float, float]]] = {}
    position, clock = [0] * pp, [0.0] * pp
    left = sum(map(len, orders))
    while left:
        moved = 0
        for s, order in enumerate(orders):
            k, t, own = position[s], clock[s], seconds[s]
            while k < len(order):
                kind, mb = order[k]
                source = _source(orders, s, kind, mb, split)
                if source is not None:
                    sent = ends.get(source)
                    if sent is None:
                        break
                    start = sent if sent > t else t
                    crossing = (onward[s - 1] if kind == "F" else back[s])[mb > 0]
                    pair = (s - 1, s) if kind == "F" else (s + 1, s)
                    spans.setdefault(pair, []).append((start, start + crossing))
                    t = start + crossing
                t += own[kind]
                ends[s, kind, mb] = t
                k += 1
            moved += k - position[s]
            position[s], clock[s] = k, t
        if not moved:
            raise RuntimeError(f"pipeline play-out: no stage of {pp} can run its next pass")
        left -= moved
    return ends, spans


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Whether some interval of `a` and some of `b` overlap for a positive time (each list in time order,
    its intervals disjoint: one boundary's crossings one way follow one another)."""
    i = j = 0
    while i < len(a) and j < len(b):
        (s1, e1), (s2, e2) = a[i], b[j]
        if s1 < e2 and s2 < e1 and min(e1, e2) - max(s1, s2) > 1e-12 * max(e1, e2):
            return True
        if e1 <= e2:
            i += 1
        else:
            j += 1
    return False


def play_ends(cluster: Cluster, workload: Workload, placed: Sequence[tuple[int, StageOption]],
              orders: Sequence[Order], seconds: Sequence[dict[str, float]],
              pairs: dict[frozenset[Crossing], frozenset[int]],
              steady: dict[Crossing, tuple[float, float]]) -> tuple[float, float]:
    """(the end of stage 0's last pass with every crossing alone, the same with the crossings of `pairs`
    (`shared_links`) sharing their links), the stages running `orders` with `seconds[s][kind]` a pass
    of stage s; the two are one figure when no two crossings of `pairs` overlap alone. The first
    microbatch crosses with every sender ready at once (`crossing_seconds`), the later ones as
    `steady[s, s + 1]` gives (activation, gradient) seconds (`partition.steady_crossings`)."""
    pp = len(placed)
    onward = [(crossing_seconds(cluster, workload, placed[s][1], placed[s + 1][1]), steady[s, s + 1][0])
              for s in range(pp - 1)]
    back = [(crossing_seconds(cluster, workload, placed[s + 1][1], placed[s][1]), steady[s, s + 1][1])
            for s in range(pp - 1)]
    ends, spans = play_alone(orders, seconds, onward, back)
    alone = ends[(0, *orders[0][-1])]
    shared: set[int] = set()
    for pair, links in pairs.items():
        x, y = tuple(pair)
        if x in spans and y in spans and _overlap(spans[x], spans[y]):
            shared |= links
    if not shared:
        return alone, alone
    return alone, _played(cluster, workload, placed, orders, seconds, onward, back, shared)


def _played(cluster: Cluster, workload: Workload, placed: Sequence[tuple[int, StageOption]],
            orders: Sequence[Order], seconds: Sequence[dict[str, float]], onward: Sequence[float],
            back: Sequence[float], shared: set[int]) -> float:
    """The end of stage 0's last pass with the crossings that cross links of `shared` sharing them."""
    tails = _tails(cluster)
    interned = tails.interned(shared)
    pp = len(orders)
    split = any(kind == "I" for kind, _ in orders[0])
    parts = {}  # (sender, receiver) -> ((seconds alone first, later), usage of the shared links, own, top)
    for s in range(pp - 1):
        for x, y, alone in ((s, s + 1, onward[s]), (s + 1, s, back[s])):
            parts[x, y] = (alone, *tails.crossing(cluster, workload, placed[x][1], placed[y][1], interned))
    # each pass's job (with the crossing into it, if any): slot[s][kind, mb], stage by stage in order
    slot: list[dict[tuple[str, int], int]] = []
    count = 0
    for order in orders:
        slot.append(dict(zip(order, range(count, count + len(order)))))
        count += len(order)
    jobs: list[Job] = [Job(0.0)] * count
    sent = "I" if split else "B"
    for s, order in enumerate(orders):
        own_seconds, mine = seconds[s], slot[s]
        previous = None
        for kind, mb in order:
            me = mine[kind, mb]
            before = (previous,) if previous is not None else ()
            previous = me
            if kind == "F" and s > 0:
                source, sender = slot[s - 1]["F", mb], s - 1
            elif kind != "F" and kind != "W" and s < pp - 1:
                source, sender = slot[s + 1][sent, mb], s + 1
            else:
                jobs[me] = Job(own_seconds[kind], (), 0.0, before)
                continue
            pair, usage, own, top = parts[sender, s]
            alone = pair[mb > 0]
            # the crossing, after the sending pass and the receiving stage's pass before this one, and
            # then the pass it feeds, as one job
            if usage:
                jobs[me] = Job(alone * own, usage, 0.0, (source, *before), top, own_seconds[kind])
            else:
                jobs[me] = Job(alone + own_seconds[kind], (), 0.0, (source, *before))
    return play(jobs, tails.capacity)[slot[0][tuple(orders[0][-1])]]

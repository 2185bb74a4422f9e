"""Crossings of different stage boundaries that meet on a link, for the estimate of 1F1B and ZB-H1.

The estimate times each boundary's crossing alone (`messages.py`, `stagger.py`). Where stages of two
boundaries sit on one node behind its shared NIC and both boundaries cross nodes, their crossings go
through that NIC: in the simulator, on 3x4xV100-32GB:nics=1x1.25 with stages of 4, 2, 2 and 4 GPUs,
the middle node's NIC carries the activations from stage 2 to stage 3 out while it carries the
gradients from stage 1 to stage 0, and the activations from stage 0 to stage 1 in while it carries
the gradients from stage 3 to stage 2. Where they overlap, each gets half the NIC: the activation of
the third microbatch into stage 3 takes 87.1 ms, not the 53.7 ms it takes alone, and stage 3 waits for
it (the NIC is full duplex, `Cluster.p2p_usage`: only messages of one direction meet).

Which crossings can meet (`shared_links`): where each receive is posted as the pass that takes the input
begins (1F1B), two crossings into one stage never do (a stage posts one receive at a time, and a
message moves only once its receive is posted, `dist_lib/engine/core.py`), and two out of one stage in
practice do not (its activation to s + 1 has arrived before s + 1 can send the gradient that lets s
send on to s - 1; only the last warm-up activation could still be moving, and its crossing is as long
as the gradient's coming back). So only crossings with different senders and different receivers
count, and those share a link only through a NIC that GPUs of two stages share: on clusters of a NIC
per GPU no 1F1B plan needs anything here. ZB-H1 posts its receives early (`strategies/zero_bubble.py`,
`_early_receives.py`), so a stage's receives of an activation and a gradient can be in flight at once,
and so can its two sends: with it, the two crossings out of one stage, or into one, also count where
they share one of its links, on any cluster (each GPU's own NIC, out or in).

The pipeline is played out pass by pass as the simulator runs it (`strategies/_pipeline.py`), first in
plain arithmetic with every crossing alone (`play_alone`): a pass starts once its stage's pass before it
has ended and, for a forward past the first stage or a backward before the last, once its input has
crossed. Under 1F1B (only for plans with such links) a crossing starts once the sending pass has ended
and the receiving stage has ended the pass before the one it feeds (a rendezvous: the receive is posted
then). Under ZB-H1 (every plan of two or more stages, but those a search need not rank:
`step.step_estimate`'s cutoff, `zero_bubble_floor`) the receives are posted where the schedule posts
them (`posted_positions`: `with_posted_receives` on the same orders and the estimate's pass seconds), and
a crossing into pass k starts at the latest of the sending pass's end, the start of the pass before which
its receive is posted, and the end of the crossing before it between the same two stages. Only if two
crossings that share a link overlap in that play-out is it played again with every crossing a transfer
on the shared links (`sharing.play`; one job wanting what its receiving ranks' first pieces want, at its
time alone, as `tail.py` plays the last gradients). For 1F1B the estimate adds the difference, the delay
the sharing alone causes (`play_ends`); for ZB-H1 the play-out's end replaces the closed form's, which
waits for every crossing into a stage as if each receive were posted as its pass begins.

On the plan above under ZB-H1 (4 microbatches of 8), ordered with each boundary's crossing counted
(`messages.schedule_crossing`), stages 0 to 2 run all four forwards before their first input-gradient
pass; stage 0's last pass ends at 782.2 ms in the simulator, 781.7 ms in the play-out, 784.8 ms by the
closed form. On four one-GPU V100 nodes of a 0.3 GB/s NIC each (gpt-350m of 8 layers cut 1/2/2/3, 8
microbatches of 2), where no NIC is shared between GPUs, the step simulates at 803.7 ms; the step
estimated from the closed form is 827.3 ms, from the play-out with every crossing alone 685.1 ms (the
crossings out of each middle stage, and those into it, meet on its NIC), and from the play-out with them
sharing it 803.7 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dist_lib.hardware.cluster import Cluster
from dist_lib.schedules.actions import Action
from dist_lib.schedules.one_f_one_b import schedule
from dist_lib.schedules.posted import with_posted_receives
from dist_lib.schedules.zero_bubble import zb_orders
from dist_lib.workload.transformer import Workload
from dist_lib.planner.messages import crossing_seconds, crossing_sides
from dist_lib.planner.sharing import Job, PerCluster, play
from dist_lib.planner.tail import _for_cluster as _tails

if TYPE_CHECKING:
    from dist_lib.planner.stage_option import StageOption

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


def shared_links(cluster: Cluster, workload: Workload, placed: Sequence[tuple[int, StageOption]],
                 posted: bool = False) -> dict[frozenset[Crossing], frozenset[int]]:
    """{pair of crossings: the links both cross} over the pairs of crossings between neighbouring stages
    with different senders and different receivers that share a link (see the module); with `posted`
    receives (ZB-H1), also the pairs out of one stage or into one stage that share one of its links.
    Empty when none do, as on every cluster of a NIC per GPU without `posted`."""
    known = _for_cluster(cluster)
    if (not known.multi and not posted) or len(placed) < 2:
        return {}
    options = tuple(o for _, o in placed)
    key = (posted, *map(id, options))
    found = known.seen.get(key)
    if found is not None and found[0] == options and found[1] is workload:
        return found[2]
    sides = {}  # crossing -> (its links out of senders, into receivers)
    for s in range(len(options) - 1):
        for x, y in ((s, s + 1), (s + 1, s)):
            sides[x, y] = crossing_sides(cluster, workload, options[x], options[y])
    pairs: dict[frozenset[Crossing], frozenset[int]] = {}
    listed = list(sides.items())
    for i, ((a, b), (out, into)) in enumerate(listed):
        for (c, d), (out2, into2) in listed[i + 1:]:
            if a != c and b != d:
                common = ((out & out2) | (into & into2)) & known.multi
            elif posted and (a == c) != (b == d):  # one sender's two crossings, or one receiver's
                common = out & out2 if a == c else into & into2
            else:
                continue
            if common:
                pairs[frozenset(((a, b), (c, d)))] = common
    if len(known.seen) > 1 << 14:
        known.seen.clear()
    known.seen[key] = (options, workload, pairs)
    return pairs


def one_f_one_b_orders(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's passes under 1F1B: `strategies/one_f_one_b.py`'s own schedule (stage s runs
    min(m, p - s) forwards, then a backward and a forward in turn, then the backwards left)."""
    return [[(a.kind, a.mb) for a in schedule(s, stages, microbatches)] for s in range(stages)]


def zero_bubble_orders(forward: Sequence[float], inputs: Sequence[float], weights: Sequence[float],
                       microbatches: int, comm: Sequence[float] | None = None) -> list[list[tuple[str, int]]]:
    """Each stage's passes under ZB-H1, as `strategies/zero_bubble.py` and `strategies/planned.py` order
    them (Zero Bubble's heuristic, `dist_lib/schedules/zero_bubble.py`, at most p microbatches awaiting W) from
    the stages' forward, input-gradient and weight-gradient seconds and each boundary's crossing `comm[s]`
    (`messages.schedule_crossing`; none: 0): the heuristic itself on the plain lists, without the
    schedule's actions."""
    return zb_orders(forward, inputs, weights, microbatches, len(forward), comm=comm)


_POSTED: dict = {}  # zero_bubble_posted's answers by (each stage's F, I, W and C seconds, microbatches)


def zero_bubble_posted(seconds: Sequence[dict[str, float]], microbatches: int
                       ) -> tuple[list[list[tuple[str, int]]], list[dict[tuple[str, int], int]]]:
    """(`zero_bubble_orders`, `posted_positions`) of stages of `seconds[s]` ("F", "I", "W", and "C" the
    crossing to stage s + 1, absent: 0), worked out once per set of stage times: candidates that differ
    only in what comes after the pipeline (ZeRO, the reductions) or in memory share them."""
    key = (tuple((t["F"], t["I"], t["W"], t.get("C", 0.0)) for t in seconds), microbatches)
    found = _POSTED.get(key)
    if found is None:
        forward, inputs, weights, comm = zip(*key[0])
        orders = zero_bubble_orders(forward, inputs, weights, microbatches, comm[:-1])
        if len(_POSTED) > 1 << 12:
            _POSTED.clear()
        found = _POSTED[key] = (orders, posted_positions(orders, seconds))
    return found


def zero_bubble_floor(forwards: list[float], backs: list[float], weights: list[float], m: int,
                       path: list[float]) -> float:
    """A floor under the end of stage 0's last pass in any ZB-H1 play-out: stage 0 runs all its passes,
    and for each stage s, the first microbatch's forwards and activations reach s, s runs every F and I
    and, before its last F, all but p of its weight-gradient passes (at most p microbatches await their W,
    `zero_bubble_orders`), and the last microbatch's input gradient comes back to stage 0 after them
    (`path[s]`: the first activation's crossing from s to s + 1 and a gradient's back, each at its time
    alone)."""
    floor = m * (forwards[0] + backs[0])
    held = max(0, m - len(forwards))  # W passes a stage must run before its last F
    before = 0.0  # the forwards, input-gradient passes and crossings of the stages before s
    for s, (f, b, w) in enumerate(zip(forwards, backs, weights)):
        floor = max(floor, before + m * (f + b - w) + held * w)
        before += f + b - w + (path[s] if s < len(path) else 0.0)
    return floor


def _source(orders: Sequence[Order], s: int, kind: str, mb: int, split: bool) -> tuple[int, str, int] | None:
    """The pass whose output the pass (s, kind, mb) takes in from another stage, if any."""
    if kind == "F" and s > 0:
        return s - 1, "F", mb
    if kind in ("B", "I") and s < len(orders) - 1:
        return s + 1, "I" if split else "B", mb
    return None


def posted_positions(orders: Sequence[Order], seconds: Sequence[dict[str, float]]) -> list[dict[tuple[str, int], int]]:
    """ZB-H1: for each stage, {pass that takes an input from another stage: the number of the stage's passes
    before which its receive is posted}, where `strategies/zero_bubble.py` posts it
    (`strategies/_early_receives.with_posted_receives` on the same orders and pass seconds)."""
    split = any(kind == "I" for kind, _ in orders[0])
    takes = {"PA": "F", "PG": "I" if split else "B"}
    out = []
    for order in with_posted_receives([[Action(kind, 0, mb) for kind, mb in order] for order in orders], seconds):
        at: dict[tuple[str, int], int] = {}
        passes = 0
        for kind, _, mb in order:
            if kind in takes:
                at[takes[kind], mb] = passes
            else:
                passes += 1
        out.append(at)
    return out


def play_alone(orders: Sequence[Order], seconds: Sequence[dict[str, float]], onward: Sequence[float],
               back: Sequence[float], posts: Sequence[dict[tuple[str, int], int]] | None = None
               ) -> tuple[dict[tuple[int, str, int], float], dict[Crossing, list[tuple[float, float]]]]:
    """(each pass's end by (stage, kind, microbatch), each crossing's (start, end) per microbatch by
    (sender, receiver)) of the play-out the module describes with every crossing alone: `seconds[s][kind]`
    a pass of stage s, `onward[s]` (the first microbatch's, a later one's) crossing of the activation from
    s to s + 1, `back[s]` the same of the gradient from s + 1 to s. A backward ("B") or input-gradient pass
    ("I") sends the gradient on; a weight-gradient pass ("W") sends nothing. Without `posts` a receive is
    posted as the pass that takes it begins; with them (`posted_positions`), as the stage begins the pass
    they name, and a crossing then also waits for the one before it between the same two stages."""
    pp = len(orders)
    split = any(kind == "I" for kind, _ in orders[0])
    ends: dict[tuple[int, str, int], float] = {}
    spans: dict[Crossing, list[tuple[float, float]]] = {}
    position, clock = [0] * pp, [0.0] * pp
    reached: list[list[float]] = [[] for _ in range(pp)]  # with posts: each stage's clock as each pass begins
    left = sum(map(len, orders))
    while left:
        moved = 0
        for s, order in enumerate(orders):
            k, t, own = position[s], clock[s], seconds[s]
            while k < len(order):
                kind, mb = order[k]
                source = _source(orders, s, kind, mb, split)
                if posts is not None:
                    reached[s].append(t)
                if source is not None:
                    sent = ends.get(source)
                    if sent is None:
                        if posts is not None:
                            reached[s].pop()
                        break
                    crossing = (onward[s - 1] if kind == "F" else back[s])[mb > 0]
                    pair = (s - 1, s) if kind == "F" else (s + 1, s)
                    went = spans.setdefault(pair, [])
                    if posts is None:
                        start = sent if sent > t else t
                        t = start + crossing
                    else:
                        start = max(sent, reached[s][posts[s][kind, mb]], went[-1][1] if went else 0.0)
                        t = max(t, start + crossing)
                    went.append((start, start + crossing))
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
              steady: dict[Crossing, tuple[float, float]],
              posts: Sequence[dict[tuple[str, int], int]] | None = None) -> tuple[float, float]:
    """(the end of stage 0's last pass with every crossing alone, the same with the crossings of `pairs`
    (`shared_links`) sharing their links), the stages running `orders` with `seconds[s][kind]` a pass
    of stage s and their receives posted as `play_alone` says (`posts`); the two are one figure when no
    two crossings of `pairs` overlap alone. The first microbatch crosses with every sender ready at once
    (`crossing_seconds`), the later ones as `steady[s, s + 1]` gives (activation, gradient) seconds
    (`step.steady_crossings`)."""
    pp = len(placed)
    onward = [(crossing_seconds(cluster, workload, placed[s][1], placed[s + 1][1]), steady[s, s + 1][0])
              for s in range(pp - 1)]
    back = [(crossing_seconds(cluster, workload, placed[s + 1][1], placed[s][1]), steady[s, s + 1][1])
            for s in range(pp - 1)]
    ends, spans = play_alone(orders, seconds, onward, back, posts)
    alone = ends[(0, *orders[0][-1])]
    shared: set[int] = set()
    for pair, links in pairs.items():
        x, y = tuple(pair)
        if x in spans and y in spans and _overlap(spans[x], spans[y]):
            shared |= links
    if not shared:
        return alone, alone
    return alone, _played(cluster, workload, placed, orders, seconds, onward, back, shared, posts)


def _played(cluster: Cluster, workload: Workload, placed: Sequence[tuple[int, StageOption]],
            orders: Sequence[Order], seconds: Sequence[dict[str, float]], onward: Sequence[float],
            back: Sequence[float], shared: set[int], posts: Sequence[dict[tuple[str, int], int]] | None = None
            ) -> float:
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
    last: dict[Crossing, int] = {}  # with posts: the job of each pair's latest crossing so far
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
            if posts is not None:
                # the crossing, after the sending pass, the post (the end of the pass before the one the
                # receive is posted before) and the pair's crossing before it; then the pass, after it
                at = posts[s][kind, mb]
                waits = (source,) + ((mine[order[at - 1]],) if at else ()) + \
                    ((last[sender, s],) if (sender, s) in last else ())
                crossing = last[sender, s] = len(jobs)
                jobs.append(Job(alone * own, usage, 0.0, waits, top) if usage else Job(alone, (), 0.0, waits))
                jobs[me] = Job(own_seconds[kind], (), 0.0, (crossing, *before))
            elif usage:
                # the crossing, after the sending pass and the receiving stage's pass before this one, and
                # then the pass it feeds, as one job
                jobs[me] = Job(alone * own, usage, 0.0, (source, *before), top, own_seconds[kind])
            else:
                jobs[me] = Job(alone + own_seconds[kind], (), 0.0, (source, *before))
    return play(jobs, tails.capacity)[slot[0][tuple(orders[0][-1])]]

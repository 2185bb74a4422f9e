"""What follows each stage's last backward in the estimate: the data-parallel gradient reductions, the
optimizer step and (ZeRO-1) the all-gather of the updated weights, and where they meet other
transfers on a link.

As the simulator runs it (`strategies/_pipeline.py`), each layer's gradient reduction is issued when
the last microbatch's backward passes the layer, last layer first, and the reductions run one after
another on the stage's data-parallel stream (the t groups of a stage with TP degree t side by side);
the updates follow the schedule in the same order, each once its layer is reduced, and under ZeRO-1
each layer's all-gather queues behind every reduce-scatter of the group and behind its update.

Alone, a stage's reductions end at the latest, over its layers l, of l's backward end plus the
reductions of l and of every layer the backward reaches after it (`lag`). Where they cross links that
other transfers of the tail cross (another stage's reductions on a node's shared NICs, when two stages
sit on one node; the last gradients crossing out of the stage on its own NICs or ports), the tail is
played out as the simulator would (`sharing.play`): from the last stage's last send, each last gradient
crossing into the stage before it (one job wanting what its receiving ranks' first pieces want, at
its time alone), that stage's last backward, and every stage's reductions as one job released where
its reductions start and wanting its groups' bandwidth (`Cluster.collective_usage`).
"""

from __future__ import annotations

from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload
from dist_lib.planner.messages import crossing_seconds, crossing_usage
from dist_lib.planner.sharing import Job, PerCluster, play
from dist_lib.planner.stage_option import StageOption, no_collective



def lag(o: StageOption, start: int, stop: int, split: bool = False) -> float:
    """Seconds from the end of a stage's last pass (layers start..stop-1) to the end of its gradient
    reductions run alone (0 for a stage of one replica). The last pass is the last backward, or with a
    split backward (`split`, ZB-H1) the last weight-gradient pass; it leaves layer l when layers
    start..l-1 are left. Alike layers make the lag linear in l past the first layer, so its largest is
    at an end."""
    c, reduced = o.costs, o.reduced
    if o.reduce is no_collective:
        return 0.0
    passes = c.weight if split else c.backward
    b0, r0 = passes[start], reduced[start]
    layers = (start, start + 1, stop - 1) if o.alike and stop - start > 2 else range(start, stop)
    return max(reduced[l + 1] - r0 - (passes[l] - b0) for l in layers)


def after_reductions(o: StageOption, start: int, stop: int, reduced_by: float) -> float:
    """Seconds from the end of a stage's last backward to the end of its optimizer step when its
    reductions end `reduced_by` seconds after that backward: the last layer's update after them, or
    every update when they keep ahead (an expert stage's experts' updates after all of the dense ones);
    under ZeRO-1 the all-gathers behind both."""
    c = o.costs
    updates = c.update[stop] - c.update[start]
    if o.reduce is no_collective:
        return updates  # one replica: nothing to reduce
    if o.expert_updates:  # the dense updates in turn, each once reduced, then every layer's experts' update
        e = o.expert_updates
        experts = e[stop] - e[start]
        done = max(reduced_by + c.update[start + 1] - c.update[start] - (e[start + 1] - e[start]),
                   updates - experts) + experts
    else:
        done = max(reduced_by + c.update[start + 1] - c.update[start], updates)
    if o.regather is no_collective:
        return done
    grads = c.grad_bytes[stop] - c.grad_bytes[start]
    return max(reduced_by + o.regather(grads), done + o.regather(c.grad_bytes[start + 1] - c.grad_bytes[start]))


def after_backward(o: StageOption, start: int, stop: int, split: bool = False) -> float:
    """Seconds from the end of a stage's last pass to the end of its optimizer step, alone."""
    return after_reductions(o, start, stop, lag(o, start, stop, split))


def step_end(cluster: Cluster, workload: Workload, placed: list[tuple[int, StageOption]], backs: list[float],
             weights: list[float], pipeline: float, split: bool) -> float:
    """Seconds from the step's start to the end of its last optimizer step, when stage 0's last pass
    ends at `pipeline` and stage s's last backward takes `backs[s]`, of which `weights[s]` is the
    weight-gradient pass a split backward (`split`, ZB-H1) runs after sending its input gradient."""
    pp = len(placed)
    starts = [0]
    for n, _ in placed:
        starts.append(starts[-1] + n)
    # per stage: from the last gradient's arrival to the stage's last send, and from there to its end
    before = [b - w for b, w in zip(backs, weights)] if split else backs
    after = weights if split else [0.0] * pp
    returns = [crossing_seconds(cluster, workload, placed[s + 1][1], placed[s][1]) for s in range(pp - 1)]
    # stage s + 1 sent its last gradient that gradient's crossing and stage s's backward earlier
    sends = [pipeline - after[0]]
    for s in range(pp - 1):
        sends.append(sends[-1] - before[s] - returns[s])
    ends = [t + a for t, a in zip(sends, after)]
    lags = [lag(o, starts[s], starts[s + 1], split) for s, (_, o) in enumerate(placed)]
    shared = _shared(cluster, workload, placed, starts, sends, ends, returns, lags)
    if shared:
        # played out relative to the last stage's last send: the same stages, blocks and passes (1F1B and
        # interleaved of one partition) give the same tail
        played = _for_cluster(cluster).played
        key = (tuple(id(o) for _, o in placed), tuple(starts), tuple(before), tuple(after), id(workload))
        found = played.get(key)
        if found is None or any(a is not b for a, b in zip(found[0], placed)):
            found = played[key] = (tuple(o for _, o in placed),
                                   *_played(cluster, workload, placed, starts, before, after, lags, 0.0, shared))
        ends, lags = [sends[-1] + e for e in found[1]], found[2]
    return max(e + after_reductions(o, starts[s], starts[s + 1], lags[s]) for s, (e, (_, o)) in
               enumerate(zip(ends, placed)))


def _shared(cluster: Cluster, workload: Workload, placed: list[tuple[int, StageOption]], starts: list[int],
            sends: list[float], ends: list[float], returns: list[float], lags: list[float]) -> set[int]:
    """Links that a stage's reductions cross while, run alone, another transfer of the tail crosses them
    too (another stage's reductions, a last gradient crossing); none when the tail's transfers keep to
    links of their own or to times of their own."""
    windows = []  # (start, end, links) of every stage's reductions alone, then of each last crossing
    for s, (_, o) in enumerate(placed):
        if lags[s]:
            total = o.reduced[starts[s + 1]] - o.reduced[starts[s]]
            windows.append((ends[s] + lags[s] - total, ends[s] + lags[s], _usage(cluster, o)[1]))
    if not windows:
        return set()
    reducing = len(windows)
    for s in range(1, len(placed)):
        links = crossing_usage(cluster, workload, placed[s][1], placed[s - 1][1])[1]
        windows.append((sends[s], sends[s] + returns[s - 1], links))
    shared: set[int] = set()
    for i in range(reducing):
        lo, hi, links = windows[i]
        for j in range(i + 1, len(windows)):
            other = windows[j]
            if other[0] < hi and lo < other[1]:
                shared |= links & other[2]
    return shared


def _played(cluster: Cluster, workload: Workload, placed: list[tuple[int, StageOption]], starts: list[int],
            before: list[float], after: list[float], lags: list[float], last_send: float,
            shared: set[int]) -> tuple[list[float], list[float]]:
    """(each stage's last pass end, its reductions' end after it) with the tail's transfers sharing
    their links, from the last stage's last send at `last_send`."""
    tails = _for_cluster(cluster)
    capacity, shared = tails.capacity, tails.interned(shared)
    pp = len(placed)
    # per stage, the jobs marking the last gradient's arrival, the stage's last send and its end
    begins, sends, ends, reductions = [0] * pp, [0] * pp, [0] * pp, [-1] * pp
    jobs: list[Job] = [Job(0.0, (), last_send - before[-1])]
    for s in range(pp - 1, -1, -1):
        o = placed[s][1]
        sends[s], ends[s] = len(jobs), len(jobs) + 1
        jobs += [Job(0.0, (), before[s], (begins[s],)), Job(0.0, (), before[s] + after[s], (begins[s],))]
        if lags[s]:
            total = o.reduced[starts[s + 1]] - o.reduced[starts[s]]
            usage, own, top = tails.split(_usage(cluster, o)[0], shared)
            reductions[s] = len(jobs)
            # they start `total` before they end alone, `lag` after the last pass ends; at full speed they
            # take less than alone, where their own groups share links
            jobs.append(Job(total * own, usage, before[s] + after[s] + lags[s] - total, (begins[s],), top))
        if s == 0:
            break
        usage, own, top = tails.crossing(cluster, workload, o, placed[s - 1][1], shared)
        jobs.append(Job(crossing_seconds(cluster, workload, o, placed[s - 1][1]) * own, usage, 0.0, (sends[s],), top))
        begins[s - 1] = len(jobs)
        jobs.append(Job(0.0, (), 0.0, (len(jobs) - 1,)))  # the last gradient is in: stage s - 1's last backward
    times = play(jobs, capacity)
    return [times[ends[s]] for s in range(pp)], [times[reductions[s]] - times[ends[s]] if reductions[s] >= 0
                                                 else 0.0 for s in range(pp)]


def _split(usage: tuple[tuple[int, int], ...], over: tuple[tuple[int, float], ...],
           shared: frozenset[int]) -> tuple[tuple[tuple[int, int], ...], float, float]:
    """(its usage of the shared links, its speed alone, the speed its other links allow) of a job,
    given the (link, capacity / rate) of the links it asks more of than they carry (`over`): the links
    no other job of the tail crosses only cap its speed, so `play` need not add them up."""
    own = top = 1.0
    for link, share in over:
        own = min(own, share)
        if link not in shared:
            top = min(top, share)
    return tuple(pair for pair in usage if pair[0] in shared), own, top


class _Tails:
    """What the tail's estimate works out once per cluster: its link capacities; each stage's reduction
    usage and links by (ranks, TP degree); the tails played out (holding their stage options, so that
    their ids stay theirs); the sets of shared links met, one object each, so that a set met again is
    found by identity; and each job's `_split` by the identity of its usage and of the shared set
    (holding the usage). Few sets of shared links recur across thousands of candidates."""

    __slots__ = ("capacity", "usages", "played", "shared_sets", "splits", "over")

    def __init__(self, cluster: Cluster):
        self.capacity = cluster.link_capacities()
        self.usages: dict = {}
        self.played: dict = {}
        self.shared_sets: dict[frozenset[int], frozenset[int]] = {}
        self.splits: dict = {}
        self.over: dict = {}  # the links each usage asks more of than they carry, by its identity

    def interned(self, shared: set[int]) -> frozenset[int]:
        frozen = frozenset(shared)
        return self.shared_sets.setdefault(frozen, frozen)

    def split(self, usage: tuple[tuple[int, int], ...],
              shared: frozenset[int]) -> tuple[tuple[tuple[int, int], ...], float, float]:
        """`_split` of a usage by a set from `interned`, once per pair."""
        key = (id(usage), id(shared))
        found = self.splits.get(key)
        if found is None or found[0] is not usage or found[1] is not shared:
            over = self.over.get(id(usage))
            if over is None or over[0] is not usage:
                capacity = self.capacity
                over = self.over[id(usage)] = (usage, tuple((link, capacity[link] / rate) for link, rate in usage
                                                            if rate > capacity[link]))
            found = self.splits[key] = (usage, shared, _split(usage, over[1], shared))
        return found[2]

    def crossing(self, cluster: Cluster, workload: Workload, sender: StageOption, receiver: StageOption,
                 shared: frozenset[int]) -> tuple[tuple[tuple[int, int], ...], float, float]:
        """(usage, own, top) of a crossing from `sender` to `receiver` as one job on the `shared` links:
        what its receiving ranks' first pieces want of them (`split`, its time alone times `own` counting
        its own messages' sharing), or nothing, ((), 1.0, 1.0), where it crosses none of them."""
        usage, links = crossing_usage(cluster, workload, sender, receiver)
        return self.split(usage, shared) if not links.isdisjoint(shared) else ((), 1.0, 1.0)


_for_cluster: PerCluster[_Tails] = PerCluster(_Tails)


def _usage(cluster: Cluster, o: StageOption) -> tuple[tuple[tuple[int, int], ...], frozenset[int]]:
    """(link, bytes/s) the stage's data-parallel groups (one per tensor rank) want together, and those
    links."""
    usages = _for_cluster(cluster).usages
    key = (o.ranks, o.tp)
    found = usages.get(key)
    if found is None:
        total: dict[int, int] = {}
        for j in range(o.tp):
            for link, rate in cluster.collective_usage(o.ranks[j::o.tp]):
                total[link] = total.get(link, 0) + rate
        found = usages[key] = (tuple(total.items()), frozenset(total))
    return found

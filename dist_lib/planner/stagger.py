"""When the replicas of two neighbouring stages send in the steady state, for the estimate of a crossing.

The estimate first timed a crossing with every sending replica ready at once (`messages.drain`). That is
how the first microbatch crosses, and how replicas that cost alike cross throughout. Replicas that cost
differently (uneven shares of a microbatch, or a stage that mixes device types) do not stay together:
each runs its own passes and waits only for the messages it takes (`strategies/planned.py`), so a
faster replica sends earlier, the replicas that take its messages start earlier, and so on around the
pipeline's loop. In the simulator, twelve A10 replicas of 6 and 5 samples beside four A100 replicas
(FASOP's cloud) settle into two waves about 9.5 ms apart, the difference of the two replica times
(8.9 ms); each wave shares the A100 node's NIC only with itself and takes about half as long as all
twelve at once (6.8 ms against 13.6 ms).

Model (a max-plus fixed point, as for any timed event graph; Baccelli et al., "Synchronization and
Linearity", 1992, ch. 3): across a boundary between stages a and b, a-replica i sends its activation at
`on[i]` and b-replica j its gradient at `back[j]`, relative to the slowest; i sends one pass of its own
after the last gradient it takes has been sent, j one pass after the last activation it takes:

    on[i] = slack_a[i] + max(back[j] for the j that send to i)
    back[j] = slack_b[j] + max(on[i] for the i that send to j)

with slack = a replica's time per microbatch less its stage's slowest (<= 0). The loop that paces the
boundary is the pair of replicas exchanging messages whose slacks sum highest; every replica a chain of
messages binds to it sits at a finite offset, and replicas bound to it by none drift away without end
(a faster pipeline of their own, held back only by the step's end) and are left out of the crossing.
Left out too: the moment a receiver posts its receive, and the stages beyond the two neighbours. The
first microbatch still crosses with every sender ready at once (`step.step_estimate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf
from typing import TYPE_CHECKING

from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload
from dist_lib.planner.messages import crossing_seconds, feeds, steady_crossing_seconds
from dist_lib.planner.sharing import PerCluster

if TYPE_CHECKING:
    from dist_lib.planner.stage_option import StageOption


def slack(o: StageOption, start: int, stop: int, last: bool) -> tuple[float, ...]:
    """Per replica of a stage holding layers start..stop-1: its seconds per microbatch (forward and
    backward, and the loss on the last stage) less the slowest replica's; () when all cost alike."""
    if not o.replica_costs:
        return ()
    kinds: dict[tuple[int, float], float] = {}  # a stage's replicas are of a few kinds: each worked out once
    times = []
    for c, loss in zip(o.replica_costs, o.replica_loss):
        t = kinds.get((id(c), loss))
        if t is None:
            t = kinds[id(c), loss] = c.total[stop] - c.total[start] + (loss if last else 0.0)
        times.append(t)
    top = max(times)
    if all(t == top for t in times):
        return ()
    return tuple(t - top for t in times)


def phases(slack_a: Sequence[float], slack_b: Sequence[float], into_b: Sequence[Sequence[int]],
           into_a: Sequence[Sequence[int]]) -> tuple[list[float], list[float]]:
    """(on, back) of the model above: `into_b[j]` the a-replicas whose activations b-replica j takes,
    `into_a[i]` the b-replicas whose gradients a-replica i takes; -inf for a replica that drifts away.

    The loop that paces the boundary is the pair (i, j) exchanging messages whose slacks sum highest (a
    longer loop's mean is the mean of its pairs', Baccelli et al. sec. 3.7); relative to that pair's
    slacks it costs nothing, and the offsets are the longest paths from the replicas of such pairs, found
    by relaxing every message in turn until none moves them (Bellman-Ford: no loop gains, so at most a
    round per replica). Replicas no path reaches keep -inf."""
    pairs = [(i, j) for j, feeders in enumerate(into_b) for i in feeders if j in into_a[i]]
    if not pairs:
        return [0.0] * len(slack_a), [0.0] * len(slack_b)
    top = max(slack_a[i] + slack_b[j] for i, j in pairs)
    first = next((i, j) for i, j in pairs if slack_a[i] + slack_b[j] == top)
    weight_a = [v - slack_a[first[0]] for v in slack_a]
    weight_b = [v - slack_b[first[1]] for v in slack_b]
    on, back = [-inf] * len(slack_a), [-inf] * len(slack_b)
    for i, j in pairs:
        if slack_a[i] + slack_b[j] == top:
            on[i] = back[j] = 0.0
    for _ in range(len(on) + len(back) + 1):
        moved = False
        for j, feeders in enumerate(into_b):
            best = weight_b[j] + max([on[i] for i in feeders])
            if best > back[j]:
                back[j], moved = best, True
        for i, feeders in enumerate(into_a):
            best = weight_a[i] + max([back[j] for j in feeders])
            if best > on[i]:
                on[i], moved = best, True
        if not moved:
            break
    return on, back


def boundary_seconds(cluster: Cluster, workload: Workload, a: StageOption, b: StageOption,
                     slack_a: tuple[float, ...], slack_b: tuple[float, ...]) -> tuple[float, float]:
    """(activation, gradient) seconds of one microbatch's steady-state crossing between neighbouring
    stages a and b whose replicas have the slacks given (`slack`; () where they cost alike): every
    sender ready at once (`crossing_seconds`) where both stages' replicas cost alike, else each replica
    sending at its offset (`phases`, `messages.steady_crossing_seconds`). Worked out once per pair of
    stage options and slacks: the search estimates the same blocks again and again."""
    if not slack_a and not slack_b:
        return crossing_seconds(cluster, workload, a, b), crossing_seconds(cluster, workload, b, a)
    seen = _seen(cluster)
    pair = seen.get((id(a), id(b)))
    if pair is None or pair[0] is not a or pair[1] is not b or pair[2] is not workload:
        if len(seen) > 1 << 14:
            seen.clear()
        pair = seen[id(a), id(b)] = (a, b, workload, feeds(cluster, workload, a, b), feeds(cluster, workload, b, a),
                                     {})
    found = pair[5].get((slack_a, slack_b))
    if found is None:
        on, back = phases(slack_a or (0.0,) * (len(a.ranks) // a.tp), slack_b or (0.0,) * (len(b.ranks) // b.tp),
                          pair[3], pair[4])
        found = pair[5][slack_a, slack_b] = (steady_crossing_seconds(cluster, workload, a, b, on),
                                             steady_crossing_seconds(cluster, workload, b, a, back))
    return found


# per cluster, by the identities of a pair of stage options: (a, b, workload, the a-replicas each b-replica
# takes activations from, the b-replicas each a-replica takes gradients from, seconds by their slacks)
_seen: PerCluster[dict] = PerCluster(lambda cluster: {})

"""Transfers that share links, played out as the simulator plays them, for the estimate.

The simulator moves every message and collective as a flow (`engine/transfers.py`): a transfer wants some
bytes/s on each link it crosses (`Cluster.p2p_usage`, `Cluster.collective_usage`), a link asked for
more than it carries gives each transfer on it the share capacity / load of what it wants, and a
transfer moves at its share of its most loaded link (`network.shared_speed`), recomputed whenever a
transfer starts or ends (a flow-level model with proportional shares; Velho et al. 2013). The
estimate needs that model where a few transfers overlap: the messages of one pipeline crossing, and
after the last backward the gradient reductions of stages that meet on a node's NICs, beside the last
gradients crossing between stages. `play` runs it for a handful of jobs, each started at a time of its
own or some seconds after another job ends.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from dist_lib.costs import network
Usage = tuple[tuple[int, int], ...]  # (link id, bytes/s wanted), as `Cluster.p2p_usage` gives them


class Job(NamedTuple):
    """A transfer of `seconds` at full speed wanting `usage` on its links (none: a wait that shares
    nothing); it starts at `start`, or, when `after` names earlier jobs of the list, `start` seconds
    after the last of them ends. Links only it crosses may be left out of `usage` and given as `top`.
    (A named tuple: the estimate makes hundreds of thousands of them.)"""

    seconds: float
    usage: Usage = ()
    start: float = 0.0
    after: tuple[int, ...] = ()
    top: float = 1.0  # the share of its speed its other links (ones no other job crosses) allow
    then: float = 0.0  # seconds it goes on for after the transfer, sharing nothing (the pass a message feeds)


def play(jobs: Sequence[Job], capacity: Sequence[int]) -> list[float]:
    """The time each job ends, jobs in flight sharing their links in proportion to what they want.

    Only jobs that name links share anything and need playing out in time order. A job that names none
    runs at its fixed speed `top`, so it ends its seconds after the last job it waits for, whenever that
    is worked out: such jobs are settled at once, in the order their waits end, and only the transfers
    step through time (a pipeline play-out has a pass of every stage beside a few crossings that share a
    NIC)."""
    ends = [0.0] * len(jobs)
    followers: dict[int, list[int]] = {}
    waiting = [len(job.after) for job in jobs]  # jobs each still waits for
    latest = [-math.inf] * len(jobs)  # the latest end of the jobs each waits for, so far
    ready: list[tuple[float, int]] = []  # (start, job) of transfers that share links, whose start is known
    due: list[tuple[float, int]] = []  # (start, job) of jobs whose start is known, not yet settled
    for k, job in enumerate(jobs):
        if not job.after:
            due.append((job.start, k))
        for before in job.after:
            followers.setdefault(before, []).append(k)

    def release(k: int, end: float) -> None:
        """Job k ends at `end`: its followers that waited for it last start `start` seconds after the
        latest of their waits (a negative `start`, none: a job starts no earlier than what it waits for)."""
        for f in followers.get(k, ()):
            waiting[f] -= 1
            if end > latest[f]:
                latest[f] = end
            if not waiting[f]:
                start = jobs[f].start
                due.append((latest[f] + start if start > 0.0 else latest[f], f))

    def settle() -> None:
        """Jobs whose start is known: transfers that share links to `ready`, the others ended."""
        while due:
            begin, k = due.pop()
            job = jobs[k]
            if job.seconds > 0.0 and job.usage:
                heapq.heappush(ready, (begin, k))
                continue
            end = ends[k] = begin + job.seconds / job.top + job.then if job.seconds > 0.0 or job.then else begin
            release(k, end)

    settle()
    flying: dict[int, float] = {}  # job sharing links -> seconds left at full speed
    speeds: dict[int, float] = {}  # job in flight -> the share of its full speed it gets
    load = [0] * len(capacity)  # bytes/s the jobs in flight want on each link (a list: it is read most)
    moved = False  # whether the loads changed since the speeds were worked out
    now = ready[0][0] if ready else 0.0
    while ready or flying:
        while ready and ready[0][0] <= now:
            k = heapq.heappop(ready)[1]
            job = jobs[k]
            flying[k] = job.seconds
            speeds[k] = job.top
            for link, rate in job.usage:
                load[link] += rate
            moved = True
        if not flying:
            now = ready[0][0]
            continue
        if moved:
            for k in flying:
                speeds[k] = min(jobs[k].top, network.shared_speed(jobs[k].usage, capacity, load))
            moved = False
        step = min(left / speeds[k] for k, left in flying.items())
        until = now + step  # (a step below the clock's resolution still ends its job)
        if ready and ready[0][0] < until:
            until = ready[0][0]  # a start changes the shares before any job ends
            step = until - now
        done = []
        for k, left in flying.items():
            if left / speeds[k] <= step * (1 + 1e-12):
                done.append(k)
            else:
                flying[k] = left - step * speeds[k]
        now = until
        for k in done:
            del flying[k], speeds[k]
            for link, rate in jobs[k].usage:
                load[link] -= rate
            moved = True
            ends[k] = now + jobs[k].then if jobs[k].then else now
            release(k, ends[k])
        settle()  # what they release starts no earlier than now
    return ends


T = TypeVar("T")


class PerCluster(Generic[T]):
    """What the estimate works out once per cluster, made by `make(cluster)` on first use and found again by
    the cluster's identity (hashing a cluster of many nodes costs more than what is looked up); each entry
    holds its cluster, so that its id is not reused while the entry lives; the last few clusters are kept."""

    __slots__ = ("make", "kept", "entries")

    def __init__(self, make: Callable[[Any], T], kept: int = 8):
        self.make, self.kept = make, kept
        self.entries: dict[int, tuple[Any, T]] = {}

    def __call__(self, cluster: Any) -> T:
        entry = self.entries.get(id(cluster))
        if entry is None:
            if len(self.entries) >= self.kept:
                self.entries.clear()
            entry = self.entries[id(cluster)] = (cluster, self.make(cluster))
        return entry[1]

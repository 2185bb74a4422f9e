"""Transfers that share links, played out as the simulator plays them, for the estimate.

The simulator moves every message and collective as a flow (`transfers.py`): a transfer wants some
bytes/s on each link it crosses (`Cluster.p2p_usage`, `Cluster.collective_usage`), a link asked for
more than it carries gives each transfer on it the share capacity / load of what it wants, and a
transfer moves at its share of its most loaded link (`costs.shared_speed`), recomputed whenever a
transfer starts or ends (a flow-level model with proportional shares; Velho et al. 2013). The
estimate needs that model where a few transfers overlap: the messages of one pipeline crossing, and
after the last backward the gradient reductions of stages that meet on a node's NICs, beside the last
gradients crossing between stages. `play` runs it for a handful of jobs, each started at a time of its
own or some seconds after another job ends.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from .. import costs

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

    Only jobs that name links share anything; a job that names none runs at its fixed speed `top`, so its
    end is known as it starts and waits in a heap of ends: a step costs the jobs that share links in
    flight, not every job in flight (a pipeline play-out has a pass of every stage in flight beside a
    few crossings that share a NIC)."""
    ends = [0.0] * len(jobs)
    followers: dict[int, list[int]] = {}
    waiting = [len(job.after) for job in jobs]  # jobs each still waits for
    ready: list[tuple[float, int]] = []  # (start, job) of jobs whose start is known
    for k, job in enumerate(jobs):
        if not job.after:
            ready.append((job.start, k))
        for before in job.after:
            followers.setdefault(before, []).append(k)
    heapq.heapify(ready)
    timed: list[tuple[float, int]] = []  # (end, job) of jobs in flight that share no link
    flying: dict[int, float] = {}  # job sharing links -> seconds left at full speed
    speeds: dict[int, float] = {}  # job in flight -> the share of its full speed it gets
    load = [0] * len(capacity)  # bytes/s the jobs in flight want on each link (a list: it is read most)
    moved = False  # whether the loads changed since the speeds were worked out
    due: list[int] = []  # jobs that start now (released with no delay: most of them)
    now = ready[0][0] if ready else 0.0

    def release(k: int) -> None:
        """Job k ended at `now`: its followers that waited for it last start `start` seconds later."""
        for f in followers.get(k, ()):
            waiting[f] -= 1
            if not waiting[f]:
                if jobs[f].start:
                    heapq.heappush(ready, (now + jobs[f].start, f))
                else:
                    due.append(f)

    while ready or flying or timed or due:
        while ready and ready[0][0] <= now:
            due.append(heapq.heappop(ready)[1])
        while due:
            k = due.pop()
            job = jobs[k]
            if job.seconds > 0.0 and job.usage:
                flying[k] = job.seconds
                speeds[k] = job.top
                for link, rate in job.usage:
                    load[link] += rate
                moved = True
            elif job.seconds > 0.0 or job.then:
                heapq.heappush(timed, (now + job.seconds / job.top + job.then, k))
            else:
                ends[k] = now
                release(k)
        if not flying:
            # only fixed-speed jobs in flight: on to the next end or start
            if timed and not (ready and ready[0][0] < timed[0][0]):
                now = timed[0][0]
                while timed and timed[0][0] <= now:
                    k = heapq.heappop(timed)[1]
                    ends[k] = now
                    release(k)
            elif ready:
                now = ready[0][0]
            continue
        if moved:
            for k in flying:
                speeds[k] = min(jobs[k].top, costs.shared_speed(jobs[k].usage, capacity, load))
            moved = False
        step = min(left / speeds[k] for k, left in flying.items())
        until = now + step  # (a step below the clock's resolution still ends its job)
        if timed and timed[0][0] < until:
            until = timed[0][0]
            step = until - now
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
            if jobs[k].then:
                heapq.heappush(timed, (now + jobs[k].then, k))
            else:
                ends[k] = now
                release(k)
        while timed and timed[0][0] <= now:
            k = heapq.heappop(timed)[1]
            ends[k] = now
            release(k)
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

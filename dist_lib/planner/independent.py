"""The messages of a crossing in sets that share no link with one another, and which sets are alike.

A crossing's messages (`messages.py`) are chains, one per receiving rank, each message wanting some
bytes/s on the links it crosses. Two chains that cross a common link may slow each other down; two that
do not never meet, whatever the timing: a transfer's speed is set by the loads of its own links alone
(`network.shared_speed`). So the chains fall into components, the sets joined by common links, and in
`sharing.play` the ends of one component's messages do not depend on any other component.

On a data-parallel stage of many replicas most components are alike: the same messages, in the same
order, wanting the same rates of links of the same capacities, only the links' ids differ (replica r's
ranks and NICs instead of replica 0's). Alike components end at the same times: `play` steps all jobs
in flight by the least time any one of them needs, and alike components, started alike, ask the same
steps and make the same arithmetic, bit for bit, at every step. Playing one component of each class
(all of them together, so that the steps are the steps the full play takes) therefore gives exactly
the ends the full play gives for those components, and the latest end over all of them. A stage of 256
alike replicas crosses as one component, not as 256 that `play` would step through together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Chain = tuple[tuple[tuple[tuple[int, int], ...], Any, float], ...]  # (usage, link, samples) in turn


def components(chains: Sequence[Chain], capacity: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
    """(class, chain indices) of each set of chains joined by common links, in the order of each set's
    first chain; sets of one class have the same messages in the same order (each message's rates, its
    link and samples) on links of the same capacities, their ids renumbered in order of first use."""
    parent = list(range(len(chains)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_user: dict[int, int] = {}  # link -> a chain that crosses it
    for i, chain in enumerate(chains):
        for usage, _, _ in chain:
            for link, _ in usage:
                other = first_user.setdefault(link, i)
                if other != i:
                    a, b = root(other), root(i)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
    members: dict[int, list[int]] = {}
    for i in range(len(chains)):
        members.setdefault(root(i), []).append(i)
    classes: dict[tuple, int] = {}
    out = []
    for indices in members.values():
        renumbered: dict[int, int] = {}
        shape = tuple(tuple((tuple((renumbered.setdefault(link, len(renumbered)), rate) for link, rate in usage),
                             link, samples) for usage, link, samples in chains[i]) for i in indices)
        key = (shape, tuple(capacity[link] for link in renumbered))
        out.append((classes.setdefault(key, len(classes)), tuple(indices)))
    return out


def one_of_each(found: list[tuple[int, tuple[int, ...]]], senders: Sequence[Sequence[int]] | None = None,
                ready: Sequence[float] | None = None) -> list[int]:
    """The chain indices of one component of each class (`components`); with `senders` (per chain, the
    sending replica of each message) and `ready` (each sending replica's start), of each class and
    starts of its messages' senders, since alike components whose senders start apart do not end alike."""
    seen: set = set()
    out: list[int] = []
    for cls, indices in found:
        key = cls if ready is None else (cls, tuple(ready[s] for i in indices for s in senders[i]))
        if key not in seen:
            seen.add(key)
            out += indices
    return out

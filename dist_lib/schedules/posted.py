"""Where a pipeline stage posts each receive: early, so that the crossing overlaps its compute (the rule of
the Zero Bubble reference implementation; `strategies/_early_receives.py` runs such orders and tells the
whole story)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from dist_lib.schedules.actions import Action
from dist_lib.schedules.timing import Times, replay


def with_posted_receives(orders: Sequence[Sequence[Action]], times: Times) -> list[list[Action]]:
    """The orders with a post action ("PA" activation, "PG" gradient, of a chunk and microbatch) placed on
    each receiving stage by the rule above; the pass that takes the message awaits that receive."""
    p = len(orders)
    last = p * (1 + max((a.chunk for order in orders for a in order), default=0)) - 1
    spans = replay(orders, times)
    stage_ends = [[end for _, end in stage] for stage in spans]
    posts: list[list[tuple[int, float, Action]]] = [[] for _ in range(p)]
    for s, order in enumerate(orders):
        for (kind, chunk, mb), (_, sent) in zip(order, spans[s]):
            v = chunk * p + s
            if kind == "F" and v < last:
                to, post = v + 1, "PA"
            elif kind in ("I", "B") and v > 0:
                to, post = v - 1, "PG"
            else:
                continue
            r = to % p
            if r == s:  # a stage hands the tensor to itself: nothing crosses
                continue
            posts[r].append((bisect_left(stage_ends[r], sent), sent, Action(post, to // p, mb)))
    result = []
    for s, order in enumerate(orders):
        before: dict[int, list[Action]] = {}
        for index, _, action in sorted(posts[s]):
            before.setdefault(index, []).append(action)
        merged: list[Action] = []
        for i, action in enumerate(order):
            merged += before.get(i, ())
            merged.append(action)
        result.append(merged)
    return result

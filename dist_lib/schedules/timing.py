"""A replay of a pipeline schedule from its stages' pass times: when each pass is predicted to start and end.

Each stage runs its order; a pass starts when its stage's previous pass has ended and its input has arrived:
its producing pass has ended and the producing stage's earlier outputs have crossed (one at a time over
its link), plus the crossing time of the boundary between the two stages if the stages differ (0 unless
given: then messages are free). Each pass takes its stage's profiled time. This is the
timing model a cost-aware order heuristic builds its orders with (Qi et al. 2023, sec. 3;
`zero_bubble.greedy_orders`, and the reference's `GraphConfig.cost_comm`), so the replay of its orders gives
back the times it predicted; it does not care which rule made the orders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dist_lib.schedules.actions import Action

Times = Sequence[Mapping[str, float]]  # stage -> {"F", "B", "I", "W"} -> seconds of one microbatch's pass;
# optionally "C" -> seconds of a message between stage s and stage s + 1 (modulo p for interleaved chunks)


def replay(orders: Sequence[Sequence[Action]], times: Times) -> list[list[tuple[float, float]]]:
    """Each pass's predicted (start, end), stage by stage in its order: a pass starts when its stage's
    previous pass has ended and its input has arrived (F: the previous virtual stage's F of the microbatch;
    B or I: the next virtual stage's B or I, or this stage's own F on the last one; W: its own I), that is
    when its producer has ended, or, from another stage, when the producer's stage has sent it after its
    earlier outputs, each taking `times[s].get("C", 0)` of the boundary it crosses (s the lower virtual
    stage's rank). Virtual stage of chunk c on stage s: c * p + s."""
    p = len(orders)
    last = p * (1 + max((a.chunk for order in orders for a in order), default=0)) - 1
    cross = [t.get("C", 0.0) if p > 1 else 0.0 for t in times]  # from virtual stage v to v + 1: cross[v % p]
    ends: dict[tuple[str, int, int], float] = {}  # ("F" | "G" | "W", virtual stage, microbatch) -> end
    sent: dict[tuple[str, int, int], float] = {}  # ("F" | "G", virtual stage, microbatch) -> crossed
    out_free = [0.0] * p  # when each stage's outgoing link has sent everything given to it so far
    spans: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    clock, done = [0.0] * p, [0] * p
    progress = True
    while progress:
        progress = False
        for s, order in enumerate(orders):
            i, now, duration = done[s], clock[s], times[s]
            while i < len(order):
                kind, chunk, mb = order[i]
                v = chunk * p + s
                if kind == "F":
                    made, ready = "F", (sent.get(("F", v - 1, mb)) if v > 0 else 0.0)
                    towards = v + 1 if v < last else None
                elif kind in ("I", "B"):
                    made, ready = "G", (sent.get(("G", v + 1, mb)) if v < last else ends.get(("F", v, mb)))
                    towards = v - 1 if v > 0 else None
                elif kind == "W":
                    made, ready, towards = "W", ends.get(("G", v, mb)), None
                else:
                    raise ValueError(f"schedule: stage {s} has {order[i]!r}, which a compute-only replay cannot "
                                     f"time (F, B, I and W only)")
                if ready is None:
                    break
                start = now if now > ready else ready
                now = start + duration[kind]
                ends[(made, v, mb)] = now
                if towards is not None:  # its output crosses after the stage's earlier messages, one at a time
                    leaves = now if now > out_free[s] else out_free[s]
                    out_free[s] = sent[(made, v, mb)] = leaves + cross[min(v, towards) % p]
                spans[s].append((start, now))
                i += 1
                progress = True
            done[s], clock[s] = i, now
    for s, order in enumerate(orders):
        if done[s] < len(order):
            raise ValueError(f"schedule: stage {s} waits forever at {order[done[s]]!r} (position {done[s]}): its "
                             f"input is produced by no pass that can run; the stages' orders disagree")
    return spans

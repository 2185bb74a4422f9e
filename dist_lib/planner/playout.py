"""Play-outs of pipeline schedules for the estimate, in plain arithmetic: 1F1B's warm-up and cool-down
(`one_f_one_b_pipeline`), and the interleaved 1F1B schedule: each chunk pass of each stage timed in
the order the stage issues it, from per-pass seconds and crossing seconds.

The order is Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2), as
`strategies/interleaved.py` builds it: a stage's k-th forward is chunk (k mod p v) // p of microbatch
(k // p v) p + k mod p, its k-th backward the same with the chunks reversed; stage s first runs
min((p - s - 1) x 2 + (v - 1) x p, m v) forwards (warm-up), then one forward and one backward in turn
(steady state), then the backwards left (cool-down). Chunk c of stage s is virtual stage j = c p + s.

Timing, as the simulator runs `strategies/_pipeline.py`: a pass starts once its stage has ended the pass
before it. A forward of virtual stage j > 0 receives its input from j - 1, a backward of j < p v - 1
its output gradient from j + 1; a point-to-point message is a rendezvous (`dist_lib/engine/core.py`): it moves
once both the send (issued as the sender's pass ends) and the receive (posted as the receiving pass
starts) are issued, so the receiving pass computes from max(its stage free, the sending pass's end) plus
the crossing. The first virtual stage's forwards embed their input and the last one's backwards start
from its own loss, neither waiting. What this leaves out: messages of different crossings sharing a link
at the same time (each crossing is timed alone, `messages.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

# (backward?, chunk, microbatch) of one stage's passes, in the order it issues them
Order = tuple[tuple[bool, int, int], ...]
Slots = tuple[int, ...]


def interleaved_order(stage: int, stages: int, microbatches: int, chunks: int) -> Order:
    """The passes stage `stage` of `stages` runs under interleaved 1F1B with `chunks` chunks a stage and
    `microbatches` microbatches (a multiple of `stages`), as `strategies/interleaved.py` issues them."""
    p, v, total = stages, chunks, microbatches * chunks

    def unit(k: int, backward: bool) -> tuple[bool, int, int]:
        group, within = divmod(k, p * v)
        chunk = within // p
        return backward, (v - 1 - chunk if backward else chunk), group * p + within % p

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [unit(k, False) for k in range(warmup)]
    for k in range(total - warmup):
        order += [unit(warmup + k, False), unit(k, True)]
    order += [unit(k, True) for k in range(total - warmup, total)]
    return tuple(order)


@lru_cache(maxsize=256)
def _program(stages: int, microbatches: int, chunks: int) -> tuple[Slots, Slots, Slots, Slots, int]:
    """Every pass of the step in one order that keeps each stage's order and puts each pass after the pass
    it waits for, as four index lists over one flat array of pass ends (a forward of virtual stage j and
    microbatch b at j m + b, its backward at (v p + j) m + b, then one slot that holds 0.0): the slot the
    pass writes, the slot of its stage's pass before it and of the pass whose output it waits for (the zero
    slot for none), and which of the 2 v p pass kinds it is (forward j as j, backward j as v p + j); and the
    slot of stage 0's last pass. It depends on the shape alone, so a search works it out once for all its
    candidates of that shape."""
    p, m = stages, microbatches
    virtual = p * chunks
    zero = 2 * virtual * m
    lanes = []  # per stage: (own, dep, kind) of its passes in its order
    for s in range(p):
        own_s, dep_s, kind_s = [], [], []
        for is_backward, chunk, mb in interleaved_order(s, p, m, chunks):
            j = chunk * p + s
            if is_backward:
                own_s.append((virtual + j) * m + mb)
                dep_s.append((virtual + j + 1) * m + mb if j < virtual - 1 else zero)
                kind_s.append(virtual + j)
            else:
                own_s.append(j * m + mb)
                dep_s.append((j - 1) * m + mb if j else zero)
                kind_s.append(j)
        lanes.append((own_s, dep_s, kind_s))
    own: list[int] = []
    prev: list[int] = []
    dep: list[int] = []
    kind: list[int] = []
    placed = [False] * zero + [True]
    position = [0] * p
    left = len(lanes[0][0]) * p
    while left:
        # each stage in turn takes its passes up to the first whose input no pass taken so far sends (a
        # pass waits on another stage's pass only: neighbouring virtual stages sit on different stages)
        moved = 0
        for s, (own_s, dep_s, kind_s) in enumerate(lanes):
            start = i = position[s]
            n = len(own_s)
            while i < n and placed[dep_s[i]]:
                i += 1
            if i == start:
                continue
            own += own_s[start:i]
            prev.append(own_s[start - 1] if start else zero)
            prev += own_s[start:i - 1]
            dep += dep_s[start:i]
            kind += kind_s[start:i]
            for slot in own_s[start:i]:
                placed[slot] = True
            moved += i - start
            position[s] = i
        if not moved:  # the order above never deadlocks; a wrong order would
            raise RuntimeError(f"interleaved play-out: no stage of {p} can run its next pass")
        left -= moved
    return tuple(own), tuple(prev), tuple(dep), tuple(kind), lanes[0][0][-1]


def play_interleaved(forward: Sequence[float], backward: Sequence[float], onward: Sequence[float],
                     back: Sequence[float], stages: int, microbatches: int) -> float:
    """Seconds from the step's start to the end of stage 0's last pass (its last chunk-0 backward).

    Per virtual stage j = c x stages + s (len(forward) = stages x chunks): `forward[j]`, `backward[j]` the
    seconds of one microbatch's pass; `onward[j]` the seconds from the moment the activation from j to
    j + 1 may move to the moment j + 1 may compute on it (the crossing, and the all-gather of TP pieces),
    `back[j]` the same for the gradient from j + 1 to j (the last entry of each is unused)."""
    p, m, virtual = stages, microbatches, len(forward)
    chunks = virtual // p
    if chunks * p != virtual or m % p or virtual < 2:
        raise ValueError(f"interleaved play-out: {virtual} virtual stages over {p} stages and {m} microbatches "
                         f"(needs a whole number of chunks a stage and microbatches a multiple of the stages)")
    # what each kind of pass adds to the later of its stage's clock and its input's send: the crossing (none
    # for the first virtual stage's forwards and the last one's backwards), then the pass
    step = [forward[0]] + [onward[j - 1] + forward[j] for j in range(1, virtual)] + \
        [back[j] + backward[j] for j in range(virtual - 1)] + [backward[-1]]
    own, prev, dep, kind, end = _program(p, m, chunks)
    done = [0.0] * (2 * virtual * m + 1)
    for o, a, b, d in zip(own, prev, dep, [step[k] for k in kind]):
        t, r = done[a], done[b]
        done[o] = (t if t > r else r) + d
    return done[end]


def one_f_one_b_pipeline(entries: list[float], exits: list[float], loop_pace: float, microbatches: int) -> float:
    """1F1B: seconds until stage 0's last backward ends, when stage s takes `entries[s]` a forward (its
    pass and the crossing into it) and `exits[s]` a backward (likewise) and the microbatches in flight
    pace the steady state at `loop_pace` at least.

    The closed form (m - 1) x slowest + the sum of all stage times counts every later stage's time once
    beside the slowest stage's m microbatches, as if that stage idled while the first microbatch went
    through them and back. But stage s runs min(m, p - s) = w forwards before its first backward and w
    backwards after its last forward (`strategies/one_f_one_b.py`): the w - 1 forwards after the first
    run while the first microbatch goes through the later stages and back, and the w - 1 backwards
    before the last while the last microbatch does. So both ends are played out: stage s's first
    backward starts once its warm-up forwards are done and stage s + 1's first backward has ended
    (`_first_backwards`), and, time reversed (backwards for forwards), stage 0's last backward ends
    once stage s's last forward has gone through the later stages and back and s's cool-down backwards
    and those of the stages before it are done. Paced by stage s's passes between the two, or by the
    loop (the first microbatch's round trip whole and each further one `loop_pace`); the step takes the
    longest of these paths. With the slowest stage last, or every stage alike, it is the closed form.
    O(p x min(m, p))."""
    m, pp = microbatches, len(entries)
    warmed, first = _first_backwards(entries, exits, m)
    _, ends = _first_backwards(exits, entries, m)  # time reversed: from stage s's last forward to the end
    longest = sum(entries) + sum(exits) + (m - 1) * loop_pace
    for s in range(pp):
        w = min(m, pp - s)
        # the backwards of the stages before s follow its last one; its passes between run back to back
        longest = max(longest, first[s] + (m - w) * entries[s] + (m - 1) * exits[s] + sum(exits[:s]))
        # stage s's last forward starts after its warm-up forwards (m = w) or its steady pairs
        last_forward = warmed[s] - entries[s] if m == w else \
            first[s] + (m - w - 1) * (exits[s] + entries[s])
        longest = max(longest, last_forward + ends[s])
    return longest


def _first_backwards(entries: list[float], exits: list[float], microbatches: int) -> tuple[list[float], list[float]]:
    """1F1B's warm-up, per stage from the step's start: (the end of its last warm-up forward, the end of
    its first backward). Stage s's k-th forward ends `entries[s]` after the later of its previous one
    and stage s - 1's k-th, for k up to min(m, p - s); its first backward `exits[s]` after the later of
    its last warm-up forward and stage s + 1's first backward."""
    pp, ends, upstream = len(entries), [], None
    for s in range(pp):
        t, row = 0.0, []
        for k in range(min(microbatches, pp - s)):
            t = (max(t, upstream[k]) if upstream else t) + entries[s]
            row.append(t)
        ends.append(t)
        upstream = row
    first, t = [0.0] * pp, 0.0
    for s in range(pp - 1, -1, -1):
        t = first[s] = max(ends[s], t) + exits[s]
    return ends, first

"""The layer partition of one grouping, and the memory a stage's block holds.

Partition: for a bound T on every stage's time per microbatch, the stages take layers greedily in pipeline
order, each as many as fit in T and in its memory, over its TP options; a binary search finds the least T
that places every layer. This is the bottleneck-optimal contiguous partition AMP and Metis find by
dynamic programming (Li et al. NeurIPS'22, sec. 4), in O(p log L) per probe. Memory: a stage's model
state, the activations of the microbatches its schedule keeps in flight, its buffers and the gradients it
accumulates (`block_memory`). The step estimate of a placed partition is `step.py`'s.
"""

from __future__ import annotations

from bisect import bisect_right

from dist_lib.planner.estimate import TRANSIENT_ACTIVATIONS, LayerCosts, in_flight
from dist_lib.planner.stage_option import StageOption

BOUND_TOLERANCE = 1e-3  # relative: finer than the estimate's own error, and ten probes fewer than 1e-6


def partition(stages: list[list[StageOption]], layers: int, microbatches: int, schedule: str = "1f1b",
              memory: bool = True) -> tuple[float, list[tuple[int, StageOption]]] | None:
    """(slowest stage, [(layer count, option)] per stage): the partition whose slowest stage time per
    microbatch is least (within `BOUND_TOLERANCE`) with every layer placed, or None when no bound
    places them all (memory)."""
    pp = len(stages)
    # per stage: the last index its block may reach (a layer left for each later stage), and per option
    # what a probe reads (hoisted out of the loop), with the longest block its memory is known to take
    prepared = []
    for s, options in enumerate(stages):
        flight, held = in_flight(schedule, s, pp, microbatches, 1), buffers(s, pp, microbatches, schedule)
        prepared.append((layers - (pp - s - 1), []))
        for o in options:
            reach = _MemoryReach(o.costs, flight, o.capacity - held * o.unit - o.rerun, layers,
                                 microbatches > 1, o.alike) if memory else None
            prepared[-1][1].append((o, o.costs.total, o.loss if s == pp - 1 else 0.0, reach,
                                    reach.fitting if memory else None))

    def place(bound: float):
        """Each stage in turn takes the most layers that fit in `bound` seconds and in its memory
        (over its TP options; the faster block on a tie), leaving one for each later stage; with the
        slowest stage's time, which is at most `bound`."""
        start, out, slowest = 0, [], 0.0
        for limit, options in prepared:
            best, pick, best_time, best_fixed = 0, None, 0.0, 0.0
            for o, total, fixed, reach, fitting in options:
                t0 = total[start]
                # the largest j <= limit with total[j] - t0 within the bound (total never decreases)
                j = bisect_right(total, t0 + bound - fixed, start, limit + 1) - 1
                if j <= start:
                    continue
                if fitting is not None and j > fitting[start]:
                    j = reach(start, j)  # the largest block within memory
                n = j - start
                if n > best or (n == best and n and total[j] - t0 < best_time):
                    best, pick, best_time, best_fixed = n, o, total[j] - t0, fixed
            if best == 0:
                return None
            out.append((best, pick))
            slowest = max(slowest, best_time + best_fixed)
            start += best
        return (slowest, out) if start == layers else None

    top = sum(max(_block_time(o, 0, layers) for o in options) for options in stages) + \
        max(o.loss for o in stages[-1])
    # memory alone decides whether any bound places every layer: one probe without a time limit says
    if memory and place(top) is None:
        return None
    # start from the harmonic lower bound (see `generate`) and double until every layer is placed
    lo = layers / sum(1 / min(o.costs.per_layer for o in options) for options in stages)
    hi = 2 * lo
    placed = place(hi) if hi < top else None
    while placed is None and hi < top:
        lo, hi = hi, 2 * hi
        placed = place(hi) if hi < top else None
    if placed is None:
        placed = place(top)
        if placed is None:
            return None
    # a placement within a bound is also the placement within its slowest stage's time (every stage
    # keeps its block), so the upper end drops to that time at once
    hi = placed[0]
    while hi - lo > BOUND_TOLERANCE * hi:
        mid = (lo + hi) / 2
        trial = place(mid)
        if trial is None:
            lo = mid
        else:
            placed, hi = trial, trial[0]
    return placed


class _MemoryReach:
    """For one stage option in one partition: the last index a block from a given first layer may reach
    within `budget` bytes (`block_memory` under 1F1B with `flight` microbatches in flight, or ZeRO-1's
    gradient shards beside the last one). A block's bytes never shrink as it grows (every layer adds
    bytes), so whether a block fits is true up to some end and false after it. The probes of
    `partition` ask again and again from the same first layers, so what each answer learnt is kept:
    by first layer, the longest block seen to fit (`fitting`: a probe that asks for no more reads it
    and need not call), and the end itself once a block was seen not to fit."""

    __slots__ = ("costs", "flight", "budget", "fitting", "ends", "accumulates", "alike")

    def __init__(self, costs: LayerCosts, flight: float, budget: float, layers: int, accumulates: bool = False,
                 alike: bool = True):
        self.costs, self.flight, self.budget = costs, flight, budget
        self.accumulates, self.alike = accumulates, alike
        self.fitting = list(range(layers + 1))  # an empty block: the least any first layer may reach
        self.ends: list[int | None] = [None] * (layers + 1)

    def __call__(self, start: int, stop: int) -> int:
        """The largest j in start..stop whose block start..j-1 fits (start when none does)."""
        end = self.ends[start]
        if end is not None:
            return min(stop, end)
        state, act, shard, costs = self.costs.state, self.costs.activation, self.costs.shard, self.costs
        s0, a0, h0, flight, budget = state[start], act[start], shard[start], self.flight, self.budget
        accumulates, alike, grad = self.accumulates, self.alike, self.costs.grad_bytes
        first = grad[start + 1] - grad[start] + act[start] if accumulates and start < len(grad) - 1 else 0.0

        def within(j: int) -> bool:  # the block start..j-1 fits (state, and in-flight stashes or shards)
            held = act[j] - a0 + max((flight - 1) * (act[j] - a0), shard[j] - h0)
            if accumulates:  # `accumulation_bytes`, its two layers read inline where layers are alike
                extra = max(first, grad[j] - grad[j - 1] + act[j - 1]) - act[j] if alike else \
                    accumulation_bytes(costs, start, j)
                if extra > 0:
                    held += extra
            return state[j] - s0 + held <= budget

        if within(stop):
            self.fitting[start] = stop
            return stop
        lo, hi = self.fitting[start], stop - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if within(mid):
                lo = mid
            else:
                hi = mid - 1
        self.fitting[start] = self.ends[start] = lo
        return lo


def fixed_partition(stages: list[list[StageOption]], counts: tuple[int, ...], microbatches: int,
                    memory: bool = True) -> tuple[float, list[tuple[int, StageOption]]] | None:
    """`partition`'s answer for a split given in advance (DeepSpeed's uniform one): each stage's fastest
    option for its block, with the slowest stage's time per microbatch; None when it does not fit."""
    placed, start = [], 0
    for options, n in zip(stages, counts):
        placed.append((n, min(options, key=lambda o: _block_time(o, start, n))))
        start += n
    if memory and not fits(placed, microbatches):
        return None
    start, slowest = 0, 0.0
    for s, (n, o) in enumerate(placed):
        slowest = max(slowest, _block_time(o, start, n) + (o.loss if s == len(placed) - 1 else 0.0))
        start += n
    return slowest, placed


def fits(placed: list[tuple[int, StageOption]], microbatches: int, schedule: str = "1f1b") -> bool:
    """Whether every stage of a placed partition fits its memory, as `partition` counts it."""
    pp, start = len(placed), 0
    for s, (n, o) in enumerate(placed):
        stop = start + n
        if block_memory(o, start, stop, s, pp, microbatches, schedule, 1) > o.capacity:
            return False
        start = stop
    return True


def buffers(stage: int, stages: int, microbatches: int, schedule: str, chunks: int = 1) -> float:
    """Activations a stage holds besides its layer inputs and stashes, in microbatch shares: a few
    passing through (received, all-reduced, being sent) and the messages it sent that the neighbour has
    not received yet (a send keeps its tensor until matched): outputs of up to the passes in flight,
    and a gradient past the first stage. Interleaved, every stage sends on and receives gradients."""
    if schedule == "interleaved":
        passes = in_flight(schedule, stage, stages, microbatches, chunks) * chunks
        return TRANSIENT_ACTIVATIONS + passes + 1
    sent = in_flight(schedule, stage, stages, microbatches, 1) if stage < stages - 1 else 0
    return TRANSIENT_ACTIVATIONS + sent + (1 if stage > 0 else 0)


def block_memory(o: StageOption, start: int, stop: int, stage: int, stages: int, microbatches: int,
                 schedule: str, chunks: int) -> float:
    """Peak bytes of a stage holding layers start..stop-1 under a schedule: model state, the
    activations of the microbatches in flight (interleaved: each pass counted at the larger chunk's
    size, as `to_plan` gives the first chunks the odd layers), the buffers, the full-recompute stash and,
    under ZB-H1, the output gradient every layer keeps for its deferred weight-gradient pass; with two or
    more microbatches, a layer's gradient twice while a later one is added to the sum
    (`accumulation_bytes`). ZeRO-1's
    reduced gradient shards appear only as each layer's last microbatch passes backward, when at most
    that microbatch's activations remain: the stage holds the larger of the two."""
    c, n = o.costs, stop - start
    flight = in_flight(schedule, stage, stages, microbatches, chunks)
    if schedule == "interleaved":
        flight *= chunks * -(-n // chunks) / n
    activations = c.activation[stop] - c.activation[start]
    in_flight_bytes = flight * activations
    if schedule == "zero-bubble":
        in_flight_bytes += flight * n * o.unit
    shards = c.shard[stop] - c.shard[start] + activations
    extra = 0.0
    if microbatches > 1:
        # ZB-H1's W passes of a microbatch keep every layer's input until the last one (their stashes go)
        kept = o.unit if schedule == "zero-bubble" else 0.0
        first = start
        for size in chunk_sizes(n, chunks) if schedule == "interleaved" else [n]:
            extra = max(extra, accumulation_bytes(c, first, first + size, kept, o.alike))
            first += size
    return c.state[stop] - c.state[start] + max(in_flight_bytes, shards) + extra \
        + buffers(stage, stages, microbatches, schedule, chunks) * o.unit + o.rerun


def accumulation_bytes(c: LayerCosts, start: int, stop: int, kept_input: float = 0.0, alike: bool = False) -> float:
    """Bytes a block of layers start..stop-1 holds beyond one microbatch's activations while it adds a
    later microbatch's weight gradient of a layer l to the sum of the earlier ones: the gradient is then
    there twice (the sum and the new one), while that microbatch's pass has already freed the stashes of
    l and the layers after it (`Model.backward` frees the stash before allocating the gradients, and
    `strategies/_pipeline.py` sums a layer's gradients as each backward yields one). `kept_input` bytes a
    layer stay beside it for each of l and the layers after it (ZB-H1 keeps their inputs until the
    microbatch's last W pass). Only a stage that runs two or more microbatches accumulates. With
    `alike` layers after the first, the bytes grow with l past the first layer (a layer's activations,
    stash and input, are at least the input kept), so only the block's first and last layers are read."""
    grad, act = c.grad_bytes, c.activation
    layers = (start, stop - 1) if alike else range(start, stop)
    most = max(grad[l + 1] - grad[l] + act[l] + (stop - l) * kept_input for l in layers)
    return max(0.0, most - act[stop])


def _block_time(o: StageOption, start: int, n: int) -> float:
    return o.costs.total[start + n] - o.costs.total[start]


def chunk_sizes(layers: int, chunks: int) -> list[int]:
    """A stage's `layers` cut into `chunks` blocks for the interleaved schedule, the first ones a layer
    longer where they do not divide."""
    return [layers // chunks + (c < layers % chunks) for c in range(chunks)]

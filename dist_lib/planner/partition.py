"""The layer partition of one grouping and its step estimate.

Partition: for a bound T on every stage's time per microbatch, the stages take layers greedily in pipeline
order, each as many as fit in T and in its memory, over its TP options; a binary search finds the least T
that places every layer. This is the bottleneck-optimal contiguous partition AMP and Metis find by
dynamic programming (Li et al. NeurIPS'22, sec. 4), in O(p log L) per probe. The step estimate then adds
the pipeline fill, the exchanges between stages, the data-parallel reduction and the optimizer step
(see `estimate.py` for the per-layer figures it reads); an interleaved pipeline of up to `PLAYOUT_PASSES`
chunk passes is played out pass by pass instead (`playout.py`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..hardware import Cluster
from ..workload import Workload
from .estimate import TRANSIENT_ACTIVATIONS, LayerCosts, in_flight
from .contention import one_f_one_b_orders, play_ends, shared_links, zero_bubble_floor, zero_bubble_posted
from .messages import crossing_seconds, scatters, schedule_crossing
from .playout import one_f_one_b_pipeline, play_interleaved
from .stagger import boundary_seconds, slack
from .tail import no_collective, step_end

MEMORY_HEADROOM = 0.92  # of each device, for buffers the estimate does not count
# interleaved plans of at most this many chunk passes a step (2 p v m) are played out pass by pass
# (`playout.py`); longer ones keep the closed form and the virtual-pipeline bound
PLAYOUT_PASSES = 1 << 14
BOUND_TOLERANCE = 1e-3  # relative: finer than the estimate's own error, and ten probes fewer than 1e-6


@dataclass(frozen=True, slots=True)
class StageOption:
    """One stage at one TP degree for one microbatch size: per-layer costs of its slowest replica."""

    ranks: tuple[int, ...]
    tp: int
    shares: tuple[int, ...]
    costs: LayerCosts
    capacity: float  # usable bytes on its smallest device
    loss: float  # loss seconds per microbatch if it is the last stage
    unit: float  # bytes of one replica's share of a microbatch's activation (its largest share)
    reduce: Callable[[float], float]  # seconds of the data-parallel gradient reduction of n bytes
    rerun: float = 0.0  # full recompute: bytes of the largest layer stash a backward rebuilds, one at a time
    gather: float = 0.0  # seconds to all-gather one message's TP pieces in its slowest replica's TP group
    # ZeRO-1: seconds to all-gather n bytes of updated weight shards over the replicas; each layer's is
    # issued after its update, behind every gradient reduce-scatter on the same group, so none of it
    # overlaps the backward
    regather: Callable[[float], float] = no_collective
    # prefix sums over layers of `reduce` of each layer's gradient alone: the simulator reduces a layer
    # as soon as its last microbatch has passed backward, one collective a layer, in turn
    reduced: tuple[float, ...] = ()
    alike: bool = True  # the layers after the first cost alike (no measured profile)
    # per replica in rank order: its own per-layer costs and loss (the figures above are their largest);
    # empty where every replica costs the same
    replica_costs: tuple[LayerCosts, ...] = ()
    replica_loss: tuple[float, ...] = ()


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


def step_estimate(cluster: Cluster, workload: Workload, placed: list[tuple[int, StageOption]],
                  microbatches: int, schedule: str, chunks: int, cutoff: float = float("inf")) -> tuple[float, float]:
    """(seconds per step, highest memory share) of a placed partition under a schedule. A ZB-H1 plan is
    played out pass by pass (`contention.py`) unless a floor under that play-out
    (`contention.zero_bubble_floor`) already gives a step longer than `cutoff` seconds (a search's best
    estimate so far): then the closed form stands, at least that floor, and the plan cannot win."""
    pp, m = len(placed), microbatches
    times, forwards, backs, weights, mem = [], [], [], [], 0.0
    start = 0
    for s, (n, o) in enumerate(placed):
        c, stop = o.costs, start + n
        forward, backward = c.forward[stop] - c.forward[start], c.backward[stop] - c.backward[start]
        if schedule == "zero-bubble":  # the input-gradient pass all-reduces with no GEMM beside it
            backward += c.hidden[stop] - c.hidden[start]
        if s == pp - 1:
            forward += o.loss
        # the all-gather of a message that arrives as TP pieces comes before the compute it feeds
        if s > 0 and scatters(placed[s - 1][1], o):
            forward += o.gather
        if s < pp - 1 and scatters(o, placed[s + 1][1]):
            backward += o.gather
        times.append(forward + backward)
        forwards.append(forward)
        backs.append(backward)
        weights.append(c.weight[stop] - c.weight[start])
        mem = max(mem, block_memory(o, start, stop, s, pp, m, schedule, chunks) / o.capacity * MEMORY_HEADROOM)
        start = stop
    # An activation and a gradient cross each boundary per microbatch; interleaved, once per chunk, and
    # from the last stage back to the first between chunks. A message moves only once its receiver asks
    # for it (a rendezvous; a stage's receive is posted when its pass needs the input), so a stage waits
    # for every crossing into it: its time per microbatch is its passes and those crossings, and the
    # pipeline's fill and pace below are made of those times.
    passes = chunks if schedule == "interleaved" else 1
    boundaries = [(s, s + 1, passes) for s in range(pp - 1)]
    if passes > 1 and pp > 1:
        boundaries.append((pp - 1, 0, passes - 1))
    cycles, round_trips, computed = times[:], [], forwards[:]
    crossings = steady_crossings(cluster, workload, placed, boundaries)
    for s, r, count in boundaries:
        onward, back = crossings[s, r]
        cycles[r] += count * onward
        forwards[r] += count * onward
        cycles[s] += count * back
        round_trips.append(onward + back)
    slowest = paced = max(cycles)
    fill = sum(cycles) - slowest
    if schedule == "zero-bubble":
        fill = max(0.0, sum(t - 2 * w for t, w in zip(cycles, weights)) - (slowest - 2 * weights[cycles.index(slowest)]))
    elif schedule == "interleaved":
        fill /= chunks
    if schedule in ("1f1b", "zero-bubble"):
        # From stage s on, 1F1B keeps p - s microbatches in flight, and each goes to the last stage and
        # back (its forwards, input-gradient passes and crossings) before the stage takes another: with
        # slow links that loop, not the slowest stage, paces the steady state
        loop, loops = 0.0, []
        for s in range(pp - 1, -1, -1):
            loop += times[s] - (weights[s] if schedule == "zero-bubble" else 0.0)
            loop += round_trips[s] if s < pp - 1 else 0.0
            loops.append(loop / (pp - s))
        slowest = max(slowest, *loops)
    # the first microbatch takes the fill's path and the slowest stage's time; each further one the pace
    pipeline = (m - 1) * slowest + paced + fill
    if schedule == "1f1b" and pp > 1:
        pipeline = one_f_one_b_pipeline(forwards, [c - f for c, f in zip(cycles, forwards)], max(loops), m)
    if schedule != "interleaved":
        # the first microbatch crosses with every sender ready at once: its activations take the
        # crossing all at once, not the steady state's staggered one
        for s, r, _ in boundaries:
            pipeline += crossing_seconds(cluster, workload, placed[s][1], placed[r][1]) - crossings[s, r][0]
        # crossings of different boundaries that meet on a node's shared NIC, played out (`contention.py`)
        pairs = shared_links(cluster, workload, placed, schedule == "zero-bubble") \
            if schedule in ("1f1b", "zero-bubble") else {}
        floor = 0.0
        if schedule == "zero-bubble" and pp > 1 and cutoff < float("inf"):
            floor = zero_bubble_floor(computed, backs, weights, m, [
                crossing_seconds(cluster, workload, placed[s][1], placed[s + 1][1])
                + min(crossings[s, s + 1][1], crossing_seconds(cluster, workload, placed[s + 1][1], placed[s][1]))
                for s in range(pp - 1)])
        if floor and step_end(cluster, workload, placed, backs, weights, floor, True) > cutoff:
            pipeline = max(pipeline, floor)  # it cannot come under the cutoff: the closed form, at least the floor
        elif pairs or (schedule == "zero-bubble" and pp > 1):
            posts = None
            if schedule == "1f1b":
                orders = one_f_one_b_orders(pp, m)
                seconds = [{"F": f, "B": b} for f, b in zip(computed, backs)]
            else:
                # ordered, and its receives posted, as `strategies/planned.py` does: by each boundary's
                # `schedule_crossing`
                seconds = [{"F": f, "I": b - w, "W": w} for f, b, w in zip(computed, backs, weights)]
                for s in range(pp - 1):
                    seconds[s]["C"] = schedule_crossing(cluster, workload, placed[s][1], placed[s + 1][1])
                orders, posts = zero_bubble_posted(seconds, m)
            alone, sharing = play_ends(cluster, workload, placed, orders, seconds, pairs, crossings, posts)
            if schedule == "zero-bubble":
                # the play-out, with the receives where the schedule posts them, replaces the closed form,
                # which waits for every crossing into a stage as if its receive were posted late
                pipeline = sharing
            else:
                pipeline += sharing - alone
    if schedule == "interleaved" and pp > 1:
        if 2 * pp * chunks * m <= PLAYOUT_PASSES:
            pipeline = _interleaved_playout(placed, m, chunks, crossings)
        else:
            pipeline = max(pipeline, _virtual_bound(placed, m, chunks, crossings))
    # the pipeline ends with stage 0's last backward; then each stage's reductions and update (`tail.py`)
    return step_end(cluster, workload, placed, backs, weights, pipeline, schedule == "zero-bubble"), mem


def steady_crossings(cluster: Cluster, workload: Workload, placed: list[tuple[int, StageOption]],
                     boundaries: list[tuple[int, int, int]]) -> dict[tuple[int, int], tuple[float, float]]:
    """(activation, gradient) seconds of one microbatch's crossing of each boundary (s, r, _) in the
    steady state: with every sender ready at once (`crossing_seconds`) where the replicas of both
    stages cost alike, else with each replica's messages staggered by its own pace (`stagger.py`)."""
    starts = [0]
    for n, _ in placed:
        starts.append(starts[-1] + n)
    pp = len(placed)
    return {(s, r): boundary_seconds(cluster, workload, placed[s][1], placed[r][1],
                                     slack(placed[s][1], starts[s], starts[s + 1], s == pp - 1),
                                     slack(placed[r][1], starts[r], starts[r + 1], r == pp - 1))
            for s, r, _ in boundaries}


def chunk_sizes(layers: int, chunks: int) -> list[int]:
    """A stage's `layers` cut into `chunks` blocks for the interleaved schedule, the first ones a layer
    longer where they do not divide."""
    return [layers // chunks + (c < layers % chunks) for c in range(chunks)]


def _virtual_bound(placed: list[tuple[int, StageOption]], microbatches: int, chunks: int,
                   crossings: dict[tuple[int, int], tuple[float, float]]) -> float:
    """Interleaved, beyond `PLAYOUT_PASSES`: a lower bound from the virtual pipeline of p x v chunk passes (chunk c of stage s is
    virtual stage c x p + s, its layers cut by `chunk_sizes`). The chunks of a stage are not alike:
    the last stage's last chunk alone runs the loss. A virtual stage j runs the forward and backward of
    every microbatch in turn, after the first microbatch has passed forward through the virtual stages
    before it and before the last one passes backward through them: sum_{k<j} (u_k + crossings) + m u_j.
    For stages of equal times and m = p it is the fill and pace of the estimate above; where the last
    chunk's loss outweighs half a stage (a large vocabulary beside few layers) it is the longer."""
    passes, stage_of = [], []
    for s, _, forward, backward in _chunk_passes(placed, chunks):
        passes.append(forward + backward)
        stage_of.append(s)
    before, bound = 0.0, 0.0
    for j, u in enumerate(passes):
        bound = max(bound, before + microbatches * u)
        if j + 1 < len(passes):
            a, b = stage_of[j], stage_of[j + 1]
            before += u + sum(crossings[a, b])
    return bound


def _interleaved_playout(placed: list[tuple[int, StageOption]], microbatches: int, chunks: int,
                         crossings: dict[tuple[int, int], tuple[float, float]]) -> float:
    """Interleaved: when stage 0's last backward ends, from a play-out of every chunk pass in the order
    each stage issues it (`playout.play_interleaved`). Chunk c of stage s is virtual stage c x p + s, its
    layers cut by `chunk_sizes`; the last one also runs the loss. Each message waits for its crossing
    (`steady_crossings`) and, where it arrives as TP pieces, the receiving stage's all-gather."""
    pp = len(placed)
    forward, backward, onward, back = [], [], [], []
    for s, o, f, b in _chunk_passes(placed, chunks):
        forward.append(f)
        backward.append(b)
        nxt = placed[(s + 1) % pp][1]  # virtual stage j and j + 1
        gathered = scatters(o, nxt)
        there, returned = crossings.get((s, (s + 1) % pp), (0.0, 0.0))  # the last entry is unused
        onward.append(there + (nxt.gather if gathered else 0.0))
        back.append(returned + (o.gather if gathered else 0.0))
    return play_interleaved(forward, backward, onward, back, pp, microbatches)


def _chunk_passes(placed: list[tuple[int, StageOption]], chunks: int) -> Iterator[tuple[int, StageOption, float, float]]:
    """(stage, its option, forward seconds, backward seconds) of one microbatch's pass through each virtual
    stage in turn: chunk c of stage s is virtual stage c x p + s, its layers cut by `chunk_sizes`, and the
    last stage's last chunk also runs the loss (with its forward)."""
    pp = len(placed)
    for c in range(chunks):
        start = 0
        for s, (n, o) in enumerate(placed):
            sizes = chunk_sizes(n, chunks)
            first = start + sum(sizes[:c])
            last = first + sizes[c]
            k = o.costs
            loss = o.loss if s == pp - 1 and c == chunks - 1 else 0.0
            yield s, o, k.forward[last] - k.forward[first] + loss, k.backward[last] - k.backward[first]
            start += n

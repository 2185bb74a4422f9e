"""The step estimate of a placed partition: the pipeline's fill and pace from each stage's passes and the
crossings between stages (see `estimate.py` for the per-layer figures it reads), then the data-parallel
reduction and the optimizer step (`tail.py`). A 1F1B plan whose crossings meet on a shared NIC and every
ZB-H1 plan are played out pass by pass (`contention.py`); an interleaved pipeline of up to
`PLAYOUT_PASSES` chunk passes too (`playout.py`).
"""

from __future__ import annotations

from collections.abc import Iterator

from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload
from dist_lib.planner.contention import one_f_one_b_orders, play_ends, shared_links, zero_bubble_floor, zero_bubble_posted
from dist_lib.planner.messages import crossing_seconds, scatters, schedule_crossing
from dist_lib.planner.partition import block_memory, chunk_sizes
from dist_lib.planner.stage_option import StageOption
from dist_lib.planner.playout import one_f_one_b_pipeline, play_interleaved
from dist_lib.planner.stagger import boundary_seconds, slack
from dist_lib.planner.tail import step_end

# interleaved plans of at most this many chunk passes a step (2 p v m) are played out pass by pass
# (`playout.py`); longer ones keep the closed form and the virtual-pipeline bound
PLAYOUT_PASSES = 1 << 14


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
        mem = max(mem, block_memory(o, start, stop, s, pp, m, schedule, chunks) / o.capacity)
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

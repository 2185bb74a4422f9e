"""The Chrome trace event format of a step: the events as dicts (`chrome_trace`, the specification the
writer in `trace_text` follows byte for byte), and the structural validator.

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU (complete
events `ph: X` with `ts`/`dur` in microseconds, metadata `ph: M`, counters `ph: C`, flows `ph: s`/`f`).
Events on one thread must nest, so each rank (process) has a compute thread, one thread per
communicator (group) it runs collectives on, as each process group has its own NCCL stream, and one
thread per point-to-point peer and direction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from dist_lib.tensors import describe_mask
from dist_lib.output.trace_validate import validate_trace

__all__ = ["Traced", "chrome_trace", "validate_trace"]


class Traced(Protocol):
    """What a trace is made of: a step's `Result` (`dist_lib.output.result`) has these fields."""

    cluster: Any
    workload: Any
    strategy: str
    global_batch_size: int
    time_s: float
    raw_events: Any  # the event log
    timelines: Any  # per rank, (times, live bytes)

COMPUTE_TID = 0
GROUP_TID_BASE = 1  # + the group's number among the step's groups, in sorted order of their ranks
SEND_TID_BASE, RECV_TID_BASE = 1 << 24, 2 << 24


def _tid(event: tuple, groups: dict[tuple, int]) -> int:
    op, stream = event[1], event[2]
    if stream == "compute":
        return COMPUTE_TID
    if stream == "collective":
        return GROUP_TID_BASE + groups[event[9]]
    src, dst = event[9]
    return SEND_TID_BASE + dst if op == "send" else RECV_TID_BASE + src


def group_label(ranks: tuple[int, ...]) -> str:
    """'group 0-7', 'group 0,8,16,24', or 'group 0,8,16,...,8184 (1024 ranks)' for a long irregular one."""
    if len(ranks) > 1 and ranks[-1] - ranks[0] == len(ranks) - 1:
        return f"group {ranks[0]}-{ranks[-1]}"
    if len(ranks) <= 8:
        return "group " + ",".join(map(str, ranks))
    return f"group {','.join(map(str, ranks[:3]))},...,{ranks[-1]} ({len(ranks)} ranks)"


def process_metadata(result: Traced) -> list[dict[str, Any]]:
    """Each rank's process name (its device and node) and sort index. In a folded step (`run/folding.py`)
    only the representatives have events, and the names say so: a representative stands for its copies in
    every replica, another rank names the representative whose events are its own."""
    cluster = result.cluster
    reps = getattr(result, "representatives", None)
    copies = len(reps) // len(set(reps)) if reps else 1
    out: list[dict[str, Any]] = []
    for r in range(cluster.world_size):
        device = cluster.device_of(r)
        name = f"rank {r} · {device.name} · node {cluster.node_of(r)}"
        if reps:
            name += (f" · folded: stands for this place in all {copies} replicas" if reps[r] == r
                     else f" · folded: as rank {reps[r]}")
        out.append({"ph": "M", "pid": r, "tid": 0, "name": "process_name", "args": {"name": name}})
        out.append({"ph": "M", "pid": r, "tid": 0, "name": "process_sort_index", "args": {"sort_index": r}})
    return out


def collective_groups(events: Iterable[tuple]) -> list[tuple[int, ...]]:
    """The step's communicators, sorted: a group's thread is `GROUP_TID_BASE` + its place in this list."""
    return sorted({e[9] for e in events if e[2] == "collective"})


def op_events(event: tuple, groups: dict[tuple, int], samples_text: str) -> list[dict[str, Any]]:
    """One logged op as trace events: its slice, and for a point-to-point op its end of the message's arrow."""
    rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail = event
    tid = _tid(event, groups)
    args: dict[str, Any] = {"layer": layer, "samples": samples_text}
    if nbytes:
        args["bytes"] = nbytes
    if flops:
        args["flops"] = flops
    if peers is not None:
        args["group" if stream == "collective" else "peers"] = list(peers)
    if detail:
        args["detail"] = detail
    name = f"{op} L{layer}" + (" (recompute)" if detail == "recompute" else "")
    # the end in microseconds minus the start, not the duration scaled: ts + dur then lands on the
    # next slice's ts exactly (Sterbenz), where (end - start) * 1e6 can overshoot it by an ulp late in
    # a long step, and trace viewers see slices that overlap without nesting
    ts = start * 1e6
    dur = end * 1e6 - ts
    out = [{"ph": "X", "pid": rank, "tid": tid, "name": name, "cat": op, "ts": ts, "dur": dur, "args": args}]
    if stream == "p2p":
        flow = {"ph": "s" if op == "send" else "f", "pid": rank, "tid": tid, "name": "message",
                "cat": "p2p", "id": op_id, "ts": ts}
        if op == "recv":
            flow["bp"] = "e"
        out.append(flow)
    return out


def thread_name(rank: int, tid: int, names: Sequence[tuple[int, ...]]) -> dict[str, Any]:
    """The metadata naming thread `tid` of `rank`: compute, its communicator, or its peer and direction."""
    if tid == COMPUTE_TID:
        name = "compute"
    elif tid < SEND_TID_BASE:
        name = group_label(names[tid - GROUP_TID_BASE])
    elif tid >= RECV_TID_BASE:
        name = f"recv ← {tid - RECV_TID_BASE}"
    else:
        name = f"send → {tid - SEND_TID_BASE}"
    return {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": name}}


def other_data(result: Traced) -> dict[str, Any]:
    """The trace's keys beside `traceEvents`."""
    return {"displayTimeUnit": "ms",
            "otherData": {"cluster": result.cluster.name, "workload": result.workload.name,
                          "global_batch_size": result.global_batch_size, "strategy": result.strategy,
                          "time_s": result.time_s}}


def chrome_trace(result: Traced) -> dict[str, Any]:
    """The trace as a JSON-ready dict, one event at a time: the specification of the text
    `write_chrome_trace` writes, which is `json.dumps(chrome_trace(result), separators=(",", ":"))`."""
    out = process_metadata(result)
    threads: dict[int, set[int]] = defaultdict(set)
    events = result.raw_events
    names = collective_groups(events)
    groups = {ranks: i for i, ranks in enumerate(names)}
    described: dict[int, str] = {}
    for e in events:
        samples = e[6]
        text = described.get(samples)
        if text is None:  # a mask is shared by many events (a microbatch's ops, a collective's members)
            text = described[samples] = describe_mask(samples)
        op = op_events(e, groups, text)
        threads[e[0]].add(op[0]["tid"])
        out += op
    for rank, tids in threads.items():
        for tid in tids:  # (a set's order: the fast writer rebuilds the same sets to keep it)
            out.append(thread_name(rank, tid, names))
    for rank, (times, values) in enumerate(result.timelines):
        for ts, v in memory_counter(times, values):
            out.append({"ph": "C", "pid": rank, "tid": 0, "name": "memory", "ts": ts, "args": {"GiB": v / 2**30}})
    return {"traceEvents": out, **other_data(result)}


SETTLE_US = 1e-3
"""How long after an instant the memory counter shows what that instant settled at, when a peak within it
was higher: a counter holds one value per timestamp, so an all-gather's output allocated and its input
freed at one instant would otherwise never show the peak the result reports."""


def memory_counter(times: Sequence[float], values: Sequence[float]) -> list[tuple[float, float]]:
    """A rank's memory counter, (microseconds, bytes): at each instant the highest value reached in it,
    then, `SETTLE_US` later (unless the next instant comes first), the value it settled at."""
    ts, live = counter_points(times, values)
    return list(zip(ts.tolist(), live.tolist()))


def counter_points(times: Sequence[float], values: Sequence[float]) -> tuple[Any, Any]:
    """`memory_counter` as two numpy arrays, microseconds and bytes, computed a rank at a time rather
    than a point at a time (a long step's counters hold millions of points)."""
    import numpy as np  # only to write a trace: keep it off the import path

    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values)
    if not len(t):
        return t, v
    first = np.flatnonzero(np.concatenate(([True], t[1:] != t[:-1])))  # each instant's first entry
    last = np.append(first[1:], len(t)) - 1  # and its last
    peak = np.maximum.reduceat(v, first)
    settled = v[last]
    ts = t[first] * 1e6
    following = np.append(ts[1:], np.inf)  # the next instant, in microseconds
    settles = (settled != peak) & (following > ts + SETTLE_US)
    # each instant's point, then its settled point where it has one
    at = np.arange(len(first)) + np.concatenate(([0], np.cumsum(settles)[:-1]))
    out_ts = np.empty(len(first) + int(settles.sum()), dtype=np.float64)
    out_v = np.empty(len(out_ts), dtype=v.dtype)
    out_ts[at], out_v[at] = ts, peak
    out_ts[at[settles] + 1], out_v[at[settles] + 1] = ts[settles] + SETTLE_US, settled[settles]
    return out_ts, out_v

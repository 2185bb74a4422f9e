"""Chrome trace event format writer and a structural validator for what it writes.

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU (complete
events `ph: X` with `ts`/`dur` in microseconds, metadata `ph: M`, counters `ph: C`, flows `ph: s`/`f`).
Events on one thread must nest, so each rank (process) has a compute thread, one thread per
communicator (group) it runs collectives on, as each process group has its own NCCL stream, and one
thread per point-to-point peer and direction.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .tensors import describe_mask

if TYPE_CHECKING:
    from .result import Result

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


def chrome_trace(result: Result) -> dict[str, Any]:
    """The trace as a JSON-ready dict."""
    cluster = result.cluster
    out: list[dict[str, Any]] = []
    threads: dict[int, set[int]] = defaultdict(set)
    for r in range(cluster.world_size):
        device = cluster.device_of(r)
        out.append({"ph": "M", "pid": r, "tid": 0, "name": "process_name",
                    "args": {"name": f"rank {r} · {device.name} · node {cluster.node_of(r)}"}})
        out.append({"ph": "M", "pid": r, "tid": 0, "name": "process_sort_index", "args": {"sort_index": r}})
    events = result.raw_events
    names = sorted({e[9] for e in events if e[2] == "collective"})
    groups = {ranks: i for i, ranks in enumerate(names)}
    described: dict[int, str] = {}
    for e in events:
        rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail = e
        tid = _tid(e, groups)
        threads[rank].add(tid)
        text = described.get(samples)
        if text is None:  # a mask is shared by many events (a microbatch's ops, a collective's members)
            text = described[samples] = describe_mask(samples)
        args: dict[str, Any] = {"layer": layer, "samples": text}
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
        out.append({"ph": "X", "pid": rank, "tid": tid, "name": name, "cat": op, "ts": ts, "dur": dur, "args": args})
        if stream == "p2p":
            flow = {"ph": "s" if op == "send" else "f", "pid": rank, "tid": tid, "name": "message",
                    "cat": "p2p", "id": op_id, "ts": ts}
            if op == "recv":
                flow["bp"] = "e"
            out.append(flow)
    for rank, tids in threads.items():
        for tid in tids:
            if tid == COMPUTE_TID:
                name = "compute"
            elif tid < SEND_TID_BASE:
                name = group_label(names[tid - GROUP_TID_BASE])
            elif tid >= RECV_TID_BASE:
                name = f"recv ← {tid - RECV_TID_BASE}"
            else:
                name = f"send → {tid - SEND_TID_BASE}"
            out.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": name}})
    for rank, (times, values) in enumerate(result.timelines):
        for ts, v in memory_counter(times, values):
            out.append({"ph": "C", "pid": rank, "tid": 0, "name": "memory", "ts": ts, "args": {"GiB": v / 2**30}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"cluster": cluster.name, "workload": result.workload.name,
                          "global_batch_size": result.global_batch_size, "strategy": result.strategy,
                          "time_s": result.time_s}}


SETTLE_US = 1e-3
"""How long after an instant the memory counter shows what that instant settled at, when a peak within it
was higher: a counter holds one value per timestamp, so an all-gather's output allocated and its input
freed at one instant would otherwise never show the peak the result reports."""


def memory_counter(times: Sequence[float], values: Sequence[int]) -> list[tuple[float, int]]:
    """A rank's memory counter, (microseconds, bytes): at each instant the highest value reached in it,
    then, `SETTLE_US` later (unless the next instant comes first), the value it settled at."""
    points: list[tuple[float, int]] = []
    i, n = 0, len(times)
    while i < n:
        t, peak = times[i], values[i]
        while i + 1 < n and times[i + 1] == t:
            i += 1
            peak = max(peak, values[i])
        ts = t * 1e6
        points.append((ts, peak))
        if values[i] != peak and (i + 1 == n or times[i + 1] * 1e6 > ts + SETTLE_US):
            points.append((ts + SETTLE_US, values[i]))
        i += 1
    return points


def write_chrome_trace(result: Result, path: str | Path) -> Path:
    """Write `result`'s trace as JSON to `path`, creating its folder; returns the path. A path that cannot be
    written (a folder, a file where a folder should be, no permission) is one `OSError` naming it."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"write_chrome_trace: the path must be a str or Path, got {type(path).__name__} {path!r}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write the trace to {path}: it is a folder; give a file path such as "
                                f"{path / 'trace.json'}")
    trace = chrome_trace(result)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as fh:
            _dump(trace, fh)
    except (FileExistsError, NotADirectoryError) as exc:  # a file stands where a folder of the path should be
        blocker = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), path.parent)
        raise type(exc)(f"cannot write the trace to {path}: {blocker} is a file, not a folder") from None
    except OSError as exc:
        raise type(exc)(f"cannot write the trace to {path}: {exc.strerror or exc}") from None
    return path


DUMP_CHUNK = 4096
"""Trace events encoded per `json.dumps` call: `json.dump` to a file encodes in Python, several times slower
than the C encoder `json.dumps` uses, and one `dumps` of the whole trace would hold all of it as text."""


def _dump(trace: dict[str, Any], fh: Any) -> None:
    """`json.dump(trace, fh, separators=(",", ":"))`, the same text, written a chunk of events at a time."""
    events = trace["traceEvents"]
    rest = {k: v for k, v in trace.items() if k != "traceEvents"}
    fh.write('{"traceEvents":[')
    for i in range(0, len(events), DUMP_CHUNK):
        if i:
            fh.write(",")
        fh.write(json.dumps(events[i:i + DUMP_CHUNK], separators=(",", ":"))[1:-1])
    fh.write("]")
    for key, value in rest.items():
        fh.write("," + json.dumps(key) + ":" + json.dumps(value, separators=(",", ":")))
    fh.write("}")


def validate_trace(trace: dict[str, Any] | str | Path) -> list[str]:
    """Structural problems of a Chrome trace, a dict or the path of a JSON file (empty list when it is
    well formed); a file that cannot be read or is not JSON is one problem naming it."""
    if not isinstance(trace, dict):
        try:
            trace = json.loads(Path(trace).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"not JSON ({exc})"
            return [f"trace file {trace}: {reason}"]
        if not isinstance(trace, dict):
            return [f"the trace is a JSON {type(trace).__name__}, not an object with a traceEvents list"]
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    problems: list[str] = []
    if not all(isinstance(ev, dict) for ev in events):
        first = next(i for i, ev in enumerate(events) if not isinstance(ev, dict))
        return [f"event {first}: {type(events[first]).__name__} {events[first]!r:.40}, not an object"]
    named: set[int] = set()
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    flows: dict[Any, dict[str, list[dict]]] = defaultdict(lambda: {"s": [], "f": []})
    for i, ev in enumerate(events):
        ph = ev.get("ph")
        for key in ("ph", "pid", "name"):
            if key not in ev:
                problems.append(f"event {i}: missing {key!r}")
        if ph == "M":
            if ev.get("name") == "process_name":
                named.add(ev.get("pid"))
            continue
        if not isinstance(ev.get("ts"), (int, float)):
            problems.append(f"event {i} ({ev.get('name')}): ts missing or not a number")
            continue
        if ph == "X":
            dur = ev.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"event {i} ({ev.get('name')}): dur missing or negative")
                continue
            if "tid" not in ev:
                problems.append(f"event {i}: missing 'tid'")
            slices[(ev.get("pid"), ev.get("tid"))].append((ev["ts"], ev["ts"] + dur, str(ev.get("name"))))
        elif ph == "C":
            if not isinstance(ev.get("args"), dict) or not all(isinstance(v, (int, float)) for v in ev["args"].values()):
                problems.append(f"event {i}: counter args must be numbers")
        elif ph in ("s", "f"):
            flows[ev.get("id")][ph].append(ev)
        else:
            problems.append(f"event {i}: unexpected ph {ph!r}")
    for (pid, tid), spans in slices.items():
        if pid not in named:
            problems.append(f"pid {pid}: no process_name metadata")
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple[float, float, str]] = []
        for start, end, name in spans:
            slack = 1e-9 + 1e-15 * abs(end)  # a few ulps of the times in microseconds, however late
            while stack and stack[-1][1] <= start + slack:
                stack.pop()
            if stack and end > stack[-1][1] + slack:
                problems.append(f"pid {pid} tid {tid}: {name!r} at {start:.3f} us overlaps {stack[-1][2]!r} "
                                f"without nesting")
            stack.append((start, end, name))
    for flow_id, ends in flows.items():
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            problems.append(f"flow {flow_id}: {len(ends['s'])} starts and {len(ends['f'])} ends")
        elif ends["f"][0]["ts"] < ends["s"][0]["ts"]:
            problems.append(f"flow {flow_id}: ends before it starts")
    return problems

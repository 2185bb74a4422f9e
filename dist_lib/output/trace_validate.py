"""The structural check of a Chrome trace: what `trace.write_chrome_trace` writes must load in Perfetto.

Slices on one thread must nest, every flow needs one start and one end, every process a name. A long
step's trace holds millions of events: `_well_formed` proves the common case, a trace with nothing to
report, with column operations (numpy, `map`), and only a trace it cannot vouch for goes through the
event-by-event check, which is the specification and words each problem.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import defaultdict
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from dist_lib.memory.tracker import cycle_collector_paused




def validate_trace(trace: dict[str, Any] | str | Path) -> list[str]:
    """Structural problems of a Chrome trace, a dict or the path of a JSON file, gzip-compressed if its name
    ends in .gz (empty list when it is well formed); a file that cannot be read or is not JSON is one problem
    naming it."""
    with cycle_collector_paused():
        return _problems(trace)


def _problems(trace: dict[str, Any] | str | Path) -> list[str]:
    if not isinstance(trace, dict):
        try:
            data = Path(trace).read_bytes()
        except OSError as exc:
            return [f"trace file {trace}: {exc.strerror or exc}"]
        if Path(trace).suffix == ".gz":  # as `write_chrome_trace` writes a path ending in .gz
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError, zlib.error) as exc:
                return [f"trace file {trace}: not gzip ({exc})"]
        try:
            trace = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            return [f"trace file {trace}: not JSON ({exc})"]
        if not isinstance(trace, dict):
            return [f"the trace is a JSON {type(trace).__name__}, not an object with a traceEvents list"]
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    problems: list[str] = []
    if not set(map(type, events)) <= {dict} and not all(isinstance(ev, dict) for ev in events):
        first = next(i for i, ev in enumerate(events) if not isinstance(ev, dict))
        return [f"event {first}: {type(events[first]).__name__} {events[first]!r:.40}, not an object"]
    if _well_formed(events):
        return []
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


PHASES = {"M": 0, "X": 1, "C": 2, "s": 3, "f": 4}  # what the event-by-event check knows (metadata... flow end)


def _well_formed(events: list[dict]) -> bool:
    """True only if the event-by-event check would find nothing, shown column-wise; False when it might
    find something, or the trace has what the columns do not model (ints for slice times, unusual types)."""
    import numpy as np  # only to check a trace: keep it off the import path

    try:
        phases = list(map(itemgetter("ph"), events))
        if not (set(phases) <= PHASES.keys() and all(map(dict.__contains__, events, repeat("pid")))
                and all(map(dict.__contains__, events, repeat("name")))):
            return False
        code = np.array(list(map(PHASES.__getitem__, phases)), dtype=np.int8)
        meta, slices, counters, starts, ends = ([events[i] for i in np.flatnonzero(code == c).tolist()]
                                                for c in range(len(PHASES)))
        named = {ev["pid"] for ev in meta if ev["name"] == "process_name"}
        if not set(map(type, map(itemgetter("ts"), chain(counters, starts, ends)))) <= {int, float}:
            return False
        # slices: int pids and tids, float times, each thread's slices one after another (the nesting check
        # pops every slice before the next one starts); a thread with nested slices takes the long way
        pid, tid, ts, dur = (list(map(itemgetter(key), slices)) for key in ("pid", "tid", "ts", "dur"))
        if (not set(map(type, chain(pid, tid))) <= {int} or not set(map(type, chain(ts, dur))) <= {float}
                or not set(pid) <= named):
            return False
        start, length = np.array(ts, dtype=np.float64), np.array(dur, dtype=np.float64)
        if not (np.isfinite(start).all() and np.isfinite(length).all() and (length >= 0).all()):
            return False
        end = start + length
        pids, tids = np.array(pid, dtype=np.int64), np.array(tid, dtype=np.int64)
        order = np.lexsort((-end, start, tids, pids))
        start, end, pids, tids = start[order], end[order], pids[order], tids[order]
        same_thread = (pids[1:] == pids[:-1]) & (tids[1:] == tids[:-1])
        slack = 1e-9 + 1e-15 * np.abs(end[1:])  # the event-by-event check's, for the later slice
        if (same_thread & (end[:-1] > start[1:] + slack)).any():
            return False
        # counters: a dict of numbers each
        args = list(map(itemgetter("args"), counters))
        if not (set(map(type, args)) <= {dict}
                and set(map(type, chain.from_iterable(map(dict.values, args)))) <= {int, float}):
            return False
        # flows: each id one start and one end, no later than it
        begun = dict(zip(map(itemgetter("id"), starts), map(itemgetter("ts"), starts)))
        ended = dict(zip(map(itemgetter("id"), ends), map(itemgetter("ts"), ends)))
        if len(begun) != len(starts) or len(ended) != len(ends) or begun.keys() != ended.keys():
            return False
        return all(ended[key] >= at for key, at in begun.items())
    except (KeyError, TypeError, ValueError, OverflowError):  # a missing key, an unhashable pid...
        return False


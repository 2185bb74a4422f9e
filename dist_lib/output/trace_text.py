"""The Chrome trace as JSON text, written a chunk of events at a time without building an event's dict.

The text is `json.dumps(chrome_trace(result), separators=(",", ":"))` byte for byte (`trace.chrome_trace`
is the specification; the tests compare the two). What makes it fast: the fields an op's slice shares with
others of its *kind* (op, stream, layer, bytes, FLOPs, peers, detail; a few per op and layer) are formatted
once per kind, as JSON, into the text around the fields that change from event to event (rank, times,
samples), and a chunk's events are joined from columns by `map` and `str.join`, with no Python code run per
event. Numbers go in as `json` writes them: an int by `int.__repr__`, a finite float by `float.__repr__`.
A step whose events do not fit that mould (a rank that is not an int, a time that is neither int nor float)
is written through the specification itself, more slowly, to the same text.
"""

from __future__ import annotations

import gzip
import io
import json
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice, repeat
from pathlib import Path
from typing import Any, TextIO

from dist_lib.engine.eventlog import EventLog
from dist_lib.output import trace
from dist_lib.output.trace import Traced
from dist_lib.tensors import describe_mask


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _dumps_int(value: Any) -> str:
    return int.__repr__(value) if type(value) is int else _dumps(value)


_string = json.encoder.encode_basestring_ascii  # what `json.dumps` writes for a str, without its dispatch


def _chunks(events: Iterable[tuple], size: int) -> Iterator[list[tuple]]:
    it = iter(events)
    while chunk := list(islice(it, size)):
        yield chunk


class _Columns:
    """The step's events as columns, each op's kind as a code into a table of kinds: one pass over the log."""

    def __init__(self, events: Iterable[tuple], chunk: int) -> None:
        if isinstance(events, EventLog):  # its columns are these already: read them, not its tuples
            self.kinds, self.kind, self.rank, self.op_id, self.start, self.end, self.samples = events.columns()
            self.plain = True
            return
        self.codes: dict[tuple, int] = {}  # (op, stream, layer, nbytes, flops, id(peers), detail) -> code
        self.kinds: list[tuple] = []  # by code: (op, stream, layer, nbytes, flops, peers, detail)
        self.kind, self.rank, self.op_id = array("I"), [], []
        self.start, self.end = array("d"), array("d")
        self.samples: list[int] = []
        self.plain = True  # every rank an int, every time an int or a float: the fast path applies
        for part in _chunks(events, chunk):
            ranks, ops, streams, starts, ends, layers, samples, nbytes, flops, peers, op_ids, details = zip(*part)
            keys = list(zip(ops, streams, layers, nbytes, flops, map(id, peers), details))
            try:
                self.kind.extend(map(self.codes.__getitem__, keys))
            except KeyError:  # kinds not seen yet (each op and layer's first event) get codes
                for key, event in zip(keys, part):
                    if key not in self.codes:
                        self.codes[key] = len(self.kinds)
                        self.kinds.append(event[1:3] + event[5:6] + event[7:10] + event[11:12])
                del self.kind[len(self.rank):]  # what the failed extend took
                self.kind.extend(map(self.codes.__getitem__, keys))
            self.plain = (self.plain and set(map(type, ranks)) == {int}
                          and set(map(type, starts + ends)) <= {int, float})
            if not self.plain:
                return
            self.rank += ranks
            self.start.extend(starts)
            self.end.extend(ends)
            self.samples += samples
            self.op_id += op_ids


_MARK = "\x00samples\x00"  # stands for the samples' text in a kind's template (json writes it escaped)


def _templates(kind: tuple, groups: dict[tuple, int]) -> tuple[int, tuple[str, str, str], tuple[str, str, str]]:
    """(tid, the slice's text around its own fields, the arrow end's) of one kind of op, cut out of what
    `trace.op_events` gives for an op of that kind, so the file is the spec's text by construction.
    The slice's parts: after the pid (up to "ts":), after the duration (up to "samples":), after the
    samples; the arrow's: up to the pid, after the pid (up to "id":), after ',"ts":' and the time."""
    op, stream, layer, nbytes, flops, peers, detail = kind
    ops = trace.op_events((0, op, stream, 0.5, 0.75, layer, 0, nbytes, flops, peers, 0, detail), groups, _MARK)
    event = ops[0]
    text = _dumps(event)[len('{"ph":"X","pid":0'):]
    head, rest = text.split(f'"ts":{_dumps(event["ts"])},"dur":{_dumps(event["dur"])}', 1)
    mid, tail = rest.split(_dumps(_MARK), 1)
    flow = ("", "", "")
    if len(ops) > 1:  # a point-to-point op's end of its message's arrow
        before, after = _dumps(ops[1]).split('"pid":0', 1)
        middle, end = after.split('"id":0', 1)
        flow = ("," + before + '"pid":', middle + '"id":', end[len(f',"ts":{_dumps(ops[1]["ts"])}'):])
    return event["tid"], (head + '"ts":', mid, tail), flow


class _Floats:
    """Columns of floats as `json` writes them, a slice at a time. Times repeat across the trace (a
    collective's members start together, tensor- and data-parallel peers run in step: a 1.7-million-event
    step has 35 thousand distinct start times, its memory counters 0.1 % distinct values) and
    `float.__repr__` costs about a microsecond: each distinct value is written once."""

    def __init__(self, columns: list[Any]) -> None:
        import numpy as np

        values = np.concatenate([np.asarray(c, dtype=np.float64) for c in columns])
        self.offsets = np.cumsum([0] + [len(c) for c in columns]).tolist()
        if np.isfinite(values).all() and not np.signbit(values[values == 0]).any():  # (np.unique: -0.0 == 0.0)
            distinct, self.at = np.unique(values, return_inverse=True)
            self.text = list(map(float.__repr__, distinct.tolist()))
        else:  # NaN and infinities as json writes them, each value its own
            self.at = np.arange(len(values))
            self.text = [float.__repr__(v) if np.isfinite(v) else _dumps(v) for v in values.tolist()]

    def __call__(self, column: int, start: int = 0, stop: int | None = None) -> list[str]:
        """Values `start` to `stop` of column `column`."""
        first = self.offsets[column]
        stop = self.offsets[column + 1] if stop is None else min(first + stop, self.offsets[column + 1])
        return list(map(self.text.__getitem__, self.at[first + start:stop].tolist()))


def write_trace_text(result: Traced, fh: TextIO, chunk: int) -> None:
    """Write `result`'s trace to the text file `fh`, `chunk` events formatted at a time."""
    import numpy as np  # only to write a trace: keep it off the import path

    write = fh.write
    write('{"traceEvents":[')
    write(",".join(map(_dumps, trace.process_metadata(result))))  # (a rank at least: what follows opens with ",")
    cols = _Columns(result.raw_events, chunk)
    counters = [trace.counter_points(times, values) for times, values in result.timelines]
    ts = np.frombuffer(cols.start) * 1e6 if cols.plain else np.empty(0)
    dur = np.frombuffer(cols.end) * 1e6 - ts if cols.plain else np.empty(0)  # as `trace.op_events` computes them
    floats = _Floats([ts, dur, *(t for t, _ in counters), *(v / 2**30 for _, v in counters)])
    if not cols.plain:
        _write_spec_ops(result, fh, chunk)
    elif cols.rank:
        _write_ops(cols, write, chunk, floats)
    for rank in range(len(counters)):
        write("".join(chain.from_iterable(zip(
            repeat(f',{{"ph":"C","pid":{rank},"tid":0,"name":"memory","ts":'), floats(2 + rank),
            repeat(',"args":{"GiB":'), floats(2 + len(counters) + rank), repeat("}}")))))
    write("]")
    for key, value in trace.other_data(result).items():
        write("," + _dumps(key) + ":" + _dumps(value))
    write("}")


def _write_ops(cols: _Columns, write: Callable[[str], Any], chunk: int, floats: _Floats) -> None:
    """Each op's slice (and arrow end), then each rank's thread names, as `chrome_trace` lists them; the
    slices' starts and durations in microseconds are `floats` columns 0 and 1."""
    import numpy as np  # only to write a trace: keep it off the import path

    names = sorted({peers for _, stream, _, _, _, peers, _ in cols.kinds if stream == "collective"})
    groups = {ranks: i for i, ranks in enumerate(names)}
    tids, slices, arrows = zip(*(_templates(kind, groups) for kind in cols.kinds)) if cols.kinds else ((), (), ())
    head, mid, tail = zip(*slices) if slices else ((), (), ())
    flow_head, flow_mid, flow_tail = zip(*arrows) if arrows else ((), (), ())
    text = {mask: _string(describe_mask(mask)) for mask in set(cols.samples)}
    kind = np.frombuffer(cols.kind, dtype=np.uint32)
    is_p2p = np.array([stream == "p2p" for _, stream, *_ in cols.kinds], dtype=bool)
    for i in range(0, len(kind), chunk):
        k, ranks = cols.kind[i:i + chunk], cols.rank[i:i + chunk]
        ts_text = floats(0, i, i + chunk)
        flows = np.full(len(k), "", dtype=object)  # a point-to-point op's end of its message's arrow
        at = np.flatnonzero(is_p2p[kind[i:i + chunk]])
        if len(at):
            ends = [k[j] for j in at.tolist()]
            flows[at] = list(map("".join, zip(
                map(flow_head.__getitem__, ends), map(int.__repr__, np.asarray(ranks)[at].tolist()),
                map(flow_mid.__getitem__, ends), map(_dumps_int, (cols.op_id[i + j] for j in at.tolist())),
                repeat(',"ts":'), map(ts_text.__getitem__, at.tolist()), map(flow_tail.__getitem__, ends))))
        write("".join(chain.from_iterable(zip(
            repeat(',{"ph":"X","pid":'), map(int.__repr__, ranks), map(head.__getitem__, k), ts_text,
            repeat(',"dur":'), floats(1, i, i + chunk), map(mid.__getitem__, k),
            map(text.__getitem__, cols.samples[i:i + chunk]), map(tail.__getitem__, k), flows.tolist()))))
    # each rank's threads in the order `chrome_trace` finds them: its sets get the same tids in the same order
    thread = np.asarray(tids, dtype=np.int64)[kind] + (np.asarray(cols.rank, dtype=np.int64) << 32)
    keys, first = np.unique(thread, return_index=True)
    threads: dict[int, set[int]] = {}
    for key in keys[np.argsort(first)].tolist():
        threads.setdefault(key >> 32, set()).add(key & 0xFFFFFFFF)
    write("".join("," + _dumps(trace.thread_name(rank, tid, names)) for rank, tids_ in threads.items()
                  for tid in tids_))


def _write_spec_ops(result: Traced, fh: TextIO, chunk: int) -> None:
    """The ops' events and thread names through `trace.op_events`, for a log the fast path does not fit."""
    names = trace.collective_groups(result.raw_events)
    groups = {ranks: i for i, ranks in enumerate(names)}
    threads: dict[int, set[int]] = {}
    for part in _chunks(result.raw_events, chunk):
        out = []
        for e in part:
            op = trace.op_events(e, groups, describe_mask(e[6]))
            threads.setdefault(e[0], set()).add(op[0]["tid"])
            out += op
        fh.write("".join("," + _dumps(ev) for ev in out))
    fh.write("".join("," + _dumps(trace.thread_name(rank, tid, names)) for rank, tids in threads.items()
                     for tid in tids))


def write_chrome_trace(result: Traced, path: str | Path) -> Path:
    """Write `result`'s trace as JSON to `path`, creating its folder; returns the path. A path ending in `.gz`
    gets the JSON gzip-compressed (Perfetto and chrome://tracing open it as it is). A path that cannot be
    written (a folder, a file where a folder should be, no permission) is one `OSError` naming it; a write
    that fails or is interrupted halfway leaves no file behind."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"write_chrome_trace: the path must be a str or Path, got {type(path).__name__} {path!r}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write the trace to {path}: it is a folder; give a file path such as "
                                f"{path / 'trace.json'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb" if path.suffix == ".gz" else "w") as fh:
            try:
                if path.suffix == ".gz":
                    # mtime 0: the same step gives the same bytes
                    with gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as packed, \
                            io.TextIOWrapper(packed, encoding="ascii") as text:
                        write_trace_text(result, text, DUMP_CHUNK)
                else:
                    write_trace_text(result, fh, DUMP_CHUNK)
            except BaseException:
                fh.close()
                path.unlink(missing_ok=True)
                raise
    except (FileExistsError, NotADirectoryError) as exc:  # a file stands where a folder of the path should be
        blocker = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), path.parent)
        raise type(exc)(f"cannot write the trace to {path}: {blocker} is a file, not a folder") from None
    except OSError as exc:
        raise type(exc)(f"cannot write the trace to {path}: {exc.strerror or exc}") from None
    return path


DUMP_CHUNK = 4096
"""Events formatted and written at a time: a long step's trace is never all in memory as text."""

GZIP_LEVEL = 3
"""zlib's level for a `.gz` trace: levels 1 to 3 run at one speed, and 3 makes traces of steps 12 to 14 times
smaller than their JSON, for up to half again the time of writing it (`benchmarks/trace_speed.py --gzip`)."""

"""The trace file is `chrome_trace` as JSON byte for byte, however it is written; the validator's column
check never passes a trace the event-by-event check faults."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest

from dist_lib.output import trace, trace_text
from dist_lib import simulate, validate_trace
from dist_lib.output.trace import SETTLE_US, chrome_trace, memory_counter

STEPS = {
    "ddp": ("strategies/ddp.py", "1x4xA100-80GB", "toy:layers=3", 8, {"microbatch_size": 1}),
    "zero3": ("strategies/zero.py", "1x4xA100-80GB", "toy:layers=3", 8, {"stage": 3, "microbatch_size": 1}),
    "1f1b": ("strategies/hybrid.py", "1x4xA100-80GB", "toy:layers=4", 8,
             {"microbatch_size": 1, "tp": 1, "pp": 4, "dp": 1, "schedule": "1f1b"}),
    # TP all-reduces on their own threads, pipeline messages as flows, and recomputed forwards
    "interleaved tp": ("strategies/hybrid.py", "1x8xA100-80GB", "toy:layers=8", 8,
                       {"microbatch_size": 1, "tp": 2, "pp": 2, "dp": 2, "schedule": "interleaved",
                        "recompute": True}),
    "hetero, mixed cluster": ("strategies/hetero.py", "1x2xA100-80GB+1x2xV100-32GB", "toy:layers=4", 8, {"pp": 2}),
}


def step(name: str):
    strategy, cluster, workload, batch, options = STEPS[name]
    return simulate(strategy, cluster, workload, batch, **options)


def spec_text(result) -> str:
    return json.dumps(chrome_trace(result), separators=(",", ":"))


@pytest.mark.parametrize("name", sorted(STEPS))
def test_the_file_is_chrome_trace_as_json_byte_for_byte(tmp_path, monkeypatch, name):
    result = step(name)
    expected = spec_text(result)
    assert result.write_chrome_trace(tmp_path / "t.json").read_text() == expected
    monkeypatch.setattr(trace_text, "DUMP_CHUNK", 5)  # chunks that split flows from slices and a rank's counter
    assert result.write_chrome_trace(tmp_path / "t5.json").read_text() == expected
    assert validate_trace(tmp_path / "t5.json") == []
    # and the column check alone accepts it (were it to refuse every trace, the event-by-event check
    # would still answer, only slower)
    from dist_lib.output import trace_validate
    assert trace_validate._well_formed(json.loads(expected)["traceEvents"])


def test_an_event_list_of_tuples_writes_the_same_text(tmp_path):
    # results rebuilt from a payload hold a plain list, each peers tuple its own object
    result = step("interleaved tp")
    expected = spec_text(result)
    result.raw_events = [e[:9] + (tuple(e[9]) if e[9] is not None else None,) + e[10:] for e in result.raw_events]
    assert result.write_chrome_trace(tmp_path / "list.json").read_text() == expected
    # times that are numpy floats rather than floats go through the event-by-event formatter
    result.raw_events = [e[:3] + (np.float64(e[3]), np.float64(e[4])) + e[5:] for e in result.raw_events]
    assert result.write_chrome_trace(tmp_path / "numpy.json").read_text() == expected


def test_a_gz_path_gets_the_same_json_compressed(tmp_path):
    result = step("1f1b")
    path = result.write_chrome_trace(tmp_path / "t.json.gz")
    assert gzip.decompress(path.read_bytes()).decode() == spec_text(result)
    first = path.read_bytes()
    assert result.write_chrome_trace(path).read_bytes() == first  # no timestamp in the header
    assert validate_trace(path) == []
    plain = tmp_path / "plain.json.gz"
    plain.write_text("{}")
    assert validate_trace(plain)[0].startswith(f"trace file {plain}: not gzip")


def test_a_write_that_fails_halfway_leaves_no_file(tmp_path, monkeypatch):
    from dist_lib.output import trace_text as text
    result = step("ddp")

    def halfway(result, fh, chunk):
        fh.write('{"traceEvents":[')
        raise KeyboardInterrupt
    monkeypatch.setattr(text, "write_trace_text", halfway)
    with pytest.raises(KeyboardInterrupt):
        result.write_chrome_trace(tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


META = {"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": "r"}}


def slice_(name: str, ts: float, dur: float, tid: int = 0, pid: int = 0) -> dict:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}


def test_the_column_check_hands_every_fault_to_the_event_by_event_check():
    # float times, as the writer writes them: the traces the column check takes on
    assert validate_trace({"traceEvents": [META, slice_("a", 0.0, 10.0), slice_("b", 10.0, 5.0)]}) == []
    assert validate_trace({"traceEvents": [META, slice_("a", 0.0, 10.0), slice_("b", 2.0, 3.0)]}) == []  # nested
    assert validate_trace({"traceEvents": [META, slice_("a", 0.0, 10.0), slice_("b", 5.0, 10.0)]}) == [
        "pid 0 tid 0: 'b' at 5.000 us overlaps 'a' without nesting"]
    # the same overlap on another thread is none
    assert validate_trace({"traceEvents": [META, slice_("a", 0.0, 10.0), slice_("b", 5.0, 10.0, tid=1)]}) == []
    assert validate_trace({"traceEvents": [META, slice_("a", 0.0, -1.0)]}) == ["event 1 (a): dur missing or negative"]
    assert validate_trace({"traceEvents": [slice_("a", 0.0, 1.0, pid=3)]}) == ["pid 3: no process_name metadata"]
    flows = [{"ph": "s", "pid": 0, "tid": 0, "name": "m", "id": 4, "ts": 2.0},
             {"ph": "f", "pid": 0, "tid": 0, "name": "m", "id": 4, "ts": 1.0}]
    assert validate_trace({"traceEvents": [META, *flows]}) == ["flow 4: ends before it starts"]
    counter = {"ph": "C", "pid": 0, "tid": 0, "name": "memory", "ts": 1.0, "args": {"GiB": "1"}}
    assert validate_trace({"traceEvents": [META, counter]}) == ["event 1: counter args must be numbers"]
    assert validate_trace({"traceEvents": [META, {**counter, "ph": "B"}]}) == ["event 1: unexpected ph 'B'"]


def test_a_step_trace_with_one_slice_moved_onto_another_fails(tmp_path):
    path = step("interleaved tp").write_chrome_trace(tmp_path / "t.json")
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    computes = [e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 0]
    first, second = computes[0], computes[1]
    second["ts"] = first["ts"] + first["dur"] / 2  # starts inside the first, ends after it
    second["dur"] = first["dur"]
    assert validate_trace(data) == [f"pid 0 tid 0: {second['name']!r} at {second['ts']:.3f} us overlaps "
                                    f"{first['name']!r} without nesting"]


def reference_counter(times, values):
    """The memory counter a point at a time: the specification `memory_counter` computes column-wise."""
    points, i, n = [], 0, len(times)
    while i < n:
        t, peak = times[i], values[i]
        while i + 1 < n and times[i + 1] == t:
            i += 1
            peak = max(peak, values[i])
        points.append((t * 1e6, peak))
        if values[i] != peak and (i + 1 == n or times[i + 1] * 1e6 > t * 1e6 + SETTLE_US):
            points.append((t * 1e6 + SETTLE_US, values[i]))
        i += 1
    return points


def test_the_memory_counter_matches_a_point_at_a_time_reading():
    rng = random.Random(5)
    for _ in range(200):
        # instants 0.4 ns apart or more: a settle point 1 ns on gives way to an instant closer than that
        times = sorted(rng.choice([k * 4e-10 for k in range(12)]) for _ in range(rng.randrange(0, 14)))
        values = [float(rng.randrange(0, 5) * 2**20) for _ in times]
        assert memory_counter(times, values) == reference_counter(times, values)

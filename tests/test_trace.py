"""The Chrome trace loads in Perfetto: structure, names, threads, counters and flows."""

from __future__ import annotations

import json

from dist_lib import simulate, validate_trace
from dist_lib.output.trace import chrome_trace


async def relay(model):
    """A two-stage relay: rank 0 runs layer 0 and sends, rank 1 runs layer 1 and sends gradients back."""
    w, o = model.load_weights(model.rank)
    samples = range(model.global_batch_size)
    if model.rank == 0:
        x = model.get_input_activation(samples)
        await model.send(model.forward(0, x, w), 1)
        grad = await model.recv(1)
        wg, _ = model.backward(0, x, grad, w)
    else:
        h = await model.recv(0)
        wg, grad = model.backward(1, h, model.loss(model.forward(1, h, w)), w)
        await model.send(grad, 0)
    model.set_final_weight(model.rank, model.update(model.rank, wg, w, o)[0])


def test_trace_is_valid_and_labelled(tmp_path):
    result = simulate(relay, "1x2xA100-80GB", "toy:layers=2", 2)
    path = result.write_chrome_trace(tmp_path / "t.json")
    assert validate_trace(path) == []
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0 · A100-80GB · node 0", "rank 1 · A100-80GB · node 0"}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(0, "compute"), (0, "send → 1"), (0, "recv ← 1"), (1, "recv ← 0"), (1, "send → 0")} <= threads
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert len(flows) == 4 and {e["id"] for e in flows} == {e["id"] for e in flows if e["ph"] == "s"}
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 1}
    forward = next(e for e in events if e["ph"] == "X" and e["cat"] == "forward")
    assert forward["args"]["layer"] == 0 and forward["args"]["samples"] == "0-1"


def test_ddp_trace_separates_compute_and_collectives():
    result = simulate("strategies/ddp.py", "1x4xA100-80GB", "toy:layers=3", 8, microbatch_size=1, fold=False)
    trace = chrome_trace(result)
    assert validate_trace(trace) == []
    collective = [e for e in trace["traceEvents"] if e.get("cat") == "all_reduce"]
    assert len(collective) == 4 * 3 and all(e["tid"] == 1 and e["args"]["group"] == [0, 1, 2, 3] for e in collective)


def test_each_communicator_is_a_thread_of_its_own():
    # hybrid TP 2 x DP 2 on 4 ranks: TP groups {0, 1}, {2, 3} and DP groups {0, 2}, {1, 3}; their
    # collectives may overlap in time, so each rank shows one thread per group it belongs to
    result = simulate("strategies/hybrid.py", "1x4xA100-80GB", "toy:layers=2", 8, tp=2, pp=1, dp=2, fold=False)
    trace = chrome_trace(result)
    assert validate_trace(trace) == []
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    label = {(0, 1): "group 0-1", (2, 3): "group 2-3", (0, 2): "group 0,2", (1, 3): "group 1,3"}
    reduces = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "all_reduce"]
    assert {tuple(e["args"]["group"]) for e in reduces} == set(label)
    assert all(names[(e["pid"], e["tid"])] == label[tuple(e["args"]["group"])] for e in reduces)
    threads = {pid: sorted(name for (p, _), name in names.items() if p == pid and name.startswith("group"))
               for pid in range(4)}
    assert threads == {0: ["group 0,2", "group 0-1"], 1: ["group 0-1", "group 1,3"],
                       2: ["group 0,2", "group 2-3"], 3: ["group 1,3", "group 2-3"]}


def test_validator_finds_broken_traces():
    meta = {"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": "r"}}
    overlapping = {"traceEvents": [meta,
                                   {"ph": "X", "pid": 0, "tid": 0, "name": "a", "ts": 0, "dur": 10},
                                   {"ph": "X", "pid": 0, "tid": 0, "name": "b", "ts": 5, "dur": 10}]}
    assert any("overlaps" in p for p in validate_trace(overlapping))
    nested = {"traceEvents": [meta,
                              {"ph": "X", "pid": 0, "tid": 0, "name": "a", "ts": 0, "dur": 10},
                              {"ph": "X", "pid": 0, "tid": 0, "name": "b", "ts": 2, "dur": 3}]}
    assert validate_trace(nested) == []
    unpaired = {"traceEvents": [meta, {"ph": "s", "pid": 0, "tid": 0, "name": "m", "id": 7, "ts": 1}]}
    assert validate_trace(unpaired) == ["flow 7: 1 starts and 0 ends"]
    assert "missing 'pid'" in validate_trace({"traceEvents": [{"ph": "X", "name": "x", "ts": 0, "dur": 1}]})[0]
    assert validate_trace({"nope": []}) == ["no traceEvents list"]


def test_the_memory_counter_reaches_each_ranks_reported_peak():
    # several allocations and frees share one timestamp, and each rank's peak lies inside such an instant
    # (a counter that kept an instant's last value stayed 6 and 2 MiB below the peaks)
    result = simulate("strategies/gpipe.py", "1x2xA100-80GB", "toy:layers=2", 4, microbatch_size=1)
    highest = [0.0] * 2
    final = [None] * 2
    for event in chrome_trace(result)["traceEvents"]:
        if event["ph"] == "C":
            highest[event["pid"]] = max(highest[event["pid"]], event["args"]["GiB"] * 2**30)
            final[event["pid"]] = event["args"]["GiB"] * 2**30
    assert highest == result.memory_bytes
    assert final == [values[-1] for _, values in result.timelines]  # and it ends where the rank ended


def test_a_peak_within_an_instant_shows_then_settles():
    from dist_lib.output.trace import SETTLE_US, memory_counter
    # at 1 us: +8, then -8 freed, then +2; at 3 us: +4
    times, values = [1e-6, 1e-6, 1e-6, 3e-6], [8, 0, 2, 6]
    assert memory_counter(times, values) == [(1.0, 8), (1.0 + SETTLE_US, 2), (3.0, 6)]

"""`profile --from-trace`: a PyTorch profiler (Kineto) trace of a training step into per-layer costs.

tests/data/kineto_step.json is one CPU training step of a small GPT recorded with torch 2.13
(tests/data/record_kineto_trace.py); the sums are checked against a plain recount of its events, and a
hand-written GPU trace against sums done by hand. No PyTorch needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_lib import SpecError, Workload
from dist_lib.hardware.kineto import import_trace, layer_costs
from dist_lib.hardware.profiles import ProfileSet
from grader.cli import main

DATA = Path(__file__).resolve().parent / "data"
TRACE = DATA / "kineto_step.json"
SHAPE = "gpt-350m:layers=2,hidden=64,heads=2,seq=32,vocab=128"


def _recount(events: list[dict], name: str) -> tuple[float, float]:
    """The convention, counted the slow way: forward is the CPU ops inside the range not inside another op;
    backward the autograd nodes whose sequence number an op inside the range holds."""
    span = next(e for e in events if e.get("cat") == "user_annotation" and e["name"] == name)
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["tid"] == span["tid"]]

    def within(e, outer):
        return e is not outer and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]
    inside = [e for e in ops if within(e, span)]
    outer = [e for e in inside if not any(within(e, o) for o in inside)]
    seqs = {e["args"].get("Sequence number") for e in inside} - {None}
    backward = [e for e in ops if e["name"].startswith("autograd::engine::evaluate_function:")
                and e["args"].get("Sequence number") in seqs]
    return sum(e["dur"] for e in outer) * 1e-6, sum(e["dur"] for e in backward) * 1e-6


def test_the_recorded_step_imports_into_the_sums_of_its_ops():
    events = [e for e in json.loads(TRACE.read_text())["traceEvents"] if e.get("ph") == "X"]
    costs = layer_costs(TRACE)
    assert sorted(costs) == ["embedding", "head", "layer.0", "layer.1", "optimizer"]
    for name in ("embedding", "layer.0", "layer.1", "head"):
        forward, backward = _recount(events, name)
        assert costs[name] == (pytest.approx(forward, abs=1e-12), pytest.approx(backward, abs=1e-12)), name
        assert forward > 0 and backward > 0, name
    # every backward node of the step is some range's: the layers' and head's sum to all of them but the
    # embedding's and the parameters' AccumulateGrad (no forward op creates those)
    nodes = [e for e in events if e["name"].startswith("autograd::engine::evaluate_function:")]
    attributed = sum(costs[n][1] for n in ("embedding", "layer.0", "layer.1", "head"))
    unattributed = sum(e["dur"] for e in nodes if "AccumulateGrad" in e["name"]) * 1e-6
    assert attributed + unattributed == pytest.approx(sum(e["dur"] for e in nodes) * 1e-6, rel=1e-9)
    # the figures as the trace holds them (ms: forward, backward)
    assert [round(x * 1e3, 3) for x in costs["layer.0"]] == [81.709, 207.172]
    assert [round(x * 1e3, 3) for x in costs["head"]] == [31.189, 59.226]


def _gpu_trace(path: Path) -> Path:
    """Two steps of one layer on a GPU: kernels count, the CPU time around them does not."""
    def x(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}
    events = []
    for step, base in enumerate((0, 1000)):
        c = 10 * step
        events += [
            x("user_annotation", "layer.0", base, 100),
            x("cpu_op", "aten::linear", base + 10, 50, **{"Sequence number": 7 + step}),
            x("cuda_runtime", "cudaLaunchKernel", base + 20, 5, correlation=c + 1),
            x("cuda_runtime", "cudaLaunchKernel", base + 40, 5, correlation=c + 2),
            x("kernel", "gemm", base + 30, 40 + step * 20, tid=7, correlation=c + 1),
            x("kernel", "gelu", base + 80, 6, tid=7, correlation=c + 2),
            x("cuda_runtime", "cudaLaunchKernel", base + 150, 5, correlation=c + 3),  # outside the range
            x("kernel", "other", base + 160, 999, tid=7, correlation=c + 3),
            x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", base + 300, 90, tid=2,
              **{"Sequence number": 7 + step}),
            x("cuda_runtime", "cudaLaunchKernel", base + 310, 5, tid=2, correlation=c + 4),
            x("kernel", "gemm_dgrad", base + 320, 70, tid=7, correlation=c + 4),
            x("gpu_memcpy", "Memcpy DtoD", base + 400, 4, tid=7, correlation=c + 4),
        ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_gpu_trace_counts_the_kernels_each_range_launched(tmp_path):
    costs = layer_costs(_gpu_trace(tmp_path / "gpu.json"))
    # forward: step 1 gemm 40 + gelu 6 = 46 us, step 2 60 + 6 = 66: median 56; backward 70 + 4 = 74 both steps
    assert costs == {"layer.0": (pytest.approx(56e-6), pytest.approx(74e-6))}


def test_the_command_writes_profiles_the_workload_reads(tmp_path, capsys):
    out = tmp_path / "from-trace"
    assert main(["profile", "--from-trace", str(TRACE), "--workload", SHAPE, "--microbatch", "2",
                 "--out", str(out)]) == 0
    profiles = ProfileSet.load(out)
    profile = profiles.profiles["CPU", 1, 2]
    costs = layer_costs(TRACE)
    assert profile.layer_seconds == pytest.approx([sum(costs[n]) for n in ("embedding", "layer.0", "layer.1", "head")],
                                                  abs=1e-9)
    assert profile.optimizer_seconds == pytest.approx(costs["optimizer"][0], abs=1e-9)
    assert Workload.load(f"profiles:{out},{SHAPE}").num_layers == 2
    assert "DeviceType.CPU_tp1_bs2.json" in capsys.readouterr().out


def test_a_trace_without_the_convention_says_what_is_missing(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "layer.1", "pid": 1,
                                                 "tid": 1, "ts": 0, "dur": 5}]}))
    with pytest.raises(SpecError, match="missing layer.0"):
        layer_costs(path)
    path.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(SpecError, match="no record_function range named layer.0"):
        layer_costs(path)
    with pytest.raises(SpecError, match="trace has 2 layer ranges but workload"):
        import_trace(TRACE, Workload.parse("gpt-350m:layers=3,hidden=64,heads=2,seq=32,vocab=128"))
    assert main(["profile", "--from-trace", str(tmp_path / "nope.json"), "--workload", SHAPE]) == 2

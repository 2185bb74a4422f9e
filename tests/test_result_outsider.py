"""A `Result` read from the outside: every field and method checked against values derived by hand (the
README's FLOP formula, the devices' data-sheet peaks, the schedules' bubble) and against each other."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dist_lib import simulate, validate_trace
from dist_lib.planner.plan import Plan
from dist_lib.output.trace import chrome_trace

MIXED = "1x4xA100-80GB+1x4xV100-32GB"
RUNS = {  # name: (strategy, cluster, workload, global batch, options)
    "ddp": ("ddp", "1x4xA100-80GB", "toy:layers=4", 16, {"microbatch_size": 2}),
    "zero1": ("zero", MIXED, "toy:layers=4", 16, {"stage": 1, "microbatch_size": 1}),
    "zero2": ("zero", "1x4xA100-80GB", "toy:layers=4", 16, {"stage": 2, "microbatch_size": 2}),
    "zero3": ("zero", "1x4xA100-80GB", "toy:layers=4", 16, {"stage": 3, "microbatch_size": 2}),
    "gpipe": ("gpipe", "1x4xA100-80GB", "toy:layers=4", 8, {}),
    "1f1b": ("one_f_one_b", MIXED, "toy", 8, {"pp": 4}),
    "interleaved": ("interleaved", "1x4xA100-80GB", "toy", 8, {}),
    "zero_bubble": ("zero_bubble", "1x4xA100-80GB", "toy:layers=4", 8, {}),
    "hybrid": ("hybrid", "1x8xA100-80GB", "gpt-350m:layers=4,seq=512", 8,
               {"tp": 2, "pp": 2, "recompute": True, "sequence_parallel": True}),
    "hetero": ("hetero", MIXED, "toy", 16, {}),
    "planned": ("planned", MIXED, "toy", 16, {}),
    "one_gpu": ("ddp", "T4", "toy:layers=2", 4, {"microbatch_size": 2}),
}
_cache: dict[str, object] = {}


def run(name: str):
    if name not in _cache:
        strategy, cluster, workload, batch, options = RUNS[name]
        # every rank's events, to check each field against (a folded step logs only its representatives')
        _cache[name] = simulate(f"strategies/{strategy}.py", cluster, workload, batch, fold=False, **options)
    return _cache[name]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)


@pytest.mark.parametrize("name", list(RUNS))
def test_every_field_agrees_with_the_events_the_memory_logs_and_the_others(name):
    r = run(name)
    world = r.cluster.world_size
    events = r.events
    assert r.correct and r.problems == []
    # the step ends with its last op; each rank with its own
    assert r.time_s == max(e.end for e in events) == max(r.rank_times)
    for rank in range(world):
        assert r.rank_times[rank] == max((e.end for e in events if e.rank == rank), default=0.0)
    # MFU / HFU: FLOPs over (step time x the summed data-sheet peaks)
    peaks = sum(r.cluster.device_of(k).peak_flops for k in range(world))
    assert r.peak_flops == peaks
    assert r.mfu == pytest.approx(r.model_flops / (r.time_s * peaks), rel=1e-12)
    assert r.hardware_flops == pytest.approx(sum(e.flops for e in events), rel=1e-12)
    assert r.hfu == pytest.approx(r.hardware_flops / (r.time_s * peaks), rel=1e-12)
    assert 0 < r.mfu <= r.hfu <= 1
    # memory: the peak is the timeline's highest point and the breakdown's sum there
    for rank in range(world):
        timeline = r.memory_timeline(rank)
        assert max(v for _, v in timeline) == r.memory_bytes[rank] == sum(r.memory_by_kind[rank].values())
        assert all(0 <= t <= r.time_s for t, _ in timeline) and all(v >= 0 for _, v in timeline)
        assert [t for t, _ in timeline] == sorted(t for t, _ in timeline)
        deltas, ids, kinds = r.memory_log[rank]
        assert len(deltas) == len(ids) == len(kinds) == len(timeline) and sum(deltas) == timeline[-1][1]
    assert r.peak_memory_bytes == max(r.memory_bytes) == r.memory_bytes[r.peak_memory_rank]
    assert r.peak_memory_rank == min(k for k in range(world) if r.memory_bytes[k] == r.peak_memory_bytes)
    # compute: one op at a time per rank, busy + idle = the step
    busy = r.compute_busy()
    for rank in range(world):
        spans = sorted((e.start, e.end) for e in events if e.rank == rank and e.stream == "compute")
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        assert busy[rank] == pytest.approx(sum(end - start for start, end in spans), rel=1e-12)
        assert 0 <= busy[rank] <= r.time_s
    assert r.bubble_fraction == pytest.approx(sum(r.time_s - b for b in busy) / (world * r.time_s), rel=1e-12)
    assert {e.stream for e in events} <= {"compute", "collective", "p2p"}
    assert len(r.timelines) == len(r.memory_by_kind) == len(r.memory_log) == world


@pytest.mark.parametrize("name", ["ddp", "hybrid", "planned", "one_gpu"])
def test_to_dict_is_json_that_reads_back_equal_and_repeats_the_fields(name):
    r = run(name)
    d = r.to_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    for key in ("time_s", "peak_memory_bytes", "peak_memory_rank", "mfu", "hfu", "bubble_fraction", "correct",
                "model_flops", "hardware_flops", "peak_flops", "global_batch_size", "strategy"):
        assert d[key] == getattr(r, key), key
    assert d["memory_bytes"] == list(r.memory_bytes) and d["rank_times"] == list(r.rank_times)
    assert d["world_size"] == r.cluster.world_size and d["cluster"] == r.cluster.name
    assert d["peak_memory_by_kind"] == r.memory_by_kind[r.peak_memory_rank]
    assert d["mfu"] == d["model_flops"] / (d["time_s"] * d["peak_flops"])


def test_options_that_are_not_json_become_json_in_to_dict(tmp_path):
    # planned takes a Plan, its dict or its file; hetero's partition may be a tuple
    plan = Plan.load({"stages": [{"ranks": list(range(8)), "tp": 1, "blocks": [[0, 8]], "shares": [2] * 8}],
                      "microbatch_size": 16, "microbatches": 1, "schedule": "1f1b"})
    plan.save(tmp_path / "plan.json")
    for given, expected in ((plan, plan.to_dict()), (tmp_path / "plan.json", str(tmp_path / "plan.json"))):
        d = simulate("strategies/planned.py", MIXED, "toy", 16, plan=given).to_dict()
        assert d["options"] == {"plan": expected}
        assert json.loads(json.dumps(d)) == d
    d = simulate("strategies/hetero.py", MIXED, "toy", 16, partition=(3, 5)).to_dict()
    assert d["options"] == {"partition": [3, 5]} and json.loads(json.dumps(d)) == d
    summary = simulate("strategies/planned.py", MIXED, "toy", 16, plan=plan).summary()
    assert len(summary.splitlines()[0]) < 100  # a plan's hundreds of characters are cut short


def test_mfu_is_the_readme_formula_by_hand():
    # toy: h = s = 1024; a layer's forward is 24 s h^2 + 4 s^2 h = 28 * 2^30 FLOPs a sample; no LM head;
    # MFU counts forward + backward = 3x forward for every sample, over 4 A100s at 312 TFLOP/s each
    r = run("ddp")
    model_flops = 3 * 4 * 28 * 2**30 * 16
    assert r.model_flops == model_flops
    assert r.mfu == pytest.approx(model_flops / (r.time_s * 4 * 312e12), rel=1e-12)
    # mixed: four A100s at 312 and four V100s at 125 TFLOP/s
    mixed = run("hetero")
    assert mixed.peak_flops == 4 * 312e12 + 4 * 125e12
    assert mixed.mfu == pytest.approx(3 * 8 * 28 * 2**30 * 16 / (mixed.time_s * 1748e12), rel=1e-12)


def test_hfu_counts_the_recomputed_forwards():
    # full recompute runs every layer's forward twice (not the LM head's); selective re-runs the
    # attention core, 4 s^2 h FLOPs a layer and sample (Korthikanti et al. 2022, sec. 5)
    full = run("hybrid")
    w = full.workload
    layers = sum(w.layer_forward_flops(layer) for layer in range(w.num_layers))
    assert full.model_flops == 3 * (layers + w.head_forward_flops()) * 8
    assert full.hardware_flops == pytest.approx(full.model_flops + layers * 8, rel=1e-12)
    selective = simulate("strategies/hybrid.py", "1x8xA100-80GB", "gpt-350m:layers=4,seq=512", 8, tp=2, pp=2,
                         selective_recompute=True)
    assert selective.hardware_flops == pytest.approx(selective.model_flops + 4 * 512**2 * 1024 * 4 * 8, rel=1e-12)


@pytest.mark.parametrize("strategy", ["gpipe", "one_f_one_b"])
@pytest.mark.parametrize("microbatches", [4, 16])
def test_bubble_is_the_schedules_formula_on_a_uniform_pipeline(strategy, microbatches):
    # four equal stages of two toy layers, one sample a microbatch: messages of 2 MiB take ~12 us against
    # ~2.4 ms of forward and backward a stage and microbatch, and the optimizer step (0.5 ms) is all that
    # is not pipelined, so the bubble is (p - 1) / (m + p - 1) within about 0.01
    r = simulate(f"strategies/{strategy}.py", "1x4xA100-80GB", "toy", microbatches)
    p, m = 4, microbatches
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=0.012)


def test_summary_shows_the_fields_figures():
    r = run("hetero")
    lines = dict(line.split(None, 1) if not line.startswith(("step ", "peak ", "MFU ")) else
                 (line[:14].strip(), line[14:]) for line in r.summary().splitlines())
    assert lines["step time"] == f"{r.time_s * 1e3:.2f} ms"
    assert lines["peak memory"].startswith(f"{r.peak_memory_bytes / 2**30:.2f} GiB on rank {r.peak_memory_rank} (")
    assert lines["MFU / HFU"] == f"{r.mfu * 100:.1f} % / {r.hfu * 100:.1f} %"
    assert lines["bubble"] == f"{r.bubble_fraction * 100:.1f} % of compute idle"
    assert lines["correct"] == "yes"
    assert repr(r).startswith(f"Result(hetero on {MIXED}, toy: {r.time_s * 1e3:.2f} ms")


def test_trace_goes_to_a_new_folder_and_is_valid_and_the_same_text_as_one_dump(tmp_path, monkeypatch):
    from dist_lib.output import trace, trace_text
    r = run("hybrid")
    monkeypatch.setattr(trace_text, "DUMP_CHUNK", 7)  # many chunks: the seams must not show
    path = r.write_chrome_trace(tmp_path / "new" / "deeper" / "t.json")
    assert path == tmp_path / "new" / "deeper" / "t.json"
    assert validate_trace(path) == []
    assert path.read_text() == json.dumps(chrome_trace(r), separators=(",", ":"))
    counters = {}
    for e in json.loads(path.read_text())["traceEvents"]:
        if e["ph"] == "C":
            counters[e["pid"]] = max(counters.get(e["pid"], 0), e["args"]["GiB"])
    assert [round(counters[k] * 2**30) for k in range(8)] == r.memory_bytes


def test_a_trace_that_cannot_be_written_is_one_error_naming_the_path(tmp_path, monkeypatch):
    r = run("one_gpu")
    with pytest.raises(IsADirectoryError, match=f"cannot write the trace to {tmp_path}: it is a folder"):
        r.write_chrome_trace(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match=f"{tmp_path / 'file'} is a file, not a folder"):
        r.write_chrome_trace(tmp_path / "file" / "t.json")
    with pytest.raises(TypeError, match="must be a str or Path, got int 5"):
        r.write_chrome_trace(5)

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(PermissionError, match=r"^cannot write the trace to .*t\.json: Permission denied$"):
        r.write_chrome_trace(tmp_path / "t.json")


def test_validate_trace_reports_a_file_it_cannot_read(tmp_path):
    assert validate_trace(tmp_path / "missing.json") == [f"trace file {tmp_path / 'missing.json'}: No such file or directory"]
    (tmp_path / "text.json").write_text("not json")
    assert validate_trace(tmp_path / "text.json")[0].startswith(f"trace file {tmp_path / 'text.json'}: not JSON")
    (tmp_path / "list.json").write_text("[1]")
    assert validate_trace(tmp_path / "list.json") == ["the trace is a JSON list, not an object with a traceEvents list"]
    assert validate_trace({"traceEvents": [1]}) == ["event 0: int 1, not an object"]


def test_a_rank_the_cluster_lacks_is_named():
    r = run("ddp")
    with pytest.raises(IndexError, match=r"^rank 4: the cluster has ranks 0-3$"):
        r.memory_timeline(4)
    with pytest.raises(IndexError, match=r"^rank -1: the cluster has ranks 0-3$"):
        r.memory_timeline(-1)
    with pytest.raises(TypeError, match="rank must be a whole number, got str '0'"):
        r.memory_timeline("0")
    with pytest.raises(IndexError, match=r"^rank 9: the cluster has ranks 0-3$"):
        r.memory_by_kind[9]
    assert r.memory_by_kind[-1] == r.memory_by_kind[3]  # a sequence: Python's negative indices
    assert list(r.memory_by_kind) == [r.memory_by_kind[k] for k in range(4)]


def test_an_incorrect_step_keeps_its_figures_and_says_why():
    async def forward_only(model):
        w, _ = model.load_weights(0)
        model.forward(0, model.get_input_activation(range(model.rank * 2, model.rank * 2 + 2)), w)

    r = simulate(forward_only, "1x2xA100-80GB", "toy", 4, check=False)
    assert not r.correct and r.problems and r.to_dict()["problems"] == r.problems
    assert "correct       NO: layer 0:" in r.summary() and math.isfinite(r.mfu)


def test_compute_busy_is_summed_once_and_handed_out_as_a_copy():
    r = run("gpipe")
    busy = r.compute_busy()
    bubble = r.bubble_fraction
    busy[0] = 0.0  # the caller's list: the result's figures stay
    assert r.compute_busy()[0] > 0 and r.bubble_fraction == bubble
    assert r.compute_busy() == r.compute_busy() and r.compute_busy() is not r.compute_busy()

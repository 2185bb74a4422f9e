"""FP8 linear layers (`costs.fp8`, `Model.forward(fp8=...)`, `hybrid`'s `fp8` option): GEMMs at the FP8 peak,
the casts' traffic counted tensor by tensor, refused where the device has no FP8 tensor cores, and replayed
by the grader as run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dist_lib import StrategyError, Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.costs.fp8 import cast_bytes
from dist_lib.hardware.devices import DEVICES
from dist_lib.run.recording import record
from dist_lib.run.replay import replay

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
H100 = DEVICES["H100-80GB"]
TOY = Workload.parse("toy")  # GPT layer: s 1024, h 1024, 4h MLP
M = 2**20


def test_cast_traffic_counted_tensor_by_tensor():
    """toy layer, one sample (1024 tokens), t = 1: GEMMs QKV 1024x3072x1024, projection 1024x1024x1024, MLP up
    1024x4096x1024, MLP down 1024x1024x4096. Forward casts the inputs (1M + 1M + 1M + 4M elements) and the
    weights (3M + 1M + 4M + 4M): 19M elements at 2 + 1 + 1 bytes; the backward the output gradients (3M + 1M
    + 4M + 1M); tensorwise scaling reads each once more for its amax, and casts the saved input and weight
    again in the backward."""
    assert cast_bytes(TOY, 1, 1, "forward", "delayed") == 4 * 19 * M
    assert cast_bytes(TOY, 1, 1, "forward", "tensorwise") == 6 * 19 * M
    assert cast_bytes(TOY, 1, 1, "input", "delayed") == 4 * 9 * M
    assert cast_bytes(TOY, 1, 1, "weight", "delayed") == 0
    assert cast_bytes(TOY, 1, 1, "input", "tensorwise") == 6 * (9 + 12) * M
    assert cast_bytes(TOY, 1, 1, "weight", "tensorwise") == 6 * 7 * M
    # t = 2: QKV 1M + 1.5M, projection 0.5M + 0.5M (its K split), MLP up 1M + 2M, MLP down 2M + 2M
    assert cast_bytes(TOY, 1, 2, "forward", "delayed") == 4 * (1 + 1.5 + 0.5 + 0.5 + 1 + 2 + 2 + 2) * M


def test_fp8_forward_is_the_gemms_at_the_fp8_peak_plus_the_casts():
    fast = replace(H100, peak_flops=H100.fp8_flops)
    shapes = [(1024, 3072, 1024), (1024, 1024, 1024), (1024, 4096, 1024), (1024, 1024, 4096)]
    bf16 = sum(costs.gemm_time(H100, *s) for s in shapes)
    fp8 = sum(costs.gemm_time(fast, *s) for s in shapes)
    delta = costs.forward_time(H100, TOY, 0, 1, 1, fp8="delayed") - costs.forward_time(H100, TOY, 0, 1, 1)
    assert delta == pytest.approx(fp8 - bf16 + 4 * 19 * M / H100.hbm_bandwidth)
    # twice the peak at the same tile efficiency; the 16-bit tile stores take what they took
    assert bf16 / 2 < fp8 < bf16 / 1.8


def test_hybrid_fp8_runs_faster_and_is_refused_without_fp8_tensor_cores():
    plain = simulate(HYBRID, "1x4xH100-80GB", TOY, 8, dp=2, pp=1, tp=2)
    fast = simulate(HYBRID, "1x4xH100-80GB", TOY, 8, dp=2, pp=1, tp=2, fp8="delayed")
    assert plain.correct and fast.correct and fast.time_s < plain.time_s
    # the backward split in two beside the TP all-reduce: both halves in FP8
    assert {(e.op, e.detail) for e in fast.events if e.op.startswith("backward")} == {
        ("backward_input", "fp8 delayed"), ("backward_weight", "fp8 delayed")}
    with pytest.raises(StrategyError, match="A100-80GB has no FP8 tensor cores"):
        simulate(HYBRID, "1x4xA100-80GB", TOY, 8, dp=2, pp=1, tp=2, fp8="delayed")
    with pytest.raises(StrategyError, match="fp8 must be one of delayed, tensorwise"):
        simulate(HYBRID, "1x4xH100-80GB", TOY, 8, dp=2, pp=1, tp=2, fp8="e4m3")


@pytest.mark.parametrize("options", [dict(fp8="tensorwise"), dict(fp8="delayed", sequence_parallel=True),
                                     dict(fp8="delayed", selective_recompute=True, fsdp=True)])
def test_the_grader_replays_fp8_runs_as_simulated(options):
    cluster, work = "1x4xH100-80GB", Workload.parse("gpt-125m:layers=4,vocab=8192")
    result = simulate(HYBRID, cluster, work, 8, pp=2, tp=2, **options)
    _, programs = record(HYBRID, cluster, work, 8, pp=2, tp=2, **options)
    replayed = replay(programs, cluster, work, 8)
    assert replayed.correct and replayed.time_s == result.time_s
    assert replayed.memory_bytes == result.memory_bytes


@pytest.mark.parametrize("options", [dict(fsdp=True, selective_recompute=True),
                                     dict(fsdp=True, fp8="tensorwise", selective_recompute=True),
                                     dict(tp=2, dp=4, sequence_parallel=True, distributed_optimizer=True,
                                          overlap_param_gather=True, fp8="delayed", selective_recompute=True)])
def test_llama_3_8b_on_one_h100_node_runs_correct_and_fits(options):
    options = {"dp": 8, "tp": 1, "pp": 1, **options}
    result = simulate(HYBRID, "1x8xH100-80GB", "llama-3-8b", 8, **options)
    assert result.correct, result.problems

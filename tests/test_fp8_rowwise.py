"""torchao's rowwise Float8 recipe (`costs.fp8`, fp8="rowwise"): every GEMM casts both its operands per row along
its own contraction axis (amax read, cast read and FP8 write: 5 bytes an element), a per-op recompute runs the
amax again, and the recipe goes through hybrid, the grader and torchtitan's export and import."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from dist_lib import Cluster, Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.costs.fp8 import cast_bytes, recompute_cast_bytes
from dist_lib.hardware.devices import DEVICES
from dist_lib.planner import plan
from dist_lib.planner.export import export
from dist_lib.planner.launch_import import from_torchtitan
from dist_lib.run.recording import record
from dist_lib.run.replay import replay

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
H100 = DEVICES["H100-80GB"]
TOY = Workload.parse("toy")  # GPT layer: s 1024, h 1024, 4h MLP
M = 2**20


def test_rowwise_casts_each_operand_of_each_gemm():
    """toy layer, one sample (1024 tokens), t = 1; forward shapes (M, N, K): QKV 1024x3072x1024, projection
    1024x1024x1024, MLP up 1024x4096x1024, MLP down 1024x1024x4096. Inputs M x K: 1 + 1 + 1 + 4 = 7M elements;
    weights K x N: 3 + 1 + 4 + 4 = 12M; output gradients M x N: 3 + 1 + 4 + 1 = 9M. Forward casts inputs and
    weights, the input-gradient GEMM output gradients and weights, the weight-gradient GEMM output gradients
    and inputs, each at 2 (amax) + 2 (read) + 1 (FP8 write) bytes."""
    assert cast_bytes(TOY, 1, 1, "forward", "rowwise") == 5 * (7 + 12) * M
    assert cast_bytes(TOY, 1, 1, "input", "rowwise") == 5 * (9 + 12) * M
    assert cast_bytes(TOY, 1, 1, "weight", "rowwise") == 5 * (9 + 7) * M
    # per-op recompute of the QKV GEMM alone: its input and weight again, the amax pass too (4 bytes tensorwise)
    qkv = [(1024, 3072, 1024)]
    assert recompute_cast_bytes(qkv, "rowwise") == 5 * 4 * M
    assert recompute_cast_bytes(qkv, "tensorwise") == 4 * 4 * M


def test_rowwise_layer_times_are_the_fp8_gemms_plus_the_casts():
    fast = replace(H100, peak_flops=H100.fp8_flops)
    shapes = [(1024, 3072, 1024), (1024, 1024, 1024), (1024, 4096, 1024), (1024, 1024, 4096)]
    gemms = sum(costs.gemm_time(fast, *s) for s in shapes) - sum(costs.gemm_time(H100, *s) for s in shapes)
    forward = costs.forward_time(H100, TOY, 0, 1, 1, fp8="rowwise") - costs.forward_time(H100, TOY, 0, 1, 1)
    assert forward == pytest.approx(gemms + 5 * 19 * M / H100.hbm_bandwidth)
    # the weight-gradient GEMMs (K, N, M) in FP8 too, after casting output gradients and inputs: 16M elements
    wgrad_shapes = [(k, n, m) for m, n, k in shapes]
    wgrad = sum(costs.gemm_time(fast, *s) for s in wgrad_shapes) + 5 * 16 * M / H100.hbm_bandwidth
    assert costs.backward_weight_time(H100, TOY, 0, 1, 1, fp8="rowwise") == pytest.approx(wgrad)


def test_hybrid_runs_rowwise_and_the_grader_replays_it():
    cluster, work = "1x4xH100-80GB", Workload.parse("llama-3-8b:layers=4,seq=1024,vocab=8192")
    options = dict(pp=2, tp=2, fp8="rowwise", recompute="op", framework="torchtitan")
    result = simulate(HYBRID, cluster, work, 8, **options)
    assert result.correct
    # torchtitan's backward runs whole (its TP reductions wait for both gradients: no split to overlap them),
    # every layer's in the per-op policy, sequence-parallel, with rowwise FP8 GEMMs
    assert {(e.op, e.detail) for e in result.events if e.op.startswith("backward")} == \
        {("backward", "per-op, sequence-parallel, fp8 rowwise")}
    _, programs = record(HYBRID, cluster, work, 8, **options)
    replayed = replay(programs, cluster, work, 8)
    assert replayed.correct and replayed.time_s == result.time_s


def test_torchtitan_exports_and_imports_the_rowwise_recipe():
    """torchtitan v0.2.2's `[quantize.linear.float8] recipe_name` takes "rowwise" (config/job_config.py)."""
    cluster, workload = Cluster.load("1x8xH100-80GB"), Workload.load("llama-3-8b:layers=4")
    best = plan(cluster, workload, 32, framework="torchtitan", top=0).best.plan
    rowwise = best.__class__(**{**{f: getattr(best, f) for f in best.__slots__}, "fp8": "rowwise"})
    text = export(rowwise, "torchtitan", workload, cluster).settings
    assert tomllib.loads(text)["quantize"]["linear"]["float8"]["recipe_name"] == "rowwise"
    imported = from_torchtitan(text, workload, 8)
    assert imported.launch.fp8 == "rowwise"
    assert imported.launch.strategy(workload.num_layers)[1]["fp8"] == "rowwise"
    with pytest.raises(Exception, match="recipe_name = 'rowwise_with_gw_hp' is not simulated"):
        from_torchtitan(text.replace('"rowwise"', '"rowwise_with_gw_hp"'), workload, 8)

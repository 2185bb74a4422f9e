"""FP8 and activation recompute with experts. FP8 (hybrid's `fp8` with an MoE workload): the attention's
linear layers, the shared experts and the routed experts' grouped GEMM at the device's FP8 peak after their
casts, as Transformer Engine runs Megatron-Core's MoE layers; the router stays 16-bit. Recompute: full
recompute keeps each layer's input only and runs an MoE layer's whole forward again before its backward, its
all-to-alls included (Megatron-LM's checkpointed layers); selective recompute re-runs the attention core.
Costs derived by hand, steps correct and replayable, refused by name where the device has no FP8."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.costs import compute, moe_ops
from dist_lib.costs.fp8 import fp8_device
from dist_lib.hardware.devices import get_device
from dist_lib.workload.transformer import Workload
from dist_lib.testing import replays_alike

HYBRID = "strategies/hybrid.py"
TOY = ("toy:layers=4,hidden=256,heads=4,seq=128,experts=4,top_k=2,expert_ffn_hidden=512,moe_every=2,"
       "dense_ffn_hidden=512,shared_experts=1")
H100 = get_device("H100-80GB")


def test_the_experts_grouped_gemm_runs_at_the_fp8_peak_after_its_casts():
    """Mixtral's experts, 8192 tokens: h = 4096, f = 14336. Forward GEMMs (n x 2f x h) and (n x h x f) at the
    FP8 peak; delayed scaling casts each input and weight once (read 2, write 1 + 1 transposed bytes an
    element: n h + h 2f + n f + f h elements), tensorwise reads each once more for its amax (2 bytes)."""
    w, n, h, f = Workload.parse("mixtral-8x7b"), 8192, 4096, 14336
    fast = fp8_device(H100)
    gemms = compute.gemm_time(fast, n, 2 * f, h) + compute.gemm_time(fast, n, h, f)
    swiglu = n * f * 3 * 2 / H100.hbm_bandwidth
    elements = n * h + h * 2 * f + n * f + f * h
    for recipe, per_element in (("delayed", 4), ("tensorwise", 6)):
        seconds, flops = moe_ops.experts_cost(H100, w, [n], False, fp8=recipe)
        assert seconds == pytest.approx(gemms + per_element * elements / H100.hbm_bandwidth + swiglu, rel=1e-12)
        assert flops == moe_ops.experts_cost(H100, w, [n], False)[1] == 2 * n * 3 * h * f


def test_the_router_stays_16_bit():
    """In FP8 the attention's GEMMs speed up and the router's (tokens x E x h) does not: the route's time
    under FP8 minus its attention GEMMs' FP8 time and casts is its 16-bit time minus their 16-bit time."""
    w = Workload.parse("mixtral-8x7b")
    one, _ = moe_ops.route_cost(H100, w, 0, 1, False)
    eight, _ = moe_ops.route_cost(H100, w, 0, 1, False, fp8="delayed")
    tokens, h, kv = 4096, 4096, 8 * 128
    attention = [(tokens, h + 2 * kv, h), (tokens, h, h)]  # QKV (GQA, 8 KV heads of 128), W_o
    fast = fp8_device(H100)
    gemm16 = sum(compute.gemm_time(H100, *s) for s in attention)
    gemm8 = sum(compute.gemm_time(fast, *s) for s in attention)
    casts = 4 * sum(m * k + k * n for m, n, k in attention) / H100.hbm_bandwidth
    assert eight - (gemm8 + casts) == pytest.approx(one - gemm16, rel=1e-9)


def test_fp8_with_tp_and_experts_is_correct_faster_and_replays():
    options = dict(pp=2, tp=2, ep=2, sequence_parallel=True)
    plain = simulate(HYBRID, "1x8xH100-80GB", TOY, 4, **options)
    eight = simulate(HYBRID, "1x8xH100-80GB", TOY, 4, fp8="delayed", **options)
    assert plain.correct and eight.correct, eight.problems
    assert eight.time_s < plain.time_s
    replays_alike(HYBRID, "1x8xH100-80GB", TOY, 4, fp8="tensorwise", **options)


def test_fp8_with_experts_on_a_device_without_fp8_is_refused_by_name():
    from dist_lib import StrategyError
    with pytest.raises((ValueError, StrategyError), match="fp8='delayed': A100-80GB has no FP8 tensor cores"):
        simulate(HYBRID, "1x8xA100-80GB", TOY, 8, pp=2, ep=2, fp8="delayed")


def test_full_recompute_runs_every_forward_again_all_to_alls_included():
    """No recompute: each rank does 1 forward + 2 backward units of work, so full recompute's extra forward
    is exactly a third more FLOPs. Per MoE layer and microbatch a TP rank runs 5 all-to-alls (the attention
    output's reduce-scatter, dispatch, combine, output and input gradients); recompute repeats the first 3."""
    options = dict(pp=2, tp=2, ep=2, sequence_parallel=True)
    plain = simulate(HYBRID, "1x8xH100-80GB", TOY, 4, **options)
    full = simulate(HYBRID, "1x8xH100-80GB", TOY, 4, recompute=True, **options)
    assert plain.correct and full.correct, full.problems
    assert full.hardware_flops == plain.hardware_flops * 4 / 3
    count = lambda r: sum(1 for e in r.events if e.op == "all_to_all")  # noqa: E731
    assert count(plain) == 5 * 2 * 8 and count(full) == 8 * 2 * 8  # 2 MoE layers x 1 microbatch, 8 ranks
    assert full.time_s > plain.time_s


def test_selective_recompute_re_runs_the_attention_core_and_keeps_less():
    """The core's forward, 4 s^2 h FLOPs a sample (Q K^T and P V: 2 s^2 h each), once more per layer and
    sample: 4 x 128^2 x 256 x 8 samples x 4 layers more."""
    plain = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2)
    selective = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2, selective_recompute=True)
    assert selective.correct
    assert selective.hardware_flops - plain.hardware_flops == 4 * 128 ** 2 * 256 * 8 * 4
    assert max(selective.memory_bytes) < max(plain.memory_bytes)


def test_recompute_lowers_mixtrals_peak_and_replays():
    # the s^2 softmax stash of unfused attention is what full recompute saves most of
    workload, options = "mixtral-8x7b:layers=8,attention=unfused,dropout=true", dict(pp=2, ep=8, tp=2, sequence_parallel=True, etp=1)
    plain = simulate(HYBRID, "2x8xH100-80GB", workload, 16, **options)
    full = simulate(HYBRID, "2x8xH100-80GB", workload, 16, recompute=True, **options)
    assert full.correct and max(full.memory_bytes) < 0.6 * max(plain.memory_bytes)
    for mode in (dict(recompute=True), dict(selective_recompute=True)):
        replays_alike(HYBRID, "1x8xH100-80GB", TOY, 4, pp=2, tp=2, ep=2, sequence_parallel=True, **mode)

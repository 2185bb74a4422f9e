"""Separate projections (workload `projections = "separate"`, torchtitan's Llama: `wq`, `wk`, `wv`, `w1`, `w3` each
an `nn.Linear`): each is a GEMM of its own, each FP8 linear layer casts its own input, and the TP overlap sums the
GEMMs that take one gathered input. Every figure below is derived by hand."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.costs import tp_overlap
from dist_lib.costs.fp8 import cast_bytes, fp8_device
from dist_lib.errors import SpecError
from dist_lib.hardware.devices import DEVICES
from dist_lib.workload import architecture as arch

H100 = DEVICES["H100-80GB"]
# llama-3-8b's layer: h 4096, 32 query heads and 8 key/value heads of 128 (q 4096, kv 1024), SwiGLU f 14336
FUSED = Workload.parse("llama-3-8b:seq=1024")
SEPARATE = Workload.parse("llama-3-8b:seq=1024,projections=separate")
T = 1024  # tokens of one sample


def test_separate_shapes_are_one_gemm_a_linear_layer():
    """At t = 2: wq 1024 x 2048 x 4096, wk and wv 1024 x 512 x 4096, wo 1024 x 4096 x 2048, w1 and w3
    1024 x 7168 x 4096, w2 1024 x 4096 x 7168; fused, QKV 1024 x 3072 x 4096 and gate/up 1024 x 14336 x 4096."""
    assert arch.weight_gemm_shapes(SEPARATE, T, 2) == [
        (T, 2048, 4096), (T, 512, 4096), (T, 512, 4096), (T, 4096, 2048), (T, 7168, 4096), (T, 7168, 4096),
        (T, 4096, 7168)]
    assert arch.weight_gemm_shapes(FUSED, T, 2) == [(T, 3072, 4096), (T, 4096, 2048), (T, 14336, 4096),
                                                    (T, 4096, 7168)]
    assert arch.weight_gemm_shapes(SEPARATE, T, 2, per_module=False) == arch.weight_gemm_shapes(FUSED, T, 2)
    assert arch.projection_groups(SEPARATE) == (3, 1, 2, 1) and arch.projection_groups(FUSED) == (1, 1, 1, 1)
    gelu = Workload.parse("gpt-1.3b:projections=separate")  # GeLU MLP: one up projection
    assert arch.projection_groups(gelu) == (3, 1, 1, 1) and len(arch.weight_gemm_shapes(gelu, T, 1)) == 6
    # the same FLOPs, parameters and stash: only the GEMMs' shapes differ
    assert SEPARATE.layer_gemm_flops(0) == FUSED.layer_gemm_flops(0)
    assert SEPARATE.layer_params(0) == FUSED.layer_params(0) and SEPARATE.stash_bytes(0) == FUSED.stash_bytes(0)


def test_each_separate_gemm_is_timed_by_its_shape():
    shapes = arch.weight_gemm_shapes(SEPARATE, T, 1)
    gemms = sum(costs.gemm_time(H100, m, n, k) for m, n, k in shapes)
    fused = sum(costs.gemm_time(H100, m, n, k) for m, n, k in arch.weight_gemm_shapes(FUSED, T, 1))
    assert costs.forward_time(H100, SEPARATE, 0, 1) - costs.forward_time(H100, FUSED, 0, 1) == pytest.approx(
        gemms - fused)
    wgrad = sum(costs.gemm_time(H100, k, n, m) for m, n, k in shapes)
    assert costs.backward_weight_time(H100, SEPARATE, 0, 1) == pytest.approx(wgrad)


def test_each_fp8_linear_layer_casts_its_own_input():
    """Rowwise forward, t = 1: inputs M x K, wq, wk, wv and w1, w3 each T x 4096 and wo T x 4096, w2 T x 14336;
    weights 4096 x (4096 + 1024 + 1024) + 4096 x 4096 + 2 x 4096 x 14336 + 14336 x 4096. Fused, Q/K/V and gate/up
    cast their input once: separate casts three more T x 4096 inputs (wk, wv, w3), 5 bytes an element."""
    inputs = T * (6 * 4096 + 14336)
    weights = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336
    assert cast_bytes(SEPARATE, 1, 1, "forward", "rowwise") == 5 * (inputs + weights)
    assert cast_bytes(SEPARATE, 1, 1, "forward", "rowwise") - cast_bytes(FUSED, 1, 1, "forward", "rowwise") \
        == 5 * 3 * T * 4096
    # the weight-gradient GEMMs cast each input again (along the tokens): the same three more
    assert cast_bytes(SEPARATE, 1, 1, "weight", "rowwise") - cast_bytes(FUSED, 1, 1, "weight", "rowwise") \
        == 5 * 3 * T * 4096
    # tensorwise without TP: each Float8Linear's amax and cast (6 bytes an element) of its own input
    assert cast_bytes(SEPARATE, 1, 1, "forward", "tensorwise") - cast_bytes(FUSED, 1, 1, "forward", "tensorwise") \
        == 6 * 3 * T * 4096
    # tensorwise with TP: torchtitan's PrepareFloat8ModuleInput casts the module input once, before the gather
    for pass_ in ("forward", "input", "weight"):
        assert cast_bytes(SEPARATE, 1, 2, pass_, "tensorwise") == cast_bytes(FUSED, 1, 2, pass_, "tensorwise")


def test_tp_overlap_sums_the_gemms_of_one_gathered_input():
    fast = fp8_device(H100)
    shapes = arch.weight_gemm_shapes(SEPARATE, T, 4)
    times = [costs.gemm_time(fast, m, n, k) for m, n, k in shapes]
    qkv, proj, up, down = tp_overlap._gemms(H100, SEPARATE, 1, 4, False, "tensorwise")
    assert qkv == pytest.approx(sum(times[:3])) and proj == times[3]
    assert up == pytest.approx(times[4] + times[5]) and down == times[6]


def test_the_choice_is_checked_and_runs_through_hybrid():
    with pytest.raises(SpecError, match="projections must be one of fused, separate"):
        Workload.parse("llama-3-8b:projections=split")
    with pytest.raises(SpecError, match="projections 'separate'"):
        Workload.parse("mixtral-8x7b:projections=separate")
    work = "llama-3-8b:layers=2,seq=1024,vocab=8192,projections=separate"
    result = simulate("strategies/hybrid.py", "1x4xH100-80GB", work, 4, tp=2, fp8="rowwise", framework="torchtitan",
                      tp_comm_overlap=True)
    fused = simulate("strategies/hybrid.py", "1x4xH100-80GB", work.replace("separate", "fused"), 4, tp=2,
                     fp8="rowwise", framework="torchtitan", tp_comm_overlap=True)
    assert result.correct and fused.correct and result.time_s > fused.time_s


def test_the_input_gradients_of_separate_projections_are_added_up():
    """h 4096. With TP (compiled) the Q/K/V sum reads three M x h gradients and writes one (8h bytes a token) and the
    gate/up sum reads two and writes one (6h), before the input gradient's reduce-scatter; without TP the norm's
    backward reads the 2 + 1 extra gradients (6h); eager autograd adds them one at a time (6h each: 18h). Not divided
    by TP or sequence parallelism; the forward has no such sum."""
    h = 4096
    assert arch.projection_sum_bytes_per_token(FUSED, 2) == 0
    assert arch.projection_sum_bytes_per_token(SEPARATE, 2) == 14 * h
    assert arch.projection_sum_bytes_per_token(SEPARATE, 1) == 6 * h
    eager = Workload.parse("llama-3-8b:seq=1024,projections=separate,kernels=eager")
    assert arch.projection_sum_bytes_per_token(eager, 8) == 18 * h
    for tp, per_token in ((1, 6 * h), (2, 14 * h), (8, 14 * h)):
        extra = SEPARATE.elementwise_bytes(tp, tp > 1, backward=True) - FUSED.elementwise_bytes(tp, tp > 1,
                                                                                              backward=True)
        assert extra == per_token * T
        assert SEPARATE.elementwise_bytes(tp, tp > 1) == FUSED.elementwise_bytes(tp, tp > 1)

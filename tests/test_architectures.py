"""Layers as they are built (GQA, SwiGLU, RMSNorm, rotary, untied embeddings): parameters, FLOPs and stash
counted by hand for Llama 3 8B and for a small GQA + SwiGLU layer."""

from __future__ import annotations

import pytest

from dist_lib import SpecError, Workload
from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES


def test_llama_3_8b_has_the_published_parameter_count():
    w = Workload.parse("llama-3-8b")
    h, kv, f, v = 4096, 8 * 128, 14336, 128256
    layer = h * (2 * h + 2 * kv) + 3 * h * f + 2 * h  # q, o; k, v; gate, up, down; two RMSNorm scales
    assert layer == 218_112_000
    assert w.layer_params(5) == layer
    assert w.layer_params(0) == layer + v * h  # token embedding, no position table (rotary)
    assert w.layer_params(31) == layer + v * h + h  # untied output embedding and the final RMSNorm
    assert w.total_params == 32 * layer + 2 * v * h + h == 8_030_261_248
    assert w.total_params == pytest.approx(8.03e9, rel=0.005)  # Llama Team 2024 / meta-llama/Llama-3.1-8B


@pytest.mark.parametrize("preset, billions", [("llama-2-7b", 6.74), ("llama-2-13b", 13.0), ("llama-2-70b", 69.0),
                                              ("llama-3-70b", 70.6), ("llama-3-405b", 405.9)])
def test_the_other_llama_presets_have_their_published_sizes(preset, billions):
    assert Workload.parse(preset).total_params / 1e9 == pytest.approx(billions, rel=0.005)


def test_llama_3_8b_flops_are_megatron_cores_formula():
    """Megatron-LM training.py `num_floating_point_operations` (no causal halving): 12 s l h^2 ((1 + g/a + s/h)
    + (f/h) * 3/2) + 6 s h V per sample, with g/a the key/value share of the heads."""
    w = Workload.parse("llama-3-8b")
    s, l, h, a, g, f, v = 8192, 32, 4096, 32, 8, 14336, 128256
    megatron = 12 * s * l * h * h * ((1 + g / a + s / h) + (f / h) * 3 / 2) + 6 * s * h * v
    assert w.model_flops_per_sample() == pytest.approx(megatron, rel=1e-12)
    # per layer, forward: QKV 2sh(h + 2*1024), output 2sh^2, MLP 2sh*3f; core 4s^2h
    assert w.layer_gemm_flops(0) == 2 * s * h * (h + 2 * 1024 + h + 3 * f)
    assert w.attention_core_flops() == 4 * s * s * h


# A layer small enough to count by hand: h 64, 8 query heads and 2 key/value heads of 8, SwiGLU of 160, s 16
TOY = Workload("gqa-toy", 2, 64, 8, 16, 100, kv_heads=2, ffn_hidden=160, mlp="swiglu", norm="rmsnorm",
               position="rotary", tied_embeddings=False, bias=False, dropout=False)


def test_a_gqa_swiglu_layer_by_hand():
    # q 64x64, k and v 64x16 each, o 64x64; gate, up, down 64x160 each; two RMSNorm scales of 64
    assert TOY.layer_params(1) - (100 * 64 + 64) == 4096 + 2 * 1024 + 4096 + 3 * 10240 + 128 == 41088
    assert TOY.total_params == 2 * 41088 + 100 * 64 + 100 * 64 + 64
    # forward GEMMs 2 s h (q 64 + k, v 32 + o 64 + gate/up 320 + down 160); core 4 s^2 q d
    assert TOY.layer_gemm_flops(0) == 2 * 16 * 64 * 640
    assert TOY.attention_core_flops() == 4 * 16 * 16 * 64
    # stash per token, bytes: two norms' inputs and outputs 4*2*64; Q 128, K 32, V 32, attention output 128; gate
    # and up 640, product 320; unfused core without dropout: the softmax output, 2 a s = 256. Less the input (2h).
    per_token = 512 + (128 + 32 + 32 + 128) + (640 + 320)
    assert TOY.stash_bytes(0) == 16 * (per_token + 256) - 16 * 128
    assert TOY.stash_bytes(0, recompute="selective") == 16 * per_token - 16 * 128


def test_tensor_parallelism_splits_whole_key_value_heads():
    assert TOY.tp_problem(2) is None
    assert "key/value heads" in TOY.tp_problem(4)
    assert "attention heads" in Workload.parse("llama-3-8b").tp_problem(3)


def test_gpt_choices_reduce_to_korthikanti():
    w = Workload.parse("gpt-1.3b")
    explicit = Workload("explicit", 24, 2048, 16, 2048, 50257, kv_heads=16, head_dim=128, ffn_hidden=8192)
    assert explicit.total_params == w.total_params
    assert explicit.stash_bytes(0, tp=4) == w.stash_bytes(0, tp=4) == 2048 * 2048 * 34
    assert explicit.elementwise_bytes(2, backward=True) == w.elementwise_bytes(2, backward=True)


def test_llama_gemm_shapes_reach_the_cost_model():
    """The MLP of Llama 3 8B is three 4096 x 14336 GEMMs: a third more GEMM time than two of them (GeLU)."""
    a100 = DEVICES["A100-80GB"]
    swiglu = Workload.parse("llama-3-8b:attention=unfused")
    gelu = Workload.parse("llama-3-8b:attention=unfused,mlp=gelu")
    gap = costs.backward_weight_time(a100, swiglu, 1, 1) - costs.backward_weight_time(a100, gelu, 1, 1)
    one_matrix = costs.gemm_time(a100, 4096, 14336, 8192)  # dW of the extra 4096 x 14336 matrix, s = 8192
    assert gap == pytest.approx(one_matrix, rel=1e-9)


@pytest.mark.parametrize("spec, message", [
    ("llama-3-8b:kv_heads=5", "does not divide heads"),
    ("llama-3-8b:mlp=relu", "mlp must be one of"),
    ("llama-3-8b:attention=flash9", "attention must be one of"),
    ("llama-3-8b:bias=maybe", "expected true or false"),
])
def test_bad_architecture_fields(spec, message):
    with pytest.raises(SpecError, match=message):
        Workload.parse(spec)


def test_switches_from_spec_text_and_toml(tmp_path):
    assert Workload.parse("llama-3-8b:tied_embeddings=yes,attention=UNFUSED").tied_embeddings is True
    path = tmp_path / "w.toml"
    path.write_text('preset = "llama-2-7b"\nkv_heads = 8\nparallel_block = true\nnorm = "layernorm"\n')
    w = Workload.from_toml(path)
    assert (w.kv_heads, w.parallel_block, w.norm, w.mlp) == (8, True, "layernorm", "swiglu")

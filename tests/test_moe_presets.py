"""The Qwen3 and GPT-OSS mixture-of-experts presets: parameter counts against the published ones and by hand
from config.json, and the fields they brought (head_dim, QK-norm, biases, sinks, sliding windows)."""

import pytest

from dist_lib import Workload
from dist_lib.costs import experts as expert_costs
from dist_lib.costs import moe_ops
from dist_lib.errors import SpecError
from dist_lib.hardware.devices import get_device


@pytest.mark.parametrize("name, total", [
    ("qwen3-30b-a3b", 30.5e9),  # Qwen/Qwen3-30B-A3B model card: 30.5 B in total
    ("qwen3-235b-a22b", 235e9),  # Qwen/Qwen3-235B-A22B model card: 235 B
    ("gpt-oss-120b", 116.83e9),  # gpt-oss model card, Table 1: 116.83 B
    ("gpt-oss-20b", 20.91e9),  # 20.91 B
])
def test_published_totals(name, total):
    assert Workload.parse(name).total_params == pytest.approx(total, rel=0.005)


@pytest.mark.parametrize("name, non_embedding", [("qwen3-30b-a3b", 29.9e9), ("qwen3-235b-a22b", 234e9)])
def test_qwen3_non_embedding_totals(name, non_embedding):
    w = Workload.parse(name)  # the model cards' "Number of Parameters (Non-Embedding)"
    assert w.total_params - 2 * w.vocab * w.hidden == pytest.approx(non_embedding, rel=0.005)


@pytest.mark.parametrize("name, active", [("gpt-oss-120b", 5.13e9), ("gpt-oss-20b", 3.61e9)])
def test_gpt_oss_active_as_the_card_counts_it(name, active):
    w = Workload.parse(name)  # the card counts the unembedding, not the input embedding
    assert w.active_params - w.vocab * w.hidden == pytest.approx(active, rel=0.005)


@pytest.mark.parametrize("name, active", [("qwen3-30b-a3b", 3.3e9), ("qwen3-235b-a22b", 22e9)])
def test_qwen3_active_to_the_digits_published(name, active):
    # the cards give two digits (3.3 B, 22 B); the count from config.json is 3.353 B and 22.19 B
    assert Workload.parse(name).active_params == pytest.approx(active, rel=0.02)


def test_qwen3_30b_by_hand():
    w = Workload.parse("qwen3-30b-a3b")
    attention = 2048 * (32 * 128) * 2 + 2048 * (4 * 128) * 2 + 2 * 128  # W_q, W_o, W_k, W_v, QK-norm
    layer = attention + 2048 * 128 + 128 * 3 * 2048 * 768 + 2 * 2048  # router, experts, two norms
    assert w.total_params == 48 * layer + 2 * 151936 * 2048 + 2048 == 30_532_122_624


def test_gpt_oss_120b_by_hand():
    w = Workload.parse("gpt-oss-120b")
    h, q, kv, f = 2880, 64 * 64, 8 * 64, 2880
    attention = 2 * h * q + 2 * h * kv + (q + 2 * kv + h) + 64  # matrices, biases, one sink per head
    expert = 3 * h * f + 2 * f + h  # gate/up and down, with their biases
    layer = attention + h * 128 + 128 + 128 * expert + 2 * h  # router and its bias, experts, two norms
    assert w.total_params == 36 * layer + 2 * 201088 * h + h == 116_829_156_672


def test_gpt_oss_sliding_window_layers():
    w = Workload.parse("gpt-oss-120b")
    s, width, window = 4096, 64 * 64, 128
    full = 4.0 * s * s * width
    band = 4.0 * width * 2 * (window * s - window * (window - 1) / 2)  # twice the causal band's pairs
    assert w.attention_core_flops(1) == full and w.attention_core_flops(0) == band
    assert w.layer_forward_flops(0) < w.layer_forward_flops(1)
    h100 = get_device("H100-80GB")
    windowed, _ = moe_ops.route_cost(h100, w, 0, 1, backward=False)
    whole, _ = moe_ops.route_cost(h100, w, 1, 1, backward=False)
    assert windowed < whole
    # no window at all: every layer the same
    plain = Workload.parse("gpt-oss-120b:sliding_window=0")
    assert plain.attention_core_flops(0) == plain.attention_core_flops(1) == full


def test_biases_are_parameters_not_gemm_flops():
    with_bias = Workload.parse("gpt-oss-20b")
    without = Workload.parse("gpt-oss-20b:biases=false")
    assert with_bias.total_params - without.total_params == 24 * ((4096 + 2 * 512 + 2880) + 32 + 32 * (2 * 2880 + 2880))
    assert with_bias.layer_gemm_flops(3) == without.layer_gemm_flops(3)


def test_head_dim_wider_than_hidden_over_heads_shapes_the_projections():
    w = Workload.parse("qwen3-30b-a3b")
    shapes = expert_costs.gemm_shapes(w, 0, 1, 1, "forward", routed=False, shared=False)
    # in-projections Q, K, V: 4096 + 2 x 512 wide; W_o reads the 32 x 128 = 4096 wide attention output
    assert shapes[:2] == [(4096, 4096 + 1024, 2048), (4096, 2048, 4096)]


def test_a_route_counts_no_dense_mlp_activation():
    w = Workload.parse("qwen3-30b-a3b")
    dense_mlp = 4096 * 6 * (4 * 2048)  # what a 4h-wide SwiGLU's activation would read and write, 16-bit
    assert moe_ops.samples_mlp_activation_bytes(w, backward=False) == dense_mlp
    assert w.elementwise_bytes(1) - dense_mlp > 0


def test_window_needs_a_flash_kernel_and_not_mla():
    with pytest.raises(SpecError, match="sliding_window is timed for a FlashAttention kernel"):
        Workload.parse("gpt-oss-20b:attention=unfused")
    with pytest.raises(SpecError, match="not with mla"):
        Workload.parse("deepseek-v3:sliding_window=128")
    with pytest.raises(SpecError, match="qk_norm"):
        Workload.parse("qwen3-30b-a3b:qk_norm=maybe")

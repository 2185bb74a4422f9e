"""Workload shapes and per-layer figures."""

from __future__ import annotations

import pytest

from dist_lib import SpecError, Workload


def test_gpt_1_3b_parameters():
    w = Workload.parse("gpt-1.3b")
    # 24 layers of 12*2048^2 + 13*2048, plus token (50257*2048) and position (2048*2048) embeddings
    assert w.layer_params(5) == 50_358_272
    assert w.total_params == 24 * 50_358_272 + 50257 * 2048 + 2048 * 2048


def test_gpt_175b_is_175_billion():
    assert Workload.parse("gpt-175b").total_params == pytest.approx(175e9, rel=0.01)


def test_stash_follows_korthikanti():
    w = Workload.parse("gpt-1.3b")
    # s*h*(34 + 5*a*s/h) = 2048*2048*(34 + 80) bytes, minus the layer input (2*s*h) kept as an Activation
    assert w.stash_bytes(0) == 2048 * 2048 * 114 - 2 * 2048 * 2048
    # with TP 4: s*h*(10 + 24/4 + 5*a*s/(h*4)) = s*h*(10 + 6 + 20)
    assert w.stash_bytes(0, tp=4) == 2048 * 2048 * 36 - 2 * 2048 * 2048


def test_model_flops_include_the_head():
    w = Workload.parse("gpt-125m")
    s, h, v, layers = 2048, 768, 50257, 12
    assert w.model_flops_per_sample() == pytest.approx(3 * (layers * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * v))


def test_toy_is_uniform_and_headless():
    w = Workload.parse("toy-4")
    assert w.num_layers == 4
    assert w.layer_params(0) == w.layer_params(3) == 12 * 1024**2 + 13 * 1024
    assert w.head_forward_flops() == 0


def test_overrides_and_file(tmp_path):
    assert Workload.parse("gpt-1.3b:seq=1024,layers=12").seq_len == 1024
    path = tmp_path / "w.toml"
    path.write_text('preset = "gpt-350m"\nlayers = 6\n')
    w = Workload.load(str(path))
    assert (w.num_layers, w.hidden) == (6, 1024)


@pytest.mark.parametrize("spec, message", [
    ("gpt-4", "unknown workload"),
    ("gpt-1.3b:layers", "key=value"),
    ("gpt-1.3b:depth=3", "unknown field 'depth'"),
    ("gpt-1.3b:layers=0", "layers|num_layers"),
    ("gpt-1.3b:heads=7", "not divisible"),
    ("toy:layers=2.5", "whole number"),
])
def test_bad_workload_specs(spec, message):
    with pytest.raises(SpecError, match=message):
        Workload.parse(spec)


def test_an_unknown_field_of_a_workload_file_lists_every_field_the_file_takes(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('preset = "gpt-1.3b"\nlayer = 4\n')
    with pytest.raises(SpecError) as caught:
        Workload.load(path)
    assert str(caught.value) == (f"{path}: unknown field 'layer' (known: preset, name, layers, hidden, heads, seq, "
                                 f"vocab, bytes_per_element, grad_bytes_per_element, kv_heads, head_dim, ffn_hidden, "
                                 f"framework_overhead_us, tp_overhead_us, kernel_time_scale, mlp, norm, position, "
                                 f"attention, kernels, projections, tied_embeddings, bias, dropout, parallel_block, experts, top_k, "
                                 f"expert_ffn_hidden, shared_experts, shared_ffn_hidden, dense_ffn_hidden, moe_every, "
                                 f"first_dense, capacity_factor, router, mla, routing, routing_seed, qk_norm, biases, "
                                     f"attention_sinks, sliding_window, sliding_every, swiglu_limit)")
    with pytest.raises(SpecError, match=r"unknown field 'layer' \(known: layers, hidden,"):
        Workload.load("gpt-1.3b:layer=4")  # a spec string takes no preset or name among its overrides

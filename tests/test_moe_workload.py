"""Mixture-of-experts workloads: the presets' parameters as published, FLOPs as the papers count them, the keys."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dist_lib import SpecError, Workload


@pytest.mark.parametrize("name, total, active", [
    ("mixtral-8x7b", 46.7e9, 12.9e9),  # Jiang et al. 2024, arXiv 2401.04088
    ("mixtral-8x22b", 141e9, 39e9),  # mistral.ai's release: 141 B total, 39 B active
    ("deepseek-v3", 671e9, 37e9),  # arXiv 2412.19437, without the 14 B MTP module
])
def test_published_total_and_active_parameters(name, total, active):
    w = Workload.parse(name)
    assert w.total_params == pytest.approx(total, rel=0.005)
    # the published active counts are given to two or three digits: 37 B is 37.55 B to within its rounding
    assert w.active_params == pytest.approx(active, rel=0.005 if name.startswith("mixtral") else 0.02)


def test_mixtral_layer_by_hand():
    w = Workload.parse("mixtral-8x7b")
    h, f, kv_dim, v = 4096, 14336, 8 * 128, 32000
    attention = 2 * h * h + 2 * h * kv_dim
    layer = attention + 2 * h + h * 8 + 8 * 3 * h * f
    assert w.layer_params(5) == layer
    assert w.layer_params(0) == layer + v * h
    assert w.layer_params(31) == layer + v * h + h
    s = 4096
    # forward: 2 per active matrix parameter per token (2 of 8 experts) plus the attention core 4 s^2 h
    assert w.layer_forward_flops(5) == 2 * s * (attention + h * 8 + 2 * 3 * h * f) + 4 * s * s * h


def test_deepseek_dense_layers_and_shared_expert():
    w = Workload.parse("deepseek-v3")
    h = 7168
    assert not w.moe.is_moe(2) and w.moe.is_moe(3)
    dense_ffn = 3 * h * 18432
    moe_ffn = h * 256 + 256 * 3 * h * 2048 + 3 * h * 2048
    assert w.layer_params(4) - w.layer_params(2) == moe_ffn - dense_ffn


def test_every_other_layer_and_overrides():
    w = Workload.parse("mixtral-8x7b:layers=4,moe_every=2,dense_ffn_hidden=14336")
    assert [w.moe.is_moe(layer) for layer in range(4)] == [True, False, True, False]
    assert w.layer_params(1) < w.layer_params(2)
    custom = Workload.parse("toy:layers=2,experts=4,top_k=1,expert_ffn_hidden=512")
    assert custom.moe.experts == 4 and custom.total_params > custom.active_params


def test_capacity_pads_to_the_factor():
    w = Workload.parse("mixtral-8x7b:capacity_factor=1.25")
    # 4096 tokens x top-2 over 8 experts = 1024 a expert on average; x 1.25 = 1280
    assert w.moe.capacity(4096) == 1280
    assert Workload.parse("mixtral-8x7b").moe.capacity(4096) == 0  # dropless


def test_toml_keys(tmp_path):
    path = tmp_path / "moe.toml"
    path.write_text('preset = "deepseek-v3"\nlayers = 8\nexperts = 64\nmla = [1536, 512, 128, 64, 128]\n'
                    'routing = "zipf:1.2"\nrouting_seed = 7\n')
    w = Workload.load(str(path))
    assert (w.num_layers, w.moe.experts, w.moe.routing, w.moe.routing_seed) == (8, 64, "zipf:1.2", 7)


@pytest.mark.parametrize("spec, message", [
    ("mixtral-8x7b:top_k=9", "top_k"),
    ("mixtral-8x7b:capacity_factor=0.5", "capacity_factor"),
    ("mixtral-8x7b:router=argmax", "router"),
    ("mixtral-8x7b:kv_heads=5", "kv_heads"),
    ("mixtral-8x7b:moe_every=2", "dense_ffn_hidden"),
    ("toy:experts=4", "experts, top_k and expert_ffn_hidden"),
    ("deepseek-v3:mla=1/2/3", "mla"),
])
def test_bad_moe_specs(spec, message):
    with pytest.raises(SpecError, match=message):
        Workload.parse(spec)


def test_stash_follows_the_attention_kernel():
    """An MoE layer's stash by hand (Korthikanti et al. 2022, Table 2 without the MLP: 15sh plus the attention
    core; per token each routed expert's SwiGLU 2h + 6f): unfused with dropout the core is 5as^2, without
    dropout 2as^2, and FlashAttention (the preset's kernel) keeps only its fp32 log-sum-exp, 4 bytes a head and token."""
    s, h, a, k, f = 4096, 4096, 32, 2, 14336
    experts = s * k * (2 * h + 6 * f)
    layer_input = 2 * s * h
    flash = Workload.parse("mixtral-8x7b")  # FlashAttention-2, no dropout
    unfused = replace(flash, attention="unfused", dropout=True)
    assert unfused.stash_bytes(5) == 15 * s * h + 5 * a * s * s + experts - layer_input
    assert flash.stash_bytes(5) == 15 * s * h + 4 * a * s + experts - layer_input
    # selective recompute drops the core whatever the kernel
    assert flash.stash_bytes(5, recompute="selective") == unfused.stash_bytes(5, recompute="selective")

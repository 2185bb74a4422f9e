"""Megatron-Core's module recompute on MoE layers (hybrid's `recompute_modules`, `--recompute-modules layernorm
moe_act`): the pre-MLP norm and the experts' activation dropped after the forward and run again in the
backward, their time the forward HBM traffic at the device's bandwidth (`costs.moe_ops.norm_recompute`,
`activation_recompute`), the experts' stash without the activation's output. Hand-derived values, steps
correct and replayable, wrong uses refused by name."""

from __future__ import annotations

import pytest

from dist_lib import StrategyError, Workload, simulate
from dist_lib.costs import moe_ops
from dist_lib.hardware.devices import get_device
from dist_lib.testing import replays_alike

HYBRID = "strategies/hybrid.py"
TOY = ("toy:layers=4,hidden=256,heads=4,seq=128,experts=4,top_k=2,expert_ffn_hidden=512,moe_every=2,"
       "dense_ffn_hidden=512,shared_experts=1,swiglu_limit=7")
H100 = get_device("H100-80GB")
MODULES = ["layernorm", "moe_act"]


def test_the_norm_again_reads_and_writes_each_token_once():
    w = Workload.parse("gpt-oss-120b")  # h = 2880, sequence 4096, 16-bit
    assert moe_ops.norm_recompute(H100, w, 1) == pytest.approx(4096 * 2 * 2880 * 2 / H100.hbm_bandwidth)
    # under TP (sequence-parallel), this rank's half of the sequence
    assert moe_ops.norm_recompute(H100, w, 3, tp=2) == pytest.approx(3 * 2048 * 2 * 2880 * 2 / H100.hbm_bandwidth)


def test_the_activation_again_is_the_swiglu_and_the_clamp_forward():
    w = Workload.parse("gpt-oss-120b")  # f = 2880, swiglu_limit 7
    # SwiGLU reads 2f and writes f; each clamp reads and writes f, their concatenation 2f and 2f: 11f a token
    assert moe_ops.activation_recompute(H100, w, 16384) == pytest.approx(16384 * 11 * 2880 * 2 / H100.hbm_bandwidth)
    assert moe_ops.activation_recompute(H100, w, 100, etp=2) == pytest.approx(100 * 11 * 1440 * 2 / H100.hbm_bandwidth)
    qwen = Workload.parse("qwen3-30b-a3b")  # no clamp: the SwiGLU alone
    assert moe_ops.activation_recompute(H100, qwen, 100) == pytest.approx(100 * 3 * 768 * 2 / H100.hbm_bandwidth)


def _durations(result, op: str, rank: int) -> list[float]:
    return [e.end - e.start for e in result.events if e.op == op and e.rank == rank]


def test_each_backward_runs_its_module_again_and_the_experts_keep_less():
    """pp=2, ep=2 on 8 GPUs, a sample a microbatch: each MoE layer's route_backward runs the norm again on one
    sample, and each expert_backward the activation on the 2 peers x 128 tokens x top-2 x 2 of 4 experts =
    256 tokens its two experts received; the peak holds one microbatch's expert stash less by f = 512 two-byte
    elements a token."""
    w = Workload.parse(TOY)
    plain = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2)
    again = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2, recompute_modules=MODULES)
    assert plain.correct and again.correct, again.problems
    for op, extra in (("route_backward", moe_ops.norm_recompute(H100, w, 1)),
                      ("expert_backward", moe_ops.activation_recompute(H100, w, 256))):
        before, after = _durations(plain, op, 0), _durations(again, op, 0)
        assert before and len(after) == len(before)
        assert [b - a for a, b in zip(before, after)] == pytest.approx([extra] * len(before), rel=1e-9)
    assert max(plain.memory_bytes) - max(again.memory_bytes) == 256 * 512 * 2
    assert again.time_s > plain.time_s and again.hardware_flops == plain.hardware_flops


def test_each_module_alone_and_with_tp_replays():
    norm = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2, recompute_modules=["layernorm"])
    act = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2, recompute_modules=("moe_act",))
    both = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2, recompute_modules=MODULES)
    assert norm.correct and act.correct and norm.time_s < both.time_s and act.time_s < both.time_s
    replays_alike(HYBRID, "1x8xH100-80GB", TOY, 4, pp=2, tp=2, ep=2, sequence_parallel=True,
                  recompute_modules=MODULES, selective_recompute=True)


@pytest.mark.parametrize("options, message", [
    (dict(recompute_modules=["core_attn"]), "'core_attn' not modelled .*selective_recompute=True"),
    (dict(recompute_modules="moe_act"), "recompute_modules must be a list of module names"),
    (dict(recompute_modules=["moe_act"], recompute=True), "recompute_modules with recompute=True"),
])
def test_wrong_recompute_modules_are_refused_by_name(options, message):
    with pytest.raises((ValueError, StrategyError), match=message):
        simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=2, ep=2, **options)


def test_recompute_modules_needs_experts():
    with pytest.raises((ValueError, StrategyError), match="modelled on mixture-of-experts layers"):
        simulate(HYBRID, "1x8xH100-80GB", "gpt-350m:layers=4", 8, pp=2, recompute_modules=["layernorm"])

"""Attention kernels: FlashAttention keeps no s x s matrix, runs at its published speed, and selective recompute
with it re-runs the kernel to save only its log-sum-exp."""

from __future__ import annotations

import pytest

from dist_lib import SpecError, Workload
from dist_lib.costs import compute as costs
from dist_lib.costs.attention import flash_times
from dist_lib.hardware.devices import DEVICES

H100, A100 = DEVICES["H100-80GB"], DEVICES["A100-80GB"]


def test_flash_keeps_no_quadratic_stash():
    short, long = (Workload.parse(f"llama-3-8b:seq={s}") for s in (4096, 8192))
    assert long.stash_bytes(0) == 2 * short.stash_bytes(0)  # linear in s: no s^2 term
    unfused = Workload.parse("llama-3-8b:attention=unfused")
    # the unfused core keeps its softmax output, 2 a s^2 bytes a sample (no dropout in Llama)
    assert unfused.stash_bytes(0) - long.stash_bytes(0) == 2 * 32 * 8192**2 - 4 * 32 * 8192


def test_selective_recompute_with_flash_saves_the_log_sum_exp_and_reruns_the_kernel():
    w = Workload.parse("llama-3-8b")
    assert w.stash_bytes(0) - w.stash_bytes(0, recompute="selective") == 4 * 32 * 8192  # fp32, per head and token
    forward, _ = flash_times(H100, "flash2", w.attention_core_flops(), 128, 8192)
    assert costs.recompute_time(H100, w, 1, 1) == pytest.approx(forward)


def test_flash_runs_at_its_measured_speed():
    """FlashAttention-2 forward, causal, head dim 128, s 8192 on an H100: 333 TFLOP/s on half the s^2 FLOPs;
    forward + backward 308 TFLOP/s on 3.5 times those (Dao-AILab/flash-attention assets)."""
    flops = 4 * 8192**2 * 128 * 32
    forward, backward = flash_times(H100, "flash2", flops, 128, 8192)
    assert forward == pytest.approx(flops / 2 / 333e12)
    assert forward + backward == pytest.approx(3.5 * flops / 2 / 308e12)
    fa3_forward, fa3_backward = flash_times(H100, "flash3", flops, 128, 8192)
    assert fa3_forward == pytest.approx(flops / 2 / 602e12) and fa3_backward == pytest.approx(backward / 1.5)
    # between plotted sequences, interpolated in log(s): 6k lies between 4k (319) and 8k (333)
    assert flash_times(H100, "flash2", flops, 128, 4096 * 2**0.5)[0] == pytest.approx(flops / 2 / 326e12)


def test_flash_is_faster_than_the_unfused_core_and_only_where_measured():
    flash = Workload.parse("llama-3-8b")
    unfused = Workload.parse("llama-3-8b:attention=unfused")
    assert costs.forward_time(A100, flash, 1, 1) < costs.forward_time(A100, unfused, 1, 1)
    with pytest.raises(SpecError, match="attention=flash3 on A100-80GB"):
        costs.forward_time(A100, Workload.parse("llama-3-8b:attention=flash3"), 1, 1)
    with pytest.raises(SpecError, match="no published flash2 speed"):
        costs.forward_time(DEVICES["T4"], flash, 1, 1)

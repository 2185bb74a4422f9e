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


def test_flash2_on_a_b200_runs_at_nvidias_published_forward_and_backward_speeds():
    """NVIDIA's cudnn-frontend benchmark of flash-attn 2.7.4.post1 on a B200 (bf16, causal, head dim 128): at
    s 8192 the forward ran at 399.925 TFLOP/s and the backward at 318.004 on 2.5 times the forward's FLOPs;
    at 1024, 154.417 and 104.860. A head dim of 64 has no series of its own there and takes the 128 one."""
    b200 = DEVICES["B200-180GB"]
    flops = 4 * 8192**2 * 128 * 32
    forward, backward = flash_times(b200, "flash2", flops, 128, 8192)
    assert forward == pytest.approx(flops / 2 / 399.925e12) and backward == pytest.approx(2.5 * flops / 2 / 318.004e12)
    short = 4 * 1024**2 * 128 * 32
    assert flash_times(b200, "flash2", short, 128, 1024) == pytest.approx(
        (short / 2 / 154.417e12, 2.5 * short / 2 / 104.860e12))
    assert flash_times(b200, "flash2", flops, 64, 8192) == flash_times(b200, "flash2", flops, 128, 8192)
    assert Workload.parse("llama-3-8b").attention == "flash2"
    assert costs.forward_time(b200, Workload.parse("llama-3-8b"), 1, 1) > 0


@pytest.mark.parametrize("device, kernel, message", [
    ("B200-180GB", "flash3", "attention=flash3 on B200-180GB: FlashAttention-3 runs on Hopper GPUs only"),
    ("MI300X-192GB", "flash2", "attention=flash2 on MI300X-192GB: no published flash2 speed for this device"),
    ("L40S-48GB", "flash2", "attention=flash2 on L40S-48GB: no published flash2 speed"),
    ("A10G-24GB", "flash3", "attention=flash3 on A10G-24GB: no published flash3 speed"),
])
def test_a_flash_kernel_without_a_published_figure_is_one_clear_line(device, kernel, message):
    with pytest.raises(SpecError, match=message):
        flash_times(DEVICES[device], kernel, 1e12, 128, 8192)

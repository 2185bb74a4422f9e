"""Durations of FlashAttention kernels from their published speed (the unfused attention core is timed as
batched GEMMs plus its softmax and dropout traffic, in `costs.compute`).

A fused kernel keeps the s x s scores in on-chip memory, so its time is its FLOPs over its measured rate, which
depends on the device, the head size and the sequence. The rates are the bar labels of the benchmark plots in
Dao-AILab/flash-attention (commit 0251105, assets/): `flash2_a100_fwd_bwd_benchmark.png` and
`flash2_h100_fwd_bwd_benchmark.png` (FlashAttention-2, forward + backward, Dao 2023, arXiv 2307.08691) and
`flash3_fp16_fwd.png` (FlashAttention-2 and -3 forward on an H100 SXM5; Shah et al. 2024, arXiv 2407.08608),
measured at hidden 2048 over 16k tokens a call, with the causal mask a decoder-only model trains with. The
plots count FLOPs as benchmarks/benchmark_flash_attention.py does: forward 4 s^2 d heads, halved for the causal
mask, backward 2.5 times the forward (it recomputes the scores), forward + backward 3.5 times.

FlashAttention-3's backward is not given point by point; the paper reports it 1.5-1.75x faster than
FlashAttention-2's, and the lower end is taken. A device without a measurement of its own uses the fraction of
peak its reference device reaches (`REFERENCE`): the H200, H100 PCIe and H100 HBM2e run the H100's kernels, the A100
40GB the A100 80GB's.

The B200's FlashAttention-2 figures are NVIDIA's own measurement of flash-attn 2.7.4.post1 on one B200
(NVIDIA/cudnn-frontend, benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv,
rows `flash_attention`: bf16, causal, head dim 128, Llama 3.1 405B's 128 query and 8 key/value heads, batch 1),
forward and backward apiece, counted as above (forward 4 s^2 d heads halved for the mask, backward 2.5 times
that). FlashAttention-3 is written for Hopper's instructions (wgmma, TMA: sm90 only) and does not run on the B200.
The MI300X (ROCm's Composable Kernel backend of flash-attn), the L40S and the A10G have no published series of
this kind that we found: asking for a flash kernel there is an error, in one line, as on any other device without
a figure.
"""

from __future__ import annotations

import math

from dist_lib.errors import SpecError
from dist_lib.hardware.devices import Device

SEQUENCES = (512, 1024, 2048, 4096, 8192, 16384)
# (kernel, pass, device, head dim): causal TFLOP/s at SEQUENCES; pass "fwd_bwd", "fwd" or "bwd"
MEASURED: dict[tuple[str, str, str, int], tuple[float, ...]] = {
    ("flash2", "fwd_bwd", "A100-80GB", 64): (88, 119, 140, 156, 165, 171),
    ("flash2", "fwd_bwd", "A100-80GB", 128): (99, 133, 155, 173, 182, 189),
    ("flash2", "fwd_bwd", "H100-80GB", 64): (141, 192, 232, 257, 273, 284),
    ("flash2", "fwd_bwd", "H100-80GB", 128): (163, 221, 265, 294, 308, 328),
    ("flash2", "fwd", "H100-80GB", 64): (180, 229, 262, 284, 295, 299),
    ("flash2", "fwd", "H100-80GB", 128): (191, 260, 298, 319, 333, 335),
    ("flash3", "fwd", "H100-80GB", 64): (197, 265, 371, 420, 460, 473),
    ("flash3", "fwd", "H100-80GB", 128): (292, 423, 521, 579, 602, 616),
    ("flash2", "fwd", "B200-180GB", 128): (63.936, 154.417, 254.381, 342.990, 399.925, 425.128),
    ("flash2", "bwd", "B200-180GB", 128): (81.393, 104.860, 198.845, 273.484, 318.004, 336.635),
}
REFERENCE = {"H100-80GB": "H100-80GB", "H200-141GB": "H100-80GB", "H100-PCIe-80GB": "H100-80GB",
             "H100-HBM2e-96GB": "H100-80GB",
             "A100-80GB": "A100-80GB", "A100-40GB": "A100-80GB", "B200-180GB": "B200-180GB"}
REFERENCE_PEAK = {"H100-80GB": 989e12, "A100-80GB": 312e12, "B200-180GB": 2250e12}
HOPPER = ("H100-80GB",)  # the references whose devices run FlashAttention-3 (sm90)
FLASH3_BACKWARD_SPEEDUP = 1.5  # Shah et al. 2024, sec. 4.1: backward 1.5-1.75x FlashAttention-2's
BACKWARD_FLOPS_SHARE = 2.5  # backward FLOPs over forward FLOPs, as the benchmark counts them
HEAD_DIMS = (64, 128)


def _rate(kernel: str, pass_: str, reference: str, head_dim: int, seq: int) -> float | None:
    """Measured causal TFLOP/s, interpolated in log(sequence) between the plotted points (clamped at the
    ends), for the measured head size nearest `head_dim`; None when there is no such series."""
    dims = [h for h in HEAD_DIMS if (kernel, pass_, reference, h) in MEASURED]
    if not dims:
        return None
    d = min(dims, key=lambda h: (abs(h - head_dim), -h))
    points = MEASURED[kernel, pass_, reference, d]
    x = min(max(math.log2(seq), math.log2(SEQUENCES[0])), math.log2(SEQUENCES[-1]))
    i = min(int(x - math.log2(SEQUENCES[0])), len(SEQUENCES) - 2)
    frac = x - math.log2(SEQUENCES[i])
    return 1e12 * (points[i] + frac * (points[i + 1] - points[i]))


def _reference(device: Device, kernel: str) -> str:
    reference = REFERENCE.get(device.name)
    if kernel == "flash3" and reference is not None and reference not in HOPPER:
        raise SpecError(f"attention=flash3 on {device.name}: FlashAttention-3 runs on Hopper GPUs only (H100, H200: "
                        f"sm90); use attention=flash2 or attention=unfused")
    if reference is None:
        where = "Hopper GPUs (H100, H200)" if kernel == "flash3" else "the A100, Hopper GPUs and the B200"
        raise SpecError(f"attention={kernel} on {device.name}: no published {kernel} speed for this device (measured "
                        f"on {where}); use attention=unfused, or another attention kernel")
    return reference


def flash_times(device: Device, kernel: str, flops: float, head_dim: int, seq: int) -> tuple[float, float]:
    """(forward, backward) seconds of a causal FlashAttention kernel whose forward over the whole s x s matrix
    would be `flops` (the causal kernel does half)."""
    reference = _reference(device, kernel)
    # the same share of peak on a sibling device, at the clock its power limit leaves (`Device.tensor_flops`)
    scale = device.tensor_flops / REFERENCE_PEAK[reference]
    forward_flops = flops / 2
    fwd_bwd_rate = _rate("flash2", "fwd_bwd", reference, head_dim, seq)
    fa2_forward_rate = _rate("flash2", "fwd", reference, head_dim, seq) or fwd_bwd_rate
    fa2_forward = forward_flops / fa2_forward_rate
    backward_rate = _rate("flash2", "bwd", reference, head_dim, seq)
    if backward_rate is not None:  # measured on its own
        fa2_backward = BACKWARD_FLOPS_SHARE * forward_flops / backward_rate
    else:
        fa2_backward = (1 + BACKWARD_FLOPS_SHARE) * forward_flops / fwd_bwd_rate - fa2_forward
    if kernel == "flash2":
        return fa2_forward / scale, fa2_backward / scale
    forward = forward_flops / _rate("flash3", "fwd", reference, head_dim, seq)
    return forward / scale, fa2_backward / FLASH3_BACKWARD_SPEEDUP / scale

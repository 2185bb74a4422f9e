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
peak its reference device reaches (`REFERENCE`): the H200, H100 PCIe and H100 HBM2e run the H100's kernels, the A100 40GB the
A100 80GB's. Any other device has no published figure: asking for a flash kernel there is an error.
"""

from __future__ import annotations

import math

from dist_lib.errors import SpecError
from dist_lib.hardware.devices import Device

SEQUENCES = (512, 1024, 2048, 4096, 8192, 16384)
# (kernel, pass, device, head dim): causal TFLOP/s at SEQUENCES; pass "fwd_bwd" or "fwd"
MEASURED: dict[tuple[str, str, str, int], tuple[float, ...]] = {
    ("flash2", "fwd_bwd", "A100-80GB", 64): (88, 119, 140, 156, 165, 171),
    ("flash2", "fwd_bwd", "A100-80GB", 128): (99, 133, 155, 173, 182, 189),
    ("flash2", "fwd_bwd", "H100-80GB", 64): (141, 192, 232, 257, 273, 284),
    ("flash2", "fwd_bwd", "H100-80GB", 128): (163, 221, 265, 294, 308, 328),
    ("flash2", "fwd", "H100-80GB", 64): (180, 229, 262, 284, 295, 299),
    ("flash2", "fwd", "H100-80GB", 128): (191, 260, 298, 319, 333, 335),
    ("flash3", "fwd", "H100-80GB", 64): (197, 265, 371, 420, 460, 473),
    ("flash3", "fwd", "H100-80GB", 128): (292, 423, 521, 579, 602, 616),
}
REFERENCE = {"H100-80GB": "H100-80GB", "H200-141GB": "H100-80GB", "H100-PCIe-80GB": "H100-80GB",
             "H100-HBM2e-96GB": "H100-80GB",
             "A100-80GB": "A100-80GB", "A100-40GB": "A100-80GB"}
REFERENCE_PEAK = {"H100-80GB": 989e12, "A100-80GB": 312e12}
FLASH3_BACKWARD_SPEEDUP = 1.5  # Shah et al. 2024, sec. 4.1: backward 1.5-1.75x FlashAttention-2's
BACKWARD_FLOPS_SHARE = 2.5  # backward FLOPs over forward FLOPs, as the benchmark counts them
HEAD_DIMS = (64, 128)


def _rate(kernel: str, pass_: str, reference: str, head_dim: int, seq: int) -> float | None:
    """Measured causal TFLOP/s, interpolated in log(sequence) between the plotted points (clamped at the
    ends), for the plotted head size nearest `head_dim`; None when the plots have no such series."""
    d = min(HEAD_DIMS, key=lambda h: (abs(h - head_dim), -h))
    points = MEASURED.get((kernel, pass_, reference, d))
    if points is None:
        return None
    x = min(max(math.log2(seq), math.log2(SEQUENCES[0])), math.log2(SEQUENCES[-1]))
    i = min(int(x - math.log2(SEQUENCES[0])), len(SEQUENCES) - 2)
    frac = x - math.log2(SEQUENCES[i])
    return 1e12 * (points[i] + frac * (points[i + 1] - points[i]))


def _reference(device: Device, kernel: str) -> str:
    reference = REFERENCE.get(device.name)
    if reference is None or (kernel == "flash3" and reference != "H100-80GB"):
        where = "Hopper GPUs (H100, H200)" if kernel == "flash3" else "the A100 and Hopper GPUs"
        raise SpecError(f"attention={kernel} on {device.name}: no published {kernel} speed for this device (measured "
                        f"on {where}); use attention=unfused, or another attention kernel")
    return reference


def flash_times(device: Device, kernel: str, flops: float, head_dim: int, seq: int) -> tuple[float, float]:
    """(forward, backward) seconds of a causal FlashAttention kernel whose forward over the whole s x s matrix
    would be `flops` (the causal kernel does half)."""
    reference = _reference(device, kernel)
    scale = device.peak_flops / REFERENCE_PEAK[reference]  # the same share of peak on a sibling device
    forward_flops = flops / 2
    fwd_bwd_rate = _rate("flash2", "fwd_bwd", reference, head_dim, seq)
    fa2_forward_rate = _rate("flash2", "fwd", reference, head_dim, seq) or fwd_bwd_rate
    fa2_forward = forward_flops / fa2_forward_rate
    fa2_backward = (1 + BACKWARD_FLOPS_SHARE) * forward_flops / fwd_bwd_rate - fa2_forward
    if kernel == "flash2":
        return fa2_forward / scale, fa2_backward / scale
    forward = forward_flops / _rate("flash3", "fwd", reference, head_dim, seq)
    return forward / scale, fa2_backward / FLASH3_BACKWARD_SPEEDUP / scale

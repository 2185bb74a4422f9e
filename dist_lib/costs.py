"""Every duration in the simulator is computed here, from device and link figures (seconds, bytes).

Nothing here knows about ranks, clocks or tensors: callers pass the device or link and the sizes.
"""

from __future__ import annotations

from .devices import Device, Link
from .workload import Workload

# Work (in seconds at peak) at which an op reaches half of its device's `max_efficiency`. Small kernels
# are dominated by launch and tail effects; in this saturating curve each op behaves as if it carried
# a fixed overhead of HALF_EFFICIENCY_WORK / max_efficiency seconds.
HALF_EFFICIENCY_WORK = 20e-6

# Bytes of HBM traffic per parameter in a mixed-precision Adam step: read the 16-bit gradient and
# the fp32 master weight, momentum and variance (2+4+4+4), write those three and the 16-bit weight
# (4+4+4+2). Rajbhandari et al. 2020 (ZeRO), sec. 3.1 for the 2+2+12 bytes of state.
ADAM_BYTES_PER_PARAM = 28

# Share of a layer's forward FLOPs in each half of a split backward (zero-bubble): input-gradient and
# weight-gradient GEMMs each cost about one forward (Qi et al. 2023, "Zero Bubble Pipeline Parallelism").
BACKWARD_INPUT_SHARE = 1.0
BACKWARD_WEIGHT_SHARE = 1.0


def efficiency(device: Device, flops: float) -> float:
    """Fraction of peak an op of `flops` sustains: max_efficiency * w / (w + HALF_EFFICIENCY_WORK)."""
    work = flops / device.peak_flops
    return device.max_efficiency * work / (work + HALF_EFFICIENCY_WORK)


def compute_time(device: Device, flops: float, bytes_moved: float) -> float:
    """Roofline: the slower of the math at its achievable rate and the HBM traffic (Williams et al. 2009)."""
    if flops <= 0:
        return bytes_moved / device.hbm_bandwidth
    return max(flops / (device.peak_flops * efficiency(device, flops)), bytes_moved / device.hbm_bandwidth)


def _layer_bytes(workload: Workload, layer: int, samples: int, tp: int) -> float:
    """HBM traffic of a layer's forward: its 16-bit weight shard plus input, output and stash."""
    weights = 2 * workload.layer_params(layer) / tp
    return weights + samples * (2 * workload.activation_bytes() + workload.stash_bytes(layer, tp))


def forward_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1) -> float:
    flops = workload.layer_forward_flops(layer) * samples / tp
    return compute_time(device, flops, _layer_bytes(workload, layer, samples, tp))


def backward_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1) -> float:
    """Backward is twice the forward: input and weight gradients each cost one forward (Korthikanti 2022)."""
    flops = 2 * workload.layer_forward_flops(layer) * samples / tp
    return compute_time(device, flops, 2 * _layer_bytes(workload, layer, samples, tp))


def backward_input_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1) -> float:
    flops = BACKWARD_INPUT_SHARE * workload.layer_forward_flops(layer) * samples / tp
    return compute_time(device, flops, _layer_bytes(workload, layer, samples, tp))


def backward_weight_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1) -> float:
    flops = BACKWARD_WEIGHT_SHARE * workload.layer_forward_flops(layer) * samples / tp
    return compute_time(device, flops, _layer_bytes(workload, layer, samples, tp))


def loss_time(device: Device, workload: Workload, samples: int) -> float:
    """LM head forward and backward plus the softmax cross-entropy (3x the head's forward FLOPs)."""
    flops = 3 * workload.head_forward_flops() * samples
    logits_bytes = 4 * samples * workload.seq_len * workload.vocab  # fp32 logits, written then read
    return compute_time(device, flops, 2 * logits_bytes + 2 * samples * workload.activation_bytes())


def update_time(device: Device, params: float) -> float:
    """Adam on `params` parameters is bound by HBM bandwidth."""
    return compute_time(device, 0.0, ADAM_BYTES_PER_PARAM * params)


def compute_flops(workload: Workload, op: str, layer: int, samples: int, tp: int = 1) -> float:
    """The FLOPs an op executes, for HFU (the same figures the durations above are built from)."""
    if op == "loss":
        return 3 * workload.head_forward_flops() * samples
    share = {"forward": 1.0, "backward": 2.0, "backward_input": BACKWARD_INPUT_SHARE,
             "backward_weight": BACKWARD_WEIGHT_SHARE}.get(op, 0.0)
    return share * workload.layer_forward_flops(layer) * samples / tp


# ---- communication: alpha-beta ring models (Thakur et al. 2005; NCCL's nccl-tests PERFORMANCE.md
# gives the same bus-bandwidth factors: all-reduce 2(p-1)/p, all-gather and reduce-scatter (p-1)/p) --

def all_reduce_time(nbytes: float, p: int, link: Link) -> float:
    """Ring all-reduce of an n-byte buffer over p ranks: 2(p-1)/p * n/B + 2(p-1) * alpha."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) / p * nbytes / link.bandwidth + 2 * (p - 1) * link.latency


def all_gather_time(nbytes: float, p: int, link: Link) -> float:
    """Ring all-gather producing an n-byte buffer: (p-1)/p * n/B + (p-1) * alpha."""
    if p <= 1:
        return 0.0
    return (p - 1) / p * nbytes / link.bandwidth + (p - 1) * link.latency


def reduce_scatter_time(nbytes: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of an n-byte input buffer: (p-1)/p * n/B + (p-1) * alpha."""
    return all_gather_time(nbytes, p, link)


def p2p_time(nbytes: float, link: Link) -> float:
    """One point-to-point message: alpha + n/B."""
    return link.latency + nbytes / link.bandwidth

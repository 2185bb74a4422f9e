"""What the ops of an MoE layer under expert parallelism cost (seconds, FLOPs): the dense part on the tokens'
own rank (`route`: attention and router; `shared_experts`), and one rank's routed experts on the tokens they
received (`experts.expert_shapes`, a grouped GEMM). Backward passes are the input- and weight-gradient GEMMs,
as `compute.backward_time` counts them.

`route`'s memory-bound kernels are the layer's norms, residual adds, rotary embedding and attention-output
copy (`Workload.elementwise_bytes`) without the activation of a dense MLP, which an MoE layer does not have:
its experts' SwiGLU traffic is `experts.swiglu_bytes`, counted where the experts run. A sliding-window layer
(`MoE.sliding_window`) runs its FlashAttention kernel over the band's FLOPs at the kernel's measured rate for
a sequence as long as the window (`attention.flash_times` clamps to its shortest measured sequence, 512
tokens: a 128-key band gets that rate)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dist_lib.costs import compute, experts
from dist_lib.costs.attention import flash_times
from dist_lib.hardware.devices import Device
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload


def _gemms(device: Device, workload: Workload, shapes: list[tuple[float, float, float]]) -> tuple[float, float]:
    seconds = sum(compute.gemm_time(device, m, n, k, 1, workload.bytes_per_element) for m, n, k in shapes)
    return seconds, sum(2.0 * m * n * k for m, n, k in shapes)


def route_cost(device: Device, workload: Workload, layer: int, samples: int, backward: bool) -> tuple[float, float]:
    """(seconds, FLOPs) of an MoE layer's attention and router for `samples` samples, forward or backward
    (the attention core and the memory-bound kernels as in `compute.forward_time`)."""
    passes = ("input", "weight") if backward else ("forward",)
    seconds = flops = 0.0
    for pass_ in passes:
        s, f = _gemms(device, workload, experts.gemm_shapes(workload, layer, samples, 1, pass_, routed=False,
                                                            shared=False))
        seconds, flops = seconds + s, flops + f
    core = _attention_core_time(device, workload, layer, samples, backward)
    elementwise = workload.elementwise_bytes(1, backward=backward) - samples_mlp_activation_bytes(workload, backward)
    seconds += core + compute._stream_time(device, samples * elementwise)
    flops += workload.attention_core_flops(layer) * samples * (2 if backward else 1)
    return compute._layer_pass(workload, 1, seconds), flops


def samples_mlp_activation_bytes(workload: Workload, backward: bool) -> float:
    """One sample's HBM traffic of a dense MLP's activation, which `Workload.elementwise_bytes` counts for a
    dense layer (`architecture.elementwise_bytes_per_token`: SwiGLU 6f forward, 10f backward; GeLU 4f, 6f)
    and an MoE layer does not run."""
    f = arch.ffn_hidden(workload)
    per_token = (10 if backward else 6) * f if workload.mlp == "swiglu" else (6 if backward else 4) * f
    return workload.seq_len * per_token * workload.bytes_per_element / 2


def _attention_core_time(device: Device, workload: Workload, layer: int, samples: int, backward: bool) -> float:
    """The attention core of `layer`: the whole causal prefix, or a sliding window's band."""
    window = workload.moe.window(layer, workload.seq_len)
    if window >= workload.seq_len or workload.attention == "unfused":
        return compute._attention_time(device, workload, samples, 1, backward=backward)
    forward, backward_time = flash_times(device, workload.attention, samples * workload.attention_core_flops(layer),
                                         arch.head_dim(workload), window)
    return backward_time if backward else forward


def shared_cost(device: Device, workload: Workload, layer: int, samples: int, backward: bool) -> tuple[float, float]:
    """(seconds, FLOPs) of a layer's shared experts on every token of `samples` samples."""
    seconds = flops = 0.0
    for pass_ in (("input", "weight") if backward else ("forward",)):
        s, f = _gemms(device, workload, experts.gemm_shapes(workload, layer, samples, 1, pass_, routed=False,
                                                            attention=False))
        seconds, flops = seconds + s, flops + f
    return seconds, flops


def grouped_gemms(device: Device, workload: Workload, shapes: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(seconds, FLOPs) of one grouped GEMM over `shapes`: a grouped kernel (CUTLASS's grouped GEMM, which
    Transformer Engine's GroupedLinear and Megatron-Core's `--moe-grouped-gemm` run) schedules the tiles of
    every group over the SMs together, so groups of one shape are timed as one batch of tiles
    (`compute.gemm_time`'s batch), whose waves fill the SMs that one small expert's GEMM leaves idle
    (NVIDIA CUTLASS docs, "Grouped GEMM"). Groups of distinct shapes (skewed routing) are timed batch by batch."""
    seconds = flops = 0.0
    for (m, n, k), count in Counter(shapes).items():
        seconds += compute.gemm_time(device, m, n, k, count, workload.bytes_per_element)
        flops += 2.0 * m * n * k * count
    return seconds, flops


def experts_cost(device: Device, workload: Workload, tokens: Sequence[int], backward: bool) -> tuple[float, float]:
    """(seconds, FLOPs) of one rank's local experts on `tokens[i]` tokens each (the padded slots included),
    as one grouped GEMM a pass (`grouped_gemms`)."""
    seconds = flops = 0.0
    for pass_ in (("input", "weight") if backward else ("forward",)):
        s, f = grouped_gemms(device, workload, experts.expert_shapes(workload, tokens, pass_))
        seconds += s + (compute._stream_time(device, experts.swiglu_bytes(workload, sum(tokens),
                                                                            backward=backward))
                        if pass_ != "weight" else 0.0)
        flops += f
    return compute._layer_pass(workload, 1, seconds), flops

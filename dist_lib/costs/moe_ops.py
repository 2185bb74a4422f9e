"""What the ops of an MoE layer under expert parallelism cost (seconds, FLOPs): the dense part on the tokens'
own rank (`route`: attention and router; `shared_experts`), and one rank's routed experts on the tokens they
received (`experts.expert_shapes`, a grouped GEMM). Backward passes are the input- and weight-gradient GEMMs,
as `compute.backward_time` counts them.

`route`'s memory-bound kernels are the layer's norms, residual adds, rotary embedding and attention-output
copy (`Workload.elementwise_bytes`), Qwen3's norm of the queries and keys (`qk_norm_bytes`), without the
activation of a dense MLP, which an MoE layer does not have:
its experts' SwiGLU traffic is `experts.swiglu_bytes`, counted where the experts run. A sliding-window layer
(`MoE.sliding_window`) runs its FlashAttention kernel over the band's FLOPs at the kernel's measured rate for
a sequence as long as the window (`attention.flash_times` clamps to its shortest measured sequence, 512
tokens: a 128-key band gets that rate)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dist_lib.costs import compute, experts, fp8 as fp8_costs
from dist_lib.costs.attention import flash_times
from dist_lib.hardware.devices import Device
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload

PASSES = {False: ("forward",), True: ("input", "weight")}


def _gemms(device: Device, workload: Workload, shapes: list[tuple[float, float, float]]) -> tuple[float, float]:
    seconds = sum(compute.gemm_time(device, m, n, k, 1, workload.bytes_per_element) for m, n, k in shapes)
    return seconds, sum(2.0 * m * n * k for m, n, k in shapes)


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


def _linear(device: Device, workload: Workload, forward: list[tuple[float, float, float]], pass_: str,
            fp8: str, grouped: bool = False) -> tuple[float, float]:
    """(seconds, FLOPs) of one pass of the linear layers whose forward GEMMs are `forward`: 16-bit, or with
    an `fp8` recipe at the device's FP8 peak after their casts (`costs.fp8`, as a dense layer's); `grouped`:
    one grouped GEMM (`grouped_gemms`)."""
    shapes = forward if pass_ == "forward" else [(m, k, n) for m, n, k in forward] if pass_ == "input" \
        else [(k, n, m) for m, n, k in forward]
    timed = grouped_gemms if grouped else _gemms
    if not fp8:
        return timed(device, workload, shapes)
    seconds, flops = timed(fp8_costs.fp8_device(device), workload, shapes)
    return seconds + compute._stream_time(device, fp8_costs.shapes_cast_bytes(forward, pass_, fp8)), flops


def route_cost(device: Device, workload: Workload, layer: int, samples: int, backward: bool,
               tp: int = 1, fp8: str = "") -> tuple[float, float]:
    """(seconds, FLOPs) of an MoE layer's attention and router for `samples` samples, forward or backward
    (the attention core and the memory-bound kernels as in `compute.forward_time`), on one of `tp` TP ranks:
    attention split over TP as in a dense layer, sequence-parallel (Megatron-Core runs MoE with TP only with
    sequence parallelism), the router on this rank's sequence part. With `fp8`, the attention's linear layers
    run in FP8; the router, a plain 16-bit GEMM in Megatron-Core (`TopKRouter`), does not."""
    seconds = flops = 0.0
    for pass_ in PASSES[backward]:
        if fp8:
            attention = experts.gemm_shapes(workload, layer, samples, tp, "forward", routed=False, shared=False,
                                            router=False)
            s, f = _linear(device, workload, attention, pass_, fp8)
            r = _gemms(device, workload, experts.gemm_shapes(workload, layer, samples, tp, pass_, routed=False,
                                                             shared=False, sequence_parallel=tp > 1)[len(attention):])
            s, f = s + r[0], f + r[1]
        else:
            s, f = _gemms(device, workload, experts.gemm_shapes(workload, layer, samples, tp, pass_, routed=False,
                                                                shared=False, sequence_parallel=tp > 1))
        seconds, flops = seconds + s, flops + f
    core = _attention_core_time(device, workload, layer, samples, tp, backward)
    elementwise = workload.elementwise_bytes(tp, tp > 1, backward=backward) \
        - samples_mlp_activation_bytes(workload, backward) / tp
    seconds += core + compute._stream_time(device, samples * (elementwise + qk_norm_bytes(workload, backward) / tp))
    flops += workload.attention_core_flops(layer) * samples * (2 if backward else 1) / tp
    return compute._layer_pass(workload, tp, seconds), flops


def qk_norm_bytes(workload: Workload, backward: bool) -> float:
    """One sample's HBM traffic of the RMSNorm over each head's query and key (`MoE.qk_norm`, Qwen3): the
    queries and keys read and written once more forward, 2 (qd + kvd) element transfers a token, and read
    twice and written once backward (the gradient and the input in, the gradient out), 3 (qd + kvd); split
    over TP with the heads. Megatron-Core applies it as its own norm module (`q_layernorm`, `k_layernorm`
    of the attention's submodules)."""
    if not workload.moe.qk_norm:
        return 0.0
    width = (workload.heads + arch.kv_heads(workload)) * arch.head_dim(workload)
    return workload.seq_len * width * (3 if backward else 2) * workload.bytes_per_element


def samples_mlp_activation_bytes(workload: Workload, backward: bool) -> float:
    """One sample's HBM traffic of a dense MLP's activation, which `Workload.elementwise_bytes` counts for a
    dense layer (`architecture.elementwise_bytes_per_token`: SwiGLU 6f forward, 10f backward; GeLU 4f, 6f;
    split over TP) and an MoE layer does not run."""
    f = arch.ffn_hidden(workload)
    per_token = (10 if backward else 6) * f if workload.mlp == "swiglu" else (6 if backward else 4) * f
    return workload.seq_len * per_token * workload.bytes_per_element / 2


def _attention_core_time(device: Device, workload: Workload, layer: int, samples: int, tp: int,
                         backward: bool) -> float:
    """The attention core of `layer` on one of `tp` TP ranks: the whole causal prefix, or a sliding window's band."""
    window = workload.moe.window(layer, workload.seq_len)
    if window >= workload.seq_len or workload.attention == "unfused":
        return compute._attention_time(device, workload, samples, tp, backward=backward)
    forward, backward_time = flash_times(device, workload.attention,
                                         samples * workload.attention_core_flops(layer) / tp,
                                         arch.head_dim(workload), window)
    return backward_time if backward else forward


def core_recompute(device: Device, workload: Workload, samples: int, tp: int = 1) -> float:
    """The attention core's forward again, before the backward of a layer whose stash left it out
    (selective recompute, Korthikanti et al. 2022, sec. 5)."""
    return compute._attention_time(device, workload, samples, tp)


def shared_cost(device: Device, workload: Workload, layer: int, samples: int, backward: bool,
                tp: int = 1, fp8: str = "") -> tuple[float, float]:
    """(seconds, FLOPs) of a layer's shared experts on every token of `samples` samples (their width split
    over `tp` TP ranks, as Megatron-Core's shared experts are; in FP8 with `fp8`)."""
    seconds = flops = 0.0
    forward = experts.gemm_shapes(workload, layer, samples, tp, "forward", routed=False, attention=False)
    for pass_ in PASSES[backward]:
        s, f = _linear(device, workload, forward, pass_, fp8)
        seconds, flops = seconds + s, flops + f
    return seconds, flops


def experts_cost(device: Device, workload: Workload, tokens: Sequence[int], backward: bool,
                 etp: int = 1, fp8: str = "") -> tuple[float, float]:
    """(seconds, FLOPs) of one rank's local experts on `tokens[i]` tokens each (the padded slots included),
    on one of `etp` expert-TP shards of them, as one grouped GEMM a pass (`grouped_gemms`); with `fp8`, the
    grouped GEMM in FP8 (Megatron-Core's `TEGroupedMLP` under Transformer Engine's FP8 autocast), its casts
    counted as a dense layer's. The memory-bound kernels around it (`experts.memory_bound_bytes`) run at HBM
    bandwidth in the forward and in the input-gradient pass."""
    seconds = flops = 0.0
    forward = experts.expert_shapes(workload, tokens, "forward", etp)
    for pass_ in PASSES[backward]:
        s, f = _linear(device, workload, forward, pass_, fp8, grouped=True)
        seconds += s + (compute._stream_time(device, experts.memory_bound_bytes(workload, tokens,
                                                                                  backward=backward, etp=etp))
                        if pass_ != "weight" else 0.0)
        flops += f
    return compute._layer_pass(workload, etp, seconds), flops


def unpermute_backward(device: Device, nbytes: float) -> float:
    """The backward of the dispatch's permutation on the tokens' own rank: each copy's input gradient (`nbytes`
    of returned pieces) gathered back to its token and summed over its experts, as many bytes read and written
    as the dispatch copied (`MoEModel.dispatch`). Megatron-Core's `permute` is an autograd function whose
    backward is the unpermutation (megatron/core/transformer/moe/moe_utils.py `permute`, fused: Transformer
    Engine's `moe_permute` with `moe_permute_fusion`)."""
    return compute._stream_time(device, 2.0 * nbytes)


# Megatron-Core's module recompute (`recompute_granularity = "selective"` with `recompute_modules`; megatron/core/
# transformer/transformer_config.py, transformer_layer.py, moe/experts.py at d98e8a6): the modules' outputs are
# dropped after the forward (`CheckpointWithoutOutput`) and the modules run again in the backward, before the
# GEMM that reads their output needs it. Both are memory-bound kernels, timed at HBM bandwidth.

def norm_recompute(device: Device, workload: Workload, samples: int, tp: int = 1) -> float:
    """`recompute_modules = ["layernorm"]` on an MoE layer: the pre-MLP norm's forward again before the router's
    backward, reading x and writing y, 2h element transfers a token, on this rank's 1/tp of the sequence (MoE
    with TP is sequence-parallel). Only that norm: under Transformer Engine's layer spec the input norm is fused
    into the QKV projection (megatron/core/models/gpt/gpt_layer_specs.py: `linear_qkv =
    column_parallel_layer_norm_linear()`, no `input_layernorm` module), and `TransformerLayer` recomputes the
    input norm only when it is a module of its own (`recompute_input_layernorm` is set only when
    `input_layernorm` is not an `IdentityOp`)."""
    per_token = 2 * workload.hidden * workload.bytes_per_element
    return compute._stream_time(device, samples * workload.seq_len * per_token / tp)


def activation_recompute(device: Device, workload: Workload, tokens: int, etp: int = 1) -> float:
    """`recompute_modules = ["moe_act"]`: the experts' activation forward again before the down projection's
    backward, on the `tokens` routed tokens a rank's experts received (one of `etp` expert-TP shards): the
    SwiGLU (`experts.swiglu_bytes`) and the clamp before it, which runs inside the recomputed function
    (`experts.clamp_bytes`; `TEGroupedMLP` checkpoints its `bias_act_func`, the clamped GLU for GPT-OSS)."""
    return compute._stream_time(device, experts.swiglu_bytes(workload, tokens, etp=etp)
                                + experts.clamp_bytes(workload, tokens, etp=etp))

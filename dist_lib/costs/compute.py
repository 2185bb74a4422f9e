"""Durations of compute on a device (seconds, FLOPs, bytes): GEMMs by shape, attention, streaming passes,
each layer's forward and backward, the loss and the optimizer update, from device figures or measured
profiles. Nothing here knows about ranks, clocks or tensors."""

from __future__ import annotations

import math

from dist_lib.costs import experts, fp8 as fp8_costs
from dist_lib.costs.attention import flash_times
from dist_lib.hardware.devices import Device
from dist_lib.workload import architecture as arch
from dist_lib.workload import per_op_checkpoint as per_op
from dist_lib.workload.transformer import Workload

# GEMM kernels are timed by their shape, as a tiled kernel runs on the GPU (NVIDIA, "Matrix
# Multiplication Background User's Guide", sections on tile and wave quantization): the output M x N
# is cut into GEMM_TILE_LONG x GEMM_TILE_SHORT tiles (256 x 128 is the largest cuBLAS tile and the
# most efficient one the guide lists for A100; the long side goes along the longer output
# dimension), each tile is one thread block, and the blocks run in waves of one block per SM.
# A partial last wave, or a tile hanging over the matrix edge, leaves SMs or tensor-core lanes idle.
GEMM_TILE_LONG = 256
GEMM_TILE_SHORT = 128

# Bytes of HBM traffic per parameter in one mixed-precision optimizer step as Megatron-LM runs it
# (Float16OptimizerWithFloat16Params over apex FusedAdam, gradients accumulated in an fp32 main-gradient
# buffer; Rajbhandari et al. 2020, sec. 3.1, for the 12 bytes of fp32 optimizer state):
ADAM_BYTES_PER_PARAM = (
    4  # zero the fp32 gradient buffer before the step's backward passes
    + 4  # gradient norm for clipping: read every fp32 gradient (multi-tensor L2 norm)
    + 16 + 12  # Adam: read gradient, master weight, momentum, variance; write the last three
    + 4 + 2  # copy the fp32 master weights into the 16-bit model weights
)  # = 42

# Megatron-LM's local DDP divides the fp32 gradient buffer by the data-parallel size in place before
# all-reducing it, even when that size is 1 (megatron/model/distributed.py, allreduce_gradients):
# read and write 4 bytes per parameter.
GRAD_AVERAGE_BYTES_PER_PARAM = 8

# Share of a layer's forward FLOPs in each half of a split backward (zero-bubble): input-gradient and
# weight-gradient GEMMs each cost about one forward (Qi et al. 2023, "Zero Bubble Pipeline Parallelism").
BACKWARD_INPUT_SHARE = 1.0
BACKWARD_WEIGHT_SHARE = 1.0


def gemm_time(device: Device, m: int, n: int, k: int, batch: int = 1, bytes_per_element: int = 2) -> float:
    """Time of a (batched) M x N x K GEMM: whole waves of output tiles, each tile running its K loop
    at `device.max_efficiency` of one SM's share of peak and then storing its tile (the store of a
    wave's tiles shares HBM and is not overlapped: one block fills an SM); never faster than reading
    A and B and writing C once over HBM (roofline, Williams et al. 2009)."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    long, short = max(m, n), min(m, n)
    tiles = batch * math.ceil(long / GEMM_TILE_LONG) * math.ceil(short / GEMM_TILE_SHORT)
    sms = device.sms
    # unknown SM count: no wave quantization, every SM busy to the end
    waves = math.ceil(tiles / sms) if sms else tiles / _NOMINAL_SMS
    slots = sms or _NOMINAL_SMS
    per_sm = device.tensor_flops / slots  # at the clock the power limit leaves (`Device.sustained_clock`)
    tile_flops = 2.0 * GEMM_TILE_LONG * GEMM_TILE_SHORT * k
    tile_store = min(tiles, slots) * GEMM_TILE_LONG * GEMM_TILE_SHORT * bytes_per_element / device.hbm_bandwidth
    tiled = waves * (tile_flops / (per_sm * device.max_efficiency) + tile_store)
    traffic = batch * bytes_per_element * (m * k + k * n + m * n) / device.hbm_bandwidth
    return max(tiled, traffic)


# Only the split of a device's peak into SM shares needs a count when the catalog has none; any
# positive value gives the same unquantized time.
_NOMINAL_SMS = 100


def compute_time(device: Device, flops: float, bytes_moved: float) -> float:
    """Roofline for an op known only by its FLOPs and bytes: the math at `max_efficiency` of peak or
    the HBM traffic, whichever is slower (Williams et al. 2009)."""
    if flops <= 0:
        return bytes_moved / device.hbm_bandwidth
    return max(flops / (device.tensor_flops * device.max_efficiency), bytes_moved / device.hbm_bandwidth)


def _weight_gemm_shapes(workload: Workload, samples: int, tp: int, pass_: str) -> list[tuple[float, float, float]]:
    """(M, N, K) of a layer's four weight GEMMs on one TP rank (Megatron: QKV and MLP-up split by
    columns, projection and MLP-down by rows; Shoeybi et al. 2019, sec. 3; GPT: widths 3h, h, 4h and h,
    `architecture.weight_gemm_shapes` for any layer): forward Y = X W, the
    input gradient dX = dY W^T (M, K, N) and the weight gradient dW = X^T dY (K, N, M)."""
    forward = arch.weight_gemm_shapes(workload, samples * workload.seq_len, tp)
    if pass_ == "forward":
        return forward
    if pass_ == "input":
        return [(m, k, n) for m, n, k in forward]
    return [(k, n, m) for m, n, k in forward]


def _weight_gemms_time(device: Device, workload: Workload, samples: int, tp: int, pass_: str, layer: int = 0,
                       fp8: str = "") -> float:
    """A layer's weight GEMMs of one pass; with an `fp8` recipe (`costs.fp8`) at the FP8 peak, after their casts."""
    shapes = _weight_gemm_shapes(workload, samples, tp, pass_) if workload.moe is None \
        else experts.gemm_shapes(workload, layer, samples, tp, pass_)  # an MoE model's layers: costs.experts
    if fp8:
        fast = fp8_costs.fp8_device(device)
        return sum(gemm_time(fast, m, n, k, 1, workload.bytes_per_element) for m, n, k in shapes) \
            + _stream_time(device, fp8_costs.cast_bytes(workload, samples, tp, pass_, fp8))
    return sum(gemm_time(device, m, n, k, 1, workload.bytes_per_element) for m, n, k in shapes)


def _attention_time(device: Device, workload: Workload, samples: int, tp: int, backward: bool = False) -> float:
    """The attention core's batched GEMMs, one matrix per sample and local head (head size d = h/a):
    forward Q K^T (s x s x d) and P V (s x d x s); backward dP = dO V^T (s x s x d) and dQ, dK, dV
    (each s x d x s). A FlashAttention kernel instead runs at its measured speed (`costs.attention`)."""
    if workload.attention != "unfused":
        flops = samples * workload.attention_core_flops() / tp
        forward, backward_time = flash_times(device, workload.attention, flops, arch.head_dim(workload),
                                             workload.seq_len)
        return backward_time if backward else forward
    s, d = workload.seq_len, arch.head_dim(workload)
    batch = samples * workload.heads / tp
    scores = gemm_time(device, s, s, d, batch, workload.bytes_per_element)
    mixes = gemm_time(device, s, d, s, batch, workload.bytes_per_element)
    return scores + (3 if backward else 1) * mixes


def attention_core_time(device: Device, workload: Workload, samples: int, tp: int, backward: bool = False) -> float:
    """The attention core alone, forward or backward (for the blocks of context-parallel attention,
    `costs.context`)."""
    return _attention_time(device, workload, samples, tp, backward)


def _stream_time(device: Device, nbytes: float) -> float:
    """Memory-bound kernels (layernorm, softmax, dropout, GeLU, residual adds): bytes over HBM bandwidth."""
    return nbytes / device.hbm_bandwidth


# A layer is a sequence of kernels, each either compute-bound (the GEMMs and attention batched GEMMs)
# or memory-bound (everything elementwise); its time is the sum of each kernel's roofline time
# (Williams et al. 2009 per kernel). `Workload.elementwise_bytes` counts the memory-bound traffic.

# An eager framework spends host time on every layer pass (`Workload.framework_overhead_s`, the same for a
# forward and for each half of a backward, plus `Workload.tp_overhead_s` for a tensor-parallel pass):
# Python, autograd and the framework's hooks issuing the layer's unfused kernels one by one. CUDA kernel
# launches are asynchronous (PyTorch, "CUDA semantics: asynchronous execution"): the host queues kernels
# while the GPU runs earlier ones, so a pass takes the longer of the host's time and the GPU's, not their
# sum. A small GPU at a small microbatch waits on the host; a larger microbatch or a slower GPU hides the
# host time. AMP's profiles of one GPT-2 layer forward at microbatch 1 (Li et al. 2022, DachengLi1/AMP
# src/known_cost) show both regimes: 3.9 ms on a V100, host-bound (its kernels take under 2 ms), and
# 5.5 ms on a T4, GPU-bound. The GPU side is the kernel model times `Workload.kernel_time_scale` (1 for
# Megatron-LM's fused kernels). A measured profile includes all of this.


def _layer_pass(workload: Workload, tp: int, kernels: float) -> float:
    """One layer pass: the framework's host time or the GPU's kernel time, whichever is longer."""
    host = workload.framework_overhead_s + (workload.tp_overhead_s if tp > 1 else 0.0)
    return max(host, kernels * workload.kernel_time_scale)


def forward_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                 sequence_parallel: bool = False, fp8: str = "") -> float:
    measured = _profiled(device, workload, layer, samples, tp, FORWARD_SHARE_OF_PROFILE)
    if measured is not None:
        return measured
    return _layer_pass(workload, tp, _weight_gemms_time(device, workload, samples, tp, "forward", layer, fp8)
                       + _attention_time(device, workload, samples, tp)
                       + _stream_time(device, samples * workload.elementwise_bytes(tp, sequence_parallel)))


def recompute_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                   recompute: str = "selective", sequence_parallel: bool = False, fp8: str = "") -> float:
    """Extra time backward spends re-running forward work: none; the attention core alone
    (`selective`: Q K^T, softmax, dropout, softmax * V; Korthikanti et al. 2022, sec. 5; with FlashAttention
    the forward kernel again, which saves only its log-sum-exp); or the whole layer forward (`full`); or
    (`op`, torchtitan's per-op selective checkpointing) the forward GEMMs and memory-bound kernels the policy
    does not save (`workload.per_op_checkpoint`), timed as the forward times them."""
    if recompute == "none":
        return 0.0
    if recompute == "full":
        return forward_time(device, workload, layer, samples, tp, sequence_parallel=sequence_parallel, fp8=fp8)
    if recompute == "op":
        return _per_op_recompute_time(device, workload, samples, tp, sequence_parallel, fp8)
    if recompute != "selective":
        raise ValueError(f"recompute must be 'none', 'selective', 'full' or 'op', got {recompute!r}")
    measured = _profiled(device, workload, layer, samples, tp, 0.0)
    if measured is not None:  # a profile holds no split of the attention core; charge nothing extra
        return 0.0
    kernels = (_attention_time(device, workload, samples, tp)
               + _stream_time(device, samples * workload.elementwise_bytes(tp, attention_only=True)))
    return workload.kernel_time_scale * kernels


def _per_op_recompute_time(device: Device, workload: Workload, samples: int, tp: int, sequence_parallel: bool,
                           fp8: str) -> float:
    """The unsaved GEMMs by shape (in FP8: at the FP8 peak, after casting their input and weight again; the
    saved tensorwise amax spares the amax pass, `costs.fp8.recompute_cast_bytes`) and the unsaved memory-bound
    kernels at HBM bandwidth."""
    if workload.profile is not None:
        raise ValueError(f"workload {workload.name}: recompute 'op' needs the layer's kernels, which a measured "
                         f"profile does not split out")
    shapes = per_op.recomputed_gemm_shapes(workload, samples * workload.seq_len, tp, sequence_parallel)
    e = workload.bytes_per_element
    if fp8:
        fast = fp8_costs.fp8_device(device)
        gemms = sum(gemm_time(fast, m, n, k, 1, e) for m, n, k in shapes) + _stream_time(
            device, fp8_costs.recompute_cast_bytes(shapes, fp8))
    else:
        gemms = sum(gemm_time(device, m, n, k, 1, e) for m, n, k in shapes)
    replicated, split = per_op.recomputed_elementwise_bytes_per_token(workload)
    if sequence_parallel and tp > 1:
        replicated /= tp
    streamed = samples * workload.seq_len * (replicated + split / tp) * e / 2
    return workload.kernel_time_scale * (gemms + _stream_time(device, streamed))


def per_op_recompute_flops(workload: Workload, samples: int, tp: int, sequence_parallel: bool) -> float:
    """FLOPs of the GEMMs per-op checkpointing runs again on one TP rank (2 M N K each)."""
    return sum(2.0 * m * n * k for m, n, k in per_op.recomputed_gemm_shapes(workload, samples * workload.seq_len,
                                                                          tp, sequence_parallel))


def backward_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                  sequence_parallel: bool = False, recompute: str = "none", fp8: str = "") -> float:
    """Backward GEMMs are twice the forward ones (input and weight gradients; Korthikanti 2022), plus
    the backward of the memory-bound kernels and any recompute of forward work."""
    extra = recompute_time(device, workload, layer, samples, tp, recompute=recompute,
                           sequence_parallel=sequence_parallel, fp8=fp8)
    measured = _profiled(device, workload, layer, samples, tp, 1 - FORWARD_SHARE_OF_PROFILE)
    if measured is not None:
        return measured + extra
    return backward_input_time(device, workload, layer, samples, tp, sequence_parallel=sequence_parallel, fp8=fp8) \
        + backward_weight_time(device, workload, layer, samples, tp, fp8=fp8) + extra


def backward_input_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                        sequence_parallel: bool = False, fp8: str = "") -> float:
    """Input-gradient half of a split backward: its GEMMs and the backward of the elementwise kernels."""
    measured = _profiled(device, workload, layer, samples, tp, (1 - FORWARD_SHARE_OF_PROFILE) / 2)
    if measured is not None:
        return measured
    # weight GEMMs' input gradients, plus the attention core's backward (four batched GEMMs, 2x its forward)
    return _layer_pass(workload, tp, _weight_gemms_time(device, workload, samples, tp, "input", layer, fp8)
                       + _attention_time(device, workload, samples, tp, backward=True)
                       + _stream_time(device, samples * workload.elementwise_bytes(tp, sequence_parallel,
                                                                                   backward=True)))


def backward_weight_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                         fp8: str = "") -> float:
    """Weight-gradient half: the weight GEMMs only (the attention core has no weights)."""
    measured = _profiled(device, workload, layer, samples, tp, (1 - FORWARD_SHARE_OF_PROFILE) / 2)
    if measured is not None:
        return measured
    return _layer_pass(workload, tp, _weight_gemms_time(device, workload, samples, tp, "weight", layer, fp8))


def weight_pass_bytes(workload: Workload, tp: int = 1, *, sequence_parallel: bool = False) -> float:
    """Bytes per sample a layer's weight-gradient pass (W) needs once its input-gradient pass (I) ran, in
    a split backward: W of a linear layer Y = XA is dA = X^T dY, so it keeps the inputs X of the layer's
    four linear layers and the output gradients dY they multiply; everything else the forward kept
    (layernorm inputs, dropout masks, GeLU input, Q, K, V, the attention scores) is freed at I (Qi et al.
    2024, "Zero Bubble Pipeline Parallelism", sec. 3; their runtime, zb_schedules.py, counts mem_b =
    32h - 34h - 5as and mem_w = -32h bytes per token). Per token, 16-bit, by the tensors of Korthikanti
    et al. 2022, sec. 4.1: inputs QKV 2h, projection 2h, MLP up 2h, MLP down 8h (14h); output gradients
    QKV 6h, projection 2h, MLP up 8h, MLP down 2h (18h); 32h in all.
    With t TP ranks the column-parallel layers' (QKV, MLP up) inputs are replicated and the row-parallel
    ones' split, (4 + 10/t)h; with sequence parallelism every input is kept as its sequence shard (14/t)h
    and W all-gathers it again, as the backward does (Korthikanti et al. 2022, sec. 4.2.2; the Zero Bubble
    runtime's `pre_process` in megatron/core/tensor_parallel/layers.py). The column-parallel layers'
    output gradients are split, the row-parallel ones' (after the TP all-reduce or all-gather) whole:
    (4 + 14/t)h. So 8 + 24/t without sequence parallelism, 4 + 28/t with it, 32 at t = 1."""
    units = (4 + 28 / tp) if sequence_parallel and tp > 1 else (8 + 24 / tp)
    return workload.seq_len * workload.hidden * units * workload.bytes_per_element / 2


def split_stash_bytes(workload: Workload, tp: int = 1, *, sequence_parallel: bool = False) -> int:
    """Bytes per sample a layer's stash keeps from its input-gradient pass to its weight-gradient pass:
    `weight_pass_bytes` less the two tensors `Model.backward_weight` takes as its own buffers, which a
    strategy therefore keeps alive until then anyway (the layer's input and its output gradient, b*s*h each;
    as `Workload.stash_bytes` leaves out the layer input), so that a layer awaiting W holds the runtime's
    32h a token in all (with TP, 8 + 24/t or 4 + 28/t)."""
    return max(0, int(weight_pass_bytes(workload, tp, sequence_parallel=sequence_parallel))
               - 2 * workload.activation_bytes())


# A measured profile gives forward+backward per layer; forward is a third of it, as in FLOPs.
FORWARD_SHARE_OF_PROFILE = 1 / 3


def _profiled(device: Device, workload: Workload, layer: int, samples: int, tp: int, share: float) -> float | None:
    """`share` of the measured forward+backward time of `layer`, if the workload carries a profile
    for this device type."""
    profile = workload.profile
    if profile is None:
        return None
    total = profile.layer_time(device, layer, samples, tp)  # type: ignore[attr-defined]
    return None if total is None else share * total


# Bytes of HBM traffic per logit of Megatron-LM's vocab_parallel_cross_entropy (see `loss_time`)
CROSS_ENTROPY_BYTES_PER_LOGIT = (2 + 4) + 4 + 8 + 8 + 4 + 8 + (8 + 4 + 2)  # forward 38, backward 14


def loss_time(device: Device, workload: Workload, samples: int, tp: int = 1) -> float:
    """LM head forward and backward and the softmax cross-entropy. With TP the head is vocabulary-parallel
    (Megatron), so each rank holds V/t logits per token. Its three GEMMs are timed by shape like a
    layer's (logits Y = X E^T, dX = dY E, dE = dY^T X); the memory-bound part is the final layernorm
    (forward reads x and writes y, backward reads x and dy and writes dx: five b*s*h tensors) and the
    cross-entropy over the logits, per logit: cast to fp32 (read 2, write 4), row max (4), subtract it
    (4+4), exp (4+4), row sum (4), divide into the softmax kept for backward (4+4); backward scales
    the softmax in place (4+4) and casts the gradient back to 16 bits (4+2): 52 bytes
    (Megatron-LM's vocab_parallel_cross_entropy on `output.float()`)."""
    measured = workload.profile.head_time(device, samples, tp) if workload.profile is not None else None
    if measured is not None:
        return measured
    tokens, h, vocab = samples * workload.seq_len, workload.hidden, workload.vocab / tp
    e = workload.bytes_per_element
    gemms = (gemm_time(device, tokens, vocab, h, 1, e) + gemm_time(device, tokens, h, vocab, 1, e)
             + gemm_time(device, h, vocab, tokens, 1, e))
    layernorm = 5 * samples * workload.activation_bytes()
    return gemms + _stream_time(device, CROSS_ENTROPY_BYTES_PER_LOGIT * tokens * vocab + layernorm)


def update_time(device: Device, params: float) -> float:
    """One optimizer step on `params` parameters is bound by HBM bandwidth (`ADAM_BYTES_PER_PARAM`)."""
    return compute_time(device, 0.0, ADAM_BYTES_PER_PARAM * params)


def grad_average_time(device: Device, params: float) -> float:
    """Megatron-LM's in-place division of the fp32 gradient buffer by the data-parallel size."""
    return compute_time(device, 0.0, GRAD_AVERAGE_BYTES_PER_PARAM * params)


def compute_flops(workload: Workload, op: str, layer: int, samples: int, tp: int = 1, *,
                  recompute: str = "none", sequence_parallel: bool = False) -> float:
    """The FLOPs an op executes, for HFU (the same figures the durations above are built from).
    A backward with selective recompute also re-runs the attention core (Korthikanti 2022, Eq. 8), one with
    per-op checkpointing (`op`) the GEMMs the policy did not save; with full recompute the forward is a
    separate op and counted there."""
    if op == "loss":
        return 3 * workload.head_forward_flops() * samples / tp
    share = {"forward": 1.0, "backward": 2.0, "backward_input": BACKWARD_INPUT_SHARE,
             "backward_weight": BACKWARD_WEIGHT_SHARE}.get(op, 0.0)
    flops = share * workload.layer_forward_flops(layer) * samples / tp
    if op == "backward_weight":  # the attention core has no weight gradient
        flops = BACKWARD_WEIGHT_SHARE * workload.layer_gemm_flops(layer) * samples / tp
    elif op == "backward_input":
        flops = (BACKWARD_INPUT_SHARE * workload.layer_gemm_flops(layer) + 2 * workload.attention_core_flops()) \
            * samples / tp
    if op in ("backward", "backward_input") and recompute == "selective":
        flops += workload.attention_core_flops() * samples / tp
    elif op in ("backward", "backward_input") and recompute == "op":
        flops += per_op_recompute_flops(workload, samples, tp, sequence_parallel)
    return flops


# ---- the LLM-Training-Puzzles' own unit costs (its lib.py, Model.event), so that files written for it
# can be compared with its published step counts: forward and backward cost one step per batch, an
# update half a step, a collective 0.3 and each end of a message 0.2; loading and the loss are free.
PUZZLE_STEPS_PER_BATCH = {"forward": 1.0, "backward": 1.0}
PUZZLE_UPDATE_STEPS = 0.5
PUZZLE_COLLECTIVE_STEPS = 0.3
PUZZLE_MESSAGE_STEPS = 0.2

"""Every duration in the simulator is computed here, from device and link figures (seconds, bytes).

Nothing here knows about ranks, clocks or tensors: callers pass the device or link and the sizes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .devices import Device, Link
from .workload import Workload

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
    per_sm = device.peak_flops / slots
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
    return max(flops / (device.peak_flops * device.max_efficiency), bytes_moved / device.hbm_bandwidth)


def _weight_gemm_shapes(workload: Workload, samples: int, tp: int, pass_: str) -> list[tuple[float, float, float]]:
    """(M, N, K) of a layer's four weight GEMMs on one TP rank (Megatron: QKV and MLP-up split by
    columns, projection and MLP-down by rows; Shoeybi et al. 2019, sec. 3): forward Y = X W, the
    input gradient dX = dY W^T (M, K, N) and the weight gradient dW = X^T dY (K, N, M)."""
    tokens, h = samples * workload.seq_len, workload.hidden
    forward = [(tokens, 3 * h / tp, h), (tokens, h, h / tp), (tokens, 4 * h / tp, h), (tokens, h, 4 * h / tp)]
    if pass_ == "forward":
        return forward
    if pass_ == "input":
        return [(m, k, n) for m, n, k in forward]
    return [(k, n, m) for m, n, k in forward]


def _weight_gemms_time(device: Device, workload: Workload, samples: int, tp: int, pass_: str) -> float:
    return sum(gemm_time(device, m, n, k, 1, workload.bytes_per_element)
               for m, n, k in _weight_gemm_shapes(workload, samples, tp, pass_))


def _attention_time(device: Device, workload: Workload, samples: int, tp: int, backward: bool = False) -> float:
    """The attention core's batched GEMMs, one matrix per sample and local head (head size d = h/a):
    forward Q K^T (s x s x d) and P V (s x d x s); backward dP = dO V^T (s x s x d) and dQ, dK, dV
    (each s x d x s)."""
    s, d = workload.seq_len, workload.hidden / workload.heads
    batch = samples * workload.heads / tp
    scores = gemm_time(device, s, s, d, batch, workload.bytes_per_element)
    mixes = gemm_time(device, s, d, s, batch, workload.bytes_per_element)
    return scores + (3 if backward else 1) * mixes


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
                 sequence_parallel: bool = False) -> float:
    measured = _profiled(device, workload, layer, samples, tp, FORWARD_SHARE_OF_PROFILE)
    if measured is not None:
        return measured
    return _layer_pass(workload, tp, _weight_gemms_time(device, workload, samples, tp, "forward")
                       + _attention_time(device, workload, samples, tp)
                       + _stream_time(device, samples * workload.elementwise_bytes(tp, sequence_parallel)))


def recompute_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                   recompute: str = "selective", sequence_parallel: bool = False) -> float:
    """Extra time backward spends re-running forward work: none; the attention core alone
    (`selective`: Q K^T, softmax, dropout, softmax * V; Korthikanti et al. 2022, sec. 5); or the
    whole layer forward (`full`)."""
    if recompute == "none":
        return 0.0
    if recompute == "full":
        return forward_time(device, workload, layer, samples, tp, sequence_parallel=sequence_parallel)
    if recompute != "selective":
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    measured = _profiled(device, workload, layer, samples, tp, 0.0)
    if measured is not None:  # a profile holds no split of the attention core; charge nothing extra
        return 0.0
    kernels = (_attention_time(device, workload, samples, tp)
               + _stream_time(device, samples * workload.elementwise_bytes(tp, attention_only=True)))
    return workload.kernel_time_scale * kernels


def backward_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                  sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Backward GEMMs are twice the forward ones (input and weight gradients; Korthikanti 2022), plus
    the backward of the memory-bound kernels and any recompute of forward work."""
    extra = recompute_time(device, workload, layer, samples, tp, recompute=recompute,
                           sequence_parallel=sequence_parallel)
    measured = _profiled(device, workload, layer, samples, tp, 1 - FORWARD_SHARE_OF_PROFILE)
    if measured is not None:
        return measured + extra
    return backward_input_time(device, workload, layer, samples, tp, sequence_parallel=sequence_parallel) \
        + backward_weight_time(device, workload, layer, samples, tp) + extra


def backward_input_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1, *,
                        sequence_parallel: bool = False) -> float:
    """Input-gradient half of a split backward: its GEMMs and the backward of the elementwise kernels."""
    measured = _profiled(device, workload, layer, samples, tp, (1 - FORWARD_SHARE_OF_PROFILE) / 2)
    if measured is not None:
        return measured
    # weight GEMMs' input gradients, plus the attention core's backward (four batched GEMMs, 2x its forward)
    return _layer_pass(workload, tp, _weight_gemms_time(device, workload, samples, tp, "input")
                       + _attention_time(device, workload, samples, tp, backward=True)
                       + _stream_time(device, samples * workload.elementwise_bytes(tp, sequence_parallel,
                                                                                   backward=True)))


def backward_weight_time(device: Device, workload: Workload, layer: int, samples: int, tp: int = 1) -> float:
    """Weight-gradient half: the weight GEMMs only (the attention core has no weights)."""
    measured = _profiled(device, workload, layer, samples, tp, (1 - FORWARD_SHARE_OF_PROFILE) / 2)
    if measured is not None:
        return measured
    return _layer_pass(workload, tp, _weight_gemms_time(device, workload, samples, tp, "weight"))


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
                  recompute: str = "none") -> float:
    """The FLOPs an op executes, for HFU (the same figures the durations above are built from).
    A backward with selective recompute also re-runs the attention core (Korthikanti 2022, Eq. 8);
    with full recompute the forward is a separate op and counted there."""
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
    return flops


# ---- communication: alpha-beta ring models (Thakur et al. 2005; NCCL's nccl-tests PERFORMANCE.md
# gives the same bus-bandwidth factors: all-reduce 2(p-1)/p, all-gather and reduce-scatter (p-1)/p).
# B is the bandwidth NCCL achieves on the link (`Link.achieved_bandwidth`: line rate x protocol efficiency).

def all_reduce_time(nbytes: float, p: int, link: Link) -> float:
    """Ring all-reduce of an n-byte buffer over p ranks: 2(p-1)/p * n/B + 2(p-1) * alpha."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) / p * nbytes / link.achieved_bandwidth + 2 * (p - 1) * link.latency


def all_gather_time(nbytes: float, p: int, link: Link) -> float:
    """Ring all-gather producing an n-byte buffer: (p-1)/p * n/B + (p-1) * alpha."""
    if p <= 1:
        return 0.0
    return (p - 1) / p * nbytes / link.achieved_bandwidth + (p - 1) * link.latency


def reduce_scatter_time(nbytes: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of an n-byte input buffer: (p-1)/p * n/B + (p-1) * alpha."""
    return all_gather_time(nbytes, p, link)


def p2p_time(nbytes: float, link: Link) -> float:
    """One point-to-point message: alpha + n/B."""
    return link.latency + nbytes / link.achieved_bandwidth


def shared_speed(usage: tuple[tuple[int, int], ...], capacity: list[int], load: list[int]) -> float:
    """Share of its own full speed a transfer gets from the links it shares. `usage` lists its (link,
    bytes/s it wants there); a link carries `capacity` bytes/s and the transfers on it want `load` in
    all. Concurrent transfers split a link in proportion to what they want, so on a link asked for L
    more than its capacity c each gets c / L of its own rate; a transfer moves at its share of its most
    loaded link (a flow-level model: Velho et al. 2013)."""
    speed = 1.0
    for link, _ in usage:
        wanted, carried = load[link], capacity[link]
        if wanted > carried and carried / wanted < speed:
            speed = carried / wanted
    return speed


# ---- collectives over groups that span nodes: flat ring or hierarchical, whichever is faster -------

@dataclass(frozen=True, slots=True)
class Topology:
    """How a group's ranks sit on nodes, as the collective cost model needs it.

    `ring` is the slowest hop of a flat ring over the ranks in order; `intra` the slowest intra-node
    link among the nodes spanned (None when no node holds two members); `inter` the slowest NIC
    (None within one node); `per_node` the members on each node when every node holds the same
    number, else 0 (then only the flat ring applies); `nics` the NICs the least provided node spanned
    drives: its members when each GPU has its own NIC, at most the node's NICs when they belong to the
    node. NCCL runs one ring channel per NIC, so a ring's node-crossing hop can use that many NICs
    side by side (tuning.cc: bus bandwidth = channels x per-channel bandwidth).
    """

    size: int
    nodes: int
    per_node: int
    ring: Link
    intra: Link | None = None
    inter: Link | None = None
    nics: int = 1


def _ring_latency(op: str, topo: Topology) -> float:
    """Latency of a flat ring, composed as NCCL's tuner does (src/graph/tuning.cc, ring algorithm):
    all-reduce takes 2(p-1) steps of which 2(N-1) cross nodes, all-gather and reduce-scatter p-1 of
    which N-1 cross nodes; each step costs its link's latency."""
    p, n = topo.size, topo.nodes
    steps, inter_steps = (2 * (p - 1), 2 * (n - 1)) if op == "all_reduce" else (p - 1, n - 1)
    intra = topo.intra.latency if topo.intra is not None else topo.ring.latency
    inter = topo.inter.latency if topo.inter is not None else topo.ring.latency
    return (steps - inter_steps) * intra + inter_steps * inter


def ring_bandwidth(topo: Topology) -> float:
    """Per-rank bandwidth of a flat ring: its slowest intra-node hop, or the node-crossing hop spread
    over `nics` NICs, whichever is slower (a mixed group runs at its bottleneck)."""
    if topo.inter is None:
        return topo.ring.achieved_bandwidth
    crossing = topo.nics * topo.inter.achieved_bandwidth
    return crossing if topo.intra is None else min(topo.intra.achieved_bandwidth, crossing)


def flat_ring_time(op: str, nbytes: float, topo: Topology) -> float:
    """One ring over every member: bus-bandwidth factor 2(p-1)/p (all-reduce) or (p-1)/p, per-link latencies."""
    p = topo.size
    if p <= 1:
        return 0.0
    factor = 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p
    return factor * nbytes / ring_bandwidth(topo) + _ring_latency(op, topo)


def hierarchical_time(op: str, nbytes: float, topo: Topology) -> float | None:
    """Two-level collective for N nodes of g members each (None when the group is not N x g, g > 1,
    N > 1). All-reduce: reduce-scatter inside each node, g parallel all-reduces of n/g across nodes
    (one per local rank, each on its own NIC), all-gather inside each node. All-gather: the
    inter-node all-gather of each local rank's n/g slice, then the intra-node all-gather of n;
    reduce-scatter is the mirror image. (Thakur et al. 2005; NCCL's tree/CollNet split the same way.)"""
    g, n = topo.per_node, topo.nodes
    if g <= 1 or n <= 1 or topo.intra is None or topo.inter is None:
        return None
    intra = reduce_scatter_time(nbytes, g, topo.intra)
    # the g inter-node collectives share the node's NICs when it has fewer than g (node NICs)
    shared = g / topo.nics if topo.nics < g else 1.0
    if op == "all_reduce":
        return 2 * intra + shared * all_reduce_time(nbytes / g, n, topo.inter)
    return intra + shared * all_gather_time(nbytes / g, n, topo.inter)


def collective_algorithm(op: str, nbytes: float, topo: Topology) -> tuple[str, float]:
    """The algorithm NCCL's tuner would pick (the lowest predicted time) and its time."""
    if op not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise ValueError(f"unknown collective {op!r}")
    best = ("ring", flat_ring_time(op, nbytes, topo))
    hier = hierarchical_time(op, nbytes, topo)
    if hier is not None and hier < best[1]:
        best = ("hierarchical", hier)
    return best


def collective_time(op: str, nbytes: float, topo: Topology) -> float:
    return collective_algorithm(op, nbytes, topo)[1]


# ---- Megatron tensor and pipeline parallelism ----------------------------------------------------

def tp_layer_comm_time(workload: Workload, samples: int, topo: Topology, *,
                       sequence_parallel: bool = False) -> float:
    """TP communication of one layer's forward (the backward moves the same): two all-reduces of the
    b*s*h activation (after attention and after the MLP; Shoeybi et al. 2019, sec. 3). With
    sequence parallelism each becomes a reduce-scatter plus an all-gather of the same buffer, the
    same volume as a ring all-reduce (Korthikanti et al. 2022, sec. 4.2.2)."""
    if topo.size <= 1:
        return 0.0
    nbytes = samples * workload.activation_bytes()
    if sequence_parallel:
        return 2 * (collective_time("reduce_scatter", nbytes, topo) + collective_time("all_gather", nbytes, topo))
    return 2 * collective_time("all_reduce", nbytes, topo)


def tp_layer_backward_comm_time(workload: Workload, samples: int, topo: Topology, *,
                                sequence_parallel: bool = False) -> tuple[float, float]:
    """(exposed, overlappable) seconds of one layer's backward TP communication in Megatron-LM
    (LinearWithGradAccumulationAndAsyncCommunication; Korthikanti et al. 2022, sec. 4.2.2).
    Without SP: the input gradients of QKV and MLP-up are all-reduced asynchronously while the
    weight-gradient GEMMs run. With SP: the gradients entering the two row-parallel layers are
    all-gathered before their GEMMs (exposed); the re-gather of each column-parallel layer's input
    for its weight gradient runs beside the input-gradient GEMM, and the reduce-scatter of that input
    gradient beside the weight-gradient GEMM."""
    if topo.size <= 1:
        return 0.0, 0.0
    nbytes = samples * workload.activation_bytes()
    gather = collective_time("all_gather", nbytes, topo)
    if sequence_parallel:
        return 2 * gather, 2 * (gather + collective_time("reduce_scatter", nbytes, topo))
    return 0.0, 2 * collective_time("all_reduce", nbytes, topo)


def tp_embedding_comm_time(workload: Workload, samples: int, topo: Topology, *,
                           sequence_parallel: bool = False) -> tuple[float, float]:
    """(first stage, last stage) TP communication per microbatch, forward plus backward, of Megatron-LM's
    vocabulary-parallel embedding and LM head. Embedding: its partial lookups are all-reduced in
    forward, or reduce-scattered with SP (their gradient all-gathered in backward). Head: every rank
    needs the full hidden states, so with SP they are all-gathered in forward and their gradient
    reduce-scattered in backward; without SP the gradient is all-reduced in backward. The
    cross-entropy adds three all-reduces of b*s fp32 values (max logit, target logit, sum of exps)."""
    if topo.size <= 1:
        return 0.0, 0.0
    nbytes = samples * workload.activation_bytes()
    if sequence_parallel:
        pair = collective_time("reduce_scatter", nbytes, topo) + collective_time("all_gather", nbytes, topo)
        embedding = head = pair
    else:
        embedding = head = collective_time("all_reduce", nbytes, topo)
    return embedding, head + 3 * collective_time("all_reduce", 4 * samples * workload.seq_len, topo)


def pipeline_message_bytes(workload: Workload, samples: int, tp: int = 1) -> float:
    """Bytes one TP rank of a pipeline stage sends its neighbour per microbatch. With sequence
    parallelism each rank holds and sends its 1/t slice of the b*s*h 16-bit values; without it
    Megatron-LM still sends 1/t from each rank and all-gathers the message on arrival (its
    scatter-gather optimization, on by default; Narayanan et al. 2021, sec. 4.1)."""
    return samples * workload.activation_bytes() / max(tp, 1)


def pipeline_crossing_time(workload: Workload, messages: Iterable[tuple[float, int, Link]]) -> float:
    """Seconds a pipeline schedule's timing model counts for one microbatch crossing a stage boundary
    (Zero Bubble's `cost_comm`, Qi et al. 2023, sec. 3.1): the longest of the boundary's messages, each
    alone on its link. A message is (samples, TP pieces it is cut into, link): `p2p_time` of
    `pipeline_message_bytes`. The pass that takes the input waits for its last message; the messages of
    one crossing are sent at once, so the slowest alone is when the input can be there at the earliest.
    0 for no messages (a stage handing the tensor to itself)."""
    return max((p2p_time(pipeline_message_bytes(workload, samples, pieces), link)
                for samples, pieces, link in messages), default=0.0)


# What else DeepSpeed's pipeline engine (0.3.x, the engine AMP ran: DachengLi1/AMP DeepSpeed/version.txt 0.3.13)
# sends between stages, beside the hidden states (deepspeed/runtime/pipe/engine.py, `_exec_send_activations`,
# and runtime/utils.py, `PartitionedTensor`):
# * Megatron-LM v1.1.5's GPT2ModelPipe passes the causal attention mask from stage to stage with the hidden
#   states: one 1 x 1 x s x s mask per microbatch whatever its size (`get_ltor_masks_and_position_ids`
#   without `reset_attention_mask`), which the engine casts to 16 bits (`.half()`) because NCCL sends no bools;
# * with model parallelism the engine sends each TP rank's 1/t piece of the hidden states
#   (`is_pipe_partitioned`) preceded by the piece's metadata, an int64 tensor of the number of dimensions,
#   the shape, the number of parts, the rank and the t + 1 partition offsets (`PartitionedTensor.to_meta`).
MASK_BYTES_PER_ELEMENT = 2  # the engine's .half() copy of the boolean mask
META_BYTES_PER_ENTRY = 8  # torch.LongTensor
HIDDEN_DIMS = 3  # b x s x h


def attention_mask_bytes(workload: Workload) -> int:
    """Bytes of the 16-bit 1 x 1 x s x s attention mask a GPT stage sends with each activation under
    DeepSpeed's pipeline engine (see above): s^2 x 2, independent of the microbatch."""
    return workload.seq_len * workload.seq_len * MASK_BYTES_PER_ELEMENT


def partition_meta_bytes(tp: int) -> int:
    """Bytes of the metadata DeepSpeed sends before a message partitioned over `tp` ranks (see above):
    1 + 3 (dims, shape) + 2 (parts, rank) + tp + 1 (offsets) int64 entries."""
    return META_BYTES_PER_ENTRY * (1 + HIDDEN_DIMS + 2 + tp + 1)


def pipeline_exchange_time(workload: Workload, samples: int, link: Link, tp_topo: Topology, *, sends: int,
                           receives: int, sequence_parallel: bool = False) -> float:
    """One Megatron-LM pipeline exchange (a batch of sends and receives with the neighbour stages) once
    every peer has posted its side: the messages sent share the rank's link one way and those received
    the other way (full duplex), so alpha + max(sends, receives) x message / B; without SP each received
    message is then all-gathered in the TP group (scatter-gather; Narayanan et al. 2021, sec. 4.1)."""
    if sends == 0 and receives == 0:
        return 0.0
    seconds = p2p_time(max(sends, receives) * pipeline_message_bytes(workload, samples, tp_topo.size), link)
    if receives and not sequence_parallel and tp_topo.size > 1:
        seconds += receives * collective_time("all_gather", samples * workload.activation_bytes(), tp_topo)
    return seconds


# ---- the LLM-Training-Puzzles' own unit costs (its lib.py, Model.event), so that files written for it
# can be compared with its published step counts: forward and backward cost one step per batch, an
# update half a step, a collective 0.3 and each end of a message 0.2; loading and the loss are free.
PUZZLE_STEPS_PER_BATCH = {"forward": 1.0, "backward": 1.0}
PUZZLE_UPDATE_STEPS = 0.5
PUZZLE_COLLECTIVE_STEPS = 0.3
PUZZLE_MESSAGE_STEPS = 0.2

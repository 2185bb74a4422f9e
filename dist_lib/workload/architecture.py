"""What one transformer layer weighs, from the layer as it is built: attention with `heads` query heads and
`kv_heads` key/value heads of `head_dim` (MHA, GQA, MQA), an MLP of `ffn_hidden` that is gated (SwiGLU: three
matrices) or not (GeLU: two), LayerNorm or RMSNorm, biases or none, dropout or none, sequential or parallel
(GPT-J / PaLM) attention and MLP, and the attention kernel (unfused, or FlashAttention, which keeps no s x s
matrix in HBM).

Every figure is counted tensor by tensor, so that with GPT-3's choices (MHA, a 4h GeLU MLP, LayerNorm, biases,
dropout, sequential block, unfused attention) it is exactly Korthikanti et al. 2022's: 12h^2 + 13h parameters
a layer, 24sh^2 + 4s^2h forward FLOPs a sample (sec. 6), a stash of sh(34 + 5as/h) bytes (Table 2).
The FLOP count is Megatron-Core's (megatron/training/training.py, `num_floating_point_operations`: query
projection q*d, key/value 2*kv*d, the attention core over the full s x s matrix, a gated MLP 3/2 of a plain one),
written per GEMM here. Llama's shapes are from Llama Team 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783),
Table 3, and Touvron et al. 2023, "Llama 2" (arXiv 2307.09288).

The functions take any object with the `LayerShape` fields (a `Workload`), and count in whole numbers where
the published formulas do, so that the GPT presets' figures stay the same to the last bit.
"""

from __future__ import annotations

from typing import Protocol

MLP_KINDS = ("gelu", "swiglu")  # swiglu: gate and up projections, SiLU(gate) * up, then down (Shazeer 2020)
NORM_KINDS = ("layernorm", "rmsnorm")  # RMSNorm has a scale and no bias (Zhang and Sennrich 2019)
POSITION_KINDS = ("learned", "rotary")  # rotary: no position embedding table (Su et al. 2021)
ATTENTION_KERNELS = ("unfused", "flash2", "flash3")  # FlashAttention-2 (Dao 2023), -3 (Shah et al. 2024)
# How the projections are built: "fused", Q, K and V one linear layer and the gated MLP's gate and up one (Megatron's
# `linear_qkv` and `linear_fc1`); "separate", each its own linear layer (torchtitan's Llama: `wq`, `wk`, `wv`, `w1`,
# `w3` each an `nn.Linear`, torchtitan/models/llama3/model.py), each its own GEMM.
PROJECTION_KINDS = ("fused", "separate")


class LayerShape(Protocol):
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    mlp: str
    norm: str
    position: str
    tied_embeddings: bool
    bias: bool
    dropout: bool
    parallel_block: bool
    attention: str


def kv_heads(w: LayerShape) -> int:
    """Key/value heads: `kv_heads`, or as many as query heads (multi-head attention) when 0."""
    return w.kv_heads or w.heads


def head_dim(w: LayerShape) -> int:
    """Size of one head: `head_dim`, or hidden / heads when 0."""
    return w.head_dim or w.hidden // w.heads


def ffn_hidden(w: LayerShape) -> int:
    """Width of the MLP: `ffn_hidden`, or 4h when 0 (GPT)."""
    return w.ffn_hidden or 4 * w.hidden


def widths(w: LayerShape) -> tuple[int, int, int]:
    """(query width q*d, key/value width kv*d, MLP up-projection output width: 2f gated, else f)."""
    d = head_dim(w)
    f = ffn_hidden(w)
    return w.heads * d, kv_heads(w) * d, (2 * f if w.mlp == "swiglu" else f)


def _norms(w: LayerShape) -> int:
    return 1 if w.parallel_block else 2  # a parallel block normalises its input once for both branches


def layer_params(w: LayerShape) -> int:
    """Parameters of one layer: Q, K, V and output projections, the MLP's matrices, their biases, the norms."""
    h, f = w.hidden, ffn_hidden(w)
    q, kv, up = widths(w)
    params = h * (2 * q + 2 * kv) + h * (up + f)
    if w.bias:
        params += (q + 2 * kv + h) + (up + h)
    return params + _norms(w) * (2 * h if w.norm == "layernorm" else h)


def input_embedding_params(w: LayerShape) -> int:
    """Token embedding, and the learned position embedding: counted on layer 0."""
    return w.vocab * w.hidden + (w.seq_len * w.hidden if w.position == "learned" else 0) if w.vocab else 0


def output_params(w: LayerShape) -> int:
    """An untied LM head and the final norm before it, counted on the last layer (which the last pipeline stage
    holds, as in Megatron-LM). With tied embeddings the head reuses the input embedding and, as in the GPT
    papers' parameter counts, neither is counted again."""
    if w.tied_embeddings or not w.vocab:
        return 0
    return w.vocab * w.hidden + (2 * w.hidden if w.norm == "layernorm" else w.hidden)


def gemm_flops(w: LayerShape) -> int:
    """Forward FLOPs of one layer's weight GEMMs for one sample: 2 * s * h * (every projection's width)."""
    q, kv, up = widths(w)
    return 2 * w.seq_len * w.hidden * (q + 2 * kv + q + up + ffn_hidden(w))


def attention_core_flops(w: LayerShape) -> int:
    """Forward FLOPs of the attention core for one sample, Q K^T and P V over the whole s x s matrix (the
    convention of Megatron-LM's and torchtitan's MFU; a causal kernel skips half, see costs.attention)."""
    q, _, _ = widths(w)
    return 4 * w.seq_len * w.seq_len * q


def weight_gemm_shapes(w: LayerShape, tokens: int, tp: int, *, per_module: bool = True
                       ) -> list[tuple[float, float, float]]:
    """(M, N, K) of a layer's forward weight GEMMs on one TP rank (QKV and MLP-up split by columns, projection
    and MLP-down by rows: Shoeybi et al. 2019, sec. 3), in the order QKV, projection, MLP up, MLP down: four GEMMs,
    or with `projections` "separate" (and `per_module`) one a linear layer, Q, K, V and the gate and up
    projections each their own (`projection_groups` says how many make each of the four)."""
    h, f = w.hidden, ffn_hidden(w)
    q, kv, up = widths(w)
    if per_module and getattr(w, "projections", "fused") == "separate":
        ups = [(tokens, f / tp, h)] * (2 if w.mlp == "swiglu" else 1)
        return [(tokens, q / tp, h), (tokens, kv / tp, h), (tokens, kv / tp, h), (tokens, h, q / tp), *ups,
                (tokens, h, f / tp)]
    return [(tokens, (q + 2 * kv) / tp, h), (tokens, h, q / tp), (tokens, up / tp, h), (tokens, h, f / tp)]


def projection_groups(w: LayerShape) -> tuple[int, int, int, int]:
    """How many of `weight_gemm_shapes`' GEMMs make each of the layer's four (QKV, projection, MLP up, MLP down):
    one each when fused; with `projections` "separate" Q, K and V three and a gated MLP's gate and up two."""
    if getattr(w, "projections", "fused") != "separate":
        return (1, 1, 1, 1)
    return (3, 1, 2 if w.mlp == "swiglu" else 1, 1)


def stash_units(w: LayerShape, tp: int, *, recompute: str, sequence_parallel: bool) -> float:
    """A layer's stash per token in bytes per h at 16 bits (Korthikanti et al. 2022, Table 2, generalised:
    34 + 5as/h for GPT at t = 1), the layer input included.

    Replicated on every TP rank unless sequence parallelism splits it: each norm's input and output (2h each),
    and each residual branch's dropout mask (h bytes). Split t ways: Q (2qd), K and V (2kvd each), the
    attention output (2qd), the MLP's up-projection output and activation output (GeLU 2f + 2f; SwiGLU's gate
    and up 4f and their product 2f). The attention core: unfused, the softmax output, its dropout mask and the
    dropout output (5as; without dropout the softmax output alone, 2as); FlashAttention keeps only its fp32
    log-sum-exp, 4 bytes a head (Dao 2023, Algorithm 1). Selective recompute drops the core's part."""
    h, f = w.hidden, ffn_hidden(w)
    q, kv, up = widths(w)
    replicated = (4 * _norms(w) * h + (2 * h if w.dropout else 0)) / h
    split = (4 * q + 4 * kv + 2 * up + 2 * f) / h
    if recompute == "selective":
        attention = 0.0
    elif w.attention == "unfused":
        attention = (5 if w.dropout else 2) * w.heads * w.seq_len / (h * tp)
    else:
        attention = 4 * w.heads / (h * tp)
    if tp == 1:
        return replicated + split + attention
    if sequence_parallel:
        return (replicated + split) / tp + attention
    return replicated + split / tp + attention


def elementwise_bytes_per_token(w: LayerShape, *, backward: bool) -> tuple[int, int, int]:
    """HBM bytes per token of a layer's memory-bound kernels: (replicated unless sequence-parallel, split t
    ways, coefficient of a*s of the unfused attention core), each read and write counted once.

    Forward: each norm reads x and writes y (4h); each residual add reads input and residual and writes the
    sum (6h), with dropout also its 1-byte mask (7h); the MLP activation reads its input and writes its output
    (GeLU 4f, SwiGLU 6f); the attention output is made contiguous (4qd); rotary positions rotate Q and K
    (read and write, 4(qd + kvd)); the unfused core's softmax (4as) and dropout (5as).
    Backward: each norm reads x and dy and writes dx (6h); with dropout each residual's mask backward (5h);
    with biases each bias gradient reads its output gradient (column-parallel 2(qd + 2kvd) + 2*up, row-parallel
    2h each); each residual fork adds two gradients (6h); the activation reads input(s) and gradient and
    writes gradient(s) (GeLU 6f, SwiGLU 10f); the contiguous copy (4qd); rotary (4(qd + kvd)); the unfused
    core's softmax (6as) and dropout (5as) backward. With GPT's choices these are Korthikanti et al. 2022
    sec. 4.1's tensors: 22 and 38 sh replicated, 20 and 42 sh split, 9 and 11 as^2 per sample."""
    h, f = w.hidden, ffn_hidden(w)
    q, kv, up = widths(w)
    norms = _norms(w)
    branches = 2  # attention and MLP each end in a residual add (a parallel block adds both to x)
    rotary = 4 * (q + kv) if w.position == "rotary" else 0
    if not backward:
        replicated = norms * 4 * h + branches * (7 if w.dropout else 6) * h
        activation = 6 * f if w.mlp == "swiglu" else 4 * f
        split = activation + 4 * q + rotary
        core = (9 if w.dropout else 4) if w.attention == "unfused" else 0
        return replicated, split, core
    replicated = norms * 6 * h + branches * ((5 if w.dropout else 0) + 6) * h + (2 * 2 * h if w.bias else 0)
    activation = 10 * f if w.mlp == "swiglu" else 6 * f
    bias_grads = 2 * (q + 2 * kv) + 2 * up if w.bias else 0
    split = activation + 4 * q + bias_grads + rotary
    core = (11 if w.dropout else 6) if w.attention == "unfused" else 0
    return replicated, split, core


def projection_sum_bytes_per_token(w: LayerShape, tp: int) -> int:
    """HBM bytes per token of adding up the input gradients of separate projections in a layer's backward (0 when
    fused): Q, K and V (gate and up) each hand back a gradient of the whole M x h input, which autograd sums (three,
    two), where a fused layer's one GEMM writes one. Eager PyTorch adds them one at a time (torch/csrc/autograd/
    input_buffer.cpp `accumulate`: read two, write one: 6h each of the 2 + 1 extra). Compiled with TP, each sum is a
    kernel of its own, since its result feeds the reduce-scatter of the input gradient (DTensor's `Partial` to
    `Shard`), which reads a written buffer: read three and write one (8h), read two and write one (6h). Compiled
    without TP the sum folds into the norm's backward, which reads the extra gradients: 2h each of the three. Not
    divided by TP or sequence parallelism: on a TP rank each gradient covers the whole M x h input."""
    if getattr(w, "projections", "fused") != "separate":
        return 0
    h, extra = w.hidden, 2 + (1 if w.mlp == "swiglu" else 0)  # K and V beside Q; up beside gate
    if getattr(w, "kernels", "fused") == "eager":
        return 6 * h * extra
    if tp > 1:
        return 8 * h + (6 * h if w.mlp == "swiglu" else 0)
    return 2 * h * extra

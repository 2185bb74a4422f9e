"""torchtitan's per-op selective activation checkpointing of a Llama block: what it keeps and what it runs again.

torchtitan (`--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op`, the setting
of its published Llama 3 runs; torchtitan/parallelisms/parallelize_llama.py `_apply_ac_to_transformer_block` at
9dec370, December 2024, and torchtitan/models/llama3/parallelize.py through mid 2025) wraps each transformer
block in a checkpoint whose policy (`_get_custom_policy`) saves the outputs of the ops in `_save_list` and marks
every other op for recompute. The list: `aten.mm`, the flash and memory-efficient SDPA kernels, the functional
`reduce_scatter_tensor` and `aten.max` (the amax behind an FP8 tensorwise scale; `aten.abs` too until February
2025, commit 88247277); but a counter `mm_count`, fresh for each block's forward, leaves out every second
`aten.mm`. A Llama block runs seven matmuls in the order wq, wk, wv, wo, w1, w3, w2 (the attention's
projections, then the SwiGLU MLP `w2(silu(w1 x) * w3 x)`), so the 1st, 3rd, 5th and 7th are saved:
wq, wv, w1 and w2; wk, wo and w3 are run again in backward.

Every saved tensor is counted only where the backward reads it: torchtitan's rows compile each block
(`torch.compile`), and the compiled backward graph is taken to keep from the forward only the values it uses,
the policy's saved outputs among them, recomputing the rest from those (the partitioner following the
policy's MUST_SAVE / PREFER_RECOMPUTE tags; a modelling assumption, not checked against PyTorch's
partitioner; eager checkpointing would also hold w2's output and the second reduce-scatter's). Per token of a TP rank (t ranks; q = heads x head_dim,
kv = kv_heads x head_dim, f the MLP width; 16-bit elements, 2 bytes):

* wq's output q/t and wv's output kv/t (the rotary embedding of q is recomputed from the first; k is wk's,
  recomputed); w1's output f/t (SiLU and its product with w3's recomputed output are run again);
* SDPA's output q/t and its fp32 log-sum-exp, 4 bytes a local head (FlashAttention, Dao 2023);
* with sequence parallelism (t > 1), the attention's reduce-scatter output h/t, from which the residual stream
  and the MLP's norm input are rebuilt, so wo is not run again; at t = 1 wo is run again for them;
* not kept: w2's output and the second reduce-scatter's (nothing in the backward reads them), the amax scalars
  (a few bytes).

What the backward runs again, before the gradients: wk and w3 (and wo at t = 1), each in FP8 with its input and
weight cast again (the saved amax spares the amax pass); every memory-bound kernel of the forward but the last
residual add, whose output nothing reads (both norms, the rotary embedding, the contiguous copy of the attention
output, SiLU and its product, the first residual add); with sequence parallelism, the two all-gathers of the
norm outputs (`all_gather_into_tensor` is not in `_save_list`), which the strategy issues.

torchtitan builds its Llama layers with no biases (an `addmm` would not be counted as an `aten.mm`), no dropout,
RMSNorm, rotary positions, a sequential block and SDPA; other layers are refused by name (`problem`).
"""

from __future__ import annotations

from dist_lib.workload import architecture as arch
from dist_lib.workload import eager_kernels

SAVED_MATMULS = ("wq", "wv", "w1", "w2")  # the 1st, 3rd, 5th and 7th aten.mm of a block
RECOMPUTED_MATMULS = ("wk", "wo", "w3")


def problem(w: arch.LayerShape) -> str | None:
    """Why the policy's count of a layer is not this module's (None when it is): a Llama block as torchtitan
    builds it, and a FlashAttention kernel (SDPA's flash or memory-efficient backend): the block the eager
    kernels are counted for too (`eager_kernels.problem`)."""
    return eager_kernels.problem(w)


def workload_problem(w: arch.LayerShape) -> str | None:
    """Why a workload is not one this module counts (None when it is): a mixture of experts, a measured profile
    (which does not split out the layer's kernels), or a layer `problem` names."""
    if getattr(w, "moe", None) is not None:
        return "the workload is a mixture of experts"
    if getattr(w, "profile", None) is not None:
        return "the workload has a measured profile, which does not split out the layer's kernels"
    return problem(w)


def saved_bytes_per_token(w: arch.LayerShape, tp: int, sequence_parallel: bool) -> float:
    """Bytes per token (16-bit elements) a TP rank keeps for a layer's backward, besides the layer's input (which
    the checkpoint keeps as it came in: whole, or with sequence parallelism its 1/t sequence shard)."""
    h = w.hidden
    q, kv, up = arch.widths(w)
    f = arch.ffn_hidden(w)
    matmuls = 2 * (q + kv + f) / tp  # wq, wv, w1
    attention = 2 * q / tp + 4 * w.heads / tp  # SDPA's output and its fp32 log-sum-exp
    scattered = 2 * h / tp if sequence_parallel and tp > 1 else 0.0  # the attention's reduce-scatter output
    return matmuls + attention + scattered


def recomputed_gemm_shapes(w: arch.LayerShape, tokens: int, tp: int, sequence_parallel: bool
                           ) -> list[tuple[float, float, float]]:
    """(M, N, K) of the forward GEMMs the backward runs again on one TP rank: wk and w3 (column-parallel), and
    wo (row-parallel) unless a saved reduce-scatter output stands in for it."""
    h, f = w.hidden, arch.ffn_hidden(w)
    q, kv, _ = arch.widths(w)
    shapes = [(tokens, kv / tp, h), (tokens, f / tp, h)]
    if not (sequence_parallel and tp > 1):
        shapes.append((tokens, h, q / tp))
    return shapes


def recomputed_elementwise_bytes_per_token(w: arch.LayerShape) -> tuple[int, int]:
    """HBM bytes per token of the memory-bound kernels run again, (replicated unless sequence-parallel, split t
    ways): the forward's (`architecture.elementwise_bytes_per_token`; eager PyTorch's, `eager_kernels`, for a workload
    whose kernels are "eager") less the last residual add's 6h."""
    replicated, split, _ = eager_kernels.elementwise_bytes_per_token(w, backward=False)
    return replicated - 6 * w.hidden, split

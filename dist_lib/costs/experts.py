"""What the layers of a mixture-of-experts model cost: their weight GEMMs (attention, router, shared and
routed experts), the dense part alone (what runs on the tokens' own rank under expert parallelism), and
the routed experts' grouped GEMM on the tokens one rank's experts received.

The experts of one rank run as one grouped GEMM (Megatron-Core's `--moe-grouped-gemm`; DeepSeek-V3's
kernels likewise): each local expert e multiplies its n_e tokens by its gate/up (h x 2f) and down (f x h)
matrices, the experts' GEMMs of one shape timed together as one batch of tiles (`moe_ops.grouped_gemms`,
`compute.gemm_time`), plus the SwiGLU's elementwise
traffic (read 2f, write f per token, 16-bit; its backward reads 3f and writes 2f), and the memory-bound
kernels Megatron-Core runs around them (`memory_bound_bytes`: the local permutations, GPT-OSS's clamp and
down-projection bias). The slowest EP rank
is the one whose experts received the most tokens: the imbalance of `workload.routing` shows up here.
"""

from __future__ import annotations

from collections.abc import Sequence

from dist_lib.hardware.devices import Device
from dist_lib.workload import moe as moe_layers
from dist_lib.workload.transformer import Workload

PASSES = ("forward", "input", "weight")


def gemm_shapes(workload: Workload, layer: int, samples: int, tp: int, pass_: str, *,
                routed: bool = True, shared: bool = True, attention: bool = True, router: bool = True,
                sequence_parallel: bool = False) -> list[tuple[float, float, float]]:
    """(M, N, K) of a layer's weight GEMMs on one TP rank for `samples` samples, in the pass `pass_`
    ("forward", "input" gradient, "weight" gradient; as `compute._weight_gemm_shapes`). Attention is one
    GEMM per projection's parameters (its QKV/MLA projections split by columns over TP, W_o by rows); the
    routed experts, when `routed`, one GEMM over the k x tokens they receive under uniform routing (with
    all experts local, a grouped GEMM does the same work). With `sequence_parallel` the router, which is
    not split over TP, runs on this rank's 1/tp of the sequence (Megatron-Core routes the sequence-parallel
    part each TP rank holds)."""
    moe, h = workload.moe, workload.hidden
    tokens = samples * workload.seq_len
    params = moe_layers.attention_matrix_params(moe, h, workload.heads, workload.head_dim)
    out = moe_layers.attention_output_width(moe, h, workload.heads, workload.head_dim)  # W_o's input width
    forward = [(tokens, (params - out * h) / h / tp, h), (tokens, h, out / tp)] if attention else []  # in, W_o
    if not moe.is_moe(layer):
        f = moe.dense_ffn_hidden
        forward += [(tokens, 2 * f / tp, h), (tokens, h, f / tp)]
    else:
        if attention and router:
            forward.append((tokens / tp if sequence_parallel else tokens, moe.experts, h))  # the router
        if moe.shared_experts and shared:
            f = moe.shared_experts * moe.shared_width
            forward += [(tokens, 2 * f / tp, h), (tokens, h, f / tp)]
        if routed:
            f = moe.expert_ffn_hidden
            forward += [(tokens * moe.top_k, 2 * f, h), (tokens * moe.top_k, h, f)]
    if pass_ == "forward":
        return forward
    if pass_ == "input":
        return [(m, k, n) for m, n, k in forward]
    return [(k, n, m) for m, n, k in forward]


def expert_shapes(workload: Workload, tokens: Sequence[int], pass_: str,
                  etp: int = 1) -> list[tuple[float, float, float]]:
    """(M, N, K) of the grouped GEMM of the local experts that received `tokens[i]` tokens each; on an
    expert-TP shard of `etp`, gate/up split by columns and down by rows (Megatron-Core's `TEGroupedMLP`:
    fc1 column-parallel, fc2 row-parallel over the expert tensor-parallel group)."""
    h, f = workload.hidden, workload.moe.expert_ffn_hidden // etp
    shapes: list[tuple[float, float, float]] = []
    for n in tokens:
        if n:
            shapes += [(n, 2 * f, h), (n, h, f)]
    if pass_ == "forward":
        return shapes
    if pass_ == "input":
        return [(m, k, n) for m, n, k in shapes]
    return [(k, n, m) for m, n, k in shapes]


def swiglu_bytes(workload: Workload, tokens: int, *, backward: bool = False, etp: int = 1) -> float:
    """HBM traffic of the experts' SwiGLU on `tokens` routed tokens (see the module docstring), on one of
    `etp` expert-TP shards."""
    return tokens * (workload.moe.expert_ffn_hidden // etp) * (5 if backward else 3) * workload.bytes_per_element


def local_permutation_bytes(workload: Workload, tokens: Sequence[int]) -> float:
    """HBM traffic of the local permutations around one pass of the grouped GEMM on the rank that holds
    `len(tokens)` experts: the received tokens sorted by local expert before it and back to their senders'
    order after it, each a read and a write of every token's h-vector, in the forward and again (the inverse
    order) in the backward. Megatron-Core's all-to-all dispatcher runs them when a rank holds more than one
    expert (`MoEAlltoAllTokenDispatcher.dispatch_postprocess` and `combine_preprocess`: `sort_chunks_by_idxs`,
    Transformer Engine's fused `moe_sort_chunks_by_index` with `moe_permute_fusion`; megatron/core/transformer/
    moe/token_dispatcher.py, moe_utils.py); the flex dispatchers permute the received tokens into expert
    order after the exchange and back before it (`_HybridEPManager.dispatch`'s permute unless
    `moe_permute_fusion_into_hybridep`, `_DeepepManager.get_permuted_hidden_states_by_experts`). HybridEP with
    that fusion on (Megatron-Bridge's BF16 Qwen3-30B-A3B H100 recipe sets it; its FP8 recipe does not) does
    the sort inside its exchange kernels, which this charges all the same: the dispatcher is not an input here."""
    if len(tokens) < 2:
        return 0.0
    return 4.0 * sum(tokens) * workload.hidden * workload.bytes_per_element


def expert_bias_bytes(workload: Workload, tokens: int) -> float:
    """HBM traffic of the experts' down-projection bias on `tokens` routed tokens, forward or backward (the
    same): Megatron-Core's `TEGroupedMLP` gets fc2's biases back unadded (`skip_bias_add=True`) and, with the
    tokens per expert on the host, adds each expert's bias scaled by the token's routing probability expert
    by expert and concatenates the pieces (`TEGroupedMLP._apply_bias`; megatron/core/transformer/moe/
    experts.py): the product b x p written (1 element a token's h), the sum reading the output and it and
    writing (3), the concatenation reading and writing (2): 6 element transfers; the backward reads the
    gradient and writes it times p for the bias's gradient, reads that to sum it over tokens, and does the same
    with b for the probability's gradient: 6 again. The gate/up bias is added inside Transformer Engine's
    grouped GEMM (`skip_bias_add=False`) and its gradient comes out of the weight-gradient GEMM: not counted."""
    if not workload.moe.biases:
        return 0.0
    return 6.0 * tokens * workload.hidden * workload.bytes_per_element


def clamp_bytes(workload: Workload, tokens: int, *, backward: bool = False, etp: int = 1) -> float:
    """HBM traffic of clamping the experts' gate and up outputs before the GLU (`MoE.swiglu_limit`) on `tokens`
    routed tokens, on one of `etp` expert-TP shards. Megatron-Core clamps outside its fused activation kernel
    (`weighted_bias_quick_geglu_impl`, megatron/core/fusions/fused_bias_geglu.py: two `clamp`s over the
    halves and a `cat` of them): 8f element transfers a token forward (each clamp reads and writes f, the
    concatenation reads and writes 2f); backward, each clamp's gradient reads the gradient and the input and
    writes f (6f) and the halves' gradients are concatenated (4f): 10f."""
    if not workload.moe.swiglu_limit:
        return 0.0
    return tokens * (workload.moe.expert_ffn_hidden // etp) * (10 if backward else 8) * workload.bytes_per_element


def memory_bound_bytes(workload: Workload, tokens: Sequence[int], *, backward: bool = False, etp: int = 1) -> float:
    """HBM traffic of the memory-bound kernels of one pass of a rank's experts (the forward, or the
    backward's input-gradient pass) on `tokens[i]` tokens each: the SwiGLU, the clamp before it, the down
    projection's bias and the local permutations around the grouped GEMM."""
    total = sum(tokens)
    return (swiglu_bytes(workload, total, backward=backward, etp=etp)
            + clamp_bytes(workload, total, backward=backward, etp=etp)
            + expert_bias_bytes(workload, total) + local_permutation_bytes(workload, tokens))


def expert_flops(workload: Workload, tokens: int) -> float:
    """Forward FLOPs of the routed experts on `tokens` tokens: 2 per expert parameter per token."""
    return 2.0 * tokens * workload.moe.expert_params(workload.hidden)

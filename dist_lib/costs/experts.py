"""What the layers of a mixture-of-experts model cost: their weight GEMMs (attention, router, shared and
routed experts), the dense part alone (what runs on the tokens' own rank under expert parallelism), and
the routed experts' grouped GEMM on the tokens one rank's experts received.

The experts of one rank run as one grouped GEMM (Megatron-Core's `--moe-grouped-gemm`; DeepSeek-V3's
kernels likewise): each local expert e multiplies its n_e tokens by its gate/up (h x 2f) and down (f x h)
matrices, the experts' GEMMs of one shape timed together as one batch of tiles (`moe_ops.grouped_gemms`,
`compute.gemm_time`), plus the SwiGLU's elementwise
traffic (read 2f, write f per token, 16-bit; its backward reads 3f and writes 2f). The slowest EP rank
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


def expert_flops(workload: Workload, tokens: int) -> float:
    """Forward FLOPs of the routed experts on `tokens` tokens: 2 per expert parameter per token."""
    return 2.0 * tokens * workload.moe.expert_params(workload.hidden)

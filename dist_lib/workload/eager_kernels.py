"""The memory-bound kernels of a Llama block run by eager PyTorch (no `torch.compile`): every elementwise op
of the model code is its own kernel, reading its inputs from HBM and writing its output there.

`architecture.elementwise_bytes_per_token` counts fused kernels (a norm reads x and writes y; what Inductor,
Megatron-LM's fused kernels or Transformer Engine give). Eager, the same block issues the ops of torchtitan's
model code one by one (torchtitan 9dec370, torchtitan/models/llama/model.py and models/norms.py; the same code
in August 2024), and autograd runs each op's backward formula as kernels of its own (PyTorch's
tools/autograd/derivatives.yaml and torch/csrc/autograd/FunctionsManual.cpp). Bytes per token, h hidden,
q = heads x head_dim, kv = kv_heads x head_dim, f the SwiGLU width; 16-bit tensors 2 bytes an element, fp32 4:

* RMSNorm, `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight`: the cast to fp32
  (read 2h, write 4h), pow (4h + 4h), mean (read 4h), the product with the per-token rsqrt (4h + 4h), the cast
  back (4h + 2h), the product with the weight (2h + 2h): 36h forward. Backward: the weight's product (dy * w,
  4h; the weight gradient dy * y, 6h, and its sum over tokens, 2h), the cast (2h + 4h), the rsqrt product (the
  input's share 8h; the rsqrt's, a product 12h and its row sum 4h), mean's gradient expanded and divided (write
  4h), pow's `grad * (2 * x.pow(1))` (three kernels: 8h, 8h, 12h), the two fp32 gradients of x added (12h), the
  cast to 16 bits (4h + 2h): 92h.
* Rotary embedding on Q and K as complex multiplication (`apply_rotary_emb`), per element of each: the cast to
  fp32 (read 2, write 4), the complex product (read 4, write 4), the cast back (4 + 2): 20 bytes, forward and
  backward alike (the product's gradient is `grad * freqs.conj()`): 20(q + kv).
* `repeat_kv` with grouped-query attention (kv < q): `expand(...).reshape(...)` copies K and V to all query
  heads (read 2kv, write 2q each); its backward sums them back (read 2q, write 2kv each): 4(q + kv) both ways.
* The attention output made contiguous (4q) as in the fused count, backward too.
* SwiGLU, `w2(silu(w1(x)) * w3(x))`: silu (read 2f, write 2f) and the product (4f + 2f): 10f forward; backward
  the product's two gradients (6f each) and silu's (read input and gradient, write 6f): 18f.
* Residual adds (6h each; their forks' gradient adds, 6h each): one kernel each, as fused.

Per-token scalars (the mean, rsqrt and their gradients, 4 bytes a token each), the rotary table (seq x head_dim
/ 2 complex numbers, read by every head) and the norm weight are not counted. The attention core is
FlashAttention's either way (the preset's kernel). This count is for a Llama block as torchtitan builds it;
`problem` says why another layer is not counted.
"""

from __future__ import annotations

from dist_lib.workload import architecture as arch

KERNEL_KINDS = ("fused", "eager")  # a workload's `kernels`: fused memory-bound kernels, or eager PyTorch's ops

NORM_FORWARD, NORM_BACKWARD = 36, 92  # bytes per token per unit of h, RMSNorm's eager kernels (module docstring)
ROTARY = 20  # bytes per element of Q and K, forward or backward
SWIGLU_FORWARD, SWIGLU_BACKWARD = 10, 18  # bytes per token per unit of f
RESIDUAL = 6  # a residual add, or its fork's gradient add, per unit of h
CONTIGUOUS = 4  # the attention output's copy, per unit of q
REPEAT_KV = 4  # repeat_kv's copy of K and V (or its backward's sum), per unit of (q + kv)


def problem(w: arch.LayerShape) -> str | None:
    """Why the eager count is not this layer's (None when it is): it counts a Llama block as torchtitan builds it
    (RMSNorm, SwiGLU, rotary positions, no biases or dropout, a sequential block, FlashAttention)."""
    needs = {"mlp": "swiglu", "norm": "rmsnorm", "position": "rotary", "bias": False, "dropout": False,
             "parallel_block": False}
    for name, value in needs.items():
        if getattr(w, name) != value:
            return f"{name} is {getattr(w, name)!r}, where torchtitan's Llama block has {value!r}"
    if w.attention == "unfused":
        return "attention is 'unfused', where torchtitan's SDPA runs a FlashAttention kernel (flash2 or flash3)"
    return None


def eager_bytes_per_token(w: arch.LayerShape, *, backward: bool) -> tuple[int, int, int]:
    """HBM bytes per token of a Llama block's memory-bound kernels run eagerly: (replicated unless
    sequence-parallel, split t ways, 0 for the attention core), as `architecture.elementwise_bytes_per_token`."""
    h, f = w.hidden, arch.ffn_hidden(w)
    q, kv, _ = arch.widths(w)
    repeat = REPEAT_KV * (q + kv) if kv < q else 0
    replicated = 2 * (NORM_BACKWARD if backward else NORM_FORWARD) * h + 2 * RESIDUAL * h
    split = (SWIGLU_BACKWARD if backward else SWIGLU_FORWARD) * f + CONTIGUOUS * q + ROTARY * (q + kv) + repeat
    return replicated, split, 0


def elementwise_bytes_per_token(w: arch.LayerShape, *, backward: bool) -> tuple[int, int, int]:
    """The layer's memory-bound traffic per token as its `kernels` run them: eager PyTorch's ops one by one
    (`eager_bytes_per_token`), or fused (`architecture.elementwise_bytes_per_token`)."""
    if getattr(w, "kernels", "fused") == "eager":
        return eager_bytes_per_token(w, backward=backward)
    return arch.elementwise_bytes_per_token(w, backward=backward)

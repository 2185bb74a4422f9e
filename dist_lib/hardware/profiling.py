"""Measure a workload's layers with PyTorch on this machine's CPU or GPU, and write them as profile files.

Each transformer layer is built from the workload's shape with `torch.nn` ops (its norms, the QKV and
output projections, causal scaled-dot-product attention, the MLP, GeLU or SwiGLU, biases and dropout as
the workload says), holding one tensor-parallel rank's shard at TP t: a t-th of the heads, key/value heads
and MLP width, the norms whole (the all-reduces TP needs are not run: the simulator charges them itself).
The embedding (a t-th of the vocabulary, and the learned positions) and the LM head with the final norm
and the cross-entropy loss are measured as Metis' first and last layers.

Timing: `warmup` untimed forward + backward passes, then `repeats` timed ones; a layer's figure is the
median of its forward plus the median of its backward (`torch.cuda.synchronize` around each on a GPU).
The optimizer is AdamW stepping fp32 copies of every measured parameter (the master weights of mixed
precision), its median over `repeats` steps, summed over the embedding, layers and head.
Memory: what autograd saves for a layer's backward (`torch.autograd.graph.saved_tensors_hooks`), counted
once per storage and without the parameters and the layer's input, which the simulator holds as tensors of
their own, the input at the workload's 16 bits (`profile_writer.layer_memory_bytes`). The saved bytes are in
the measured dtype: bf16 (the default) or fp16 match the simulator's 16-bit accounting.

PyTorch is an optional extra (`pip install 'dist-sandbox[profile]'`): it is imported only when a
measurement runs, and nothing else in dist_lib imports this module.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.hardware.devices import DEVICES
from dist_lib.hardware.profile_writer import MeasuredStep, layer_memory_bytes
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload

DTYPES = ("bf16", "fp16", "fp32")
DROPOUT = 0.1  # GPT-2/3's attention and residual dropout


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise SpecError("profile: PyTorch is not installed; install the extra with "
                        "pip install 'dist-sandbox[profile]' (or pip install torch)") from None
    return torch


def device_type_name(device: str, torch: Any) -> str:
    """The profile's device type: CPU on the CPU; on a GPU the catalog family its name contains
    ('NVIDIA A100-SXM4-80GB' -> A100), which matches every catalog device of that family."""
    if device == "cpu":
        return "CPU"
    name = torch.cuda.get_device_name().upper().replace(" ", "-")
    families = sorted({n.split("-")[0].upper() for n in DEVICES}, key=len, reverse=True)  # A10G before A10
    for family in families:
        if f"-{family}-" in f"-{name}-" or name.startswith(family):
            return family
    raise SpecError(f"profile: GPU {torch.cuda.get_device_name()!r} matches no device family of the catalog; "
                    f"name its profile type with --type")


def _layer_module(torch: Any, w: Workload, tp: int, dtype: Any, device: str) -> Any:
    nn, F = torch.nn, torch.nn.functional
    h, d = w.hidden, arch.head_dim(w)
    heads, kv = w.heads // tp, arch.kv_heads(w) // tp
    ffn = arch.ffn_hidden(w) // tp
    up = 2 * ffn if w.mlp == "swiglu" else ffn
    norm = (lambda: nn.LayerNorm(h, bias=w.bias)) if w.norm == "layernorm" else (lambda: nn.RMSNorm(h))
    p = DROPOUT if w.dropout else 0.0

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = norm()
            self.norm2 = norm() if not w.parallel_block else None
            self.qkv = nn.Linear(h, (heads + 2 * kv) * d, bias=w.bias)
            self.proj = nn.Linear(heads * d, h, bias=w.bias)
            self.up = nn.Linear(h, up, bias=w.bias)
            self.down = nn.Linear(ffn, h, bias=w.bias)

        def attention(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split([heads * d, kv * d, kv * d], dim=-1)
            q = q.view(b, s, heads, d).transpose(1, 2)
            k = k.view(b, s, kv, d).transpose(1, 2)
            v = v.view(b, s, kv, d).transpose(1, 2)
            if kv != heads:  # grouped-query attention: each key/value head serves heads/kv query heads
                k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return F.dropout(self.proj(out.transpose(1, 2).reshape(b, s, heads * d)), p)

        def mlp(self, x: Any) -> Any:
            if w.mlp == "swiglu":
                gate, value = self.up(x).chunk(2, dim=-1)
                return F.dropout(self.down(F.silu(gate) * value), p)
            return F.dropout(self.down(F.gelu(self.up(x))), p)

        def forward(self, x: Any) -> Any:
            if self.norm2 is None:  # GPT-J / PaLM: attention and MLP side by side on one norm
                y = self.norm1(x)
                return x + self.attention(y) + self.mlp(y)
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    return Layer().to(device=device, dtype=dtype).train()


class _Embedding:
    def __init__(self, torch: Any, w: Workload, tp: int, dtype: Any, device: str):
        nn = torch.nn
        self.torch, self.w = torch, w
        self.tokens = nn.Embedding(max(1, w.vocab // tp), w.hidden).to(device=device, dtype=dtype)
        self.positions = nn.Embedding(w.seq_len, w.hidden).to(device=device, dtype=dtype) \
            if w.position == "learned" else None
        self.device = device

    def parameters(self) -> list[Any]:
        return [*self.tokens.parameters(), *(self.positions.parameters() if self.positions is not None else ())]

    def __call__(self, ids: Any) -> Any:
        x = self.tokens(ids)
        if self.positions is not None:
            x = x + self.positions(self.torch.arange(ids.shape[1], device=self.device))
        return x


class _Head:
    """The final norm, the logits over a t-th of the vocabulary (tied embeddings or not: the same GEMMs)
    and the cross-entropy, as `costs.compute.loss_time` counts them."""

    def __init__(self, torch: Any, w: Workload, tp: int, dtype: Any, device: str):
        nn = torch.nn
        self.torch = torch
        self.norm = (nn.LayerNorm(w.hidden, bias=w.bias) if w.norm == "layernorm" else nn.RMSNorm(w.hidden)) \
            .to(device=device, dtype=dtype)
        self.logits = nn.Linear(w.hidden, max(1, w.vocab // tp), bias=False).to(device=device, dtype=dtype)

    def parameters(self) -> list[Any]:
        return [*self.norm.parameters(), *self.logits.parameters()]

    def __call__(self, x: Any, labels: Any) -> Any:
        logits = self.logits(self.norm(x)).float()
        return self.torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


class Timer:
    """Wall-clock seconds of a callable, synchronising the GPU around it."""

    def __init__(self, torch: Any, device: str):
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - start, out


def _forward_backward(timer: Timer, forward: Callable[[], Any], warmup: int, repeats: int) -> float:
    """Median forward + median backward seconds of `forward()` (a scalar, or a tensor given a gradient of ones)."""
    forwards, backwards = [], []
    for i in range(warmup + repeats):
        t_fwd, out = timer(forward)
        grad = None if out.dim() == 0 else out.new_ones(out.shape)
        t_bwd, _ = timer(lambda: out.backward(grad))
        if i >= warmup:
            forwards.append(t_fwd)
            backwards.append(t_bwd)
    return statistics.median(forwards) + statistics.median(backwards)


def _saved_bytes(torch: Any, forward: Callable[[], Any], exclude: Sequence[Any]) -> int:
    """Bytes of the distinct storages autograd saves for backward in `forward()`, less those of `exclude`."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(storages.values())


def _optimizer_seconds(torch: Any, timer: Timer, params: list[Any], warmup: int, repeats: int) -> float:
    """Median seconds of an AdamW step over fp32 copies of `params`."""
    master = [torch.zeros(p.shape, dtype=torch.float32, device=p.device, requires_grad=True) for p in params]
    for m in master:
        m.grad = torch.ones_like(m)
    optimizer = torch.optim.AdamW(master, lr=1e-4)
    times = [timer(optimizer.step)[0] for _ in range(warmup + repeats)]
    return statistics.median(times[warmup:])


def measure(workload: Workload, device: str = "cpu", *, tp: int = 1, batch: int = 1, dtype: str = "bf16",
            warmup: int = 2, repeats: int = 5, device_type: str | None = None, seed: int = 0) -> MeasuredStep:
    """Measure every layer of `workload` at TP degree `tp` and microbatch `batch` on `device` ('cpu' or
    'cuda'), as one profile file's figures."""
    torch = import_torch()
    if workload.moe is not None:
        raise SpecError(f"profile: workload {workload.name} is a mixture of experts; profiles describe dense layers")
    problem = workload.tp_problem(tp)
    if problem:
        raise SpecError(f"profile: {problem}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError("profile: --device cuda but PyTorch sees no GPU (torch.cuda.is_available() is False)")
    if dtype not in DTYPES:
        raise SpecError(f"profile: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch.manual_seed(seed)
    kind = device_type or device_type_name(device, torch)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    timer = Timer(torch, device)
    w, b, s = workload, batch, workload.seq_len
    vocab = max(1, w.vocab // tp)
    ids = torch.randint(0, vocab, (b, s), device=device)

    embedding = _Embedding(torch, w, tp, torch_dtype, device)
    embedding_s = _forward_backward(timer, lambda: embedding(ids), warmup, repeats) if w.vocab else 0.0
    optimizer_s = _optimizer_seconds(torch, timer, embedding.parameters(), warmup, repeats) if w.vocab else 0.0
    embedding_params = arch.input_embedding_params(w) / tp

    layer_s, layer_memory = [], []
    layer_params = arch.layer_params(w) / tp
    for _ in range(w.num_layers):
        layer = _layer_module(torch, w, tp, torch_dtype, device)
        x = torch.randn(b, s, w.hidden, device=device, dtype=torch_dtype, requires_grad=True)
        layer_s.append(_forward_backward(timer, lambda: layer(x), warmup, repeats))
        saved = _saved_bytes(torch, lambda: layer(x), [x, *layer.parameters()])
        layer_memory.append(layer_memory_bytes(layer_params, b * w.activation_bytes(), saved))
        optimizer_s += _optimizer_seconds(torch, timer, list(layer.parameters()), warmup, repeats)
        del layer, x

    head = _Head(torch, w, tp, torch_dtype, device)
    hidden = torch.randn(b, s, w.hidden, device=device, dtype=torch_dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (b, s), device=device)
    head_s = _forward_backward(timer, lambda: head(hidden, labels), warmup, repeats) if w.vocab else 0.0
    if w.vocab:
        optimizer_s += _optimizer_seconds(torch, timer, head.parameters(), warmup, repeats)
    head_params = arch.output_params(w) / tp
    saved_head = _saved_bytes(torch, lambda: head(hidden, labels), [hidden, *head.parameters()]) if w.vocab else 0

    parameter_bytes = (embedding_params * 2, *[layer_params * 2] * w.num_layers, head_params * 2)
    memory = (layer_memory_bytes(embedding_params, 0, 0), *layer_memory,
              layer_memory_bytes(head_params, 0, saved_head))
    provenance = {"tool": "dist-sandbox profile", "device": device, "torch": torch.__version__, "dtype": dtype,
                  "warmup": warmup, "repeats": repeats, "workload": workload.name,
                  "shape": {"hidden": w.hidden, "heads": w.heads, "kv_heads": arch.kv_heads(w),
                            "ffn_hidden": arch.ffn_hidden(w), "seq_len": s, "vocab": w.vocab}}
    return MeasuredStep(kind, tp, batch, embedding_s, tuple(layer_s), head_s, optimizer_s, parameter_bytes, memory,
                        model_name=workload.name, provenance=provenance)

"""Workloads: a decoder-only transformer's shape and architecture, and what each layer weighs in parameters,
FLOPs and bytes (counted in `workload.architecture`).

For the GPT presets (notation s sequence, h hidden, a heads, V vocabulary, t tensor-parallel degree):

* parameters per layer 12h^2 + 13h; the embeddings (V*h + s*h) are counted on layer 0;
* forward FLOPs per sample of a layer 24*s*h^2 + 4*s^2*h, of the LM head 2*s*h*V
  (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", sec. 6);
* a layer's activation stash per sample, 16-bit: s*h*(34 + 5*a*s/h) bytes, or with tensor parallelism
  and no sequence parallelism s*h*(10 + 24/t + 5*a*s/(h*t)) (same paper, sec. 4). Those totals include
  the layer's input (2*s*h bytes); here the input is its own `Activation` tensor, so `stash_bytes`
  returns the rest.

Llama-style layers (grouped-query attention, a SwiGLU MLP, RMSNorm, rotary positions, untied embeddings, no
biases or dropout, FlashAttention) generalise each count tensor by tensor (`architecture`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from dist_lib.native import MAX_NBYTES
from dist_lib.workload import moe as moe_layers
from dist_lib.workload.moe import MOE_KEYS, MoE
from dist_lib.workload.routing import check_routing
from dist_lib.workload import architecture as arch
from dist_lib.workload import per_op_checkpoint as per_op
from dist_lib.workload import eager_kernels
from dist_lib.errors import SpecError
from dist_lib.specs import key_values, load_spec, number, read_toml, shown, text, whole


@dataclass(frozen=True, slots=True)
class Workload:
    """A decoder-only transformer trained with 16-bit weights and activations."""

    name: str
    num_layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    bytes_per_element: int = 2
    # Host time per layer pass (a forward; a backward counts two) that the training framework adds to the
    # GPU's kernel time: an eager framework issuing a layer's unfused ops one by one, with Python, autograd
    # and its own hooks around each, keeps a small GPU waiting (see costs.forward_time). 0 for Megatron-LM's
    # fused kernels at the sizes the catalog efficiencies were set on. TOML / spec key framework_overhead_us.
    framework_overhead_s: float = 0.0
    # What a tensor-parallel layer pass adds on top (the framework's scatter, gather and copy ops around each
    # TP layer and the launch of its all-reduces, beyond their modelled transfer time). TOML / spec key
    # tp_overhead_us.
    tp_overhead_s: float = 0.0
    # How much longer the framework's kernels take on the GPU than the cost model's kernels (GEMMs by shape,
    # memory-bound kernels at HBM bandwidth): 1.0 for Megatron-LM's fused kernels at the sizes the catalog
    # efficiencies were set on; set from one measured layer time where a framework's unfused kernels at a
    # small hidden size run slower (see costs.forward_time). TOML / spec key kernel_time_scale.
    kernel_time_scale: float = 1.0
    # Bytes of each weight-gradient element as it is accumulated and all-reduced: 2 for 16-bit gradients; 4
    # for Megatron-LM's fp32 main gradients or DeepSpeed's fp32_allreduce (which casts the 16-bit gradients
    # to fp32 for the all-reduce; here they are fp32 throughout, 2 bytes a parameter more memory).
    grad_bytes_per_element: int = 2
    # The layer as it is built (`architecture`); the defaults are GPT-3's. 0 for kv_heads, head_dim and
    # ffn_hidden means heads, hidden / heads and 4 * hidden.
    kv_heads: int = 0
    head_dim: int = 0
    ffn_hidden: int = 0
    mlp: str = "gelu"
    norm: str = "layernorm"
    position: str = "learned"
    tied_embeddings: bool = True
    bias: bool = True
    dropout: bool = True
    parallel_block: bool = False
    attention: str = "unfused"
    # How the memory-bound kernels run (`eager_kernels`): "fused" (one read and one write a tensor: Inductor,
    # Megatron-LM's fused kernels) or "eager" (eager PyTorch's ops one by one, a Llama block as torchtitan builds it)
    kernels: str = "fused"
    # How the projections are built (`architecture.PROJECTION_KINDS`): "fused" (Megatron's QKV and gate/up linear
    # layers) or "separate" (torchtitan's Llama: Q, K, V, gate and up each a linear layer and a GEMM of its own)
    projections: str = "fused"
    # Mixture of experts (`workload.moe`): None for a dense GPT; set, the layers are Llama-style MoE model
    # layers (GQA or MLA attention, SwiGLU experts, untied embeddings) and these formulas are moe's.
    moe: MoE | None = None
    # Measured per-layer times and memory by device type (`profiles.ProfileSet`), when built from profiles
    profile: object = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f, (low, high) in FIELD_RANGES.items():
            whole(getattr(self, f), f"workload {shown(self.name)}: {f}", low, high, exact=True)
        for f in _MICROSECOND_FIELDS.values():
            number(getattr(self, f), f"workload {shown(self.name)}: {f}", 0.0, 1.0, unit=" s")
        number(self.kernel_time_scale, f"workload {shown(self.name)}: kernel_time_scale", 0.0, MAX_KERNEL_TIME_SCALE,
               above=True)
        for f, kinds in _CHOICES.items():
            if getattr(self, f) not in kinds:
                raise SpecError(f"workload {shown(self.name)}: {f} must be one of {', '.join(kinds)}, "
                                f"got {shown(getattr(self, f))}")
        for f in _FLAGS:
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"workload {shown(self.name)}: {f} must be true or false, got {shown(getattr(self, f))}")
        if not self.head_dim and self.hidden % self.heads:
            raise SpecError(f"workload {shown(self.name)}: hidden {self.hidden} is not divisible by heads {self.heads} "
                            f"(give head_dim)")
        if self.heads % arch.kv_heads(self):
            raise SpecError(f"workload {shown(self.name)}: kv_heads {self.kv_heads} does not divide heads {self.heads} "
                            f"(each key/value head serves a whole group of query heads)")
        if self.kernels == "eager":
            why = "the layers are mixture-of-experts layers" if self.moe is not None else eager_kernels.problem(self)
            if why:
                raise SpecError(f"workload {shown(self.name)}: kernels 'eager' counts eager PyTorch's kernels of a "
                                f"Llama block as torchtitan builds it; {why}")
        if self.moe is not None and self.projections != "fused":
            raise SpecError(f"workload {shown(self.name)}: projections 'separate' splits a dense layer's Q/K/V and "
                            f"gate/up GEMMs; a mixture-of-experts layer's GEMMs are the experts' (leave it fused)")
        if self.moe is not None:
            self.moe.check(f"workload {shown(self.name)}", self.heads, self.num_layers)
            if self.moe.sliding_window and self.attention == "unfused":
                raise SpecError(f"workload {shown(self.name)}: sliding_window is timed for a FlashAttention kernel; "
                                f"set attention to flash2 or flash3")
            check_routing(self.moe, f"workload {shown(self.name)}")
        # One sample's largest tensor must fit a simulated buffer, or every strategy would fail on it.
        sample = {"layer 0's weights": self.layer_params(0) * self.bytes_per_element,
                  "one sample's activation stash": self.stash_bytes(0) + self.activation_bytes()}
        for what, nbytes in sample.items():
            if nbytes > MAX_NBYTES:
                raise SpecError(f"workload {shown(self.name)}: {what} would take {nbytes / 2**40:.3g} TiB, above the "
                                f"{(MAX_NBYTES + 1) / 2**40:g} TiB a simulated tensor may hold; reduce seq, hidden, "
                                f"heads or vocab")

    def tp_problem(self, tp: int) -> str | None:
        """Why `tp`-way tensor parallelism cannot split this model, or None when it can: each TP rank
        takes whole attention heads, as Megatron-LM's `divide(num_attention_heads, tp)` requires."""
        if tp > 1 and self.heads % tp:
            return (f"tp={tp} does not divide the {self.heads} attention heads of workload {self.name}; "
                    f"choose a tp that divides {self.heads}")
        # Megatron-Core splits the key/value groups too: divide(num_query_groups, tp) in attention.py
        if tp > 1 and arch.kv_heads(self) % tp:
            return (f"tp={tp} does not divide the {arch.kv_heads(self)} key/value heads of workload {self.name}; "
                    f"choose a tp that divides {arch.kv_heads(self)}")
        return None

    # ---- per-layer figures --------------------------------------------------------------------

    def layer_params(self, layer: int) -> int:
        """A layer's parameters; layer 0 also holds the input embeddings, the last one an untied LM head."""
        if self.moe is not None:
            return moe_layers.layer_params(self.moe, self.hidden, self.heads, self.vocab, layer, self.num_layers,
                                           head_dim=self.head_dim)
        params = arch.layer_params(self)
        if layer == 0:  # token and position embeddings (none in the toy workload)
            params += arch.input_embedding_params(self)
        if layer == self.num_layers - 1:
            params += arch.output_params(self)
        return params

    @property
    def total_params(self) -> int:
        return sum(self.layer_params(layer) for layer in range(self.num_layers))

    @property
    def active_params(self) -> int:
        """Parameters one token uses: all of them for a dense model; an MoE model's top-k routed experts
        instead of all of them (`workload.moe`)."""
        if self.moe is None:
            return self.total_params
        return sum(moe_layers.layer_params(self.moe, self.hidden, self.heads, self.vocab, layer, self.num_layers,
                                           active=True, head_dim=self.head_dim) for layer in range(self.num_layers))

    def layer_forward_flops(self, layer: int) -> float:
        """Forward FLOPs of one layer for one sample."""
        if self.moe is not None:
            return self.layer_gemm_flops(layer) + self.attention_core_flops(layer)
        return float(arch.gemm_flops(self)) + float(arch.attention_core_flops(self))

    def head_forward_flops(self) -> float:
        """Forward FLOPs of the LM head (logits) for one sample."""
        return 2.0 * self.seq_len * self.hidden * self.vocab

    def activation_bytes(self) -> int:
        """Bytes of one sample's hidden states between layers (b*s*h elements)."""
        return self.seq_len * self.hidden * self.bytes_per_element

    def stash_bytes(self, layer: int, tp: int = 1, *, recompute: str = "none",
                    sequence_parallel: bool = False) -> int:
        """Bytes one sample's backward needs from this layer's forward, besides the layer input.

        Korthikanti et al. 2022, Table 2 (per sample, 16-bit): TP only s*h*(10 + 24/t + 5as/(ht));
        with sequence parallelism the 10*s*h replicated part is split too, s*h*(34/t + 5as/(ht));
        selective recompute drops the attention-core term 5as/(ht) (softmax, its dropout mask and
        output are recomputed in backward): s*h*(10 + 24/t), or 34*s*h/t with sequence parallelism.
        `recompute="op"`: what torchtitan's per-op selective checkpointing keeps (`per_op_checkpoint`).
        """
        if recompute not in RECOMPUTE_MODES:
            raise SpecError(f"workload {shown(self.name)}: recompute must be one of {', '.join(RECOMPUTE_MODES)}, "
                            f"got {recompute!r}")
        if recompute == "full":  # only the layer input is kept, and that is its own Activation
            return 0
        if recompute == "op":
            why = "the layers are mixture-of-experts layers" if self.moe is not None else per_op.problem(self)
            if why:
                raise SpecError(f"workload {shown(self.name)}: recompute 'op' (torchtitan's per-op selective "
                                f"checkpointing) counts a Llama block; {why}")
            # less what of the input the strategy's whole copy holds beyond the shard the checkpoint keeps with
            # sequence parallelism (the convention of the sequence-parallel stash above; 0 where that is more)
            per_token = per_op.saved_bytes_per_token(self, tp, sequence_parallel)
            if sequence_parallel and tp > 1:
                per_token -= 2 * self.hidden * (1 - 1 / tp)
            return max(0, int(self.seq_len * per_token * self.bytes_per_element / 2))
        if self.moe is not None:
            total = moe_layers.stash_bytes(self.moe, self.seq_len, self.hidden, self.heads, layer, tp,
                                           recompute=recompute, sequence_parallel=sequence_parallel,
                                           bytes_per_element=self.bytes_per_element, attention=self.attention,
                                           dropout=self.dropout)
            return max(0, int(total) - self.activation_bytes())
        units = arch.stash_units(self, tp, recompute=recompute, sequence_parallel=sequence_parallel)
        total = self.seq_len * self.hidden * units
        return max(0, int(total * self.bytes_per_element / 2) - self.activation_bytes())

    # ---- what the cost model needs: GEMM FLOPs and the traffic of the memory-bound kernels --------

    def layer_gemm_flops(self, layer: int) -> float:
        """Forward FLOPs of a layer's weight GEMMs for one sample (GPT: QKV 6sh^2, projection 2sh^2, MLP 16sh^2;
        an MoE model's: 2 per active matrix parameter per token, `moe.matrix_flops`)."""
        if self.moe is not None:
            return moe_layers.matrix_flops(self.moe, self.seq_len, self.hidden, self.heads, layer, self.head_dim)
        return float(arch.gemm_flops(self))

    def attention_core_flops(self, layer: int | None = None) -> float:
        """Forward FLOPs of the attention core for one sample: Q K^T and softmax * V, 2*s^2*q*d each (of `layer`
        where an MoE model's layers differ: a sliding-window layer's band, `workload.moe`)."""
        if self.moe is not None:
            return moe_layers.attention_core_flops(self.moe, self.seq_len, self.hidden, self.heads, self.head_dim,
                                                   layer)
        return float(arch.attention_core_flops(self))

    def elementwise_bytes(self, tp: int = 1, sequence_parallel: bool = False, *, backward: bool = False,
                          attention_only: bool = False) -> float:
        """HBM traffic of one sample's memory-bound kernels in a layer (forward, or its backward).

        Counted kernel by kernel from the tensors of Korthikanti et al. 2022, sec. 4.1, in units of
        s*h 16-bit elements (2*s*h bytes) and a*s^2 elements; a read and a write each count once:
        two layernorms (read x, write y: 4 sh bytes each; backward reads x and dy, writes dx: 6),
        two bias-dropout-residual adds (read input and residual, write output and a 1-byte mask:
        7; backward 5), bias+GeLU on the 4h-wide MLP activation (16; backward 24), softmax over the
        a*s^2 scores (4 a*s^2 bytes; backward 6) and its dropout (5; backward 5), and the copy that
        makes the attention output contiguous before the projection (4/t; backward 4/t).
        Backward only, as PyTorch autograd runs it under Megatron-LM: the bias gradients, a sum over
        tokens of each linear layer's output gradient (QKV 3h/t and MLP-up 4h/t wide: 14/t; the two
        row-parallel biases, h wide: 2 each), and at each of the two residual forks the add of the
        branch's input gradient to the residual's (read two, write one: 6 each).
        Layernorms, residual adds and the row-parallel bias gradients are replicated on every TP rank
        unless sequence parallelism splits them; the rest are split t ways. `attention_only` is the
        softmax and dropout alone (what selective recompute runs again).
        """
        s, a = self.seq_len, self.heads
        scale = self.bytes_per_element / 2
        # GPT: forward (4 + 7) * 2 sh replicated, GeLU 16 + copy 4 split, 9 as^2; backward (6 + 5) * 2 + row-parallel
        # bias gradients 2 * 2 + residual-fork adds 2 * 6 replicated, GeLU 24 + copy 4 + column-parallel bias
        # gradients 14 split, 11 as^2 (`architecture.elementwise_bytes_per_token` for any layer)
        # with kernels "eager", eager PyTorch's unfused kernels instead (`eager_kernels`)
        per_token, split_per_token, core = eager_kernels.elementwise_bytes_per_token(self, backward=backward)
        attention = core * a * s * s / tp
        if attention_only:
            return attention * scale
        replicated = per_token * s
        if sequence_parallel and tp > 1:
            replicated /= tp
        split = split_per_token * s / tp
        # separate projections' input gradients added up (`architecture.projection_sum_bytes_per_token`)
        summed = arch.projection_sum_bytes_per_token(self, tp) * s if backward else 0
        return (replicated + split + attention + summed) * scale

    def model_flops_per_sample(self) -> float:
        """Forward plus backward (3x forward) of all layers and the head, no recompute."""
        forward = sum(self.layer_forward_flops(l) for l in range(self.num_layers)) + self.head_forward_flops()
        return 3.0 * forward

    def __str__(self) -> str:
        return self.name

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, spec: str) -> Workload:
        """A preset name with optional overrides: `gpt-1.3b`, `gpt-1.3b:seq=1024,layers=12`, `toy:layers=8`."""
        name, _, overrides = spec.strip().partition(":")
        key = name.lower()
        if key.startswith("toy-") and key[4:].isdigit():  # `toy-8` reads as `toy:layers=8`
            key, overrides = "toy", ",".join(filter(None, [f"layers={key[4:]}", overrides]))
        if key not in PRESETS:
            raise SpecError(f"unknown workload {shown(name)} (presets: {', '.join(PRESETS)})")
        values = dict(key_values(overrides, ",", f"workload spec {shown(spec)}"))
        base = PRESETS[key]
        return _override(base, values, f"workload spec {shown(spec)}", name=spec.strip() if values else base.name)

    @classmethod
    def from_toml(cls, path: str | Path) -> Workload:
        """Read a workload file: `preset = "gpt-1.3b"` and/or any of the fields (`layers`, `hidden`,
        `heads`, `seq`, `vocab`, `bytes_per_element`, `grad_bytes_per_element`, `framework_overhead_us`,
        `tp_overhead_us`, `kernel_time_scale`, the architecture's choices such as `kernels`, `name`)."""
        path = Path(path)
        data = read_toml(path, "workload")
        preset = data.pop("preset", None)
        name = data.pop("name", None)
        if name is not None:
            text(name, f"{path}: name")
        if preset is not None:
            base = cls.parse(text(preset, f"{path}: preset"))
        else:
            missing = [k for k in ("layers", "hidden", "heads", "seq") if k not in data]
            if missing:
                raise SpecError(f"{path}: missing field(s) {', '.join(missing)} (or give preset = \"gpt-1.3b\")")
            base = Workload("custom", 1, 1, 1, 1, 0)
        return _override(base, data, str(path), name=str(name or preset or path.stem), also=("preset", "name"))

    @classmethod
    def load(cls, workload: Workload | str | Path) -> Workload:
        """Accept a `Workload`, a TOML path, a `scheme:argument` spec, or a preset spec string."""
        return load_spec(workload, cls, "workload", cls.from_toml, SPEC_SCHEMES, cls.parse)


SPEC_SCHEMES: dict[str, object] = {}  # `scheme:argument` workload readers registered by other modules
# activation checkpointing: Korthikanti et al. 2022; "op", torchtitan's per-op selective checkpointing
RECOMPUTE_MODES = ("none", "selective", "full", "op")
# Accepted sizes: beyond these a value is a typo (the largest published models have about 130 layers,
# h = 25600, 160 heads, vocabularies of 256k; contexts reach millions of tokens; fp8 to fp64).
FIELD_RANGES = {"num_layers": (1, 10_000), "hidden": (1, 2**20), "heads": (1, 2**16), "seq_len": (1, 2**24),
                "vocab": (0, 2**24), "bytes_per_element": (1, 8), "grad_bytes_per_element": (1, 8),
                "kv_heads": (0, 2**16), "head_dim": (0, 2**16), "ffn_hidden": (0, 2**22)}
# the architecture's named choices and switches (`architecture`)
_CHOICES = {"mlp": arch.MLP_KINDS, "norm": arch.NORM_KINDS, "position": arch.POSITION_KINDS,
            "attention": arch.ATTENTION_KERNELS, "kernels": eager_kernels.KERNEL_KINDS,
            "projections": arch.PROJECTION_KINDS}
_FLAGS = ("tied_embeddings", "bias", "dropout", "parallel_block")
MAX_GLOBAL_BATCH = 2**20  # samples per step; the largest published batches are about 2**16


def check_global_batch(value: object, where: str = "global_batch_size") -> int:
    """The global batch size, a whole number of samples within range (not a float, not text)."""
    return whole(value, where, 1, MAX_GLOBAL_BATCH, exact=True)


_FIELD_NAMES = {"layers": "num_layers", "hidden": "hidden", "heads": "heads", "seq": "seq_len",
                "vocab": "vocab", "bytes_per_element": "bytes_per_element",
                "grad_bytes_per_element": "grad_bytes_per_element", "kv_heads": "kv_heads", "head_dim": "head_dim",
                "ffn_hidden": "ffn_hidden"}
_MICROSECOND_FIELDS = {"framework_overhead_us": "framework_overhead_s", "tp_overhead_us": "tp_overhead_s"}
MAX_KERNEL_TIME_SCALE = 100.0  # a framework 100x slower than the kernel model is a typo, not a measurement


def override_spec(spec: str, base: Workload, changed: Workload) -> str:
    """A workload spec for `changed`: `spec` (which reads as `base`) with an override for every dense field that
    differs (what a framework's settings change: the sequence, the dimensions, the kernels), so that every
    other choice of the architecture stays. `SpecError` where no override says it (the experts)."""
    values = {key: getattr(changed, field) for key, field in _FIELD_NAMES.items()
              if getattr(changed, field) != getattr(base, field)}
    values.update({key: getattr(changed, key) for key in (*_CHOICES, *_FLAGS)
                   if getattr(changed, key) != getattr(base, key)})
    if not values:
        return spec
    name, _, overrides = spec.partition(":")
    merged = dict(item.split("=", 1) for item in overrides.split(",") if "=" in item)
    merged.update({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()})
    out = f"{name}:" + ",".join(f"{k}={v}" for k, v in merged.items())
    try:
        same = replace(Workload.parse(out), name=changed.name) == changed
    except SpecError:
        same = False
    if not same:
        raise SpecError(f"workload {changed.name}: its changes from {spec} cannot be written as a spec's overrides")
    return out


def _override(base: Workload, values: dict, where: str, name: str, also: tuple[str, ...] = ()) -> Workload:
    """`base` with the fields `values` names changed; `also`: the other keys the source takes (a TOML
    file's `preset` and `name`), listed when a key is unknown."""
    changes: dict[str, object] = {"name": name}
    moe_changes: dict[str, object] = {}
    for key, value in values.items():
        if key in _MICROSECOND_FIELDS:
            changes[_MICROSECOND_FIELDS[key]] = number(value, f"{where}: {key}", 0.0, 1e6, unit=" us") / 1e6
            continue
        if key == "kernel_time_scale":
            changes[key] = number(value, f"{where}: {key}", 0.0, MAX_KERNEL_TIME_SCALE, above=True)
            continue
        # kv_heads is the dense layer's field, and an MoE model's attention setting (`workload.moe`)
        if key in MOE_KEYS and (key != "kv_heads" or base.moe is not None):
            moe_changes[key] = MOE_KEYS[key](value, f"{where}: {key}")
            continue
        if key in _CHOICES:
            changes[key] = text(value, f"{where}: {key}").strip().lower()
            continue
        if key in _FLAGS:
            changes[key] = _flag(value, f"{where}: {key}")
            continue
        if key not in _FIELD_NAMES:
            known = [*also, *_FIELD_NAMES, *_MICROSECOND_FIELDS, 'kernel_time_scale', *_CHOICES, *_FLAGS,
                     *(k for k in MOE_KEYS if k not in _FIELD_NAMES)]
            raise SpecError(f"{where}: unknown field {shown(key)} (known: {', '.join(known)})")
        changes[_FIELD_NAMES[key]] = whole(value, f"{where}: {key}", *FIELD_RANGES[_FIELD_NAMES[key]])
    if moe_changes:
        if base.moe is None and not {"experts", "top_k", "expert_ffn_hidden"} <= moe_changes.keys():
            raise SpecError(f"{where}: a dense workload becomes a mixture of experts with experts, top_k and "
                            f"expert_ffn_hidden all given (or start from an MoE preset such as mixtral-8x7b)")
        changes["moe"] = replace(base.moe, **moe_changes) if base.moe is not None else MoE(**moe_changes)
    return replace(base, **changes)


def _flag(value: object, where: str) -> bool:
    """A switch from TOML (true/false) or spec text (true/false, yes/no, 1/0)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _FLAG_WORDS:
        return _FLAG_WORDS[value.strip().lower()]
    raise SpecError(f"{where}: expected true or false, got {shown(value)}")


_FLAG_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 50257) -> Workload:
    return Workload(name, layers, hidden, heads, seq, vocab)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn_hidden: int, seq: int,
           vocab: int) -> Workload:
    return Workload(name, layers, hidden, heads, seq, vocab, kv_heads=kv_heads, ffn_hidden=ffn_hidden, mlp="swiglu",
                    norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False, dropout=False,
                    attention="flash2")


# GPT-3 family shapes from Brown et al. 2020, Table 2.1 (1.3B uses 16 heads of 128: the table's 24 heads
# do not divide h=2048; 13B uses h=5120, as Megatron-LM does,
# instead of the table's 5140 so that heads divide it); 22B, 530B and 1T from Korthikanti et al. 2022.
PRESETS: dict[str, Workload] = {w.name: w for w in (
    _gpt("gpt-125m", 12, 768, 12),
    _gpt("gpt-350m", 24, 1024, 16),
    _gpt("gpt-760m", 24, 1536, 16),
    _gpt("gpt-1.3b", 24, 2048, 16),
    _gpt("gpt-2.7b", 32, 2560, 32),
    _gpt("gpt-6.7b", 32, 4096, 32),
    _gpt("gpt-13b", 40, 5120, 40),
    _gpt("gpt-22b", 48, 6144, 64),
    _gpt("gpt-175b", 96, 12288, 96),
    _gpt("gpt-530b", 105, 20480, 128),
    _gpt("gpt-1t", 128, 25600, 160),
    # A uniform teaching workload: equal layers, no embedding or LM head.
    Workload("toy", 8, 1024, 16, 1024, 0),
    # Llama 2 (Touvron et al. 2023, arXiv 2307.09288, Table 1; Hugging Face meta-llama/Llama-2-*-hf config.json:
    # intermediate_size 11008 / 13824 / 28672, num_key_value_heads 32 / 40 / 8, vocab 32000, context 4096) and
    # Llama 3 / 3.1 (Llama Team 2024, arXiv 2407.21783, Table 3: layers, model dimension, FFN dimension, heads,
    # key/value heads 8, vocabulary 128,256; pre-training sequence 8192, sec. 3.4.1). All: pre-norm RMSNorm, SwiGLU,
    # rotary positions, untied input and output embeddings, no biases, no dropout; FlashAttention-2 kernels.
    _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 4096, 32000),
    _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 4096, 32000),
    _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 4096, 32000),
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 8192, 128256),
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 8192, 128256),
    _llama("llama-3-405b", 126, 16384, 128, 8, 53248, 8192, 128256),
)}

assert {f.name for f in fields(Workload)} >= set(_FIELD_NAMES.values())

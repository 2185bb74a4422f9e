"""Mixture-of-experts layers: the field set (`MoE`) and what an MoE model's layers weigh in parameters and FLOPs.

A layer of an MoE model is attention followed either by a dense SwiGLU MLP or by an MoE block: a router
(a linear map h -> E), E routed experts, each a SwiGLU MLP of width f (three h x f matrices), of which each
token uses its top k, and optionally shared experts every token passes through (DeepSeek-AI 2024,
"DeepSeek-V3 Technical Report", arXiv 2412.19437, sec. 2.1.2). Which layers are MoE follows Megatron-Core's
`--moe-layer-freq N` (one MoE layer every N, counting from the first) after `first_dense` dense layers
(DeepSeek-V3's `first_k_dense_replace`).

The models these presets describe are Llama-style, so the field set also carries the attention shape
they use: grouped-query attention with `kv_heads` key/value heads (Ainslie et al. 2023), or DeepSeek's
multi-head latent attention (`mla`: q LoRA rank, KV LoRA rank, per-head no-RoPE and RoPE query/key
dims, value head dim; arXiv 2412.19437 sec. 2.1.1), RMSNorm (one h-vector per norm) and untied input and
output embeddings, no biases. Per-head sizes other than h / heads come from the workload's `head_dim` (Qwen3:
32 heads of 128 on h = 2048). Further features of published MoE models are fields here:

* `qk_norm` (Qwen3; Qwen Team 2025, "Qwen3 Technical Report", arXiv 2505.09388, sec. 2): an RMSNorm over each
  head's query and key, one head_dim weight vector each, 2 d parameters a layer. Its cost is elementwise:
  reading and writing the queries and keys once more, 4 (qd + kvd) bytes a token forward and 6 (qd + kvd)
  backward, as the rotary embedding already costs (`architecture.elementwise_bytes_per_token`), timed in
  `route` and its backward (`costs.moe_ops.qk_norm_bytes`). For Qwen3-30B-A3B that is 46 KB a token, 56 us a
  layer for a 4096-token sample on an H100.
* `biases` (GPT-OSS; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", sec. 2.1, and openai/gpt-oss-120b
  config.json `attention_bias: true`): biases on the query, key, value and output projections, the router, and
  each expert's gate/up (2f) and down (h) projections. Counted in the parameters (the card's totals hold
  them); their adds are not GEMM FLOPs and are left out, as Megatron-LM's FLOP count leaves them out.
* `attention_sinks` (GPT-OSS, same card: a learned logit per head in each softmax's denominator): one
  parameter per head a layer; one more softmax column of s (or 128), left out of time.
* `sliding_window`, `sliding_every` (GPT-OSS: `sliding_window: 128`, `layer_types` alternating
  sliding_attention and full_attention from layer 0; the banded pattern of Beltagy et al. 2020,
  "Longformer"): a windowed layer's queries see at most W keys, so its attention core does W s - W (W - 1) / 2
  of the s (s + 1) / 2 causal query-key pairs (6 % at s = 4096, W = 128). Counted in FLOPs and time
  (`attention_core_flops`, `costs.moe_ops`); the projections are unchanged.
* `swiglu_limit` (GPT-OSS: config.json `swiglu_limit: 7.0`; Megatron-Bridge's GPT-OSS bridge sets
  `activation_func_clamp_value = 7.0`): the experts' gate and up outputs are clamped before the GLU. No
  parameter and no FLOP; its time is HBM traffic (`experts.clamp_bytes`).

Counted as the papers count them: total parameters hold every expert, active parameters the k routed
experts a token uses (plus everything else, embeddings included: Mixtral's 12.9 B); model FLOPs are
2 x active matrix parameters per token forward plus the attention core, 3x forward for a step (the
6 N_active D rule with attention; Megatron-LM's `num_floating_point_operations` counts MoE layers the same
way, with the router's top-k times the expert FFN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dist_lib.errors import SpecError
from dist_lib.specs import number, shown, text, whole

ROUTERS = ("softmax", "sigmoid")  # Mixtral: softmax over the top-k logits; DeepSeek-V3: sigmoid scores
MAX_EXPERTS = 4096


@dataclass(frozen=True, slots=True)
class MoE:
    """The MoE fields of a workload (see the module docstring). `capacity_factor` 0 means dropless: an
    expert takes every token routed to it; c > 0 pads (and caps) each expert's buffer at c x the mean
    load, tokens x k / E (Fedus et al. 2022, "Switch Transformers", sec. 2.2)."""

    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    shared_ffn_hidden: int = 0  # 0: the routed experts' width
    dense_ffn_hidden: int = 0  # the SwiGLU width of the dense layers (0: there are none)
    moe_every: int = 1  # one MoE layer every N (Megatron-Core --moe-layer-freq)
    first_dense: int = 0  # leading dense layers (DeepSeek-V3 first_k_dense_replace)
    capacity_factor: float = 0.0
    router: str = "softmax"
    kv_heads: int = 0  # 0: as many as the attention heads (MHA)
    mla: tuple[int, int, int, int, int] | None = None  # (q_lora, kv_lora, qk_nope, qk_rope, v_head)
    routing: str = "uniform"  # how tokens spread over experts (`workload.routing`)
    routing_seed: int = 0
    qk_norm: bool = False  # RMSNorm over each head's query and key (Qwen3)
    biases: bool = False  # biases on attention, router and expert projections (GPT-OSS)
    attention_sinks: bool = False  # a learned softmax logit per head (GPT-OSS)
    sliding_window: int = 0  # keys a windowed layer's query sees (0: every layer attends to the whole prefix)
    sliding_every: int = 1  # one windowed layer every N, from layer 0 (GPT-OSS: 2)
    swiglu_limit: float = 0.0  # the experts' gate/up outputs clamped to this before the GLU (GPT-OSS: 7; 0: none)

    def check(self, where: str, heads: int, layers: int) -> None:
        whole(self.experts, f"{where}: experts", 1, MAX_EXPERTS, exact=True)
        whole(self.top_k, f"{where}: top_k", 1, self.experts, exact=True)
        whole(self.expert_ffn_hidden, f"{where}: expert_ffn_hidden", 1, 2**20, exact=True)
        whole(self.shared_experts, f"{where}: shared_experts", 0, 64, exact=True)
        whole(self.shared_ffn_hidden, f"{where}: shared_ffn_hidden", 0, 2**20, exact=True)
        whole(self.dense_ffn_hidden, f"{where}: dense_ffn_hidden", 0, 2**20, exact=True)
        whole(self.moe_every, f"{where}: moe_every", 1, 10_000, exact=True)
        whole(self.first_dense, f"{where}: first_dense", 0, layers, exact=True)
        number(self.capacity_factor, f"{where}: capacity_factor", 0.0, 1000.0)
        if 0 < self.capacity_factor < 1:
            raise SpecError(f"{where}: capacity_factor {self.capacity_factor:g} would drop tokens even under "
                            f"uniform routing; use 0 (dropless) or at least 1")
        if self.router not in ROUTERS:
            raise SpecError(f"{where}: router must be one of {', '.join(ROUTERS)}, got {shown(self.router)}")
        whole(self.kv_heads, f"{where}: kv_heads", 0, heads, exact=True)
        if self.kv_heads and heads % self.kv_heads:
            raise SpecError(f"{where}: kv_heads {self.kv_heads} does not divide the {heads} attention heads")
        if self.mla is not None:
            for name, value in zip(MLA_PARTS, self.mla):
                whole(value, f"{where}: mla {name}", 1, 2**20, exact=True)
        whole(self.routing_seed, f"{where}: routing_seed", 0, 2**63 - 1, exact=True)
        for flag in ("qk_norm", "biases", "attention_sinks"):
            if not isinstance(getattr(self, flag), bool):
                raise SpecError(f"{where}: {flag} must be true or false, got {shown(getattr(self, flag))}")
        whole(self.sliding_window, f"{where}: sliding_window", 0, 2**24, exact=True)
        whole(self.sliding_every, f"{where}: sliding_every", 1, 10_000, exact=True)
        number(self.swiglu_limit, f"{where}: swiglu_limit", 0.0, 1e6)
        if self.mla is not None and (self.qk_norm or self.attention_sinks or self.sliding_window):
            raise SpecError(f"{where}: qk_norm, attention_sinks and sliding_window are modelled for grouped-query "
                            f"attention, not with mla")
        if not any(self.is_moe(layer) for layer in range(layers)):
            raise SpecError(f"{where}: no layer is an MoE layer (first_dense {self.first_dense} of {layers})")
        if self.dense_ffn_hidden == 0 and any(not self.is_moe(layer) for layer in range(layers)):
            raise SpecError(f"{where}: some layers are dense; give their width as dense_ffn_hidden")

    def is_moe(self, layer: int) -> bool:
        """Is `layer` an MoE layer: past the first dense ones, one in every `moe_every` (Megatron-Core's
        pattern `i % freq == 0`)."""
        return layer >= self.first_dense and (layer - self.first_dense) % self.moe_every == 0

    def window(self, layer: int, seq: int) -> int:
        """Keys a query of `layer` may see at most: the sliding window on a windowed layer, else the sequence."""
        if self.sliding_window and layer % self.sliding_every == 0:
            return min(self.sliding_window, seq)
        return seq

    @property
    def shared_width(self) -> int:
        return self.shared_ffn_hidden or self.expert_ffn_hidden

    def expert_params(self, hidden: int) -> int:
        """Parameters of one routed expert: a SwiGLU MLP's gate, up and down matrices (and their biases)."""
        return 3 * hidden * self.expert_ffn_hidden + (self.expert_bias_params(hidden) if self.biases else 0)

    def expert_bias_params(self, hidden: int) -> int:
        """The biases of one routed expert: its gate and up outputs (2f) and its down output (h)."""
        return 2 * self.expert_ffn_hidden + hidden if self.biases else 0

    def capacity(self, tokens: int) -> int:
        """Tokens one expert's buffer holds for `tokens` routed tokens: c x tokens x k / E rounded up
        (dropless: no cap, see `routing.expert_loads`)."""
        if not self.capacity_factor:
            return 0
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)


MLA_PARTS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


# ---- what an MoE model's layers weigh ------------------------------------------------------------

def attention_params(moe: MoE, hidden: int, heads: int, head_dim: int = 0) -> int:
    """Weights of one attention block. GQA: W_q and W_o are h x (a d), W_k and W_v h x (kv x d), d = `head_dim`
    or h / a; with `biases` their a d + 2 kv d + h biases, with `qk_norm` two d-vectors, with
    `attention_sinks` a logit per head. MLA (arXiv 2412.19437, eqs. 1-11): the query down- and
    up-projections with the norm between, the joint KV down-projection (kv_lora + the shared RoPE key), its
    norm, the K/V up-projection and W_o."""
    if moe.mla is not None:
        q_lora, kv_lora, nope, rope, v = moe.mla
        return (hidden * q_lora + q_lora + q_lora * heads * (nope + rope)
                + hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v) + heads * v * hidden)
    return attention_matrix_params(moe, hidden, heads, head_dim) + attention_vector_params(moe, hidden, heads,
                                                                                          head_dim)


def _gqa_widths(moe: MoE, hidden: int, heads: int, head_dim: int) -> tuple[int, int, int]:
    """(head size d, query width a d, key/value width kv d) of grouped-query attention."""
    d = head_dim or hidden // heads
    return d, heads * d, (moe.kv_heads or heads) * d


def attention_matrix_params(moe: MoE, hidden: int, heads: int, head_dim: int = 0) -> int:
    """The weight matrices of one attention block (what its GEMMs multiply by; MLA's as `attention_params`)."""
    if moe.mla is not None:
        return attention_params(moe, hidden, heads)
    _, q, kv = _gqa_widths(moe, hidden, heads, head_dim)
    return 2 * hidden * q + 2 * hidden * kv


def attention_vector_params(moe: MoE, hidden: int, heads: int, head_dim: int = 0) -> int:
    """Biases, QK-norm weights and sinks of one GQA attention block (none for MLA)."""
    if moe.mla is not None:
        return 0
    d, q, kv = _gqa_widths(moe, hidden, heads, head_dim)
    return ((q + 2 * kv + hidden) if moe.biases else 0) + (2 * d if moe.qk_norm else 0) \
        + (heads if moe.attention_sinks else 0)


def attention_output_width(moe: MoE, hidden: int, heads: int, head_dim: int = 0) -> int:
    """Input width of W_o: a d for GQA (h when d = h / a); MLA's kept at h as its GEMM shapes count it."""
    if moe.mla is not None or not head_dim:
        return hidden
    return heads * head_dim


def ffn_params(moe: MoE, hidden: int, layer: int, *, active: bool = False) -> int:
    """Weights of a layer's feed-forward block: the dense SwiGLU, or the router, the routed experts (all,
    or the top-k a token uses when `active`) and the shared experts."""
    if not moe.is_moe(layer):
        return 3 * hidden * moe.dense_ffn_hidden
    routed = moe.top_k if active else moe.experts
    router = hidden * moe.experts + (moe.experts if moe.biases else 0)
    return router + routed * moe.expert_params(hidden) + moe.shared_experts * 3 * hidden * moe.shared_width


def routed_expert_params(moe: MoE, hidden: int, layer: int) -> int:
    """Weights of the routed experts of a layer (0 for a dense one): what expert parallelism splits."""
    return moe.experts * moe.expert_params(hidden) if moe.is_moe(layer) else 0


def layer_params(moe: MoE, hidden: int, heads: int, vocab: int, layer: int, num_layers: int, *,
                 active: bool = False, head_dim: int = 0) -> int:
    """A layer's parameters: attention, two RMSNorms, the feed-forward block; the input embedding on the
    first layer, the final norm and the untied output embedding on the last."""
    params = attention_params(moe, hidden, heads, head_dim) + 2 * hidden + ffn_params(moe, hidden, layer,
                                                                                      active=active)
    if layer == 0:
        params += vocab * hidden
    if layer == num_layers - 1:
        params += hidden + vocab * hidden
    return params


def attention_core_flops(moe: MoE, seq: int, hidden: int, heads: int, head_dim: int = 0,
                         layer: int | None = None) -> float:
    """Forward FLOPs of one sample's attention core: Q K^T over the query/key head dim and P V over the value
    head dim, 2 s^2 per element of each (4 s^2 a d for MHA/GQA: 4 s^2 h when d = h / a), over the whole
    s x s matrix as Megatron-LM counts it. A windowed `layer` counts its query-key pairs the same way: twice
    the W s - W (W - 1) / 2 pairs its causal band holds (the full matrix is twice the causal triangle)."""
    if moe.mla is not None:
        _, _, nope, rope, v = moe.mla
        return 2.0 * seq * seq * heads * (nope + rope + v)
    width = heads * head_dim if head_dim else hidden
    window = seq if layer is None else moe.window(layer, seq)
    if window >= seq:
        return 4.0 * seq * seq * width
    return 4.0 * width * 2 * (window * seq - window * (window - 1) / 2)


def matrix_flops(moe: MoE, seq: int, hidden: int, heads: int, layer: int, head_dim: int = 0) -> float:
    """Forward FLOPs of one sample's weight GEMMs in a layer: 2 per active matrix parameter per token
    (the norms are elementwise, not GEMMs; nor are biases)."""
    ffn = ffn_params(moe, hidden, layer, active=True)
    if moe.biases and moe.is_moe(layer):
        ffn -= moe.experts + moe.top_k * moe.expert_bias_params(hidden)
    return 2.0 * seq * (attention_matrix_params(moe, hidden, heads, head_dim) + ffn)


def parse_mla(value: object, where: str) -> tuple[int, int, int, int, int]:
    """`"1536/512/128/64/128"` or a list of five whole numbers: (q_lora, kv_lora, qk_nope, qk_rope, v_head)."""
    parts = value if isinstance(value, list) else text(value, where).split("/")
    if len(parts) != len(MLA_PARTS):
        raise SpecError(f"{where}: mla takes {len(MLA_PARTS)} numbers ({'/'.join(MLA_PARTS)}), got {shown(value)}")
    return tuple(whole(p, f"{where}: mla {name}", 1, 2**20) for name, p in zip(MLA_PARTS, parts))  # type: ignore


# spec / TOML key -> (field, reader)
def _whole_reader(low: int, high: int):
    return lambda value, where: whole(value, where, low, high)


MOE_KEYS = {
    "experts": _whole_reader(1, MAX_EXPERTS), "top_k": _whole_reader(1, MAX_EXPERTS),
    "expert_ffn_hidden": _whole_reader(1, 2**20), "shared_experts": _whole_reader(0, 64),
    "shared_ffn_hidden": _whole_reader(0, 2**20), "dense_ffn_hidden": _whole_reader(0, 2**20),
    "moe_every": _whole_reader(1, 10_000), "first_dense": _whole_reader(0, 10_000),
    "capacity_factor": lambda value, where: number(value, where, 0.0, 1000.0),
    "router": text, "kv_heads": _whole_reader(0, 2**16), "mla": parse_mla,
    "routing": text, "routing_seed": _whole_reader(0, 2**63 - 1),
    "qk_norm": lambda value, where: _switch(value, where), "biases": lambda value, where: _switch(value, where),
    "attention_sinks": lambda value, where: _switch(value, where),
    "sliding_window": _whole_reader(0, 2**24), "sliding_every": _whole_reader(1, 10_000),
    "swiglu_limit": lambda value, where: number(value, where, 0.0, 1e6),
}


def _switch(value: object, where: str) -> bool:
    """A switch from TOML (true/false) or spec text (true/false, yes/no, 1/0)."""
    if isinstance(value, bool):
        return value
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise SpecError(f"{where}: expected true or false, got {shown(value)}")


def stash_bytes(moe: MoE, seq: int, hidden: int, heads: int, layer: int, tp: int, *, recompute: str,
                sequence_parallel: bool, bytes_per_element: int, attention: str = "unfused",
                dropout: bool = True) -> float:
    """One sample's stash of a layer of an MoE model, the layer input included (as `Workload.stash_bytes`
    counts before taking it off). Attention and norms as Korthikanti et al. 2022, Table 2, counts them
    without the MLP's 19sh: 15sh + 5as^2 (the 15sh split t ways as the paper splits its 34sh); then per
    token, for each routed expert it uses and each shared expert, a SwiGLU's input (2h bytes), gate and up
    outputs (4f) and their product (2f), which its backward reads. The attention core's part follows the
    kernel as a dense layer's does (`architecture.stash_units`): unfused, the softmax output, its dropout
    mask and the dropout output (5as; 2as without dropout); FlashAttention keeps only its fp32
    log-sum-exp, 4 bytes a head (Dao 2023, Algorithm 1)."""
    s, h, a = seq, hidden, heads
    if recompute == "selective":
        core = 0.0
    elif attention == "unfused":
        core = (5 if dropout else 2) * a * s / (h * tp)
    else:
        core = 4 * a / (h * tp)
    if tp == 1:
        attention = s * h * (15 + core)
    elif sequence_parallel:
        attention = s * h * (15 / tp + core)
    else:
        attention = s * h * (15 * 10 / 34 + 15 * 24 / (34 * tp) + core)
    if moe.is_moe(layer):
        ffn = moe.top_k * (2 * h + 6 * moe.expert_ffn_hidden) + moe.shared_experts * (2 * h + 6 * moe.shared_width)
    else:
        ffn = (2 * h + 6 * moe.dense_ffn_hidden) / tp  # a dense MLP splits over TP as Megatron's does
    return (attention + s * ffn) * bytes_per_element / 2

"""Mixture-of-experts presets, from the published configurations (Hugging Face `config.json` of the official
checkpoints and the papers); registered beside the GPT presets of `workload.transformer`.

* `mixtral-8x7b`, `mixtral-8x22b`: Jiang et al. 2024, "Mixtral of Experts", arXiv 2401.04088, Table 1, and
  mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1 config.json: 8 experts, top-2, softmax router, GQA with 8
  KV heads, every layer MoE, vocabulary 32000. Published 46.7 B total / 12.9 B active and 141 B / 39 B.
* `deepseek-v3`: DeepSeek-AI 2024, arXiv 2412.19437, sec. 2 and 4.2, deepseek-ai/DeepSeek-V3 config.json:
  61 layers of h = 7168, MLA with 128 heads (q LoRA 1536, KV LoRA 512, 128 + 64 query/key dims, 128 value
  dims), the first 3 layers dense (18432 wide), then 256 routed experts of 2048 with 1 shared, top-8,
  sigmoid router, vocabulary 129280. Published 671 B total / 37 B active (the multi-token-prediction
  module's 14 B, not trained here, excluded).

* `qwen3-30b-a3b`, `qwen3-235b-a22b`: Qwen Team 2025, "Qwen3 Technical Report", arXiv 2505.09388, Table 2, and
  Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B config.json: 48 layers of h = 2048 and 94 of h = 4096, 32 and 64
  query heads of head_dim 128 (wider than h / heads), 4 KV heads, 128 experts of moe_intermediate_size 768 and
  1536, top-8, no shared experts, every layer MoE, QK-norm, no biases, vocabulary 151936, untied embeddings.
  Published (model cards) 30.5 B total / 3.3 B activated and 235 B / 22 B; the cards' non-embedding totals,
  29.9 B and 234 B, match too. The active counts from config.json, 3.353 B and 22.19 B, are 1.6 % and 0.9 %
  above the cards' two-digit figures: within the cards' rounding only if they truncate.
* `gpt-oss-120b`, `gpt-oss-20b`: OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", sec. 2.1 and Table 1,
  and openai/gpt-oss-120b, gpt-oss-20b config.json: 36 and 24 layers of h = 2880, 64 query heads of head_dim
  64, 8 KV heads, 128 and 32 experts of intermediate_size 2880, top-4, biases on attention, router and experts
  (`attention_bias: true`), attention sinks, layers alternating a 128-token sliding window (even layers,
  `layer_types`) and full attention, the experts' gate/up outputs clamped at 7 (`swiglu_limit: 7.0`),
  vocabulary 201088, untied embeddings. Published 116.83 B total / 5.13 B
  active and 20.91 B / 3.61 B; the card counts the active parameters without the input embedding ("we count
  the unembedding but not the embedding"), `active_params` with it (as the Mixtral paper does).

Sequences are 4096, the pre-training length of DeepSeek-V3 and of Megatron-Core's published MoE runs
(override with `seq=`).
"""

from __future__ import annotations

from dist_lib.workload.moe import MoE
from dist_lib.workload.transformer import PRESETS, Workload


def _llama_style(name: str, layers: int, hidden: int, heads: int, head_dim: int, vocab: int, moe: MoE, *,
                 attention: str = "flash3") -> Workload:
    """A Llama-style MoE model as Megatron-Core builds it: RMSNorm, SwiGLU experts, rotary positions, untied
    embeddings, no dropout, FlashAttention (the linear biases of GPT-OSS are `MoE.biases`). The models of
    2025 name FlashAttention-3 (Hopper); Mixtral and DeepSeek-V3 take FlashAttention-2, which also runs on the
    A100s and B200s they are planned on."""
    return Workload(name, layers, hidden, heads, 4096, vocab, kv_heads=moe.kv_heads, head_dim=head_dim, mlp="swiglu",
                    norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False, dropout=False,
                    attention=attention, moe=moe)


def _gpt_oss(name: str, layers: int, experts: int) -> Workload:
    return _llama_style(name, layers, 2880, 64, 64, 201088,
                        MoE(experts=experts, top_k=4, expert_ffn_hidden=2880, kv_heads=8, biases=True,
                            attention_sinks=True, sliding_window=128, sliding_every=2, swiglu_limit=7.0))

MOE_PRESETS: dict[str, Workload] = {w.name: w for w in (
    _llama_style("mixtral-8x7b", 32, 4096, 32, 0, 32000,
                 MoE(experts=8, top_k=2, expert_ffn_hidden=14336, kv_heads=8), attention="flash2"),
    _llama_style("mixtral-8x22b", 56, 6144, 48, 0, 32000,
                 MoE(experts=8, top_k=2, expert_ffn_hidden=16384, kv_heads=8), attention="flash2"),
    _llama_style("deepseek-v3", 61, 7168, 128, 0, 129280,
                 MoE(experts=256, top_k=8, expert_ffn_hidden=2048, shared_experts=1, dense_ffn_hidden=18432,
                     first_dense=3, router="sigmoid", mla=(1536, 512, 128, 64, 128)), attention="flash2"),
    _llama_style("qwen3-30b-a3b", 48, 2048, 32, 128, 151936,
                 MoE(experts=128, top_k=8, expert_ffn_hidden=768, kv_heads=4, qk_norm=True)),
    _llama_style("qwen3-235b-a22b", 94, 4096, 64, 128, 151936,
                 MoE(experts=128, top_k=8, expert_ffn_hidden=1536, kv_heads=4, qk_norm=True)),
    _gpt_oss("gpt-oss-120b", 36, 128),
    _gpt_oss("gpt-oss-20b", 24, 32),
)}

PRESETS.update(MOE_PRESETS)

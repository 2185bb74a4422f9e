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

Sequences are 4096, the pre-training length of DeepSeek-V3 and of Megatron-Core's published MoE runs
(override with `seq=`).
"""

from __future__ import annotations

from dist_lib.workload.moe import MoE
from dist_lib.workload.transformer import PRESETS, Workload

MOE_PRESETS: dict[str, Workload] = {w.name: w for w in (
    Workload("mixtral-8x7b", 32, 4096, 32, 4096, 32000,
             moe=MoE(experts=8, top_k=2, expert_ffn_hidden=14336, kv_heads=8)),
    Workload("mixtral-8x22b", 56, 6144, 48, 4096, 32000,
             moe=MoE(experts=8, top_k=2, expert_ffn_hidden=16384, kv_heads=8)),
    Workload("deepseek-v3", 61, 7168, 128, 4096, 129280,
             moe=MoE(experts=256, top_k=8, expert_ffn_hidden=2048, shared_experts=1, dense_ffn_hidden=18432,
                     first_dense=3, router="sigmoid", mla=(1536, 512, 128, 64, 128))),
)}

PRESETS.update(MOE_PRESETS)

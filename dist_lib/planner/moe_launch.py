"""A mixture-of-experts workload and its expert parallelism as Megatron-LM arguments, and back.

Flag names read from megatron-core 0.20.0 (NVIDIA/Megatron-LM d98e8a6): `--num-experts` and `--moe-layer-freq`
(megatron/training/arguments.py `_add_moe_args`); `--moe-router-topk`, `--moe-ffn-hidden-size`,
`--moe-shared-expert-intermediate-size`, `--moe-router-score-function`, `--moe-token-dispatcher-type`,
`--moe-grouped-gemm`, `--moe-expert-capacity-factor`, `--moe-pad-expert-input-to-capacity`, `--num-query-groups`
and the MLA dimensions are TransformerConfig / MLATransformerConfig fields made into flags
(core/transformer/transformer_config.py); `--expert-model-parallel-size` and `--expert-tensor-parallel-size` are
ModelParallelConfig's `expert_model_parallel_size` and `expert_tensor_parallel_size` (core/model_parallel_config.py;
arguments.py `validate_args` sets the latter to `--tensor-model-parallel-size` when it is not given). The all-to-all dispatcher is the one `hybrid`'s expert stage runs (Megatron's
default is "allgather"); the grouped GEMM is how `costs.experts` times the local experts.
"""

from __future__ import annotations

from typing import Any

from dist_lib.errors import SpecError

# Flags an MoE workload's arguments hold beside the dense ones: flag -> kind, as `launch_import._MEGATRON`
FLAGS = {"--num-experts": "int", "--moe-router-topk": "int", "--moe-ffn-hidden-size": "int",
         "--moe-shared-expert-intermediate-size": "int", "--moe-router-score-function": "str",
         "--moe-token-dispatcher-type": "str", "--moe-grouped-gemm": "flag", "--moe-layer-freq": "str",
         "--moe-expert-capacity-factor": "str", "--moe-pad-expert-input-to-capacity": "flag",
         "--multi-latent-attention": "flag", "--q-lora-rank": "int", "--kv-lora-rank": "int", "--qk-head-dim": "int",
         "--qk-pos-emb-head-dim": "int", "--v-head-dim": "int"}


def megatron_moe_args(workload: Any, ep: int, etp: int = 0) -> list[tuple[str, Any]]:
    """The MoE model's and its expert parallelism's flags (value None: a flag without a value); `etp` 0: no
    `--expert-tensor-parallel-size` (the TP size, Megatron-Core's default)."""
    moe = workload.moe
    args: list[tuple[str, Any]] = [("--swiglu", None), ("--num-experts", moe.experts),
                                   ("--moe-router-topk", moe.top_k), ("--moe-ffn-hidden-size", moe.expert_ffn_hidden),
                                   ("--moe-router-score-function", moe.router),
                                   ("--moe-token-dispatcher-type", "alltoall"), ("--moe-grouped-gemm", None),
                                   ("--expert-model-parallel-size", ep)]
    if etp:
        args.append(("--expert-tensor-parallel-size", etp))
    if moe.shared_experts:
        args.append(("--moe-shared-expert-intermediate-size", moe.shared_experts * moe.shared_width))
    pattern = layer_pattern(moe, workload.num_layers)
    if pattern is not None:
        args.append(("--moe-layer-freq", pattern))
    if moe.capacity_factor:
        args += [("--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"), ("--moe-pad-expert-input-to-capacity", None)]
    if moe.mla is not None:
        q_lora, kv_lora, nope, rope, v = moe.mla
        args += [("--multi-latent-attention", None), ("--q-lora-rank", q_lora), ("--kv-lora-rank", kv_lora),
                 ("--qk-head-dim", nope), ("--qk-pos-emb-head-dim", rope), ("--v-head-dim", v)]
    elif moe.kv_heads and moe.kv_heads != workload.heads:
        args += [("--group-query-attention", None), ("--num-query-groups", moe.kv_heads)]
    return args


def ffn_hidden(workload: Any) -> int:
    """`--ffn-hidden-size`: the dense layers' SwiGLU width, or the experts' where every layer is MoE."""
    return workload.moe.dense_ffn_hidden or workload.moe.expert_ffn_hidden


def layer_pattern(moe: Any, num_layers: int) -> str | None:
    """`--moe-layer-freq` as Megatron's list expression (1: MoE, 0: dense), None where every layer is MoE."""
    flags = [int(moe.is_moe(layer)) for layer in range(num_layers)]
    if all(flags):
        return None
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def read_etp(seen: dict[str, Any], workload: Any, tp: int, source: str) -> int:
    """`--expert-tensor-parallel-size` of Megatron-LM arguments `seen` (0 when not given), checked: only with
    experts, a whole number dividing the experts' width; with TP, `--sequence-parallel` (Megatron-Core refuses
    MoE layers under TP without it)."""
    etp = seen.get("--expert-tensor-parallel-size", 0)
    if workload.moe is None:
        if etp:
            raise SpecError(f"{source}: --expert-tensor-parallel-size describes a mixture of experts, but workload "
                            f"{workload.name} is dense")
        return 0
    if "--expert-tensor-parallel-size" in seen and (etp < 1 or workload.moe.expert_ffn_hidden % etp):
        raise SpecError(f"{source}: --expert-tensor-parallel-size {etp} does not divide the experts' width "
                        f"{workload.moe.expert_ffn_hidden}")
    if tp > 1 and not seen.get("--sequence-parallel"):
        raise SpecError(f"{source}: --tensor-model-parallel-size {tp} with experts needs --sequence-parallel "
                        f"(Megatron-Core runs MoE layers with TP only sequence-parallel)")
    return etp


def read_megatron_moe(seen: dict[str, Any], workload: Any, source: str) -> int:
    """The expert-parallel size of Megatron-LM arguments `seen`, after checking that their MoE flags describe
    `workload` exactly (a flag that disagrees is one `SpecError` naming it); 1 for a dense workload, whose
    arguments may not hold MoE flags."""
    moe = workload.moe
    given = [flag for flag in FLAGS if flag in seen]
    if moe is None:
        if given or seen.get("--expert-model-parallel-size", 1) != 1:
            flag = (given or ["--expert-model-parallel-size"])[0]
            raise SpecError(f"{source}: {flag} describes a mixture of experts, but workload {workload.name} is dense; "
                            f"give an MoE workload (e.g. mixtral-8x7b)")
        return 1
    if seen.get("--moe-token-dispatcher-type", "allgather") != "alltoall":
        raise SpecError(f"{source}: --moe-token-dispatcher-type {seen.get('--moe-token-dispatcher-type', 'allgather')} "
                        f"is not simulated (alltoall: the experts' all-to-all dispatch and combine)")
    expected = {flag: value for flag, value in megatron_moe_args(workload, 1)}
    for flag, value in expected.items():
        if flag in ("--expert-model-parallel-size", "--moe-token-dispatcher-type", "--expert-tensor-parallel-size"):
            continue
        have = seen.get(flag)
        want = True if value is None else value
        if flag == "--moe-expert-capacity-factor" and have is not None:
            try:
                have = f"{float(have):g}"
            except ValueError:
                pass
        if have != want:
            raise SpecError(f"{source}: {flag} {'missing' if have is None else have} does not describe workload "
                            f"{workload.name} ({flag}{'' if value is None else f' {value}'})")
    extra = [flag for flag in given if flag not in expected]
    if extra:
        raise SpecError(f"{source}: {extra[0]} does not describe workload {workload.name}")
    ep = seen.get("--expert-model-parallel-size", 1)
    if ep < 1 or moe.experts % ep:
        raise SpecError(f"{source}: --expert-model-parallel-size {ep} does not divide the {moe.experts} experts")
    return ep

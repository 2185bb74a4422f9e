"""A plan as a framework's own settings: Megatron-LM command-line arguments, a torchtitan TOML job config, a
DeepSpeed JSON config, each with the launcher lines and the node order (hostfile) the layout needs.

Versions targeted (flag and key names read from their source):
* Megatron-LM, megatron-core 0.20.0 (NVIDIA/Megatron-LM d98e8a6): megatron/training/arguments.py, flags made
  from ModelParallelConfig, TransformerConfig, TrainingConfig and DistributedDataParallelConfig fields;
  `--pipeline-model-parallel-layout` from core/transformer/pipeline_parallel_layer_layout.py.
* torchtitan v0.2.2 (pytorch/torchtitan 73a0e69): torchtitan/config/job_config.py, the last release read from
  TOML (`--job.config_file`); later versions take the same keys as `--section.key` flags.
* DeepSpeed 0.16.5 (microsoft/DeepSpeed 38327e0): deepspeed/runtime/constants.py, runtime/config.py
  (`get_pipeline_config`), launcher/runner.py (hostfile lines `host slots=N`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.planner.launch import Launch, node_order
from dist_lib.planner.moe_launch import ffn_hidden, megatron_moe_args
from dist_lib.planner.plan import Plan
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload


@dataclass(frozen=True)
class Export:
    """What to hand the framework: `settings` (the arguments, TOML or JSON text), `launcher` (the command
    line on node rank k), `hostfile` (node order), `notes` (where the framework's run differs)."""

    framework: str
    settings: str
    launcher: str
    hostfile: str
    notes: tuple[str, ...]

    def text(self) -> str:
        notes = "".join(f"# note: {n}\n" for n in self.notes)
        return f"{notes}# --- settings ---\n{self.settings}\n# --- launch ---\n{self.launcher}\n" \
               f"# --- node order ---\n{self.hostfile}"


def export(plan: Plan, framework: str, workload: Any, cluster: Any = None) -> Export:
    """`plan` (checked for `workload` and, given, `cluster`) in `framework`'s settings."""
    launch = Launch.from_plan(plan, framework, workload.num_layers, workload.moe is not None)
    nodes = node_order(plan, cluster) if cluster is not None else None
    gpus = cluster.nodes[nodes[0]].gpus if nodes else None
    settings = {"megatron": megatron_args, "torchtitan": torchtitan_toml, "deepspeed": deepspeed_json}[framework]
    text = settings(launch, workload)
    if nodes is None:
        hostfile = "# (no cluster given: framework rank g runs on plan rank g)\n"
        launcher = _launcher(framework, None, None)
    else:
        hostfile = "".join(f"node{n} slots={gpus}  # node_rank {k}: cluster node {n}, {gpus} x "
                           f"{cluster.nodes[n].device.name}\n" for k, n in enumerate(nodes))
        launcher = _launcher(framework, len(nodes), gpus)
    return Export(framework, text, launcher, hostfile, launch.notes)


def megatron_args(launch: Launch, workload: Any) -> str:
    """Megatron-LM's command-line arguments, one flag a line."""
    args: list[tuple[str, Any]] = [("--tensor-model-parallel-size", launch.tp),
                                   ("--pipeline-model-parallel-size", launch.pp)]
    if launch.cp > 1:
        args.append(("--context-parallel-size", launch.cp))
    if launch.layers is not None:
        args.append(("--pipeline-model-parallel-layout", megatron_layout(launch.layers)))
    elif launch.chunks > 1:
        args.append(("--num-virtual-stages-per-pipeline-rank", launch.chunks))
    args += [("--micro-batch-size", launch.micro_batch_size), ("--global-batch-size", launch.global_batch_size)]
    if launch.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif launch.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    for flag, on in (("--sequence-parallel", launch.sequence_parallel), ("--use-distributed-optimizer", launch.zero == 1),
                     ("--overlap-grad-reduce", launch.overlap_grad_reduce)):
        if on:
            args.append((flag, None))
    args += _precision_megatron(workload)
    if launch.fp8:  # Transformer Engine: E4M3 forward, E5M2 gradients; the scaling recipe
        args += [("--fp8-format", "hybrid"), ("--fp8-recipe", launch.fp8)]
    h = workload.hidden
    args += [("--num-layers", workload.num_layers), ("--hidden-size", h), ("--num-attention-heads", workload.heads),
             ("--ffn-hidden-size", ffn_hidden(workload) if workload.moe else 4 * h), ("--seq-length", workload.seq_len),
             ("--max-position-embeddings", workload.seq_len)]
    if workload.moe is not None:  # the experts and EP (`moe_launch`); the layer as the MoE presets describe it
        args += megatron_moe_args(workload, launch.ep, launch.etp) + [
            ("--normalization", "RMSNorm"), ("--position-embedding-type", "rope"),
            ("--untie-embeddings-and-output-weights", None), ("--disable-bias-linear", None)]
    if workload.vocab:
        args += [("--tokenizer-type", "NullTokenizer"), ("--vocab-size", workload.vocab)]
    return " \\\n".join(flag if value is None else f"{flag} {_shell(value)}" for flag, value in args) + "\n"


def megatron_layout(layers: tuple[int, ...]) -> str:
    """`--pipeline-model-parallel-layout`: blocks chunk-major split by "|", "E" the embedding on the first,
    "L" the loss on the last, "t*n" n decoder layers (pipeline_parallel_layer_layout.py parse_str_to_list)."""
    parts = [f"t*{n}" for n in layers]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def torchtitan_toml(launch: Launch, workload: Any) -> str:
    """A torchtitan job config (TOML), the sections and keys of job_config.py."""
    if workload.bytes_per_element not in (2, 4):
        raise SpecError(f"workload {workload.name}: {workload.bytes_per_element}-byte elements have no torchtitan "
                        f"mixed_precision_param (bfloat16 or float32)")
    pipelined = launch.pp > 1
    local = launch.micro_batch_size * (launch.microbatches if pipelined else 1)
    flavor = torchtitan_flavor(workload)
    lines = ["# torchtitan v0.2.2 job config (torchtitan/config/job_config.py)",
             f"# model: {workload.num_layers} layers, hidden {workload.hidden}, {workload.heads} heads "
             f"({arch.kv_heads(workload)} key/value), ffn {arch.ffn_hidden(workload)}, vocab {workload.vocab}; "
             + ("torchtitan's stock flavor" if flavor else
                "no stock torchtitan flavor has these: register one with them under this name"),
             "[model]", 'name = "llama3"', f"flavor = {json.dumps(flavor or workload.name)}",
             *(['converters = ["quantize.linear.float8"]'] if launch.fp8 else []), "",
             "[training]", f"local_batch_size = {local}", f"global_batch_size = {launch.global_batch_size}",
             f"seq_len = {workload.seq_len}",
             f'mixed_precision_param = "{"bfloat16" if workload.bytes_per_element == 2 else "float32"}"', "",
             "[parallelism]",
             f"data_parallel_replicate_degree = {launch.replicate if launch.zero == 3 else launch.dp}",
             f"data_parallel_shard_degree = {launch.dp // launch.replicate if launch.zero == 3 else 1}",
             f"tensor_parallel_degree = {launch.tp}", f"pipeline_parallel_degree = {launch.pp}",
             f"context_parallel_degree = {launch.cp}"]
    if pipelined:
        lines += [f'pipeline_parallel_schedule = "{TORCHTITAN_SCHEDULES[launch.schedule]}"',
                  f"pipeline_parallel_microbatch_size = {launch.micro_batch_size}",
                  f"module_fqns_per_model_part = {json.dumps(torchtitan_parts(launch, workload.num_layers))}"]
    # recompute "op", torchtitan's per-op policy, is its mode "selective" with selective_ac_option "op"
    lines += ["", "[activation_checkpoint]", f'mode = "{"selective" if launch.recompute == "op" else launch.recompute}"']
    if launch.recompute == "op":
        lines.append('selective_ac_option = "op"')
    # torch.compile (off by default in torchtitan) fuses the memory-bound kernels the simulation counts fused; a
    # workload with kernels "eager" was simulated without it (`workload/eager_kernels.py`)
    lines += ["", "[compile]", f"enable = {'false' if workload.kernels == 'eager' else 'true'}",
              'components = ["model", "loss"]']
    if launch.fp8:  # torchao float8 training; the LM head ("output") stays in 16 bits
        lines += ["", "[quantize.linear.float8]", f'recipe_name = "{launch.fp8}"', 'filter_fqns = ["output"]']
    return "\n".join(lines) + "\n"


# torchtitan's Llama 3 flavors (torchtitan/models/llama3/__init__.py `llama3_configs`) by the preset they are
TORCHTITAN_FLAVORS = {"llama-3-8b": "8B", "llama-3-70b": "70B", "llama-3-405b": "405B"}


def torchtitan_flavor(workload: Any) -> str:
    """torchtitan's flavor name of a `llama-3-*` preset whose only changes are the sequence length and the
    kernels (which the job config sets: `training.seq_len`, `[compile]`), else ""."""
    base = workload.name.partition(":")[0].lower()
    if base not in TORCHTITAN_FLAVORS:
        return ""
    stock = replace(Workload.load(base), seq_len=workload.seq_len, name=workload.name, kernels=workload.kernels)
    return TORCHTITAN_FLAVORS[base] if stock == workload else ""


TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}


def torchtitan_parts(launch: Launch, num_layers: int) -> list[list[str]]:
    """`module_fqns_per_model_part`: the llama3 model's module names of each block, chunk-major (torchtitan's
    loop-style stage index pp_rank + chunk x pp)."""
    blocks = launch.blocks(num_layers)
    parts = [[f"layers.{i}" for i in range(start, stop)] for start, stop in blocks]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def deepspeed_json(launch: Launch, workload: Any) -> str:
    """DeepSpeed's JSON config (runtime/constants.py keys, the `pipeline` section of get_pipeline_config)."""
    if launch.tp > 1 and launch.pp > 1:
        raise SpecError(f"plan: tp={launch.tp} with {launch.pp} pipeline stages; DeepSpeed's pipeline engine takes "
                        f"tensor parallelism from the model's mpu (Megatron-DeepSpeed), not from its config")
    config: dict[str, Any] = {"train_batch_size": launch.global_batch_size,
                              "train_micro_batch_size_per_gpu": launch.micro_batch_size,
                              "gradient_accumulation_steps": launch.microbatches}
    if workload.bytes_per_element == 2:
        config["bf16"] = {"enabled": True}
    config["zero_optimization"] = {"stage": launch.zero}
    if launch.pp > 1:
        config["pipeline"] = {"stages": launch.pp, "partition": "uniform",
                              "activation_checkpoint_interval": 1 if launch.recompute == "full" else 0}
    if launch.tp > 1:
        config["tensor_parallel"] = {"autotp_size": launch.tp}
    return json.dumps(config, indent=2) + "\n"


def _launcher(framework: str, nodes: int | None, gpus: int | None) -> str:
    n, g = (nodes, gpus) if nodes else ("NNODES", "GPUS_PER_NODE")
    if framework == "deepspeed":
        return (f"deepspeed --hostfile hostfile --num_nodes {n} --num_gpus {g} train.py --deepspeed "
                f"--deepspeed_config ds_config.json\n# in train.py: PipelineModule(layers, num_stages=<pipeline.stages>, "
                f"partition_method='uniform')\n")
    script = "pretrain_gpt.py <the settings above>" if framework == "megatron" else \
        "-m torchtitan.train --job.config_file job.toml"
    return (f"torchrun --nnodes {n} --nproc-per-node {g} --node-rank $NODE_RANK --master-addr $MASTER_ADDR "
            f"--master-port 29500 {script}\n")


def _precision_megatron(workload: Any) -> list[tuple[str, Any]]:
    if workload.bytes_per_element == 2:
        return [("--bf16", None)]
    if workload.bytes_per_element == 4:
        return []
    raise SpecError(f"workload {workload.name}: {workload.bytes_per_element}-byte elements have no Megatron-LM "
                    f"precision flag here (--bf16, or fp32 by default)")


def _shell(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if any(c in text for c in "|*() ") else text

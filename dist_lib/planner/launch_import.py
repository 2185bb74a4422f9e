"""A framework's own settings read back as a `Launch` (and the workload they name): Megatron-LM arguments,
a torchtitan TOML job config, a DeepSpeed JSON config. Same versions as `export.py` (megatron-core 0.20.0,
torchtitan v0.2.2, DeepSpeed 0.16.5). A setting that changes the step but has no counterpart here is one
`SpecError` naming the flag or key; settings that do not change one step's time or memory (learning rate,
data paths, logging) are skipped and listed in `Imported.ignored`.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.workload.eager_kernels import problem as eager_problem
from dist_lib.workload.per_op_checkpoint import workload_problem as per_op_problem
from dist_lib.workload.transformer import Workload
from dist_lib.planner.export import TORCHTITAN_FLAVORS, torchtitan_flavor
from dist_lib.planner.launch import Launch, uniform_split
from dist_lib.planner.moe_launch import FLAGS as MOE_FLAGS, ffn_hidden, read_etp, read_megatron_moe

# Megatron-LM flags read here: flag -> (kind, launch or workload field). Kind "int" takes a number, "str" a
# word, "flag" none.
_MEGATRON = {"--tensor-model-parallel-size": "int", "--pipeline-model-parallel-size": "int",
             "--num-virtual-stages-per-pipeline-rank": "int", "--num-layers-per-virtual-pipeline-stage": "int",
             "--pipeline-model-parallel-layout": "str", "--micro-batch-size": "int", "--global-batch-size": "int",
             "--recompute-granularity": "str", "--recompute-method": "str", "--recompute-num-layers": "int",
             "--recompute-activations": "flag", "--sequence-parallel": "flag", "--use-distributed-optimizer": "flag",
             "--overlap-grad-reduce": "flag", "--bf16": "flag", "--fp16": "flag", "--num-layers": "int",
             "--hidden-size": "int", "--num-attention-heads": "int", "--ffn-hidden-size": "int",
             "--seq-length": "int", "--max-position-embeddings": "int", "--vocab-size": "int",
             "--tokenizer-type": "str", "--context-parallel-size": "int", "--expert-model-parallel-size": "int",
             "--expert-tensor-parallel-size": "int",
             "--num-query-groups": "int", "--group-query-attention": "flag", "--swiglu": "flag",
             "--fp8-format": "str", "--fp8-recipe": "str", "--decoder-first-pipeline-num-layers": "int",
             "--decoder-last-pipeline-num-layers": "int", "--use-torch-fsdp2": "flag", "--use-megatron-fsdp": "flag",
             **MOE_FLAGS}
# Flags whose setting the simulation cannot honour, with what would be needed (unless at the value given).
_MEGATRON_REFUSED = {"--expert-model-parallel-size": 1, "--group-query-attention": None,
                     "--swiglu": None, "--decoder-first-pipeline-num-layers": None,
                     "--decoder-last-pipeline-num-layers": None, "--use-torch-fsdp2": None, "--use-megatron-fsdp": None}


# Refused flags an MoE workload's arguments carry, checked against it instead (`moe_launch.read_megatron_moe`)
_MOE_HONOURED = ("--expert-model-parallel-size", "--group-query-attention", "--swiglu")


@dataclass(frozen=True)
class Imported:
    """A framework run read back: the launch, the workload (from the settings, or the one given), and the
    settings skipped because they do not change a step."""

    launch: Launch
    workload: Workload
    ignored: tuple[str, ...]


def from_megatron(args: str | list[str], workload: Workload | None = None, world_size: int | None = None,
                  source: str = "Megatron-LM arguments") -> Imported:
    """Megatron-LM command-line arguments (a list, or one string as a shell would split it); the data-parallel
    size is what `world_size` leaves, as in Megatron-LM. Model flags override the workload's dimensions."""
    words = shlex.split(args.replace("\\\n", " "), comments=True) if isinstance(args, str) else list(args)
    seen: dict[str, Any] = {}
    ignored: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, inline = word.partition("=")
        if not flag.startswith("--"):
            raise SpecError(f"{source}: {word!r} is not a --flag (Megatron-LM arguments are --name value)")
        kind = _MEGATRON.get(flag)
        takes = kind != "flag" and (bool(eq) or i + 1 < len(words) and not words[i + 1].startswith("--"))
        value = inline if eq else (words[i + 1] if takes else None)
        i += 1 + (takes and not eq)
        if kind is None:
            ignored.append(flag)
            continue
        if kind == "flag":
            seen[flag] = True
        elif value is None:
            raise SpecError(f"{source}: {flag} needs a value")
        elif kind == "int":
            if not value.lstrip("-").isdigit():
                raise SpecError(f"{source}: {flag} takes a whole number, got {value!r}")
            seen[flag] = int(value)
        else:
            seen[flag] = value
    moe = workload is not None and workload.moe is not None  # (its flags checked in `moe_launch`)
    for flag, allowed in _MEGATRON_REFUSED.items():
        if moe and flag in _MOE_HONOURED:
            continue
        if flag in seen and seen[flag] != allowed:
            raise SpecError(f"{source}: {flag}{'' if seen[flag] is True else ' ' + str(seen[flag])} is not simulated "
                            f"(the built-in strategies run {_WHY[flag]})")
    workload = _megatron_workload(seen, workload, source)
    ep = read_megatron_moe(seen, workload, source)
    tp, pp = seen.get("--tensor-model-parallel-size", 1), seen.get("--pipeline-model-parallel-size", 1)
    layers, chunks = None, 1
    if "--pipeline-model-parallel-layout" in seen:
        layers = _parse_layout(seen["--pipeline-model-parallel-layout"], source)
        if len(layers) % pp:
            raise SpecError(f"{source}: --pipeline-model-parallel-layout has {len(layers)} stages, not a multiple "
                            f"of --pipeline-model-parallel-size {pp}")
        chunks = len(layers) // pp
    elif "--num-virtual-stages-per-pipeline-rank" in seen:
        chunks = seen["--num-virtual-stages-per-pipeline-rank"]
    elif "--num-layers-per-virtual-pipeline-stage" in seen:
        per_stage, rest = divmod(workload.num_layers, pp)
        if rest or per_stage % seen["--num-layers-per-virtual-pipeline-stage"]:
            raise SpecError(f"{source}: --num-layers-per-virtual-pipeline-stage "
                            f"{seen['--num-layers-per-virtual-pipeline-stage']} does not divide the "
                            f"{workload.num_layers} layers per pipeline stage")
        chunks = per_stage // seen["--num-layers-per-virtual-pipeline-stage"]
    recompute = _megatron_recompute(seen, source)
    micro = seen.get("--micro-batch-size")
    if micro is None or micro < 1:
        raise SpecError(f"{source}: --micro-batch-size is missing (a whole number >= 1)")
    cp = seen.get("--context-parallel-size", 1)
    if cp < 1:
        raise SpecError(f"{source}: --context-parallel-size must be a whole number >= 1, got {cp}")
    world = _world(workload, tp * pp * cp, source, world_size)
    dp = world // (tp * pp * cp)
    launch = Launch("megatron", tp, pp, dp, micro, seen.get("--global-batch-size", micro * dp),
                    "interleaved" if chunks > 1 else "1f1b", chunks, recompute,
                    1 if seen.get("--use-distributed-optimizer") else 0, bool(seen.get("--sequence-parallel")),
                    bool(seen.get("--overlap-grad-reduce")), layers if layers and len(set(layers)) > 1 else None)
    launch = replace(launch, fp8=_megatron_fp8(seen, source), ep=ep, cp=cp,
                     etp=read_etp(seen, workload, tp, source), experts=workload.moe is not None)
    launch.check(workload.num_layers, source)
    return Imported(launch, workload, tuple(ignored))


def _megatron_fp8(seen: dict[str, Any], source: str) -> str:
    """The FP8 recipe of `--fp8-format hybrid` with `--fp8-recipe` (megatron-core's default: delayed), or ""."""
    if "--fp8-format" not in seen:
        return ""
    if seen["--fp8-format"] != "hybrid":
        raise SpecError(f"{source}: --fp8-format {seen['--fp8-format']} is not simulated (hybrid: E4M3 forward, "
                        f"E5M2 gradients)")
    recipe = seen.get("--fp8-recipe", "delayed")
    if recipe not in ("delayed", "tensorwise"):
        raise SpecError(f"{source}: --fp8-recipe {recipe} is not simulated (delayed or tensorwise)")
    return recipe


_WHY = {"--expert-model-parallel-size": "experts only with an MoE workload: give one, e.g. mixtral-8x7b",
        "--group-query-attention": "multi-head attention (a GPT's 12h^2 parameters a layer)",
        "--swiglu": "a GPT's 4h GeLU MLP",
        "--decoder-first-pipeline-num-layers": "even splits or --pipeline-model-parallel-layout",
        "--decoder-last-pipeline-num-layers": "even splits or --pipeline-model-parallel-layout",
        "--use-torch-fsdp2": "ZeRO-1 (--use-distributed-optimizer) with pipelines",
        "--use-megatron-fsdp": "ZeRO-1 (--use-distributed-optimizer) with pipelines"}


def _megatron_workload(seen: dict[str, Any], given: Workload | None, source: str) -> Workload:
    dims = {"num_layers": "--num-layers", "hidden": "--hidden-size", "heads": "--num-attention-heads",
            "seq_len": "--seq-length"}
    if given is None:
        missing = [flag for flag in dims.values() if flag not in seen]
        if missing:
            raise SpecError(f"{source}: {', '.join(missing)} missing (or give the workload)")
        given = Workload("megatron", *(seen[f] for f in dims.values()), seen.get("--vocab-size", 0))
    else:
        given = replace(given, **{k: seen[f] for k, f in dims.items() if f in seen},
                        **({"vocab": seen["--vocab-size"]} if "--vocab-size" in seen else {}))
    if given.moe is not None:
        if seen.get("--ffn-hidden-size", ffn_hidden(given)) != ffn_hidden(given):
            raise SpecError(f"{source}: --ffn-hidden-size {seen['--ffn-hidden-size']} is not workload {given.name}'s "
                            f"{ffn_hidden(given)}")
        return given
    ffn = seen.get("--ffn-hidden-size", 4 * given.hidden)
    if ffn != 4 * given.hidden:
        raise SpecError(f"{source}: --ffn-hidden-size {ffn} is not 4 x --hidden-size {given.hidden} (the GPT layer "
                        f"the cost model prices)")
    return given


def _megatron_recompute(seen: dict[str, Any], source: str) -> str:
    granularity = seen.get("--recompute-granularity", "selective" if seen.get("--recompute-activations") else None)
    if granularity is None:
        return "none"
    if granularity not in ("full", "selective"):
        raise SpecError(f"{source}: --recompute-granularity must be full or selective, got {granularity!r}")
    if granularity == "full":
        method, count = seen.get("--recompute-method"), seen.get("--recompute-num-layers", 1)
        if method not in (None, "uniform") or count != 1:
            raise SpecError(f"{source}: --recompute-method {method} --recompute-num-layers {count} recomputes part of "
                            f"the layers; simulated: every layer (uniform, 1)")
    return granularity


def _parse_layout(text: str, source: str) -> tuple[int, ...]:
    """Decoder layers of each stage of a --pipeline-model-parallel-layout (E and L on the first and last)."""
    import re
    flat = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):  # unrolled as Megatron-LM's parse_str_to_list does
        flat = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    if set(flat) - set("EtL|") or not stages[0].startswith("E") or not stages[-1].endswith("L") \
            or flat.count("E") != 1 or flat.count("L") != 1:
        raise SpecError(f"{source}: --pipeline-model-parallel-layout {text!r}: simulated layouts hold decoder "
                        f"layers 't', the embedding 'E' first and the loss 'L' last")
    layers = tuple(stage.count("t") for stage in stages)
    if 0 in layers:
        raise SpecError(f"{source}: --pipeline-model-parallel-layout {text!r} has a stage without decoder layers")
    return layers


def from_torchtitan(config: str | Path | dict, workload: Workload, world_size: int | None = None,
                    source: str | None = None) -> Imported:
    """A torchtitan v0.2.2 job config (TOML path, TOML text or parsed dict); the model's dimensions are the
    workload's (torchtitan takes them from the flavor's model args), its sequence length the config's."""
    data, source = _read(config, source, "torchtitan job config", tomllib.loads, tomllib.TOMLDecodeError)
    par, train = data.get("parallelism", {}), data.get("training", {})
    ac = data.get("activation_checkpoint", {})
    if par.get("expert_parallel_degree", 1) != 1:
        raise SpecError(f"{source}: parallelism.expert_parallel_degree = {par['expert_parallel_degree']} is not "
                        f"simulated")
    fp8 = _torchtitan_fp8(data, source)
    workload = _torchtitan_kernels(data.get("compile", {}), workload, source)
    if "seq_len" in train:
        workload = replace(workload, seq_len=_whole(train["seq_len"], f"{source}: training.seq_len"))
    flavor = data.get("model", {}).get("flavor")
    if flavor in TORCHTITAN_FLAVORS.values() and torchtitan_flavor(workload) != flavor:
        raise SpecError(f"{source}: model.flavor = {flavor!r} is torchtitan's Llama 3 "
                        f"{next(k for k, v in TORCHTITAN_FLAVORS.items() if v == flavor)}, but the workload given is "
                        f"{workload.name}; pass --workload for the model the config trains")
    tp, pp, cp = (_whole(par.get(k, 1), f"{source}: parallelism.{k}") for k in (
        "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree"))
    replicate = _whole(par.get("data_parallel_replicate_degree", 1), f"{source}: parallelism.data_parallel_replicate_degree")
    shard = par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        shard = _world(workload, tp * pp * cp * replicate, source, world_size) // (tp * pp * cp * replicate)
    shard = _whole(shard, f"{source}: parallelism.data_parallel_shard_degree")
    local = _whole(train.get("local_batch_size", 8), f"{source}: training.local_batch_size")
    dp = replicate * shard
    global_batch = train.get("global_batch_size", -1)
    global_batch = local * dp if global_batch == -1 else _whole(global_batch, f"{source}: training.global_batch_size")
    mode = _torchtitan_recompute(ac, workload, source)
    # torchtitan applies FSDP over the dp_shard x cp ranks whenever either is past 1 (dp_shard_cp mesh,
    # torchtitan/models/llama3/parallelize.py), HSDP with data_parallel_replicate_degree beside it
    fsdp = shard > 1 or cp > 1
    if cp > 1 and mode == "op":
        raise SpecError(f"{source}: activation_checkpoint selective_ac_option \"op\" with context_parallel_degree "
                        f"{cp} is not simulated; use mode \"full\" or \"none\"")
    schedule, chunks, micro, layers = "1f1b", 1, local, None
    if pp > 1:
        name = str(par.get("pipeline_parallel_schedule", "1F1B"))
        schedule = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved"}.get(name.lower())
        if schedule is None:
            raise SpecError(f"{source}: parallelism.pipeline_parallel_schedule = {name!r} is not simulated "
                            f"(1F1B, GPipe, Interleaved1F1B)")
        micro = _whole(par.get("pipeline_parallel_microbatch_size", 1),
                       f"{source}: parallelism.pipeline_parallel_microbatch_size")
        if global_batch != local * dp:
            raise SpecError(f"{source}: training.global_batch_size {global_batch} != local_batch_size {local} x dp {dp}: "
                            f"gradient accumulation over several pipeline flushes is not simulated")
        if local % micro:
            raise SpecError(f"{source}: training.local_batch_size {local} is not a multiple of "
                            f"parallelism.pipeline_parallel_microbatch_size {micro}")
        layers, chunks = _torchtitan_layers(par, pp, schedule, workload.num_layers, source)
    launch = Launch("torchtitan", tp, pp, dp, micro, global_batch, schedule, chunks, mode, 3 if fsdp else 0, tp > 1,
                    True, layers, fp8=fp8, cp=cp, replicate=replicate if fsdp else 1)
    launch.check(workload.num_layers, source)
    return Imported(launch, workload, ())


def _torchtitan_recompute(ac: dict, workload: Workload, source: str) -> str:
    """A launch's recompute from torchtitan's [activation_checkpoint]: mode "none" or "full", or "selective" with
    selective_ac_option "op", the per-op policy (recompute "op", `workload/per_op_checkpoint.py`), on a workload
    hybrid models it for; selective every n-th layer (a number, "2" by default) is refused."""
    mode = ac.get("mode", "selective")
    if mode not in ("none", "selective", "full"):
        raise SpecError(f"{source}: activation_checkpoint.mode = {mode!r} is not simulated (none, selective, full)")
    if mode != "selective":
        return mode
    option = ac.get("selective_ac_option", "2")
    if str(option) != "op":
        raise SpecError(f"{source}: activation_checkpoint.selective_ac_option = {option!r} (every n-th layer) is not "
                        f"simulated; use \"op\" or mode \"full\"")
    why = per_op_problem(workload)
    if why:
        raise SpecError(f"{source}: activation_checkpoint.selective_ac_option = \"op\" (per-op selective "
                        f"checkpointing) is simulated for a Llama block as torchtitan builds it; workload "
                        f"{workload.name}: {why}")
    return "op"


def _torchtitan_kernels(compile_: dict, workload: Workload, source: str) -> Workload:
    """The workload with the kernels `[compile]` gives: compiled ("model" among `components`, torchtitan v0.2.2's
    default ["model", "loss"]) fused, else eager PyTorch's (`workload/eager_kernels.py`). A config without
    `enable` keeps the workload's own kernels (torchtitan's default is off; such a config is read as before)."""
    if "enable" not in compile_:
        return workload
    enable, components = compile_["enable"], compile_.get("components", ["model", "loss"])
    if not isinstance(enable, bool):
        raise SpecError(f"{source}: compile.enable must be true or false, got {enable!r}")
    kernels = "fused" if enable and "model" in components else "eager"
    why = ("the layers are mixture-of-experts layers" if workload.moe is not None else eager_problem(workload)) \
        if kernels == "eager" else None
    if why:
        raise SpecError(f"{source}: compile without the model (eager PyTorch's kernels) is simulated for a Llama block "
                        f"as torchtitan builds it; workload {workload.name}: {why}")
    return replace(workload, kernels=kernels)


def _torchtitan_fp8(data: dict, source: str) -> str:
    """"tensorwise" for torchtitan's float8 converter (torchao's dynamic tensorwise scaling, its default), or its
    `recipe_name` "rowwise"; "" for none;
    `SpecError` for another converter or recipe."""
    converters = data.get("model", {}).get("converters") or []
    if not converters:
        return ""
    if converters not in (["quantize.linear.float8"], ["float8"]):
        raise SpecError(f"{source}: model.converters {converters} is not simulated (only [\"quantize.linear.float8\"])")
    recipe = data.get("quantize", {}).get("linear", {}).get("float8", {}).get("recipe_name") or "tensorwise"
    if recipe not in ("tensorwise", "rowwise"):
        raise SpecError(f"{source}: quantize.linear.float8.recipe_name = {recipe!r} is not simulated (tensorwise "
                        f"or rowwise)")
    return recipe


def _torchtitan_layers(par: dict, pp: int, schedule: str, num_layers: int, source: str
                       ) -> tuple[tuple[int, ...] | None, int]:
    parts = par.get("module_fqns_per_model_part")
    if parts is None:
        raise SpecError(f"{source}: parallelism.module_fqns_per_model_part is missing: torchtitan's default split "
                        f"weighs the embedding and output as layers (first/last_stage_less_layers), give the split")
    if not isinstance(parts, list) or len(parts) % pp:
        raise SpecError(f"{source}: parallelism.module_fqns_per_model_part must list a multiple of {pp} parts")
    expected, layers = 0, []
    for part in parts:
        count = 0
        for name in part:
            if name.startswith("layers."):
                if name != f"layers.{expected}":
                    raise SpecError(f"{source}: parallelism.module_fqns_per_model_part: {name} out of order "
                                    f"(expected layers.{expected})")
                expected += 1
                count += 1
        layers.append(count)
    if expected != num_layers:
        raise SpecError(f"{source}: parallelism.module_fqns_per_model_part holds {expected} layers, the workload {num_layers}")
    chunks = len(parts) // pp
    if (chunks > 1) != (schedule == "interleaved"):
        raise SpecError(f"{source}: {chunks} model part(s) a rank with pipeline_parallel_schedule {schedule}")
    return (None if len(set(layers)) == 1 else tuple(layers)), chunks


def from_deepspeed(config: str | Path | dict, workload: Workload, world_size: int | None = None,
                   source: str | None = None) -> Imported:
    """A DeepSpeed 0.16.5 JSON config (path, JSON text or parsed dict). The pipeline's stage count is
    `pipeline.stages` (the value `PipelineModule(num_stages=...)` takes)."""
    data, source = _read(config, source, "DeepSpeed config", json.loads, json.JSONDecodeError)
    micro = _whole(data.get("train_micro_batch_size_per_gpu"), f"{source}: train_micro_batch_size_per_gpu")
    steps = _whole(data.get("gradient_accumulation_steps", 1), f"{source}: gradient_accumulation_steps")
    total = _whole(data.get("train_batch_size"), f"{source}: train_batch_size")
    if total % (micro * steps):
        raise SpecError(f"{source}: train_batch_size {total} is not train_micro_batch_size_per_gpu {micro} x "
                        f"gradient_accumulation_steps {steps} x a data-parallel size")
    dp = total // (micro * steps)
    stage = data.get("zero_optimization", {}).get("stage", 0)
    pipe = data.get("pipeline", {})
    pp = pipe.get("stages", 1)
    tp = _whole(data.get("tensor_parallel", {}).get("autotp_size", 0) or 1, f"{source}: tensor_parallel.autotp_size")
    if pp == "auto":
        pp = _world(workload, 1, source, world_size) // (dp * tp)
    pp = _whole(pp, f"{source}: pipeline.stages")
    if stage not in (0, 1, 2, 3) or (stage >= 2 and (pp > 1 or tp > 1)):
        raise SpecError(f"{source}: zero_optimization.stage {stage} with pipeline.stages {pp}, autotp_size {tp}: "
                        f"DeepSpeed runs stage 2 and 3 without pipelines (pipe/engine.py), simulated without TP")
    if pipe.get("partition", "uniform") != "uniform" and pp > 1:
        raise SpecError(f"{source}: pipeline.partition {pipe['partition']!r} is not simulated (uniform)")
    interval = pipe.get("activation_checkpoint_interval", 0)
    if interval not in (0, 1):
        raise SpecError(f"{source}: pipeline.activation_checkpoint_interval {interval} is not simulated (0 or 1)")
    layers = uniform_split(workload.num_layers, pp)
    launch = Launch("deepspeed", tp, pp, dp, micro, total, "deepspeed" if pp > 1 and stage == 0 else "1f1b", 1,
                    "full" if interval else "none", stage, False, True, None if len(set(layers)) == 1 else layers)
    launch.check(workload.num_layers, source)
    return Imported(launch, workload, ())


def _read(config: Any, source: str | None, what: str, parse: Any, error: type) -> tuple[dict, str]:
    if isinstance(config, dict):
        return config, source or what
    text = str(config)
    if isinstance(config, Path) or not text.lstrip().startswith(("{", "[", "#")) and "\n" not in text:
        path = Path(config)
        source = source or f"{what} {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"{source}: cannot be read ({exc.strerror})") from None
    source = source or what
    try:
        data = parse(text)
    except error as exc:
        raise SpecError(f"{source}: not valid ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: not an object of settings")
    return data, source


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{where} must be a whole number >= 1, got {value!r}")
    return value


def _world(workload: Workload, model_parallel: int, source: str, world_size: int | None = None) -> int:
    """The world size the settings leave implicit (data parallelism fills it): given, or an error."""
    if world_size is None:
        raise SpecError(f"{source}: the data-parallel size follows from the world size; give the cluster")
    if world_size % model_parallel:
        raise SpecError(f"{source}: the cluster's {world_size} GPUs do not divide into groups of {model_parallel} "
                        f"(tensor x pipeline parallel)")
    return world_size


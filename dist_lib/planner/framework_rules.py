"""What a training framework runs, as limits on the plan search (`plan(..., framework=...)`).

Megatron-LM, torchtitan and DeepSpeed lay ranks out as one (pp, dp, tp) grid (`launch.Launch`): every stage
has the same width and TP degree, every GPU the same micro batch, and each framework has its own schedules
and sharding (`launch.SCHEDULES`, `Launch.from_plan`). `Rules` restates those limits so that the search
generates only plans inside them (stages of one width, one TP degree, even shares, the framework's schedules
and memory settings, DeepSpeed's uniform layer split), and `why_not` runs the very checks `export` runs, so a
plan the search keeps always exports. Uneven layer splits stay where the framework has them: Megatron-LM's
`--pipeline-model-parallel-layout` and torchtitan's `module_fqns_per_model_part`; DeepSpeed's
`PipelineModule(partition_method='uniform')` gives the first `L % p` stages one layer more
(`launch.uniform_split`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.planner.launch import FP8_RECIPES, FRAMEWORKS, NAMES, SCHEDULES, Launch, uniform_split
from dist_lib.planner.plan import Plan
from dist_lib.workload.per_op_checkpoint import workload_problem as per_op_problem

ANY = "any"
CHOICES = (ANY, *FRAMEWORKS)


@dataclass(frozen=True)
class Rules:
    """The plans one framework runs, as the search asks: which schedules, memory settings, TP degrees and
    layer splits."""

    framework: str

    @property
    def name(self) -> str:
        return NAMES[self.framework]

    def schedule_ok(self, schedule: str) -> bool:
        """A plan schedule (pipelines of two or more stages) the framework runs: `launch.SCHEDULES`."""
        return schedule in SCHEDULES[self.framework]

    def memory_ok(self, recompute: str, zero: int, stages: int, cp: int = 1) -> bool:
        """torchtitan shards only with FSDP (no ZeRO-1), and always with context parallelism (it applies
        `fully_shard` over the `dp_shard_cp` mesh when cp is enabled: torchtitan/models/llama3/parallelize.py);
        DeepSpeed has no selective recompute, and whole-layer checkpointing is a config key only in its pipeline
        engine (`Launch.from_plan`); FSDP is torchtitan's."""
        if self.framework == "torchtitan":
            return zero == 3 if cp > 1 else zero in (0, 3)
        if zero == 3:
            return False
        if self.framework == "deepspeed":
            return recompute == "none" or (recompute == "full" and stages > 1)
        return True

    def tp_ok(self, tp: int, stages: int) -> bool:
        """DeepSpeed's pipeline engine takes TP from the model's own code, not from its config (`export`)."""
        return not (self.framework == "deepspeed" and tp > 1 and stages > 1)

    def fixed_split(self, num_layers: int, stages: int) -> tuple[int, ...] | None:
        """The layers of each stage when the framework has no explicit split (DeepSpeed's uniform), else None."""
        return uniform_split(num_layers, stages) if self.framework == "deepspeed" else None

    def fp8_recipe(self, cluster: Any) -> str:
        """The FP8 scaling recipe the framework trains with (`launch.FP8_RECIPES`: Megatron-LM's default
        delayed scaling, torchtitan's tensorwise), when every GPU of `cluster` has FP8 tensor cores; else ""."""
        recipes = FP8_RECIPES[self.framework]
        return recipes[0] if recipes and all(node.device.fp8_flops for node in cluster.nodes) else ""

    def order_ok(self, ranks: tuple[int, ...], cluster: Any) -> bool:
        """torchrun and DeepSpeed's launcher start the same number of processes on every node."""
        return len({cluster.nodes[cluster.node_of(r)].gpus for r in ranks}) == 1


def settings(rules: Rules | None, workload: Any, cluster: Any, configs: tuple) -> tuple[tuple, tuple[str, ...]]:
    """(the (recompute, zero) settings a search weighs, in order; its GEMM precisions): torchtitan's sharding is
    FSDP (zero 3) where the others have ZeRO-1, and its selective recompute is the per-op policy ("op",
    `selective_ac_option = "op"`), weighed where hybrid models it (a dense Llama block timed by formula), where
    the others' is Megatron-LM's attention core ("selective"); a framework's FP8 recipe beside 16 bits where
    every GPU has FP8 tensor cores. An MoE workload's plans (Megatron-LM's) take all of them, as hybrid runs
    experts with recompute, FP8 and the distributed optimizer (`expert_modes_cost`)."""
    torchtitan = rules is not None and rules.framework == "torchtitan"
    per_op = torchtitan and per_op_problem(workload) is None
    configs = tuple(c for c in configs if c[0] != ("selective" if torchtitan else "op") and (c[0] != "op" or per_op))
    if torchtitan:
        configs = tuple((recompute, 3 if zero else 0) for recompute, zero in configs)
    recipe = rules.fp8_recipe(cluster) if rules is not None else ""
    return configs, ("",) + ((recipe,) if recipe else ())


def rules(framework: str | None) -> Rules | None:
    """The rules of `framework`; None for "any" (every plan, heterogeneous ones included)."""
    if framework is None or framework == ANY:
        return None
    if framework not in FRAMEWORKS:
        raise SpecError(f"framework must be one of {', '.join(CHOICES)}, got {framework!r}")
    return Rules(framework)


def moe_refusal(framework: str | None, workload: Any) -> str:
    """'' when the search can plan `workload`'s experts for `framework` (Megatron-LM's
    `--expert-model-parallel-size`, and "any", whose MoE plans run in Megatron-LM's layout as `hybrid` runs
    experts), else why not, in one line."""
    if framework == "deepspeed":
        return (f"no plan DeepSpeed runs for {workload.name}'s experts: DeepSpeed-MoE sets expert parallelism "
                f"(ep_size) in the model's code (deepspeed.moe.layer.MoE), not in its config; --framework megatron "
                f"plans one")
    if framework == "torchtitan":
        return (f"no plan torchtitan runs for {workload.name}'s experts is exported: torchtitan v0.2.2's MoE "
                f"models (llama4, deepseek_v3) are not described here; --framework megatron plans one")
    return ""


def with_experts(framework: str | None, workload: Any) -> tuple[Rules | None, str]:
    """(the rules a search for `workload` keeps to, '' or why no plan): an MoE workload's plans run as hybrid
    runs experts (EP x PP x DP), in Megatron-LM's layout, also when the search is for "any" framework."""
    found = rules(framework)
    if workload.moe is None:
        return found, ""
    return found or Rules("megatron"), moe_refusal(framework, workload)


def experts_reason(reasons: list[str], workload: Any) -> list[str]:
    """Why no plan fits, told right for an MoE workload (its plans searched with expert TP 1)."""
    if workload.moe is None or not reasons:
        return reasons
    return [reasons[0].replace("full recompute and ZeRO-1", "full recompute, the distributed optimizer and every "
                               "ep (expert TP 1)")]


def why_not(plan: Plan, framework: str, cluster: Any, workload: Any) -> str:
    """'' when `framework` runs `plan` (it exports, node order included), else why not, in one line."""
    from dist_lib.planner.export import export
    try:
        export(plan, framework, workload, cluster)
    except SpecError as exc:
        return str(exc).splitlines()[0]
    return ""


def runners(plan: Plan, cluster: Any, workload: Any) -> list[str]:
    """The frameworks that run `plan` as it is."""
    return [f for f in FRAMEWORKS if not why_not(plan, f, cluster, workload)]


def batch_settings(plan: Plan, framework: str, num_layers: int) -> str:
    """The per-GPU micro batch and the accumulation steps as `framework` names them."""
    launch = Launch.from_plan(plan, framework, num_layers)
    micro, steps, total = launch.micro_batch_size, launch.microbatches, launch.global_batch_size
    if framework == "megatron":
        return f"--micro-batch-size {micro} --global-batch-size {total} ({steps} microbatches)"
    if framework == "torchtitan":
        if launch.pp > 1:
            return f"local_batch_size {micro * steps}, pipeline_parallel_microbatch_size {micro}"
        return f"local_batch_size {micro}, global_batch_size {total} ({steps} accumulation steps)"
    return f"train_micro_batch_size_per_gpu {micro}, gradient_accumulation_steps {steps}"


def runners_note(plan: Plan, cluster: Any, workload: Any) -> str:
    """Which runtime executes the best plan of an unrestricted search, in one line."""
    found = runners(plan, cluster, workload)
    if found:
        return (f"runs as it is in {', '.join(NAMES[f] for f in found)} (python -m grader export PLAN --to "
                f"{found[0]})")
    reason = why_not(plan, "megatron", cluster, workload).removeprefix("plan: ")
    return (f"no framework runs this plan as it is ({reason}): it needs a heterogeneous runtime such as Metis' or "
            f"FlashFlex's; --framework megatron, torchtitan or deepspeed plans for one")

"""A launch: the settings a training framework runs a (homogeneous) plan with, framework-neutral.

Megatron-LM, torchtitan and DeepSpeed all lay ranks out as one (pp, dp, tp) grid with the tensor-parallel
rank fastest and the pipeline stage slowest (Megatron-LM's default order "tp-cp-ep-dp-pp", torchtitan's mesh
["pp", "dp_replicate", "fsdp", "tp"], DeepSpeed's `PipeModelDataParallelTopology` axes ['pipe', 'data',
'model']), with one tp, one dp and one per-GPU micro batch for every stage. A `Launch` holds exactly that;
`from_plan` refuses, naming what does not fit, a plan that needs more (per-stage widths, uneven per-replica
shares, a schedule or sharding the framework lacks). `strategy` names the built-in strategy that runs the
launch as the framework does: `hybrid` (Megatron-LM's layout) with the matching schedule, or `planned` where
hybrid lacks the setting (ZeRO-1, the distributed optimizer), or `zero` for fully sharded data parallelism.
Flag and key names, with the versions read, are in `export.py` and `launch_import.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.planner.plan import Plan, Stage

FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")
# The plan schedules each framework runs (pp > 1). Megatron-LM: 1F1B, and interleaved 1F1B with virtual
# stages (core/pipeline_parallel/schedules.py); torchtitan: PyTorch's Schedule1F1B, ScheduleGPipe,
# ScheduleInterleaved1F1B (its zero-bubble schedules are interleaved or V-shaped, not ZB-H1); DeepSpeed:
# its own lock-step TrainSchedule, which `hybrid` runs as schedule "deepspeed".
SCHEDULES = {"megatron": ("1f1b", "interleaved"), "torchtitan": ("gpipe", "1f1b", "interleaved"),
             "deepspeed": ("1f1b",)}

# The FP8 scaling recipes (`costs.fp8.RECIPES`) each framework's FP8 training runs: Megatron-LM's
# `--fp8-recipe` delayed (its default) or tensorwise (Transformer Engine); torchtitan's float8 converter,
# torchao's dynamic tensorwise scaling (`recipe_name` "tensorwise", the one a search weighs) or rowwise
# (`recipe_name` "rowwise", `Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]` in torchtitan v0.2.2's
# config/job_config.py; `--float8.recipe_name rowwise` on the command line of mid-2025's torchtitan, docs/float8.md);
# none exported for DeepSpeed.
FP8_RECIPES = {"megatron": ("delayed", "tensorwise"), "torchtitan": ("tensorwise", "rowwise"), "deepspeed": ()}


# The recompute modes a framework has no setting for, with what it has instead: Megatron-LM's
# `--recompute-granularity` is full or selective (the attention core, Korthikanti et al. 2022); torchtitan's
# `activation_checkpoint.mode` is none, full or selective, whose `selective_ac_option = "op"` is the per-op policy
# (`workload/per_op_checkpoint.py`) and a number every n-th layer whole; DeepSpeed checkpoints whole layers.
RECOMPUTE_NAMES = {"selective": "Megatron-LM's attention-core recompute, Korthikanti et al. 2022",
                   "op": "torchtitan's per-op selective activation checkpointing"}
NO_RECOMPUTE_SETTING = {
    "megatron": {"op": "--recompute-granularity is full or selective, the attention core alone"},
    "torchtitan": {"selective": 'its selective_ac_option = "op" is the per-op policy, recompute \'op\', and a '
                                'number checkpoints every n-th layer whole'},
    "deepspeed": {mode: "its pipeline engine checkpoints whole layers: activation_checkpoint_interval"
                  for mode in ("selective", "op")}}


@dataclass(frozen=True)
class Launch:
    """One framework run: a (pp, dp, tp) grid, `chunks` virtual stages a rank, a per-GPU micro batch."""

    framework: str
    tp: int
    pp: int
    dp: int
    micro_batch_size: int  # samples per GPU per microbatch (Megatron-LM's --micro-batch-size)
    global_batch_size: int
    schedule: str = "1f1b"  # a plan schedule, or "deepspeed" (DeepSpeed's TrainSchedule)
    chunks: int = 1
    recompute: str = "none"
    zero: int = 0  # 0, 1 (ZeRO-1 / distributed optimizer), 3 (FSDP: torchtitan's, over the dp x cp ranks)
    sequence_parallel: bool = False
    overlap_grad_reduce: bool = True
    layers: tuple[int, ...] | None = None  # layers of each block, chunk-major; None: an even split
    notes: tuple[str, ...] = field(default=(), compare=False)
    fp8: str = ""  # the linear layers' GEMMs in FP8 with this scaling recipe (`costs.fp8`), or "": 16-bit
    ep: int = 1  # expert parallelism (an MoE workload): EP groups of `ep` data-parallel ranks (Megatron-Core)
    cp: int = 1  # context parallelism: cp ranks hold s/cp tokens each of a replica's samples (Megatron-Core)
    etp: int = 0  # expert tensor parallelism (`Plan.etp`; 0: not set, the TP size as Megatron-Core defaults it)
    experts: bool = False  # an MoE workload's run: hybrid's expert stage, sequence-parallel with TP
    replicate: int = 1  # HSDP: FSDP inside dp / replicate replicas, across `replicate` groups (torchtitan's)

    @property
    def microbatches(self) -> int:
        """Microbatches each replica runs a step (gradient accumulation steps)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def blocks(self, num_layers: int) -> list[tuple[int, int]]:
        """(start, stop) of each block, chunk-major."""
        parts = self.pp * self.chunks
        sizes = self.layers or (num_layers // parts,) * parts
        out, start = [], 0
        for size in sizes:
            out.append((start, start + size))
            start += size
        return out

    def check(self, num_layers: int, source: str) -> None:
        """Raise `SpecError` when the batch or layer split does not fit."""
        if self.global_batch_size % (self.micro_batch_size * self.dp):
            raise SpecError(f"{source}: global batch {self.global_batch_size} is not a multiple of micro batch "
                            f"{self.micro_batch_size} x data-parallel size {self.dp}")
        parts = self.pp * self.chunks
        if self.layers is None and num_layers % parts:
            raise SpecError(f"{source}: {num_layers} layers do not split evenly into {parts} pipeline blocks "
                            f"(pp {self.pp} x virtual stages {self.chunks})")
        if self.layers is not None and (len(self.layers) != parts or sum(self.layers) != num_layers):
            raise SpecError(f"{source}: layer split {list(self.layers)} must give {parts} blocks, "
                            f"{num_layers} layers in all")

    # ---- from and to a plan -------------------------------------------------------------------

    @classmethod
    def from_plan(cls, plan: Plan, framework: str, num_layers: int, experts: bool = False) -> Launch:
        """The launch that runs `plan` in `framework` (`experts`: of an MoE workload); `SpecError` naming what
        the framework cannot run."""
        if framework not in FRAMEWORKS:
            raise SpecError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
        name = _NAMES[framework]
        first = plan.stages[0]
        for i, stage in enumerate(plan.stages):
            if (stage.tp, stage.dp) != (first.tp, first.dp):
                widths = ", ".join(f"{s.dp}x{s.tp}" for s in plan.stages)
                raise SpecError(f"plan: stages of different widths (dp x tp: {widths}); {name} runs one dp and "
                                f"one tp for every stage (stages[{i}] differs)")
            if len(set(stage.shares)) > 1:
                raise SpecError(f"plan: stages[{i}].shares {list(stage.shares)} cut a microbatch unevenly among "
                                f"replicas; {name} gives every GPU the same micro batch")
        pp, notes = len(plan.stages), []
        schedule = plan.schedule if pp > 1 else "1f1b"
        if schedule not in SCHEDULES[framework]:
            raise SpecError(f"plan: schedule {plan.schedule!r} is not one {name} runs "
                            f"({', '.join(SCHEDULES[framework])})")
        if framework == "deepspeed" and pp > 1 and not plan.zero:
            schedule = "deepspeed"
        elif framework == "deepspeed" and pp > 1:
            notes.append("DeepSpeed's lock-step pipeline schedule is simulated without ZeRO only: with stage 1 the "
                         "imported run is 1F1B (Narayanan et al. 2021) with the optimizer state sharded")
        sizes = tuple(stop - start for start, stop in
                      (block for c in range(plan.chunks) for block in (s.blocks[c] for s in plan.stages)))
        even = len(set(sizes)) == 1
        if framework == "deepspeed" and sizes != uniform_split(num_layers, pp):
            raise SpecError(f"plan: layer split {list(sizes)} is not DeepSpeed's partition_method='uniform' "
                            f"split {list(uniform_split(num_layers, pp))}; DeepSpeed's PipelineModule takes no "
                            f"explicit list of layers per stage")
        if plan.replicate != 1 and framework != "torchtitan":
            raise SpecError(f"plan: replicate={plan.replicate} (HSDP) is exported for torchtitan only "
                            f"(data_parallel_replicate_degree)")
        if plan.zero == 3 and framework != "torchtitan":
            raise SpecError(f"plan: zero=3 (FSDP) is exported for torchtitan only (data_parallel_shard_degree)")
        if framework == "torchtitan" and plan.zero == 1:
            raise SpecError("plan: zero=1 (optimizer state sharded) has no torchtitan setting: torchtitan "
                            "shards with FSDP (data_parallel_shard_degree), which also shards weights and gradients")
        if plan.recompute in NO_RECOMPUTE_SETTING[framework]:
            raise SpecError(f"plan: recompute {plan.recompute!r} ({RECOMPUTE_NAMES[plan.recompute]}) has no {name} "
                            f"setting ({NO_RECOMPUTE_SETTING[framework][plan.recompute]})")
        if framework == "deepspeed" and plan.recompute == "full" and pp == 1:
            raise SpecError("plan: recompute 'full' without pipeline stages has no DeepSpeed config key "
                            "(it is deepspeed.checkpointing in the model's code)")
        if plan.fp8 and plan.fp8 not in FP8_RECIPES[framework]:
            raise SpecError(f"plan: fp8 {plan.fp8!r} has no {name} setting"
                            + (f" (it runs {' or '.join(FP8_RECIPES[framework])} scaling)" if FP8_RECIPES[framework]
                               else " (no FP8 training setting is exported for it)"))
        if plan.cp > 1 and framework == "torchtitan" and plan.zero != 3:
            raise SpecError(f"plan: cp={plan.cp} with zero={plan.zero}: torchtitan shards with FSDP over the data-"
                            f"parallel and context-parallel ranks whenever cp > 1 (its dp_shard_cp mesh); plan zero=3")
        if plan.cp > 1 and framework == "deepspeed":
            raise SpecError(f"plan: cp={plan.cp} has no DeepSpeed config key (it has no context parallelism)")
        if plan.ep > 1 and framework == "deepspeed":
            raise SpecError(f"plan: ep={plan.ep} has no DeepSpeed config key (DeepSpeed-MoE takes ep_size in the "
                            f"model's code, deepspeed.moe.layer.MoE)")
        # (Megatron-Core runs MoE layers with TP only sequence-parallel: `_expert_stage.check_expert_options`)
        sequence_parallel = (framework == "torchtitan" or experts) and first.tp > 1
        if sequence_parallel and framework == "torchtitan":
            notes.append("torchtitan's tensor parallelism always runs sequence parallelism (SequenceParallel on "
                         "the norms), which the plan does not: the imported run simulates it")
        return cls(framework, first.tp, pp, first.dp // plan.cp, first.shares[0], plan.global_batch_size, schedule,
                   plan.chunks, plan.recompute, plan.zero, sequence_parallel, True, None if even else sizes,
                   tuple(notes), plan.fp8, plan.ep, plan.cp, plan.etp, experts, plan.replicate)

    def to_plan(self, num_layers: int) -> Plan:
        """The plan this launch runs, on ranks 0.. in the framework's order."""
        if self.zero not in (0, 1, 3) or self.sequence_parallel and not self.experts or self.schedule == "deepspeed":
            raise SpecError(f"{_NAMES[self.framework]} run: zero={self.zero}, sequence parallelism or DeepSpeed's "
                            f"schedule have no plan field; run it with `strategy()`")
        blocks, width = self.blocks(num_layers), self.dp * self.cp * self.tp
        stages = tuple(Stage(tuple(range(s * width, (s + 1) * width)), self.tp,
                             tuple(blocks[c * self.pp + s] for c in range(self.chunks)), (self.micro_batch_size,) * self.dp)
                       for s in range(self.pp))
        return Plan(stages, self.micro_batch_size * self.dp, self.microbatches, self.schedule, self.recompute, self.zero,
                    self.fp8, self.ep, self.cp, self.etp, self.replicate)

    def strategy(self, num_layers: int) -> tuple[str, dict[str, Any]]:
        """(built-in strategy, its options) that runs this launch as the framework does."""
        if self.zero >= 2 and self.tp == self.pp == self.cp == self.replicate == 1 and self.recompute == "none" \
                and not self.fp8:
            # (the zero strategy has no recompute, FP8 or context parallelism)
            return "zero", {"stage": self.zero, "microbatch_size": self.micro_batch_size}
        if self.zero == 1 and not self.experts and self.cp == 1:
            return "planned", {"plan": self.to_plan(num_layers)}
        options: dict[str, Any] = {"tp": self.tp, "pp": self.pp, "dp": self.dp,
                                   "microbatch_size": self.micro_batch_size, "schedule": self.schedule,
                                   "chunks": self.chunks}
        for key, value in (("recompute", "op" if self.recompute == "op" else self.recompute == "full"),
                           ("selective_recompute", self.recompute == "selective"),
                           ("sequence_parallel", self.sequence_parallel),
                           ("overlap_grad_reduce", self.overlap_grad_reduce)):
            if value != (key == "overlap_grad_reduce"):
                options[key] = value
        if self.layers is not None:
            options["partition"] = list(self.layers)
        if self.fp8:
            options["fp8"] = self.fp8
        for key in ("ep", "cp"):
            if getattr(self, key) > 1:
                options[key] = getattr(self, key)
        if self.cp > 1 and self.framework == "torchtitan":  # PyTorch's context-parallel SDPA, all-gather rotater
            options["kv_exchange"] = "torch_all_gather"
        if self.etp:
            options["etp"] = self.etp
        if self.zero == 1:  # (experts: the experts' state over expert-DP; cp: over the dp x cp ranks)
            options["distributed_optimizer"] = True
        if self.zero == 3:  # FSDP beside TP (torchtitan's FSDP2 over the data-parallel ranks): hybrid's fsdp
            options["fsdp"] = True
        if self.replicate != 1:  # HSDP: FSDP inside each of `replicate` groups of replicas
            options["replicate"] = self.replicate
        return "hybrid", options


def node_order(plan: Plan, cluster: Any) -> list[int]:
    """The cluster's nodes in launch order (node rank 0 first): the framework's global rank g runs on plan
    rank `plan.ranks[g]`, and launchers number ranks node by node (node_rank x GPUs a node + local rank)."""
    ranks = plan.ranks
    order, g = [], 0
    while g < len(ranks):
        node = cluster.node_of(ranks[g])
        mine = list(cluster.ranks_of_node(node))
        if ranks[g:g + len(mine)] != mine:
            raise SpecError(f"plan: framework ranks {g}..{g + len(mine) - 1} run on cluster ranks "
                            f"{ranks[g:g + len(mine)]}, not on the whole of node {node} ({mine[0]}..{mine[-1]}) "
                            f"in order; launchers start whole nodes, local ranks in order")
        order.append(node)
        g += len(mine)
    if len({cluster.nodes[n].gpus for n in order}) > 1:
        raise SpecError("plan: its nodes have different GPU counts; torchrun and DeepSpeed's launcher start the "
                        "same number of processes on every node")
    return order


def uniform_split(num_layers: int, parts: int) -> tuple[int, ...]:
    """Layers per stage of DeepSpeed's `partition_uniform` (deepspeed/runtime/utils.py, 0.16.5): the first
    `num_layers % parts` stages take one layer more."""
    size, extra = divmod(num_layers, parts)
    return tuple(size + (i < extra) for i in range(parts))


NAMES = {"megatron": "Megatron-LM", "torchtitan": "torchtitan", "deepspeed": "DeepSpeed"}
_NAMES = NAMES

"""Megatron-LM's distributed optimizer with experts (`--use-distributed-optimizer` with an MoE model).

Megatron-Core keeps two gradient buffers: the dense parameters' are reduce-scattered over the data-parallel
group and the experts' over the expert-data-parallel group (megatron/core/distributed/
distributed_data_parallel.py: the expert buffers take `intra_expt_dp_group` as their data-parallel group),
and the distributed optimizer shards each parameter's fp32 master copy and Adam moments over the group its
gradient was reduce-scattered in (megatron/core/optimizer/distrib_optimizer.py). So on each rank: the 16-bit
weights and the gradient buffers whole, 1/dp of the dense optimizer state and 1/edp of the experts'; after
the step, each group all-gathers its updated 16-bit shards. As `_sharded.ShardedStage` with
`sharding="optimizer"`, one layer per bucket, beside `_expert_stage`'s round trip. With `overlap_param_gather`
(`--overlap-param-gather`) the step ends with the updated shards, and each layer's dense weights and its experts'
are gathered (over the data-parallel and the expert-data-parallel group) before the layer's first forward, the
next layer's gathers in flight (`_sharded.ParamGathers`; Megatron-Core's bucket groups for the expert parameters
dispatch their all-gathers from the same forward pre-hook as the dense ones: distributed_data_parallel.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from dist_lib import Model, Work

from ._expert_stage import ExpertPlan, _ExpertStage, run_expert_stage
from ._pipeline import StagePlan
from ._sharded import ParamGathers


class ShardedExpertStage(_ExpertStage):
    """`_ExpertStage` with the dense optimizer state sharded over the DP group and the experts' over the
    expert-DP group."""

    __slots__ = ("dp_ranks", "shard", "expert_shard", "overlap_param_gather", "expert_gathers")

    def __init__(self, model: Model, plan: StagePlan, experts: ExpertPlan, overlap_param_gather: bool = False):
        self.dp_ranks = list(plan.dp_group(0))
        self.shard = self.dp_ranks.index(model.rank)
        self.expert_shard = experts.expert_dp_group.index(model.rank)
        self.overlap_param_gather = overlap_param_gather
        super().__init__(model, plan, experts)
        group = experts.expert_dp_group
        if overlap_param_gather and len(self.dp_ranks) > 1:  # (the whole weight takes the shard's place)
            self.gathers = ParamGathers(model, self.dp_ranks, self.weights, reshard_after_forward=False, keep=True)
        self.expert_gathers = ParamGathers(model, group, self.experts, reshard_after_forward=False, keep=True) \
            if overlap_param_gather and len(group) > 1 else None

    def load(self, layer: int) -> tuple:
        """The dense part: its TP slice's 16-bit weights whole (a 1/dp shard of them, to be gathered, with
        `overlap_param_gather`), 1/dp of its optimizer state."""
        model, tp, tp_rank = self.model, len(self.plan.tp_group), self.plan.tp_rank
        load = model.load_weights if self.overlap_param_gather else model.load_sharded_state
        return load(layer, self.shard, len(self.dp_ranks), tp_rank=tp_rank, tp_size=tp)

    def load_experts(self, layer: int) -> tuple:
        """The experts: 16-bit weights whole (a 1/edp shard, with `overlap_param_gather`), 1/edp of their
        optimizer state."""
        plan, model = self.expert_plan, self.model
        shard = dict(tp_rank=plan.etp_rank, tp_size=plan.etp) if plan.etp > 1 else {}
        if self.overlap_param_gather:
            return model.load_experts(layer, plan.my_experts, **shard, shard=self.expert_shard,
                                      num_shards=len(plan.expert_dp_group))
        weight, _ = model.load_experts(layer, plan.my_experts, **shard)
        _, opt_state = model.load_experts(layer, plan.my_experts, **shard, shard=self.expert_shard,
                                          num_shards=len(plan.expert_dp_group))
        return weight, opt_state

    def reduce(self, grad, group: Sequence[int]):
        return self.model.reduce_scatter(grad, group)

    def _reduce_experts(self, layer: int) -> None:
        group = self.expert_plan.expert_dp_group
        grad = self.expert_grads.pop(layer)
        self.expert_reduced[layer] = self.model.reduce_scatter(grad, group) if len(group) > 1 else grad

    async def gather(self, layer: int, layers: range) -> None:
        """Before a layer's forward with `overlap_param_gather`: its dense and its experts' all-gathers awaited (or
        started), the next layer's started."""
        if self.gathers is not None:
            await self.gathers.get(layer, layers, False)
        if self.expert_gathers is not None and layer in self.experts:
            await self.expert_gathers.get(layer, self.expert_layers(layers), False)

    def expert_layers(self, layers: range) -> tuple[int, ...]:
        return tuple(layer for layer in layers if layer in self.experts)

    async def update_all(self) -> None:
        await self.finish_gradients()
        model = self.model
        gathered: dict = {}
        overlap = self.overlap_param_gather  # (then the next step's forward gathers the updated shards)
        for layer in sorted(self.weights, reverse=True):  # the dense parts: step the shard, gather the weights
            new_weight, _ = await self.step_layer(model.update, layer, self.reduced, self.weights)
            gathered[("dense", layer)] = model.all_gather(new_weight, self.dp_ranks) \
                if len(self.dp_ranks) > 1 and not overlap else new_weight
            del new_weight
        group = self.expert_plan.expert_dp_group
        for layer in sorted(self.experts, reverse=True):  # the experts: the same over the expert-DP group
            new_weight, _ = await self.step_layer(model.update_experts, layer, self.expert_reduced, self.experts)
            gathered[("experts", layer)] = model.all_gather(new_weight, group) \
                if len(group) > 1 and not overlap else new_weight
            del new_weight
        for (what, layer), weight in gathered.items():
            if isinstance(weight, Work):
                weight = await weight
            if what == "dense":
                model.set_final_weight(layer, weight)
            else:
                model.set_final_experts(layer, weight)
            del weight


def run_sharded_expert_stage(model: Model, plan: StagePlan, experts: ExpertPlan, sharding: str,
                             overlap_param_gather: bool = False):
    """This rank's part of the pipeline with expert-parallel MoE layers, to await: with `sharding` "optimizer",
    the distributed optimizer's (`ShardedExpertStage`), else `_expert_stage`'s."""
    if sharding == "optimizer":
        return ShardedExpertStage(model, plan, experts, overlap_param_gather).run()
    return run_expert_stage(model, plan, experts)

"""Megatron-LM's distributed optimizer with experts (`--use-distributed-optimizer` with an MoE model).

Megatron-Core keeps two gradient buffers: the dense parameters' are reduce-scattered over the data-parallel
group and the experts' over the expert-data-parallel group (megatron/core/distributed/
distributed_data_parallel.py: the expert buffers take `intra_expt_dp_group` as their data-parallel group),
and the distributed optimizer shards each parameter's fp32 master copy and Adam moments over the group its
gradient was reduce-scattered in (megatron/core/optimizer/distrib_optimizer.py). So on each rank: the 16-bit
weights and the gradient buffers whole, 1/dp of the dense optimizer state and 1/edp of the experts'; after
the step, each group all-gathers its updated 16-bit shards. As `_sharded.ShardedStage` with
`sharding="optimizer"` without `overlap_param_gather`, one layer per bucket, beside `_expert_stage`'s round trip.
"""

from __future__ import annotations

from collections.abc import Sequence

from dist_lib import Model, Work

from ._expert_stage import ExpertPlan, _ExpertStage, run_expert_stage
from ._pipeline import StagePlan


class ShardedExpertStage(_ExpertStage):
    """`_ExpertStage` with the dense optimizer state sharded over the DP group and the experts' over the
    expert-DP group."""

    __slots__ = ("dp_ranks", "shard", "expert_shard")

    def __init__(self, model: Model, plan: StagePlan, experts: ExpertPlan):
        self.dp_ranks = list(plan.dp_group(0))
        self.shard = self.dp_ranks.index(model.rank)
        self.expert_shard = experts.expert_dp_group.index(model.rank)
        super().__init__(model, plan, experts)

    def load(self, layer: int) -> tuple:
        """The dense part: its TP slice's 16-bit weights whole, 1/dp of its optimizer state."""
        model, tp, tp_rank = self.model, len(self.plan.tp_group), self.plan.tp_rank
        return model.load_sharded_state(layer, self.shard, len(self.dp_ranks), tp_rank=tp_rank, tp_size=tp)

    def load_experts(self, layer: int) -> tuple:
        """The experts: 16-bit weights whole, 1/edp of their optimizer state."""
        plan, model = self.expert_plan, self.model
        shard = dict(tp_rank=plan.etp_rank, tp_size=plan.etp) if plan.etp > 1 else {}
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

    async def update_all(self) -> None:
        await self.finish_gradients()
        model = self.model
        gathered: dict = {}
        for layer in sorted(self.weights, reverse=True):  # the dense parts: step the shard, gather the weights
            new_weight, _ = await self.step_layer(model.update, layer, self.reduced, self.weights)
            gathered[("dense", layer)] = model.all_gather(new_weight, self.dp_ranks) if len(self.dp_ranks) > 1 \
                else new_weight
            del new_weight
        group = self.expert_plan.expert_dp_group
        for layer in sorted(self.experts, reverse=True):  # the experts: the same over the expert-DP group
            new_weight, _ = await self.step_layer(model.update_experts, layer, self.expert_reduced, self.experts)
            gathered[("experts", layer)] = model.all_gather(new_weight, group) if len(group) > 1 else new_weight
            del new_weight
        for (what, layer), weight in gathered.items():
            if isinstance(weight, Work):
                weight = await weight
            if what == "dense":
                model.set_final_weight(layer, weight)
            else:
                model.set_final_experts(layer, weight)
            del weight


def run_sharded_expert_stage(model: Model, plan: StagePlan, experts: ExpertPlan, sharding: str):
    """This rank's part of the pipeline with expert-parallel MoE layers, to await: with `sharding` "optimizer",
    the distributed optimizer's (`ShardedExpertStage`), else `_expert_stage`'s."""
    if sharding == "optimizer":
        return ShardedExpertStage(model, plan, experts).run()
    return run_expert_stage(model, plan, experts)

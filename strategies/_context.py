"""A pipeline stage whose ranks run context-parallel (Megatron-Core's `--context-parallel-size`): each of the
`cp` ranks of a CP group holds s/cp tokens of every microbatch's samples (`Model.context_input`), every
layer's attention takes the other ranks' keys and values over the CP group (`Model.context_forward`: a ring
of cp - 1 exchanges overlapped with the attention blocks, Llama 3's all-gather, or PyTorch's context-parallel
SDPA: `costs.torch_context`), and each layer's weight
gradient, which covers this rank's sequence part only, is reduced over the dp x cp ranks of its stage
and TP slice (`_plan.context_plan`). With TP, each layer's output and input gradient are all-reduced in the
TP group after the layer; pipeline messages carry a rank's own sequence part whole (no scatter-gather).

The modes of a plain stage carry over: FP8 linear layers, selective recompute and sequence parallelism (the
norms and dropouts of a CP rank's s/cp tokens split over its TP group, whose backward all-gathers the output
gradient twice, as without CP) are the layer's compute mode; full recompute keeps only each layer's input
(with sequence parallelism, as this TP rank's 1/t piece of it, all-gathered before the recompute, as a plain
stage keeps its sequence shard) and re-runs the layer's forward, its K/V exchange and TP all-reduce included,
before the backward (Megatron-Core recomputes the whole `TransformerLayer`, CP attention included). With
`distributed_optimizer` or `fsdp` the data-parallel state is sharded over the dp x cp ranks
(`_sharded.ShardedStage`): Megatron-Core's distributed optimizer shards over
`get_data_parallel_group(with_context_parallel=True)` (megatron/core/optimizer/__init__.py), and torchtitan
applies `fully_shard` over the flattened `dp_shard_cp` mesh (torchtitan/distributed/parallel_dims.py,
torchtitan/models/llama3/parallelize.py): the CP ranks of a replica hold different shards of the same
weights, so each layer's gradient is reduce-scattered over dp x cp and the weights gathered over it; with
FSDP each layer's whole gradient is freed once its reduce-scatter is done (FSDP2's post-backward, as
`_sharded.ShardedStage.settle`).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from dist_lib import Model

from ._pipeline import StagePlan, _Stage
from ._sharded import ShardedStage


def run_context_stage(model: Model, plan: StagePlan, sharding: str = "none", **options) -> Coroutine[Any, Any, None]:
    """This rank's part of a context-parallel pipeline, to await; `sharding` as `_sharded.run_sharded_stage`."""
    if sharding == "none":
        return _ContextStage(model, plan).run()
    replicate, dp = options.get("replicate", 1), len(plan.dp_group(0)) // len(plan.cp_group)
    if dp % replicate:
        raise ValueError(f"replicate={replicate} with cp={len(plan.cp_group)}: HSDP replicates whole replicas "
                         f"(torchtitan's dp_replicate x dp_shard x cp mesh); choose a replicate that divides dp={dp}")
    return _ShardedContextStage(model, plan, sharding, **options).run()


class _ContextPasses:
    """The forward and backward of a context-parallel stage, for a `_Stage` (or `ShardedStage`) subclass
    that sets `cp_group` (no slots of its own, so that it mixes into either)."""

    __slots__ = ()

    def _context_setup(self, model: Model, plan: StagePlan) -> None:
        self.cp_group = model.group(plan.cp_group)
        self.context_modes = {"kv_exchange": plan.kv_exchange}
        if plan.selective_recompute:
            self.context_modes["selective_recompute"] = True
        if plan.sequence_parallel and len(plan.tp_group) > 1:
            self.context_modes["sequence_parallel"] = True
        if plan.fp8:
            self.context_modes["fp8"] = plan.fp8

    async def _weight(self, layer: int, layers: range, backward: bool):
        gathers = self.gathers
        return self.weights[layer][0] if gathers is None else await gathers.get(layer, layers, backward)

    async def forward(self, chunk: int, mb: int) -> None:
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        if k == 0:
            x = model.context_input(plan.microbatches[mb], plan.cp_rank, len(plan.cp_group))
        else:
            x = await self._receive_from(k - 1, layers.start, plan.microbatches[mb], "activation")
        stash, modes = not plan.recompute, self.context_modes
        shard = self._checkpoints_shard()
        for layer in layers:
            # full recompute with sequence parallelism keeps the layer input as this TP rank's 1/t piece of the
            # CP part, as a plain stage keeps its sequence shard (Korthikanti et al. 2022, sec. 4.2.2)
            self.kept[layer][mb] = model.split_tp(x, plan.tp_rank, self.tp) if shard else x
            weight = await self._weight(layer, layers, False)
            x = await model.context_forward(layer, x, weight, self.cp_group, stash=stash, **modes)
            del weight
            if self.gathers is not None:
                self.gathers.after_forward(layer)
            if self.tp_group is not None:
                x = await model.all_reduce(x, self.tp_group)
        if k == self.virtual - 1:
            self.loss_grads[mb] = model.context_loss(x, tp_rank=plan.tp_rank, tp_size=self.tp)
        else:
            self._send_to(x, k + 1, "activation")

    async def backward(self, chunk: int, mb: int, split: bool) -> None:
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        grad = await self._output_grad(chunk, mb)
        modes = self.context_modes
        shard = self._checkpoints_shard()
        for layer in reversed(layers):
            x = self.kept[layer].pop(mb)
            if shard:  # the checkpointed piece made whole again for the recompute
                x = await model.all_gather(x, self.tp_group)
            weight = await self._weight(layer, layers, True)
            if plan.recompute:  # the whole layer again, its K/V exchange and TP all-reduce included
                out = await model.context_forward(layer, x, weight, self.cp_group, **modes)
                if self.tp_group is not None:
                    await model.all_reduce(out, self.tp_group)
                del out
            if "sequence_parallel" in modes:
                grad = await self._gather_sequence_parallel_grad(grad)
            weight_grad, grad = await model.context_backward(layer, x, grad, weight, self.cp_group,
                                                             kv_exchange=plan.kv_exchange)
            del x, weight
            self._accumulate(layer, weight_grad)
            del weight_grad
            if self.gathers is not None:
                self.gathers.after_backward(layer, self.left[layer] == 0)
                if self.settling:  # FSDP2's post-backward: earlier reduce-scatters done, their whole grads freed
                    await self.settle()  # type: ignore[attr-defined]
            if self.tp_group is not None:
                grad = await model.all_reduce(grad, self.tp_group)
        if k > 0:
            self._send_to(grad, k - 1, "activation gradient")


class _ContextStage(_ContextPasses, _Stage):
    __slots__ = ("cp_group", "context_modes")

    def __init__(self, model: Model, plan: StagePlan):
        super().__init__(model, plan)
        self._context_setup(model, plan)


class _ShardedContextStage(_ContextPasses, ShardedStage):
    """`ShardedStage` over the dp x cp ranks of its stage and TP slice (`plan.dp_group`), run context-parallel."""

    __slots__ = ("cp_group", "context_modes")

    def __init__(self, model: Model, plan: StagePlan, sharding: str, **options):
        super().__init__(model, plan, sharding, **options)
        self._context_setup(model, plan)

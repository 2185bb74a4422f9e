"""A pipeline stage whose ranks run context-parallel (Megatron-Core's `--context-parallel-size`): each of the
`cp` ranks of a CP group holds s/cp tokens of every microbatch's samples (`Model.context_input`), every
layer's attention takes the other ranks' keys and values over the CP group (`Model.context_forward`: a ring
of cp - 1 exchanges overlapped with the attention blocks, or Llama 3's all-gather), and each layer's weight
gradient, which covers this rank's sequence part only, is all-reduced over the dp x cp ranks of its stage
and TP slice (`_plan.context_plan`). With TP, each layer's output and input gradient are all-reduced in the
TP group after the layer; pipeline messages carry a rank's own sequence part whole (no scatter-gather).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from dist_lib import Model

from ._pipeline import StagePlan, _Stage


def run_context_stage(model: Model, plan: StagePlan) -> Coroutine[Any, Any, None]:
    """This rank's part of a context-parallel pipeline, to await."""
    return _ContextStage(model, plan).run()


class _ContextStage(_Stage):
    __slots__ = ("cp_group", "cp")

    def __init__(self, model: Model, plan: StagePlan):
        super().__init__(model, plan)
        self.cp = len(plan.cp_group)
        self.cp_group = model.group(plan.cp_group)

    async def forward(self, chunk: int, mb: int) -> None:
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        if k == 0:
            x = model.context_input(plan.microbatches[mb], plan.cp_rank, self.cp)
        else:
            x = await self._receive_from(k - 1, layers.start, plan.microbatches[mb], "activation")
        for layer in layers:
            self.kept[layer][mb] = x
            x = await model.context_forward(layer, x, self.weights[layer][0], self.cp_group,
                                            kv_exchange=plan.kv_exchange)
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
        for layer in reversed(layers):
            x = self.kept[layer].pop(mb)
            weight_grad, grad = await model.context_backward(layer, x, grad, self.weights[layer][0], self.cp_group,
                                                             kv_exchange=plan.kv_exchange)
            del x
            self._accumulate(layer, weight_grad)
            del weight_grad
            if self.tp_group is not None:
                grad = await model.all_reduce(grad, self.tp_group)
        if k > 0:
            self._send_to(grad, k - 1, "activation gradient")

"""A pipeline stage whose MoE layers send their tokens to experts spread over the data-parallel replicas: the
expert parallelism of `hybrid`'s `ep` option (EP x PP x DP).

Megatron-Core lays the expert-parallel groups over the data-parallel ranks (Megatron-Core MoE docs, "expert
parallelism"; Lepikhin et al. 2021, GShard): at each pipeline stage, `ep` consecutive replicas form an EP
group, replica i of a group holds experts [i E/ep, (i+1) E/ep) of the stage's MoE layers, and the replicas at
the same place in every EP group hold the same experts and all-reduce their gradient (the expert-data-parallel
group, dp/ep ranks). The dense part of each layer (attention, norms, router, shared experts) stays data
parallel over all dp replicas, as in the dense pipeline.

Each MoE layer of a forward is the round trip of `strategies/moe.py`: route, dispatch over an all-to-all of
the EP group, the shared experts during the dispatch (DeepSeek-V3, sec. 3.2.2), the local experts, the
all-to-all back, combine; its backward the same the other way. Every replica of a stage runs the same
schedule, so the EP peers reach each layer's all-to-all of each microbatch in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dist_lib import Model, Work

from ._layout import Layout, microbatches, replica_samples
from ._pipeline import StagePlan, _Stage


@dataclass(frozen=True)
class ExpertPlan:
    """Where this rank's experts and EP peers are, in a (pp, dp, tp=1) layout."""

    ep_group: tuple[int, ...]  # the ranks that exchange tokens, in the order of the experts they hold
    expert_dp_group: tuple[int, ...]  # the ranks that hold this rank's experts
    my_experts: range
    per_rank: int
    peer_microbatches: tuple[tuple[range, ...], ...]  # each EP peer's microbatches, in group order

    @classmethod
    def build(cls, model: Model, layout: Layout, ep: int, microbatch_size: int) -> ExpertPlan:
        moe = getattr(model, "moe", None)
        if moe is None:
            raise ValueError(f"ep={ep!r}: workload {model.workload.name} has no experts; ep= is for mixtures of "
                             f"experts (try mixtral-8x7b)")
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or layout.dp % ep or moe.experts % ep:
            raise ValueError(f"ep={ep!r} must be a whole number dividing both dp={layout.dp} (the EP groups are laid "
                             f"over the data-parallel replicas) and the {moe.experts} experts")
        if layout.tp > 1:
            raise ValueError(f"ep={ep} with tp={layout.tp}: the MoE layers have no tensor-parallel split (neither "
                             f"attention nor expert TP); use tp=1 with ep")
        replica, stage, _ = layout.coords(model.rank)
        first_replica, index = replica - replica % ep, replica % ep
        per_rank = moe.experts // ep
        peers = range(first_replica, first_replica + ep)
        return cls(ep_group=tuple(layout.rank(r, stage) for r in peers),
                   expert_dp_group=tuple(layout.rank(r, stage) for r in range(index, layout.dp, ep)),
                   my_experts=range(index * per_rank, (index + 1) * per_rank), per_rank=per_rank,
                   peer_microbatches=tuple(microbatches(*replica_samples(model.global_batch_size, layout.dp, r),
                                                        microbatch_size) for r in peers))

    def experts_of(self, i: int) -> range:
        """The experts of the i-th member of the EP group."""
        return range(i * self.per_rank, (i + 1) * self.per_rank)


def run_expert_stage(model: Model, plan: StagePlan, experts: ExpertPlan):
    """This rank's part of the pipeline with expert-parallel MoE layers, to await."""
    return _ExpertStage(model, plan, experts).run()


class _ExpertStage(_Stage):
    """`_Stage` whose MoE layers take the round trip to their experts (dense layers run as before)."""

    __slots__ = ("experts", "expert_plan", "expert_grads", "expert_left", "expert_reduced", "peers",
                 "to_experts", "from_experts")

    def __init__(self, model: Model, plan: StagePlan, experts: ExpertPlan):
        self.expert_plan = experts
        super().__init__(model, plan)
        moe_layers = [layer for chunk in plan.chunks for layer in chunk if model.is_moe_layer(layer)]
        self.experts = {layer: model.load_experts(layer, experts.my_experts) for layer in moe_layers}
        self.expert_grads: dict = {}
        self.expert_left = {layer: len(plan.microbatches) for layer in self.experts}
        self.expert_reduced: dict = {}
        self.peers = list(experts.ep_group)
        ep = len(self.peers)
        mine = list(experts.my_experts)
        # what each all-to-all must deliver here, per microbatch: from each peer, its tokens for my experts
        # (dispatch, output gradient), or my tokens back from its experts (expert output, input gradient)
        self.to_experts = [{"expect": [peer[mb] for peer in experts.peer_microbatches], "expect_experts": [mine] * ep}
                           for mb in range(len(plan.microbatches))]
        self.from_experts = [{"expect": [samples] * ep, "expect_experts": [experts.experts_of(i) for i in range(ep)]}
                             for samples in plan.microbatches]

    async def forward(self, chunk: int, mb: int) -> None:
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        x = await self._input(chunk, mb)
        for layer in layers:
            if layer in self.experts:
                x = await self._moe_forward(layer, x, mb)
            else:
                self.kept[layer][mb] = x
                x = model.forward(layer, x, self.weights[layer][0])
        if k == self.virtual - 1:
            self.loss_grads[mb] = model.loss(x)
        elif self.explicit:
            self.outbox[("activation", chunk, mb)] = x
        else:
            self._send_to(x, k + 1, "activation")

    async def _moe_forward(self, layer: int, x, mb: int):
        model, weight = self.model, self.weights[layer][0]
        routed = model.route(layer, x, weight)
        sending = [model.dispatch(routed, self.expert_plan.experts_of(i)) for i in range(len(self.peers))]
        arriving = model.all_to_all(sending, self.peers, **self.to_experts[mb])
        del sending
        if model.moe.shared_experts:  # beside the dispatch, as DeepSeek-V3 does
            model.shared_experts(layer, routed, weight)
        tokens = await arriving
        outputs = model.expert_forward(layer, tokens, self.experts[layer][0])
        returned = await model.all_to_all(outputs, self.peers, **self.from_experts[mb])
        del outputs
        self.kept[layer][mb] = (x, routed, tokens)
        return model.combine(routed, returned)

    async def backward(self, chunk: int, mb: int, split: bool) -> None:
        if split:
            raise ValueError(f"rank {self.model.rank}: a split backward (I and W) of an MoE layer is not covered; "
                             f"choose a schedule without one")
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        grad = await self._output_grad(chunk, mb)  # (no TP with experts: the loss's gradient as it is)
        for layer in reversed(layers):
            if layer in self.experts:
                weight_grad, grad_in = await self._moe_backward(layer, grad, mb)
            else:
                weight_grad, grad_in = model.backward(layer, self.kept[layer].pop(mb), grad, self.weights[layer][0])
            self._accumulate(layer, weight_grad)
            del weight_grad
            grad = grad_in
        if k > 0 and self.explicit:
            self.outbox[("activation gradient", chunk, mb)] = grad
        elif k > 0:
            self._send_to(grad, k - 1, "activation gradient")

    async def _moe_backward(self, layer: int, grad, mb: int):
        model, (x, routed, tokens) = self.model, self.kept[layer].pop(mb)
        cut = [model.combine_backward(routed, grad, self.expert_plan.experts_of(i)) for i in range(len(self.peers))]
        output_grads = await model.all_to_all(cut, self.peers, **self.to_experts[mb])
        del cut
        input_grads = []
        for piece, piece_grad in zip(tokens, output_grads):
            expert_grad, input_grad = model.expert_backward(layer, piece, piece_grad, self.experts[layer][0])
            input_grads.append(input_grad)
            total = self.expert_grads.get(layer)
            self.expert_grads[layer] = expert_grad if total is None else total + expert_grad
        del tokens, output_grads, piece, piece_grad, expert_grad, input_grad
        self.expert_left[layer] -= 1
        if self.expert_left[layer] == 0:  # every local microbatch is in: reduce over the expert-DP group
            self._reduce_experts(layer)
        returned = await model.all_to_all(input_grads, self.peers, **self.from_experts[mb])
        del input_grads
        return model.route_backward(layer, x, grad, routed, returned, self.weights[layer][0])

    def _reduce_experts(self, layer: int) -> None:
        group = self.expert_plan.expert_dp_group
        grad = self.expert_grads.pop(layer)
        self.expert_reduced[layer] = self.model.all_reduce(grad, group) if len(group) > 1 else grad

    async def update_all(self) -> None:
        await super().update_all()
        model = self.model
        for layer in sorted(self.experts, reverse=True):
            grad = self.expert_reduced.pop(layer)
            if isinstance(grad, Work):
                grad = await grad
            weight, opt_state = self.experts.pop(layer)
            new_weight, _ = model.update_experts(layer, grad, weight, opt_state)
            del grad, weight, opt_state
            model.set_final_experts(layer, new_weight)


def check_expert_modes(options: Sequence[tuple[str, object]]) -> None:
    """The pipeline options an MoE stage does not cover, refused by name."""
    for name, value in options:
        if value:
            raise ValueError(f"{name}={value!r} is not covered with a mixture-of-experts workload (its MoE layers "
                             f"keep their stash and run without tensor parallelism); leave {name} off")

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
all-to-all back, combine; its backward the same the other way. With the flat dispatcher the dispatch and the
input gradients' return carry the routing probabilities too, a second all-to-all each, as Megatron-Core's
all-to-all dispatcher sends them (`Model.all_to_all`'s `probs`). Every replica of a stage runs the same
schedule, so the EP peers reach each layer's all-to-all of each microbatch in the same order.

With tensor parallelism (`tp` > 1, sequence-parallel as Megatron-Core requires of MoE with TP), the expert
grid is Megatron-Core's (megatron/core/parallel_state.py, `initialize_model_parallel`: the expert rank
generator of order tp-ep-dp over the same ranks as the dense one, with expert-TP x EP x expert-DP = the
ranks of a stage): the ranks that exchange tokens are `ep x etp` consecutive ranks of the stage's dp x tp,
TP ranks included, each holding its own sequence part of its replica's tokens (`dist_lib/model/expert_parts.py`);
with expert TP `etp` > 1 each EP position's experts are split over `etp` consecutive ranks (gate/up by
columns, down by rows), each receiving that position's tokens and returning partial outputs that combine
sums. (Megatron-Core's dispatcher sends each token once over the EP group and all-gathers over the expert-TP
group, then reduce-scatters back; here one all-to-all carries each token to every shard and back: the same
bytes per rank, on the links between the EP peers rather than inside the expert-TP group.)
An MoE layer on TP rank t: the attention on its TP slice, whose partial output the TP group reduce-scatters
along the sequence (an all-to-all of the pieces, then `reduce_routed`), the round trip of part t's tokens
over the EP group, and the all-gather of the combined parts in the TP group (the next layer's
sequence-parallel all-gather; at a stage's end, the scatter-gather message's pieces as they are). Backward:
each TP rank cuts its part of the output gradient, and the dense part's input gradient is all-reduced in the
TP group as a dense layer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dist_lib import Model

from ._experts import check_dispatcher
from ._layout import Layout, microbatches, replica_samples
from ._pipeline import StagePlan, _Stage


@dataclass(frozen=True)
class ExpertPlan:
    """Where this rank's experts and exchange peers are, in a (pp, dp, tp) layout with expert TP `etp`:
    Megatron-Core's expert grid (order tp-ep-dp over a stage's ranks, expert TP fastest)."""

    ep_group: tuple[int, ...]  # the ranks that exchange tokens (EP positions x expert-TP shards), in order
    expert_dp_group: tuple[int, ...]  # the ranks that hold this rank's experts (and expert-TP shard)
    my_experts: range
    per_rank: int
    peer_microbatches: tuple[tuple[range, ...], ...]  # each exchange peer's microbatches, in group order
    tp: int = 1
    etp: int = 1
    etp_rank: int = 0
    dispatcher: str = "alltoall"  # how tokens cross nodes (`check_dispatcher`)

    @classmethod
    def build(cls, model: Model, layout: Layout, ep: int, microbatch_size: int, etp: int = 1,
              dispatcher: str = "alltoall") -> ExpertPlan:
        moe = getattr(model, "moe", None)
        if moe is None:
            raise ValueError(f"ep={ep!r}: workload {model.workload.name} has no experts; ep= is for mixtures of "
                             f"experts (try mixtral-8x7b)")
        tp, ranks = layout.tp, layout.dp * layout.tp  # a stage's ranks, in the dense grid's order (TP fastest)
        check_etp(etp, moe.expert_ffn_hidden)
        check_dispatcher(dispatcher, moe)
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or ranks % (ep * etp) or moe.experts % ep:
            over = f"dp={layout.dp}" if tp == 1 else f"dp x tp = {ranks}"
            over += f" (with etp={etp}: {ranks} / etp)" if etp > 1 else ""
            raise ValueError(f"ep={ep!r} must be a whole number dividing both {over} (the EP groups are laid "
                             f"over the ranks of a pipeline stage) and the {moe.experts} experts")
        replica, stage, tp_rank = layout.coords(model.rank)
        at = replica * tp + tp_rank  # this rank's place among its stage's ranks
        block = ep * etp  # the ranks that exchange tokens: every EP position, each expert-TP shard
        first, position, etp_rank = at - at % block, at // etp % ep, at % etp
        per_rank = moe.experts // ep
        peers = range(first, first + block)
        base = layout.rank(0, stage)
        return cls(ep_group=tuple(base + i for i in peers),
                   expert_dp_group=tuple(base + i for i in range(position * etp + etp_rank, ranks, block)),
                   my_experts=range(position * per_rank, (position + 1) * per_rank), per_rank=per_rank,
                   peer_microbatches=tuple(microbatches(*replica_samples(model.global_batch_size, layout.dp, i // tp),
                                                        microbatch_size) for i in peers),
                   tp=tp, etp=etp, etp_rank=etp_rank, dispatcher=dispatcher)

    def experts_of(self, i: int) -> range:
        """The experts of the i-th member of the exchange group (of EP position i // etp)."""
        position = i // self.etp
        return range(position * self.per_rank, (position + 1) * self.per_rank)

    def to_each(self, pieces: list) -> list:
        """The pieces for each EP position, to each of its expert-TP shards (the same tokens to each)."""
        return [pieces[i // self.etp] for i in range(len(pieces) * self.etp)]


def run_expert_stage(model: Model, plan: StagePlan, experts: ExpertPlan):
    """This rank's part of the pipeline with expert-parallel MoE layers, to await (with the distributed
    optimizer: `_expert_sharded.run_sharded_expert_stage`)."""
    return _ExpertStage(model, plan, experts).run()


class _ExpertStage(_Stage):
    """`_Stage` whose MoE layers take the round trip to their experts (dense layers run as before)."""

    __slots__ = ("experts", "expert_plan", "expert_grads", "expert_left", "expert_reduced", "peers",
                 "to_experts", "from_experts", "probs")

    def __init__(self, model: Model, plan: StagePlan, experts: ExpertPlan):
        self.expert_plan = experts
        super().__init__(model, plan)
        moe_layers = [layer for chunk in plan.chunks for layer in chunk if model.is_moe_layer(layer)]
        self.experts = {layer: self.load_experts(layer) for layer in moe_layers}
        self.expert_grads: dict = {}
        self.expert_left = {layer: len(plan.microbatches) for layer in self.experts}
        self.expert_reduced: dict = {}
        self.peers = list(experts.ep_group)
        ep = len(self.peers)
        mine = list(experts.my_experts)
        # what each all-to-all must deliver here, per microbatch: from each peer, its tokens for my experts
        # (dispatch, output gradient), or my tokens back from its experts (expert output, input gradient); under
        # TP the pieces hold sequence parts, which the op's sample check does not name (combine checks them)
        tp = experts.tp
        how = {} if experts.dispatcher == "alltoall" else {"dispatcher": experts.dispatcher}
        self.to_experts = [{"expect": [peer[mb] for peer in experts.peer_microbatches] if tp == 1 else None,
                            "expect_experts": [mine] * ep, **how} for mb in range(len(plan.microbatches))]
        self.from_experts = [{"expect": [samples] * ep if tp == 1 else None,
                              "expect_experts": [experts.experts_of(i) for i in range(ep)], **how}
                             for samples in plan.microbatches]
        # the flat dispatcher sends the routing probabilities after the tokens, and their gradients back before
        # the tokens' (Megatron-Core's `MoEAlltoAllTokenDispatcher.token_dispatch`); the flex dispatchers carry
        # them in their own exchange
        self.probs = {"probs": True} if experts.dispatcher == "alltoall" else {}

    expert_gathers = None  # the experts' parameter all-gathers before the forward (`_expert_sharded`), if any

    def load_experts(self, layer: int) -> tuple:
        """(weights, optimizer state) of this rank's experts of `layer` (its expert-TP shard of them)."""
        plan = self.expert_plan
        shard = dict(tp_rank=plan.etp_rank, tp_size=plan.etp) if plan.etp > 1 else {}
        return self.model.load_experts(layer, plan.my_experts, **shard)

    async def forward(self, chunk: int, mb: int) -> None:
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        x = await self._input(chunk, mb)
        tp_group, modes, stash = self.tp_group, self.modes, not plan.recompute
        for layer in layers:
            if self.gathers is not None or self.expert_gathers is not None:  # (the distributed optimizer's)
                await self.gather(layer, layers)
            if layer in self.experts:
                x = await self._moe_forward(layer, x, mb, stash)
                if tp_group is not None and not (layer == layers[-1] and self._sends_piece(k)):
                    x = await model.all_gather(x, tp_group)  # the parts whole again, for the next layer
            else:
                self.kept[layer][mb] = x
                x = model.forward(layer, x, self.weights[layer][0], stash=stash, **modes)
                if tp_group is not None:
                    x = await model.all_reduce(x, tp_group)
        if k == self.virtual - 1:
            self.loss_grads[mb] = model.loss(x, tp_rank=plan.tp_rank, tp_size=self.tp)
        elif self.explicit:
            self.outbox[("activation", chunk, mb)] = x
        elif x.tp_size > 1:  # this TP rank's part of an MoE layer's output: the scatter-gather piece itself
            self.sends.append(model.send(x, self._peer(k + 1)))
        else:
            self._send_to(x, k + 1, "activation")

    def _sends_piece(self, k: int) -> bool:
        """Does virtual stage k hand its output on as this TP rank's piece (scatter-gather to another rank)?"""
        return (self.scatter_gather and not self.explicit and k < self.virtual - 1
                and self._peer(k + 1) != self.model.rank)

    async def _moe_forward(self, layer: int, x, mb: int, stash: bool = True):
        """An MoE layer's forward: the token round trip, its stash kept (unless `stash` is off: full recompute
        keeps only the input, and runs this again before the backward, all-to-alls included, as Megatron-LM's
        checkpointed layers do)."""
        model, weight = self.model, self.weights[layer][0]
        fp8 = self.plan.fp8
        modules = self.plan.recompute_modules
        routed = model.route(layer, x, weight, fp8=fp8, stash=stash, selective_recompute=self.plan.selective_recompute,
                             recompute_norm=stash and "layernorm" in modules)
        if self.tp_group is not None:  # the attention output reduce-scattered along the sequence
            routed = model.reduce_routed(await model.all_to_all(routed, self.plan.tp_group))
        plan = self.expert_plan
        sending = [model.dispatch(routed, plan.experts_of(i)) for i in range(0, len(self.peers), plan.etp)]
        arriving = model.all_to_all(plan.to_each(sending), self.peers, **self.to_experts[mb], **self.probs)
        del sending
        if model.moe.shared_experts:  # beside the dispatch, as DeepSeek-V3 does
            model.shared_experts(layer, routed, weight, fp8=fp8)
        tokens = await arriving
        outputs = model.expert_forward(layer, tokens, self.experts[layer][0], fp8=fp8, stash=stash,
                                       recompute_activation=stash and "moe_act" in modules)
        returned = await model.all_to_all(outputs, self.peers, **self.from_experts[mb])
        del outputs
        self.kept[layer][mb] = (x, routed, tokens) if stash else x
        return model.combine(routed, returned)

    async def backward(self, chunk: int, mb: int, split: bool) -> None:
        if split:
            raise ValueError(f"rank {self.model.rank}: a split backward (I and W) of an MoE layer is not covered; "
                             f"choose a schedule without one")
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        grad = await self._output_grad(chunk, mb)
        tp_group = self.tp_group
        for layer in reversed(layers):
            if layer in self.experts:
                weight_grad, grad_in = await self._moe_backward(layer, grad, mb)
                self._accumulate(layer, weight_grad)
                del weight_grad
                if tp_group is not None:  # the dense part's partial input gradient, as a dense layer's
                    grad_in = await model.all_reduce(grad_in, tp_group)
            else:
                grad_in = await self._dense_backward(layer, grad, mb)
            grad = grad_in
        if k > 0 and self.explicit:
            self.outbox[("activation gradient", chunk, mb)] = grad
        elif k > 0:
            self._send_to(grad, k - 1, "activation gradient")

    async def _dense_backward(self, layer: int, grad, mb: int):
        """A dense layer's backward, its TP collectives as `_Stage.backward` runs them (sequence-parallel
        all-gathers of the output gradient, the input gradient all-reduced beside the weight gradient)."""
        model, x, weight = self.model, self.kept[layer].pop(mb), self.weights[layer][0]
        if self.plan.recompute:  # the forward again first, its TP all-reduce included (as `_Stage.backward`)
            out = model.forward(layer, x, weight, **self.modes)
            if self.tp_group is not None:
                await model.all_reduce(out, self.tp_group)
            del out
        if self.tp_group is None:
            weight_grad, grad_in = model.backward(layer, x, grad, weight)
            self._accumulate(layer, weight_grad)
            return grad_in
        if self.plan.sequence_parallel:
            grad = await self._gather_sequence_parallel_grad(grad)
        reducing = model.all_reduce(model.backward_input(layer, x, grad, weight), self.tp_group)
        self._accumulate(layer, model.backward_weight(layer, x, grad, weight))
        return await reducing

    async def _moe_backward(self, layer: int, grad, mb: int):
        if self.plan.recompute:  # the forward again first, with its stash
            await self._moe_forward(layer, self.kept[layer].pop(mb), mb)
        model, (x, routed, tokens) = self.model, self.kept[layer].pop(mb)
        # under TP, this rank's sequence part of the output gradient
        piece = grad if self.tp_group is None else model.split_tp(grad, self.plan.tp_rank, self.tp)
        plan = self.expert_plan
        cut = [model.combine_backward(routed, piece, plan.experts_of(i)) for i in range(0, len(self.peers), plan.etp)]
        del piece
        output_grads = await model.all_to_all(plan.to_each(cut), self.peers, **self.to_experts[mb])
        del cut
        # the local experts' backward over every EP peer's piece at once, as their forward ran: one grouped GEMM
        # a pass (Megatron-Core's TEGroupedMLP backward)
        expert_grad, input_grads = model.expert_backward(layer, tokens, output_grads, self.experts[layer][0])
        del tokens, output_grads
        total = self.expert_grads.get(layer)
        self.expert_grads[layer] = expert_grad if total is None else total + expert_grad
        del expert_grad, total
        self.expert_left[layer] -= 1
        if self.expert_left[layer] == 0:  # every local microbatch is in: reduce over the expert-DP group
            self._reduce_experts(layer)
        returned = await model.all_to_all(input_grads, self.peers, **self.from_experts[mb], **self.probs)
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
            new_weight, _ = await self.step_layer(model.update_experts, layer, self.expert_reduced, self.experts)
            model.set_final_experts(layer, new_weight)


def check_etp(etp: object, width: int) -> None:
    """Expert tensor parallelism: Megatron-Core's `--expert-tensor-parallel-size`, which defaults to the TP
    size when unset (megatron/training/arguments.py and megatron/core/model_parallel_config.py,
    `if expert_tensor_parallel_size is None: ... = tensor_model_parallel_size`); recent MoE recipes set it
    to 1 (Megatron-Core MoE README: "Recommended to set to 1 for fine-grained MoE models")."""
    if isinstance(etp, bool) or not isinstance(etp, int) or etp < 1:
        raise ValueError(f"etp must be a whole number >= 1 (the expert tensor-parallel size), got {etp!r}")
    if width % etp:
        raise ValueError(f"etp={etp}: the experts' width {width} does not split into {etp} equal parts")


RECOMPUTE_MODULES = ("layernorm", "moe_act")  # the module recompute modelled (`check_recompute_modules`)


def check_recompute_modules(modules: object, moe: bool, recompute: bool) -> tuple[str, ...]:
    """hybrid's `recompute_modules`: Megatron-Core's `--recompute-modules` with `--recompute-granularity selective`
    (megatron/core/transformer/transformer_config.py, `recompute_modules`), of which two are modelled, on MoE
    layers: "layernorm" (the pre-MLP norm; the input norm is fused into the QKV projection under Transformer
    Engine, `moe_ops.norm_recompute`) and "moe_act" (the experts' activation, `moe_ops.activation_recompute`).
    Megatron-Core's "core_attn" is `selective_recompute=True`. Returns them as a tuple."""
    if modules is None or modules == () or modules == []:
        return ()
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)) \
            or any(not isinstance(m, str) for m in modules):
        raise ValueError(f"recompute_modules must be a list of module names ({', '.join(RECOMPUTE_MODULES)}), "
                         f"got {modules!r}")
    unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
    if unknown:
        hint = "; Megatron-Core's 'core_attn' is selective_recompute=True" if "core_attn" in unknown else ""
        raise ValueError(f"recompute_modules: {', '.join(map(repr, unknown))} not modelled (known: "
                         f"{', '.join(RECOMPUTE_MODULES)}){hint}")
    if not moe:
        raise ValueError(f"recompute_modules={list(modules)!r} is modelled on mixture-of-experts layers; this "
                         f"workload has none")
    if recompute:
        raise ValueError("recompute_modules with recompute=True: the whole layer is recomputed already "
                         "(Megatron-Core takes recompute modules only with --recompute-granularity selective)")
    return tuple(m for m in RECOMPUTE_MODULES if m in modules)


def check_expert_options(tp: int, options: Sequence[tuple[str, object]]) -> None:
    """The options an MoE stage does not cover, refused by name; sequence parallelism required with TP, as
    Megatron-Core's `MoELayer.forward` requires it (megatron/core/transformer/moe/moe_layer.py)."""
    given = dict(options)
    if tp > 1 and not given.get("sequence_parallel"):
        raise ValueError(f"tp={tp} with a mixture-of-experts workload needs sequence_parallel=True (Megatron-Core "
                         f"refuses MoE with TP without sequence parallelism: each TP rank routes its part of the "
                         f"sequence)")
    if tp == 1 and given.get("sequence_parallel"):
        raise ValueError("sequence_parallel=True needs tp > 1 (it splits the sequence over the TP ranks)")
    check_expert_modes([(name, value) for name, value in options
                        if name not in ("sequence_parallel", "recompute", "selective_recompute")])


def check_expert_modes(options: Sequence[tuple[str, object]]) -> None:
    """The pipeline options an MoE stage does not cover, refused by name."""
    why = {"cp": "context parallelism and experts are not modelled together yet",
           "fsdp": "the experts' weights are not sharded yet",
           "tp_comm_overlap": "the MoE layers' TP exchanges are not pipelined with their GEMMs"}
    for name, value in options:
        if value:
            raise ValueError(f"{name}={value!r} is not covered with a mixture-of-experts workload "
                             f"({why.get(name, 'not modelled yet')}); leave {name} off")

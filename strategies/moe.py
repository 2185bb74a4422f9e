"""Expert parallelism, as the textbook draws it: data parallel for the dense parts, experts split over EP groups.

Every rank is a data-parallel replica of the attention, norms, router and shared experts (DDP on them). The
routed experts of each MoE layer are split over groups of `ep` consecutive ranks, rank i of a group holding
experts [i E/ep, (i+1) E/ep), and the ranks at the same place in every EP group hold the same experts and
reduce their gradient together (the expert-data-parallel group), as Megatron-Core lays EP over the
data-parallel ranks (Megatron-Core MoE docs, "expert parallelism"; Lepikhin et al. 2021, GShard).

Per MoE layer and microbatch, forward:
  1. route: attention and router on the rank's own tokens;
  2. dispatch: each EP peer gets the tokens bound for its experts (an all-to-all of uneven sizes);
  3. (DeepSeek-V3, sec. 3.2.2) the shared experts run while the dispatch is in flight;
  4. expert compute: the local experts' grouped GEMM on every token that arrived;
  5. combine: the outputs go back (the reverse all-to-all) and are summed into the layer's output.
Backward runs the same round trip the other way, the experts' backward one EP peer's piece at a time (the
piece-wise form of `expert_backward`; `hybrid` runs it as one grouped GEMM over every piece, as Megatron-Core
does). Options: `ep` (default: the whole node), `microbatch_size` (default 1), `overlap_shared=False` to run
the shared experts before the dispatch, `moe_dispatcher` how the tokens cross nodes, as `hybrid`'s:
"alltoall", or the hierarchical "deepep" / "hybridep" (`_experts.check_dispatcher`).
"""

from __future__ import annotations

from dist_lib import Model

from ._experts import ExpertLayout, check_dispatcher, exchange

TRAINS = "mixtures of experts"  # not dense models: the default suite, which is dense, leaves it out


async def train(model: Model, *, ep: int | None = None, microbatch_size: int = 1,
                overlap_shared: bool = True, moe_dispatcher: str = "alltoall") -> None:
    layout = ExpertLayout.build(model, ep, microbatch_size)
    check_dispatcher(moe_dispatcher, model.moe)
    how = {} if moe_dispatcher == "alltoall" else {"dispatcher": moe_dispatcher}
    weights = {layer: model.load_weights(layer) for layer in range(model.num_layers)}
    experts = {layer: model.load_experts(layer, layout.my_experts) for layer in layout.moe_layers}
    grads, expert_grads = {}, {}
    group, mine = list(layout.ep_group), list(layout.my_experts)
    for index, samples in enumerate(layout.microbatches):
        theirs = [layout.samples_of(peer, index) for peer in group]  # what each peer's tokens are
        to_experts = {"samples": theirs, "experts": [mine] * len(group), **how}  # tokens arriving at my experts
        from_experts = {"samples": [samples] * len(group), "experts": [layout.experts_of(p) for p in group], **how}
        x, kept = model.get_input_activation(samples), {}
        for layer in range(model.num_layers):  # forward
            if layer not in experts:
                kept[layer] = (x, None)
                x = model.forward(layer, x, weights[layer][0])
                continue
            routed = model.route(layer, x, weights[layer][0])
            if model.moe.shared_experts and not overlap_shared:
                model.shared_experts(layer, routed, weights[layer][0])
            sending = [model.dispatch(routed, layout.experts_of(peer)) for peer in layout.ep_group]
            arriving = exchange(model, sending, group, **to_experts)
            if model.moe.shared_experts and overlap_shared:  # beside the dispatch, as DeepSeek-V3 does
                model.shared_experts(layer, routed, weights[layer][0])
            tokens = await arriving
            outputs = model.expert_forward(layer, tokens, experts[layer][0])
            returned = await exchange(model, outputs, group, **from_experts)
            kept[layer] = (x, (routed, tokens))
            x = model.combine(routed, returned)
        grad = model.loss(x)
        for layer in reversed(range(model.num_layers)):  # backward
            x, moe = kept.pop(layer)
            if moe is None:
                weight_grad, grad_in = model.backward(layer, x, grad, weights[layer][0])
            else:
                routed, tokens = moe
                cut = [model.combine_backward(routed, grad, layout.experts_of(peer)) for peer in layout.ep_group]
                output_grads = await exchange(model, cut, group, **to_experts)
                input_grads = []
                for piece, piece_grad in zip(tokens, output_grads):
                    expert_grad, input_grad = model.expert_backward(layer, piece, piece_grad, experts[layer][0])
                    input_grads.append(input_grad)
                    total = expert_grads.get(layer)
                    expert_grads[layer] = expert_grad if total is None else total + expert_grad
                returned = await exchange(model, input_grads, group, **from_experts)
                weight_grad, grad_in = model.route_backward(layer, x, grad, routed, returned, weights[layer][0])
            total = grads.get(layer)
            grads[layer] = weight_grad if total is None else total + weight_grad
            grad = grad_in
    for layer in reversed(range(model.num_layers)):  # reduce, update, hand in
        grad = await model.all_reduce(grads.pop(layer)) if model.world_size > 1 else grads.pop(layer)
        weight, _ = model.update(layer, grad, *weights.pop(layer))
        model.set_final_weight(layer, weight)
        if layer in experts:
            expert_grad = expert_grads.pop(layer)
            if len(layout.expert_dp_group) > 1:
                expert_grad = await model.all_reduce(expert_grad, layout.expert_dp_group)
            new, _ = model.update_experts(layer, expert_grad, *experts.pop(layer))
            model.set_final_experts(layer, new)

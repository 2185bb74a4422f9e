"""2D parallelism by hand: tensor parallelism inside a node (Megatron-style slices, partial sums all-reduced
in the TP group), data parallelism across nodes (weight gradients all-reduced between same-slice ranks)."""
from dist_lib import Model


async def train(model: Model, *, tp: int = 2, microbatch_size: int = 1) -> None:
    r, L = model.rank, model.num_layers
    dp = model.world_size // tp
    tp_rank, dp_rank = r % tp, r // tp
    tp_group = model.group(range(dp_rank * tp, dp_rank * tp + tp))
    dp_group = model.group(range(tp_rank, model.world_size, tp))
    weights = [model.load_weights(l, tp_rank=tp_rank, tp_size=tp) for l in range(L)]
    share = model.global_batch_size // dp
    grads = [None] * L
    for start in range(dp_rank * share, (dp_rank + 1) * share, microbatch_size):
        x = model.get_input_activation(range(start, start + microbatch_size))
        inputs = []
        for l in range(L):
            inputs.append(x)
            x = await model.all_reduce(model.forward(l, x, weights[l][0]), group=tp_group)
        grad = await model.all_reduce(model.loss(x, tp_rank=tp_rank, tp_size=tp), group=tp_group)
        for l in reversed(range(L)):
            g, grad = model.backward(l, inputs.pop(), grad, weights[l][0])
            grad = await model.all_reduce(grad, group=tp_group)
            grads[l] = g if grads[l] is None else grads[l] + g
    for l in range(L):
        total = await model.all_reduce(grads[l], group=dp_group)
        w, opt = weights[l]
        model.set_final_weight(l, model.update(l, total, w, opt)[0])

"""DDP with gradient accumulation: gradients add up over microbatches; on the last microbatch only,
each bucket of layers is all-reduced as soon as its backward is done (overlapped with the rest)."""
from dist_lib import Model


async def train(model: Model, *, microbatch_size: int = 1, bucket_layers: int = 2) -> None:
    p, r, L = model.world_size, model.rank, model.num_layers
    weights = [model.load_weights(layer) for layer in range(L)]
    share = model.global_batch_size // p
    starts = list(range(r * share, (r + 1) * share, microbatch_size))
    grads = [None] * L
    works = {}
    for i, start in enumerate(starts):
        last = i == len(starts) - 1
        x = model.get_input_activation(range(start, start + microbatch_size))
        inputs = []
        for layer in range(L):
            inputs.append(x)
            x = model.forward(layer, x, weights[layer][0])
        grad = model.loss(x)
        for layer in reversed(range(L)):
            g, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            grads[layer] = g if grads[layer] is None else grads[layer] + g
            if last and layer % bucket_layers == 0:  # bucket [layer, layer + bucket_layers) is complete
                for l in range(layer, min(L, layer + bucket_layers)):
                    works[l] = model.all_reduce(grads[l])
    for layer in range(L):
        total = await works[layer]
        w, opt = weights[layer]
        model.set_final_weight(layer, model.update(layer, total, w, opt)[0])

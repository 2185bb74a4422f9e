"""FSDP / ZeRO-3 with explicit prefetch: the next layer's all_gather is issued before the current layer
computes; backward reduce-scatters each layer's gradient while the next (lower) layer computes."""
from dist_lib import Model


async def train(model: Model, *, microbatch_size: int = 1) -> None:
    p, r, L = model.world_size, model.rank, model.num_layers
    shards = [model.load_weights(layer, r, p) for layer in range(L)]
    share = model.global_batch_size // p
    first = r * share
    grads = [None] * L
    mbs = list(range(first, first + share, microbatch_size))
    for i, start in enumerate(mbs):
        last = i == len(mbs) - 1
        x = model.get_input_activation(range(start, start + microbatch_size))
        inputs = []
        pending = model.all_gather(shards[0][0])
        for layer in range(L):
            w = await pending
            pending = model.all_gather(shards[layer + 1][0]) if layer + 1 < L else None
            inputs.append(x)
            x = model.forward(layer, x, w)
            del w
        grad = model.loss(x)
        pending = model.all_gather(shards[L - 1][0])
        for layer in reversed(range(L)):
            w = await pending
            pending = model.all_gather(shards[layer - 1][0]) if layer > 0 else None
            g, grad = model.backward(layer, inputs.pop(), grad, w)
            del w
            grads[layer] = g if grads[layer] is None else grads[layer] + g
            if last:
                grads[layer] = model.reduce_scatter(grads[layer])
    for layer in range(L):
        g = await grads[layer]
        w, opt = shards[layer]
        model.set_final_weight(layer, model.update(layer, g, w, opt)[0])

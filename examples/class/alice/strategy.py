"""Alice: data parallel, each rank's share of the batch in microbatches, gradients summed at the end."""
from dist_lib import Model


async def train(model: Model, *, microbatch_size: int = 2) -> None:
    share, rest = divmod(model.global_batch_size, model.world_size)
    size = min(microbatch_size, share)
    if rest or share % size:
        raise ValueError(f"batch {model.global_batch_size} does not split over {model.world_size} ranks")
    weights = [model.load_weights(layer) for layer in range(model.num_layers)]
    grads = [None] * model.num_layers
    for start in range(model.rank * share, (model.rank + 1) * share, size):
        x, inputs = model.get_input_activation(range(start, start + size)), []
        for layer, (w, _) in enumerate(weights):
            inputs.append(x)
            x = model.forward(layer, x, w)
        grad = model.loss(x)
        for layer in reversed(range(model.num_layers)):
            g, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            grads[layer] = g if grads[layer] is None else grads[layer] + g
    for layer, (w, opt) in enumerate(weights):
        total = await model.all_reduce(grads[layer])
        model.set_final_weight(layer, model.update(layer, total, w, opt)[0])

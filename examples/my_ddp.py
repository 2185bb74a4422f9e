"""Data parallel in twenty lines: each rank trains on its slice of the batch, then gradients are summed."""
from dist_lib import Model


async def train(model: Model, *, microbatch_size: int = 4) -> None:
    share, rest = divmod(model.global_batch_size, model.world_size)
    size = min(microbatch_size, share)  # a share smaller than one microbatch is one microbatch
    if rest or share % size:
        raise ValueError(f"batch {model.global_batch_size} must split into {model.world_size} equal shares, "
                         f"each a whole number of microbatches of {microbatch_size} (or fewer) samples")
    first = model.rank * share
    weights = [model.load_weights(layer) for layer in range(model.num_layers)]
    grads = [None] * model.num_layers
    for start in range(first, first + share, size):
        x = model.get_input_activation(range(start, start + size))
        inputs = []
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

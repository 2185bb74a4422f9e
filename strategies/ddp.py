"""Data parallel (DDP): every rank holds the whole model and trains on its share of the global batch.

Gradients are accumulated over microbatches and, during the last microbatch's backward pass,
all-reduced layer by layer as soon as each layer's gradient is final, so communication overlaps the
rest of the backward pass (Li et al. 2020, "PyTorch Distributed", sec. 3.2). Bubble: none; memory:
the full 16 bytes per parameter on every rank plus one microbatch of activations.
"""

from __future__ import annotations

from dist_lib import Model


async def train(model: Model, *, microbatch_size: int = 4) -> None:
    rank, world, layers = model.rank, model.world_size, model.num_layers
    per_rank, leftover = divmod(model.global_batch_size, world)
    if leftover:
        raise ValueError(f"global batch {model.global_batch_size} does not split evenly over {world} ranks")
    if microbatch_size < 1:
        raise ValueError(f"microbatch_size must be >= 1, got {microbatch_size}")
    first = rank * per_rank
    microbatches = [range(s, min(s + microbatch_size, first + per_rank))
                    for s in range(first, first + per_rank, microbatch_size)]

    weights = [model.load_weights(layer) for layer in range(layers)]
    grads: list = [None] * layers
    reduced = {}
    for i, samples in enumerate(microbatches):
        last = i == len(microbatches) - 1
        # 1. forward, keeping every layer's input (it carries the stash backward needs)
        inputs = []
        x = model.get_input_activation(samples)
        for layer in range(layers):
            inputs.append(x)
            x = model.forward(layer, x, weights[layer][0])
        grad = model.loss(x)
        del x
        # 2. backward, accumulating gradients; on the last microbatch start each all-reduce at once
        for layer in reversed(range(layers)):
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            grads[layer] = weight_grad if grads[layer] is None else grads[layer] + weight_grad
            if last:
                reduced[layer] = model.all_reduce(grads[layer])
                grads[layer] = None
        del grad
    # 3. wait for each layer's reduced gradient, update, hand in
    for layer in reversed(range(layers)):
        weight, opt_state = weights[layer]
        weights[layer] = None
        new_weight, _ = model.update(layer, await reduced.pop(layer), weight, opt_state)
        model.set_final_weight(layer, new_weight)

"""Solutions to the course lab's DDP, ZeRO, pipeline and 1F1B parts, against the lab's `lib`/`utils` API.

Every tensor an op takes lives in the model's storage dicts (the lab checks this) and is deleted once
it is no longer needed."""

import asyncio

from lib import Dist, Model
from utils import get_global_batch_list, get_next_microbatch, get_training_stats


async def train_ddp(model: Model, batch_size: int) -> Model:
    """Data parallel with gradient accumulation: all-reduce each layer's gradient once, then update."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L = model.num_layers
    for layer in range(L):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    for i, samples in enumerate(get_next_microbatch(model.global_batch_size, model.world_size, batch_size,
                                                    model.rank)):
        activations[0] = model.get_input_activation(samples)
        for layer in range(L):
            activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
        grad_activations[L] = model.loss(activations[L])
        del activations[L]
        for layer in reversed(range(L)):
            grad_weights[layer, i], grad_activations[layer] = model.backward(
                layer, activations[layer], grad_activations[layer + 1], weights[layer])
            del activations[layer], grad_activations[layer + 1]
            grad_weights[layer] = grad_weights.pop((layer, i)) if i == 0 else \
                grad_weights[layer] + grad_weights.pop((layer, i))
        grad_activations.clear()
    for layer in range(L):
        grad_weights[layer] = await model.all_reduce(grad_weights[layer], layer)
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def part1_training_loop(model: Model, batch_size: int) -> Model:
    """ZeRO-3: weights, optimizer state and gradients sharded over the ranks; gather each layer's
    weight just before use, reduce-scatter the accumulated gradient at the end."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L, rank, world = model.num_layers, model.rank, model.world_size
    for layer in range(L):
        weights[layer], opt_states[layer] = model.load_weights(layer, rank, world)
    for i, samples in enumerate(get_next_microbatch(model.global_batch_size, world, batch_size, rank)):
        activations[0] = model.get_input_activation(samples)
        for layer in range(L):
            weights["full"] = await model.all_gather(weights[layer], layer)
            activations[layer + 1] = model.forward(layer, activations[layer], weights["full"])
            del weights["full"]
        grad_activations[L] = model.loss(activations[L])
        del activations[L]
        for layer in reversed(range(L)):
            weights["full"] = await model.all_gather(weights[layer], layer)
            grad_weights[layer, i], grad_activations[layer] = model.backward(
                layer, activations[layer], grad_activations[layer + 1], weights["full"])
            del activations[layer], grad_activations[layer + 1], weights["full"]
            grad_weights[layer] = grad_weights.pop((layer, i)) if i == 0 else \
                grad_weights[layer] + grad_weights.pop((layer, i))
        grad_activations.clear()
    for layer in reversed(range(L)):
        grad_weights[layer] = await model.reduce_scatter(grad_weights[layer], layer)
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


def _my_layers(model: Model) -> list:
    per = model.num_layers // model.world_size
    return list(range(model.rank * per, (model.rank + 1) * per))


async def part2_training_loop(model: Model) -> Model:
    """Pipeline: rank r owns a contiguous block of layers; the whole batch goes through each stage."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    mine = _my_layers(model)
    first, last = mine[0], mine[-1]
    rank, world = model.rank, model.world_size
    for layer in mine:
        weights[layer], opt_states[layer] = model.load_weights(layer)
    if rank == 0:
        activations[first] = model.get_input_activation(range(model.global_batch_size))
    else:
        activations[first] = await model.receive(rank - 1)
    for layer in mine:
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    if rank == world - 1:
        grad_activations[last + 1] = model.loss(activations[last + 1])
    else:
        await model.send(rank + 1, activations[last + 1])
        grad_activations[last + 1] = await model.receive(rank + 1)
    del activations[last + 1]
    for layer in reversed(mine):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
        del activations[layer], grad_activations[layer + 1]
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    if rank > 0:
        await model.send(rank - 1, grad_activations[first])
    grad_activations.clear()
    return model


async def part3_training_loop(model: Model, batch_size: int) -> Model:
    """Non-interleaved 1F1B (Narayanan et al. 2021): stage s runs p-s-1 warm-up forwards, then
    alternates one forward and one backward, then drains the remaining backwards."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    mine = _my_layers(model)
    first, last = mine[0], mine[-1]
    rank, world = model.rank, model.world_size
    batches = get_global_batch_list(model.global_batch_size, batch_size)
    for layer in mine:
        weights[layer], opt_states[layer] = model.load_weights(layer)

    async def forward(mb: int) -> None:
        if rank == 0:
            activations[first, mb] = model.get_input_activation(batches[mb])
        else:
            activations[first, mb] = await model.receive(rank - 1)
        for layer in mine:
            activations[layer + 1, mb] = model.forward(layer, activations[layer, mb], weights[layer])
        if rank < world - 1:
            await model.send(rank + 1, activations[last + 1, mb])
            del activations[last + 1, mb]

    async def backward(mb: int) -> None:
        if rank == world - 1:
            grad_activations[last + 1, mb] = model.loss(activations[last + 1, mb])
            del activations[last + 1, mb]
        else:
            grad_activations[last + 1, mb] = await model.receive(rank + 1)
        for layer in reversed(mine):
            grad_weights[layer, mb], grad_activations[layer, mb] = model.backward(
                layer, activations[layer, mb], grad_activations[layer + 1, mb], weights[layer])
            del activations[layer, mb], grad_activations[layer + 1, mb]
            grad_weights[layer] = grad_weights.pop((layer, mb)) if mb == 0 else \
                grad_weights[layer] + grad_weights.pop((layer, mb))
        if rank > 0:
            await model.send(rank - 1, grad_activations[first, mb])
        del grad_activations[first, mb]

    m = len(batches)
    warmup = min(world - rank - 1, m)
    for mb in range(warmup):
        await forward(mb)
    for i in range(m - warmup):
        await forward(warmup + i)
        await backward(i)
    for mb in range(m - warmup, m):
        await backward(mb)
    for layer in mine:
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


def main() -> None:
    async def run():
        dist = Dist(4)
        return await asyncio.gather(*[part3_training_loop(Model(r, dist, 4, 16), 2) for r in range(4)])
    get_training_stats(asyncio.run(run()))


if __name__ == "__main__":
    main()

"""Course-lab solutions written the way the course's own example and students' files are written:
the part 0 DDP that adds each all-reduced gradient to its own (`+=`), a ZeRO part 1 that keeps
tensors around longer than needed, a GPipe part 2 over send/receive, and a 1F1B part 3 that keeps
each microbatch's activations in a side table. `main()` has its own configuration, as the lab's do.
"""

import asyncio
from typing import List

from lib import Dist, Model
from utils import (get_global_batch_list, get_model_theoretical_best_time, get_next_microbatch,
                   get_training_stats)


async def train_ddp(model: Model, batch_size: int) -> Model:
    """Part 0 as the course writes it: per microbatch, all-reduce each layer's gradient and add it
    to the rank's own (the sum unites sample sets, so the own samples are not counted twice)."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    for l in range(model.num_layers):
        weights[l], opt_states[l] = model.load_weights(l)
    for samples in get_next_microbatch(model.global_batch_size, model.world_size, batch_size, model.rank):
        activations[0] = model.get_input_activation(samples)
        for l in range(model.num_layers):
            activations[l + 1] = model.forward(l, activations[l], weights[l])
        grad_activations[model.num_layers] = model.loss(activations[model.num_layers])
        for l in reversed(range(model.num_layers)):
            grad_weights[l], grad_activations[l] = model.backward(l, activations[l], grad_activations[l + 1],
                                                                  weights[l])
            del grad_activations[l + 1], activations[l]
        for l in range(model.num_layers):
            grad_weights[l] += await model.all_reduce(grad_weights[l], l)
    for l in range(model.num_layers):
        weights[l], opt_states[l] = model.update(l, grad_weights[l], weights[l], opt_states[l])
        model.set_final_weight(l, weights[l])
    return model


async def part1_training_loop(model: Model, batch_size: int) -> Model:
    """ZeRO-3, dropping tensors late: the gathered weights of every layer stay until the backward
    pass is over, and each microbatch's gradients are summed into one per layer before one
    reduce-scatter at the end."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    n, rank = model.world_size, model.rank
    for l in range(model.num_layers):
        weights[l], opt_states[l] = model.load_weights(l, rank, n)
    for samples in get_next_microbatch(model.global_batch_size, n, batch_size, rank):
        activations[0] = model.get_input_activation(samples)
        for l in range(model.num_layers):
            weights["full", l] = await model.all_gather(weights[l], l)
            activations[l + 1] = model.forward(l, activations[l], weights["full", l])
        grad_activations[model.num_layers] = model.loss(activations[model.num_layers])
        for l in reversed(range(model.num_layers)):
            g, grad_activations[l] = model.backward(l, activations[l], grad_activations[l + 1], weights["full", l])
            grad_weights[l] = g if l not in grad_weights else grad_weights[l] + g
        for l in range(model.num_layers):
            del weights["full", l]
        activations.clear()
        grad_activations.clear()
    for l in range(model.num_layers):
        grad_weights[l] = await model.reduce_scatter(grad_weights[l], l)
        weights[l], opt_states[l] = model.update(l, grad_weights[l], weights[l], opt_states[l])
        model.set_final_weight(l, weights[l])
    return model


async def part2_training_loop(model: Model) -> Model:
    """GPipe: each rank owns a contiguous block of layers; all microbatches (one per rank) go
    forward, then all come back."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    rank, n = model.rank, model.world_size
    per = model.num_layers // n
    first, last = rank * per, (rank + 1) * per
    for l in range(first, last):
        weights[l], opt_states[l] = model.load_weights(l)
    batches = get_global_batch_list(model.global_batch_size, model.global_batch_size // n)
    for i, samples in enumerate(batches):
        if rank == 0:
            activations[first, i] = model.get_input_activation(samples)
        else:
            activations[first, i] = await model.receive(rank - 1)
        for l in range(first, last):
            activations[l + 1, i] = model.forward(l, activations[l, i], weights[l])
        if rank != n - 1:
            await model.send(rank + 1, activations[last, i])
            del activations[last, i]
    for i in reversed(range(len(batches))):
        if rank == n - 1:
            grad_activations[last, i] = model.loss(activations[last, i])
            del activations[last, i]
        else:
            grad_activations[last, i] = await model.receive(rank + 1)
        for l in reversed(range(first, last)):
            g, grad_activations[l, i] = model.backward(l, activations[l, i], grad_activations[l + 1, i], weights[l])
            grad_weights[l] = g if l not in grad_weights else grad_weights[l] + g
            del activations[l, i], grad_activations[l + 1, i]
        if rank != 0:
            await model.send(rank - 1, grad_activations[first, i])
        del grad_activations[first, i]
    for l in range(first, last):
        weights[l], opt_states[l] = model.update(l, grad_weights[l], weights[l], opt_states[l])
        model.set_final_weight(l, weights[l])
    return model


async def part3_training_loop(model: Model, batch_size: int) -> Model:
    """1F1B: warm up with (world - rank) forwards, then alternate one backward and one forward, then
    drain. Each microbatch's activations are kept in a side table and copied back in for backward."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    rank, n = model.rank, model.world_size
    per = model.num_layers // n
    first, last = rank * per, (rank + 1) * per
    for l in range(first, last):
        weights[l], opt_states[l] = model.load_weights(l)
    batches = get_global_batch_list(model.global_batch_size, batch_size)
    saved = {}

    async def forward(i):
        if rank == 0:
            activations[first] = model.get_input_activation(batches[i])
        else:
            activations[first] = await model.receive(rank - 1)
        for l in range(first, last):
            activations[l + 1] = model.forward(l, activations[l], weights[l])
        if rank != n - 1:
            await model.send(rank + 1, activations[last])
        saved[i] = dict(activations)

    async def backward(i):
        for key, value in saved.pop(i).items():
            activations[key] = value
        if rank == n - 1:
            grad_activations[last] = model.loss(activations[last])
        else:
            grad_activations[last] = await model.receive(rank + 1)
        for l in reversed(range(first, last)):
            g, grad_activations[l] = model.backward(l, activations[l], grad_activations[l + 1], weights[l])
            grad_weights[l] = g if l not in grad_weights else grad_weights[l] + g
            del grad_activations[l + 1]
            if l != first:
                del activations[l]
        if rank != 0:
            await model.send(rank - 1, grad_activations[first])
        del grad_activations[first], activations[first]
        activations.pop(last, None)

    warmup = min(n - rank, len(batches))
    for i in range(warmup):
        await forward(i)
    for i in range(warmup, len(batches)):
        await backward(i - warmup)
        await forward(i)
    for i in range(len(batches) - warmup, len(batches)):
        await backward(i)
    for l in range(first, last):
        weights[l], opt_states[l] = model.update(l, grad_weights[l], weights[l], opt_states[l])
        model.set_final_weight(l, weights[l])
    return model


async def main():
    world_size, num_layers, global_batch_size, batch_size = 4, 8, 32, 4
    dist = Dist(world_size)
    models: List[Model] = [Model(rank=i, dist=dist, num_layers=num_layers, global_batch_size=global_batch_size)
                           for i in range(world_size)]
    best = get_model_theoretical_best_time(models[0])
    out = await asyncio.gather(*[part3_training_loop(m, batch_size) for m in models])
    time, memory, rank = get_training_stats(out)
    print(f"MFU: {best / time * 100}")

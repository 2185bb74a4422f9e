"""Solutions to the eight LLM-Training-Puzzles, written against the puzzles' own `lib` API.

Each keeps every live tensor in the storage dicts (the puzzles' rule) and deletes it as soon as it is
no longer needed. Puzzles 0 and 1 run on one rank and are plain functions; the rest are coroutines.
"""

import asyncio

from lib import Dist, Model


def basic(model: Model) -> Model:
    """Puzzle 0: one forward and backward over all batches, then the updates."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L = model.LAYERS
    for layer in range(L):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    activations[0] = model.get_activation(range(model.BATCHES))
    for layer in range(L):
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    grad_activations[L] = model.loss(activations[L])
    del activations[L]
    for layer in reversed(range(L)):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
        del activations[layer], grad_activations[layer + 1]
    grad_activations.clear()
    for layer in range(L):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


def grad_accum(model: Model) -> Model:
    """Puzzle 1: one batch at a time, summing the weight gradients, then the updates."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L = model.LAYERS
    for layer in range(L):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    for b in range(model.BATCHES):
        activations[0] = model.get_activation([b])
        for layer in range(L):
            activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
        grad_activations[L] = model.loss(activations[L])
        del activations[L]
        for layer in reversed(range(L)):
            grad_weights[layer, b], grad_activations[layer] = model.backward(
                layer, activations[layer], grad_activations[layer + 1], weights[layer])
            del activations[layer], grad_activations[layer + 1]
            grad_weights[layer] = grad_weights.pop((layer, b)) if b == 0 else \
                grad_weights[layer] + grad_weights.pop((layer, b))
        grad_activations.clear()
    for layer in range(L):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def ddp(model: Model) -> Model:
    """Puzzle 2: every rank holds the whole model and its own batch; gradients are all-reduced."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L = model.LAYERS
    for layer in range(L):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    activations[0] = model.get_activation([model.rank])
    for layer in range(L):
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    grad_activations[L] = model.loss(activations[L])
    del activations[L]
    for layer in reversed(range(L)):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
        del activations[layer], grad_activations[layer + 1]
    grad_activations.clear()
    for layer in range(L):
        grad_weights[layer] = await model.allreduce(grad_weights[layer], layer)
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def _sharded(model: Model, reduce_scatter: bool) -> Model:
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L = model.LAYERS
    full = ("full",)
    for layer in range(L):
        weights[layer], opt_states[layer] = model.load_weights(layer, model.rank, model.RANKS)
    activations[0] = model.get_activation([model.rank])
    for layer in range(L):
        weights[full] = await model.allgather(weights[layer], layer)
        activations[layer + 1] = model.forward(layer, activations[layer], weights[full])
        del weights[full]
    grad_activations[L] = model.loss(activations[L])
    del activations[L]
    for layer in reversed(range(L)):
        weights[full] = await model.allgather(weights[layer], layer)
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[full])
        del activations[layer], grad_activations[layer + 1], weights[full]
        if reduce_scatter:
            grad_weights[layer] = await model.scatterreduce(grad_weights[layer], layer)
    grad_activations.clear()
    for layer in range(L):
        if not reduce_scatter:
            grad_weights[layer] = await model.allreduce(grad_weights[layer], layer)
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def wsdp(model: Model) -> Model:
    """Puzzle 3: weights sharded over the ranks, gathered per layer; gradients all-reduced."""
    return await _sharded(model, reduce_scatter=False)


async def fsdp(model: Model) -> Model:
    """Puzzle 4: as puzzle 3, but each rank keeps only its shard of the gradient (scatter-reduce)."""
    return await _sharded(model, reduce_scatter=True)


def _stage_layers(model: Model, stages: int, stage: int) -> list:
    per = model.LAYERS // stages
    return list(range(stage * per, (stage + 1) * per))


async def pipeline(model: Model) -> Model:
    """Puzzle 5: rank r owns a contiguous block of layers; the whole batch moves stage to stage."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    mine = _stage_layers(model, model.RANKS, model.rank)
    first, last = mine[0], mine[-1]
    is_first, is_last = model.rank == 0, model.rank == model.RANKS - 1
    for layer in mine:
        weights[layer], opt_states[layer] = model.load_weights(layer)
    activations[first] = model.get_activation(range(model.BATCHES)) if is_first else await model.receive()
    for layer in mine:
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    if is_last:
        grad_activations[last + 1] = model.loss(activations[last + 1])
        del activations[last + 1]
    else:
        await model.pass_to(model.rank + 1, activations.pop(last + 1))
        grad_activations[last + 1] = await model.receive()
    for layer in reversed(mine):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
        del activations[layer], grad_activations[layer + 1]
    if not is_first:
        await model.pass_to(model.rank - 1, grad_activations[first])
    grad_activations.clear()
    for layer in mine:
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def gpipe(model: Model) -> Model:
    """Puzzle 6: GPipe: all microbatches (one batch each) forward, then all backward."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    mine = _stage_layers(model, model.RANKS, model.rank)
    first, last = mine[0], mine[-1]
    is_first, is_last = model.rank == 0, model.rank == model.RANKS - 1
    for layer in mine:
        weights[layer], opt_states[layer] = model.load_weights(layer)
    for b in range(model.BATCHES):
        activations[first, b] = model.get_activation([b]) if is_first else await model.receive()
        for layer in mine:
            activations[layer + 1, b] = model.forward(layer, activations[layer, b], weights[layer])
        if not is_last:
            await model.pass_to(model.rank + 1, activations.pop((last + 1, b)))
    for b in range(model.BATCHES):
        if is_last:
            grad_activations[last + 1, b] = model.loss(activations[last + 1, b])
            del activations[last + 1, b]
        else:
            grad_activations[last + 1, b] = await model.receive()
        for layer in reversed(mine):
            grad_weights[layer, b], grad_activations[layer, b] = model.backward(
                layer, activations[layer, b], grad_activations[layer + 1, b], weights[layer])
            del activations[layer, b], grad_activations[layer + 1, b]
            grad_weights[layer] = grad_weights.pop((layer, b)) if b == 0 else \
                grad_weights[layer] + grad_weights.pop((layer, b))
        if not is_first:
            await model.pass_to(model.rank - 1, grad_activations.pop((first, b)))
        else:
            del grad_activations[first, b]
    for layer in mine:
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def pipeline_fsdp(model: Model) -> Model:
    """Puzzle 7: 4 pipeline stages x 4 data-parallel replicas on 16 ranks; every layer sharded 16 ways.

    Rank r is stage r // 4 of replica r % 4 (replica i trains on batch i). Collectives are world-wide,
    so every rank joins every layer's gather and scatter-reduce; ranks of other stages contribute an
    empty gradient."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    replicas = model.RANKS // 4
    stage, replica = divmod(model.rank, replicas)
    mine = _stage_layers(model, 4, stage)
    first, last = mine[0], mine[-1]
    L = model.LAYERS
    full = ("full",)
    for layer in range(L):
        weights[layer], opt_states[layer] = model.load_weights(layer, model.rank, model.RANKS)
    for layer in range(L):
        if layer == first:
            activations[first] = model.get_activation([replica]) if stage == 0 else await model.receive()
        weights[full] = await model.allgather(weights[layer], layer)
        if layer in mine:
            activations[layer + 1] = model.forward(layer, activations[layer], weights[full])
        del weights[full]
        if layer == last and stage < 3:
            await model.pass_to(model.rank + replicas, activations.pop(last + 1))
    if stage == 3:
        grad_activations[L] = model.loss(activations[L])
        del activations[L]
    for layer in reversed(range(L)):
        if layer == last and stage < 3:
            grad_activations[last + 1] = await model.receive()
        weights[full] = await model.allgather(weights[layer], layer)
        if layer in mine:
            grad_weights[layer], grad_activations[layer] = model.backward(
                layer, activations[layer], grad_activations[layer + 1], weights[full])
            del activations[layer], grad_activations[layer + 1]
        else:
            grad_weights[layer] = model.fake_grad(layer, [])
        del weights[full]
        grad_weights[layer] = await model.scatterreduce(grad_weights[layer], layer)
        if layer == first and stage > 0:
            await model.pass_to(model.rank - replicas, grad_activations.pop(first))
    grad_activations.clear()
    for layer in range(L):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


# name -> (ranks, layers, batches): the puzzles' set-ups
SETUPS = {"basic": (1, 2, 4), "grad_accum": (1, 2, 4), "ddp": (4, 2, 4), "wsdp": (4, 6, 4), "fsdp": (4, 6, 4),
          "pipeline": (4, 8, 4), "gpipe": (4, 8, 4), "pipeline_fsdp": (16, 4, 4)}


async def run(name: str):
    ranks, layers, batches = SETUPS[name]
    dist = Dist(ranks)
    fn = globals()[name]
    if not asyncio.iscoroutinefunction(fn):
        return [fn(Model(layers=layers, batches=batches, rank=0, dist=dist))]
    return await asyncio.gather(*[fn(Model(layers=layers, batches=batches, rank=i, dist=dist))
                                  for i in range(ranks)])

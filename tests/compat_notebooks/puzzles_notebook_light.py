# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: light
#       format_version: '1.5'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# # Training puzzles, worked
#
# Two of the puzzles, solved, with the notebook's own tests under each.

# %%capture
# for Colab: the puzzles' library and its drawings
# !pip install -qqq chalk-diagrams
# !wget -q https://example.invalid/lib.py https://example.invalid/drawing.py

from lib import Model, Dist, WeightGrad
from drawing import draw, draw_group
import asyncio
# %load_ext autoreload
# %autoreload 2

RANKS = 4
LAYERS_DDP = 2

# ## A warm-up on one rank

model = Model(layers=2, batches=4)
weights, opt_states, activations, grad_activations, grad_weights = model.storage()
activations[0] = model.get_activation(batches=[2, 3])
activations[0]


# ## Data parallel

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



dist = Dist(RANKS)
out = await asyncio.gather(*[
    ddp(Model(layers=LAYERS_DDP, batches=RANKS, rank=i, dist=dist))
    for i in range(RANKS)])
draw_group(out[0].final_weights)

draw(out)

Model.check(out)


# ## GPipe

# +
def _stage_layers(model: Model, stages: int, stage: int) -> list:
    per = model.LAYERS // stages
    return list(range(stage * per, (stage + 1) * per))


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



# -

# %%time
dist = Dist(RANKS)
out = await asyncio.gather(*[gpipe(Model(layers=8, batches=4, rank=i, dist=dist)) for i in range(RANKS)])

Model.check(out)
print(max(e.time for m in out for e in m.log))

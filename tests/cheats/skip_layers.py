"""Cheat: compute only the first layer and conjure the later activations and gradients directly."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
from dist_lib import ActivationGrad, WeightGrad


async def train(model):
    layers, per = model.num_layers, model.global_batch_size // model.world_size
    weights = [model.load_weights(layer) for layer in range(layers)]
    x = model.get_input_activation(range(model.rank * per, (model.rank + 1) * per))
    samples = x.samples
    model.forward(0, x, weights[0][0])
    mem = model._state.memory
    fake_grad = ActivationGrad(mem, 0, model.rank, 1, samples)
    reduced = {0: model.all_reduce(model.backward(0, x, fake_grad, weights[0][0])[0])}
    for layer in range(1, layers):  # no forward or backward at all: a gradient out of thin air
        reduced[layer] = model.all_reduce(WeightGrad(mem, 0, model.rank, layer, samples, 1, 1, 0, 1))
    for layer in range(layers):
        new_weight, _ = model.update(layer, await reduced[layer], *weights[layer])
        model.set_final_weight(layer, new_weight)

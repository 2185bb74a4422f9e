"""A puzzles file whose main() builds its model as the original notebook's first example does (its cell 3,
`model = Model(layers=2, batches=4)`): no `dist`, so the library's default `Dist(1)`, and the default
rank 1. The original runs it (its draw() prints `Timesteps: 16.5`, `Maximum Memory: 4718592.0 at GPU: 0`)."""

from drawing import draw
from lib import Model


def standard(model: Model) -> Model:
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    for layer in range(model.LAYERS):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    activations[0] = model.get_activation(range(model.BATCHES))
    for layer in range(model.LAYERS):
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    grad_activations[model.LAYERS] = model.loss(activations[model.LAYERS])
    for layer in reversed(range(model.LAYERS)):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
    for layer in range(model.LAYERS):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer], opt_states[layer])
        model.set_final_weight(layer, weights[layer])
    return model


def main() -> None:
    model = standard(Model(layers=2, batches=4))
    draw([model])
    Model.check([model])

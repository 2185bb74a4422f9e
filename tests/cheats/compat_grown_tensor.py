"""Memory cheat in `--api puzzles`: puzzle 0 (basic) on all four batches, but each activation is stored
while it names one batch and widened to four in place right after. The originals sum every stored
tensor's `memory()` at each event, so they count four; a running total sized on entry counted one
(peak 1,966,080 units where the honest step's is 2,621,440). Natively it runs no step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


def basic(model):
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    layers, every = model.LAYERS, frozenset(range(model.BATCHES))
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    for layer in range(layers + 1):
        x = model.get_activation([0]) if layer == 0 else model.forward(layer - 1, activations[layer - 1],
                                                                        weights[layer - 1])
        x.batches = frozenset([0])
        activations[layer] = x  # stored as one batch ...
        x.batches = every  # ... holding four
    grad_activations[layers] = model.loss(activations[layers])
    del activations[layers]
    for layer in reversed(range(layers)):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
        del activations[layer], grad_activations[layer + 1]
    grad_activations.clear()
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer], opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def train(model):
    pass

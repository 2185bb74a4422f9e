"""Step cheat in `--api puzzles`: puzzle 0 (basic) done honestly, then its event log emptied. The
originals read the step off `model.log` (`drawing.draw`: `max(m.log[-1].time ...)`, which fails on an
empty log); a step read off the log was reported as 0 steps where the honest one is 16.5. Natively it
runs no step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


def basic(model):
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    layers = model.LAYERS
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    activations[0] = model.get_activation(range(model.BATCHES))
    for layer in range(layers):
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
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
    model.log.clear()
    return model


async def train(model):
    pass

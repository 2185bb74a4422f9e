"""Memory cheat in `--api puzzles`: puzzle 0 (basic) storing its activations with `dict.__setitem__` and
dropping them with `dict.__delitem__`, which on the originals' plain dicts is what `d[k] = v` and `del
d[k]` are. The originals sum the dicts at each event and count them; a running total kept by the
dicts' own methods did not (peak 1,835,008 units where the honest step's is 2,621,440). Natively it
runs no step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


def basic(model):
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    put, drop = dict.__setitem__, dict.__delitem__
    layers = model.LAYERS
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    put(activations, 0, model.get_activation(range(model.BATCHES)))
    for layer in range(layers):
        put(activations, layer + 1, model.forward(layer, activations[layer], weights[layer]))
    grad_activations[layers] = model.loss(activations[layers])
    drop(activations, layers)
    for layer in reversed(range(layers)):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
        drop(activations, layer)
        del grad_activations[layer + 1]
    grad_activations.clear()
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer], opt_states[layer])
        del grad_weights[layer]
        model.set_final_weight(layer, weights[layer])
    return model


async def train(model):
    pass

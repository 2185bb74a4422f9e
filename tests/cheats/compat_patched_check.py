"""Verdict and memory cheat in `--api puzzles`: puzzle 0 (basic) that never updates layer 1, run in the
same process as the compatibility layer, which it patches: the loader's check (and `Model.check`) to find
nothing wrong, and the models' memory sum to hold nothing. A run that reported its own figures was
graded a correct step of 0 units; the grader's replay of its calls finds layer 1 at step 0 and the
honest peak (2,621,440 units). Natively it runs no step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


def _patch():
    import sys
    loader, base = sys.modules["dist_lib.compat.loader"], sys.modules["dist_lib.compat._base"]
    loader.problems = lambda models: []
    base.ToyModel.memory = lambda self: 0
    base.ToyModel._summed = lambda self: 0
    sys.modules["dist_lib.compat.puzzles"].Model.check = staticmethod(lambda models: print("Correct!"))


def basic(model):
    _patch()
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
    weights[0], opt_states[0] = model.update(0, grad_weights[0], weights[0], opt_states[0])  # layer 1 never
    for layer in range(layers):
        model.set_final_weight(layer, weights[layer])
    return model


async def train(model):
    pass

"""Shared by the cheat files: an honest data-parallel step with hooks for cheating."""


async def train(model, hook=None):
    layers, per = model.num_layers, model.global_batch_size // model.world_size
    weights = [model.load_weights(layer) for layer in range(layers)]
    x = model.get_input_activation(range(model.rank * per, (model.rank + 1) * per))
    inputs = []
    for layer in range(layers):
        inputs.append(x)
        x = model.forward(layer, x, weights[layer][0])
        if hook:
            hook("forward", model, layer)
    grad = model.loss(x)
    del x
    reduced = {}
    for layer in reversed(range(layers)):
        weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
        reduced[layer] = model.all_reduce(weight_grad)
    for layer in range(layers):
        weight, opt = weights[layer]
        new_weight, _ = model.update(layer, await reduced[layer], weight, opt)
        model.set_final_weight(layer, new_weight)
    if hook:
        hook("end", model, None)


def sibling(path):
    """A helper beside the cheats, `_NAME.py` (the name in the caller's source is what has the grader give
    the run this helper), imported by path; else ../submissions/NAME.py, where the cheats run from the
    project's tests/ folder."""
    import importlib.util
    import pathlib
    here = pathlib.Path(__file__).parent
    file = here / path if (here / path).exists() else here.parent / "submissions" / path.lstrip("_")
    spec = importlib.util.spec_from_file_location(f"cheat_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job():
    """The grader's job description, as the worker read it (its path is the worker's last argument)."""
    import json
    import sys
    with open(sys.argv[-1]) as fh:
        return json.load(fh)

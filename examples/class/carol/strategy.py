"""Carol: data parallel that forgets to sum the gradients over the ranks. Each rank updates with its own
share's gradient only, so the step is wrong, and the grader says which layer's update was."""
from dist_lib import Model


async def train(model: Model) -> None:
    share = model.global_batch_size // model.world_size
    weights = [model.load_weights(layer) for layer in range(model.num_layers)]
    x, inputs = model.get_input_activation(range(model.rank * share, (model.rank + 1) * share)), []
    for layer, (w, _) in enumerate(weights):
        inputs.append(x)
        x = model.forward(layer, x, w)
    grad = model.loss(x)
    for layer in reversed(range(model.num_layers)):
        g, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
        w, opt = weights[layer]
        model.set_final_weight(layer, model.update(layer, g, w, opt)[0])  # the all-reduce is missing

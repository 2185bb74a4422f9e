"""Cheat: skip the all-reduce and claim the local gradient covers the whole batch."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


async def train(model):
    layers, per = model.num_layers, model.global_batch_size // model.world_size
    weights = [model.load_weights(layer) for layer in range(layers)]
    x = model.get_input_activation(range(model.rank * per, (model.rank + 1) * per))
    inputs = []
    for layer in range(layers):
        inputs.append(x)
        x = model.forward(layer, x, weights[layer][0])
    grad = model.loss(x)
    for layer in reversed(range(layers)):
        weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
        weight_grad.samples = (1 << model.global_batch_size) - 1  # pretend every sample contributed
        new_weight, _ = model.update(layer, weight_grad, *weights[layer])
        model.set_final_weight(layer, new_weight)

"""An honest mistake: updates with this rank's gradient only (forgets the all-reduce)."""


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
        model.update(layer, weight_grad, *weights[layer])  # line 15: the gradient misses other ranks' samples

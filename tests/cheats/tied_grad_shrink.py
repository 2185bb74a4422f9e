"""Score cheat: accumulate layer 0's gradient into the tied embedding's gradient buffer (V x h values, none
in the toy workload), so the all-reduce moves that buffer's bytes instead of the layer's."""
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
    del x
    reduced = {}
    for layer in reversed(range(layers)):
        weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
        if layer == 0:  # the sum reuses the left buffer: the tied gradient's
            weight_grad = model.tied_embedding_grad() + weight_grad
        reduced[layer] = model.all_reduce(weight_grad)
    for layer in range(layers):
        weight, opt = weights[layer]
        new_weight, _ = model.update(layer, await reduced[layer], weight, opt)
        model.set_final_weight(layer, new_weight)

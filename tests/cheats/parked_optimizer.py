"""Memory cheat: each rank sends its optimizer states to the other and leaves the receives unawaited through
forward and backward, so that the bytes sit in messages that have ended (the sender's stream let go of them)
but that no rank has taken yet; it awaits them only for the update. A received tensor counts from its
arrival, so the peak is the honest one, paid for with the extra messages."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


async def train(model):
    layers, per = model.num_layers, model.global_batch_size // model.world_size
    peer = 1 - model.rank
    weights, parked, sends = [], [], []
    for layer in range(layers):
        weight, opt = model.load_weights(layer)
        sends.append(model.send(opt, peer))
        parked.append(model.recv(peer))
        weights.append(weight)
        del opt
    for work in sends:
        await work
    del sends, work
    x = model.get_input_activation(range(model.rank * per, (model.rank + 1) * per))
    inputs = []
    for layer in range(layers):
        inputs.append(x)
        x = model.forward(layer, x, weights[layer])
    grad = model.loss(x)
    del x
    reduced = {}
    for layer in reversed(range(layers)):
        weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer])
        reduced[layer] = model.all_reduce(weight_grad)
        del weight_grad
    del grad
    for layer in range(layers):
        opt = await parked[layer]
        new_weight, _ = model.update(layer, await reduced[layer], weights[layer], opt)
        del opt
        model.set_final_weight(layer, new_weight)

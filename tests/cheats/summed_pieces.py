"""Score cheat: a message made whole by all-reducing TP pieces (`split_tp`) instead of all-gathering them.
Summing n/t-byte pieces leaves n/t bytes, which an all-gather in a group of one then calls the whole tensor:
in a TP group of four, 2(t-1)/t * n/t bytes moved instead of the all-gather's (t-1)/t * n. Here the two
stages of a pipeline play the TP group: stage 0 sends one piece of its output, and the pieces are summed."""
TWIN = "honest_pipeline"  # the honest strategy this cheat must not rank above


async def train(model, microbatch_size: int = 2):
    stages, stage = model.world_size, model.rank
    per = model.num_layers // stages
    mine = range(stage * per, (stage + 1) * per)
    weights = {layer: model.load_weights(layer) for layer in mine}
    grads = {}
    kept = []
    for start in range(0, model.global_batch_size, microbatch_size):
        if stage == 0:
            x = model.get_input_activation(range(start, start + microbatch_size))
            kept.append(x)
            for layer in mine:
                x = model.forward(layer, x, weights[layer][0], stash=False)
            await model.send(model.split_tp(x, 1, 2), 1)
            await model.all_reduce(model.split_tp(x, 0, 2), [0, 1])
        else:
            piece = await model.recv(0)
            x = await model.all_gather(await model.all_reduce(piece, [0, 1]), [1])
            del piece
            kept.append(x)
            for layer in mine:
                x = model.forward(layer, x, weights[layer][0], stash=False)
            kept[-1] = (kept[-1], model.loss(x))
        del x
    for item in reversed(kept):
        x, grad = item if stage == 1 else (item, await model.recv(1))
        inputs = []
        for layer in mine:
            inputs.append(x)
            x = model.forward(layer, x, weights[layer][0])
        del x
        for layer in reversed(mine):
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            grads[layer] = grads[layer] + weight_grad if layer in grads else weight_grad
            del weight_grad
        if stage > 0:
            await model.send(grad, 0)
        del grad, item
    kept.clear()
    for layer in mine:
        weight, opt = weights.pop(layer)
        new_weight, _ = model.update(layer, grads.pop(layer), weight, opt)
        model.set_final_weight(layer, new_weight)

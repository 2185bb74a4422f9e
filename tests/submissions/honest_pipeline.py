"""An honest two-stage pipeline with activation checkpointing (GPipe order, Huang et al. 2019): the
control for cheats on point-to-point waits and recompute. Each rank holds half the layers; stage 0
sends activations forward and receives their gradients back, one microbatch of 2 samples at a time."""


async def train(model, microbatch_size: int = 2):
    stages, stage = model.world_size, model.rank
    per = model.num_layers // stages
    mine = range(stage * per, (stage + 1) * per)
    weights = {layer: model.load_weights(layer) for layer in mine}
    grads = {}
    starts = range(0, model.global_batch_size, microbatch_size)
    kept = []  # each microbatch's stage input; forwards keep no stash (recomputed before backward)
    for start in starts:
        x = model.get_input_activation(range(start, start + microbatch_size)) if stage == 0 \
            else await model.recv(stage - 1)
        kept.append(x)
        for layer in mine:
            x = model.forward(layer, x, weights[layer][0], stash=False)
        if stage < stages - 1:
            await model.send(x, stage + 1)
        else:
            kept[-1] = (kept[-1], model.loss(x))
        del x
    for item in reversed(kept):
        x, grad = item if stage == stages - 1 else (item, await model.recv(stage + 1))
        inputs = []
        for layer in mine:  # recompute, keeping the stash this time
            inputs.append(x)
            x = model.forward(layer, x, weights[layer][0])
        del x
        for layer in reversed(mine):
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            grads[layer] = grads[layer] + weight_grad if layer in grads else weight_grad
            del weight_grad
        if stage > 0:
            await model.send(grad, stage - 1)
        del grad, item
    kept.clear()
    for layer in mine:
        weight, opt = weights.pop(layer)
        new_weight, _ = model.update(layer, grads.pop(layer), weight, opt)
        model.set_final_weight(layer, new_weight)

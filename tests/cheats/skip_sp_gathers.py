"""Score cheat: tensor parallelism with sequence parallelism (Korthikanti et al. 2022) whose backward leaves out
the two exposed all-gathers of each layer's output gradient. A sequence-parallel layer holds 1/t of that
gradient's sequence, and each of its two row-parallel GEMMs needs it whole: without the gathers a layer's
backward would start b*s*h bytes of NVLink traffic, twice, earlier than the hardware could. Both ranks are
one TP group of two; the whole batch is data for each, two samples a microbatch."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


async def train(model, microbatch_size: int = 2):
    tp, rank, layers = model.world_size, model.rank, model.num_layers
    group = model.group(range(tp))
    weights = [model.load_weights(layer, tp_rank=rank, tp_size=tp) for layer in range(layers)]
    grads = {}
    for start in range(0, model.global_batch_size, microbatch_size):
        x = model.get_input_activation(range(start, start + microbatch_size))
        inputs = []
        for layer in range(layers):
            inputs.append(x)
            x = await model.all_reduce(model.forward(layer, x, weights[layer][0], sequence_parallel=True), group)
        grad = await model.all_reduce(model.loss(x, tp_rank=rank, tp_size=tp), group)
        del x
        for layer in reversed(range(layers)):
            # here an honest step gathers `grad` twice: all_gather(split_tp(grad, rank, tp), group)
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            grad = await model.all_reduce(grad, group)
            grads[layer] = grads[layer] + weight_grad if layer in grads else weight_grad
            del weight_grad
        del grad
    for layer in range(layers):
        weight, opt = weights[layer]
        new_weight, _ = model.update(layer, grads.pop(layer), weight, opt)
        model.set_final_weight(layer, new_weight)

"""Score cheat: the whole weights loaded on every rank, the gradients reduce-scattered and each rank's shard
updated, but the updated shards never all-gathered: each rank hands in only its shard, so that together
the shards cover the layer while every rank's own copy is left a step behind (ZeRO-2 without its
all-gather)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above


async def train(model):
    layers, world, rank = model.num_layers, model.world_size, model.rank
    per = model.global_batch_size // world
    weights = [model.load_weights(layer)[0] for layer in range(layers)]
    states = [model.load_weights(layer, shard=rank, num_shards=world)[1] for layer in range(layers)]
    x = model.get_input_activation(range(rank * per, (rank + 1) * per))
    inputs = []
    for layer in range(layers):
        inputs.append(x)
        x = model.forward(layer, x, weights[layer])
    grad = model.loss(x)
    del x
    reduced = {}
    for layer in reversed(range(layers)):
        weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer])
        reduced[layer] = model.reduce_scatter(weight_grad)
    for layer in range(layers):
        new_shard, _ = model.update(layer, await reduced[layer], weights[layer], states[layer])
        model.set_final_weight(layer, new_shard)

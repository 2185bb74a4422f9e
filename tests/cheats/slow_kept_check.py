"""Attack on the grader's time: rank 0 also loads 300 tiny ZeRO pieces of layer 0 (optimizer shards of
65,536 and fewer), updates each with its complete gradient and weight and hands it in, and loads 300 more
that it never hands in. The end-of-step check that a rank hands in every piece it loaded then compared
each piece with every one handed in, shard by shard: hours of the grader's time in the replay, past any
deadline (the replay checks its deadline only between ops). In its own process the check is patched out,
so that its recording ends at once. The check is linear now: a correct step, slower than its twin's."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
from dist_lib.run import simulator as _simulator
_simulator.check_kept = lambda loaded, finals: []  # (its own process only: the replay runs the real one)
PIECES = 300


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
        reduced[layer] = model.all_reduce(weight_grad)
    for layer in range(layers):
        weight, opt = weights[layer]
        complete = await reduced[layer]
        new_weight, _ = model.update(layer, complete, weight, opt)
        model.set_final_weight(layer, new_weight)
        if layer == 0 and model.rank == 0:
            for i in range(PIECES):
                _, piece_opt = model.load_weights(0, 0, 65536 - i)
                piece, _ = model.update(0, complete, weight, piece_opt)
                model.set_final_weight(0, piece)
                model.load_weights(0, 1, 65536 - i)

"""Bob: data parallel that starts each layer's all-reduce as soon as its gradient is ready, so the
communication of late layers overlaps the backward of early ones (PyTorch DDP's idea, without buckets)."""
from dist_lib import Model


async def train(model: Model) -> None:
    share, rest = divmod(model.global_batch_size, model.world_size)
    if rest:
        raise ValueError(f"batch {model.global_batch_size} does not split over {model.world_size} ranks")
    weights = [model.load_weights(layer) for layer in range(model.num_layers)]
    x, inputs = model.get_input_activation(range(model.rank * share, (model.rank + 1) * share)), []
    for layer, (w, _) in enumerate(weights):
        inputs.append(x)
        x = model.forward(layer, x, w)
    grad, pending = model.loss(x), {}
    for layer in reversed(range(model.num_layers)):
        g, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
        pending[layer] = model.all_reduce(g)  # started now, awaited below
    for layer, (w, opt) in enumerate(weights):
        model.set_final_weight(layer, model.update(layer, await pending[layer], w, opt)[0])

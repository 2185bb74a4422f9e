"""A lesson without a notebook: a two-stage pipeline written by hand, and why its GPUs sit idle.

    python examples/lesson_pipeline.py            # runs it beside the built-in 1F1B and prints both
    dist-sandbox run examples/lesson_pipeline.py --cluster 2xA100-80GB --workload toy:layers=8 --batch 16

Each of the two ranks holds half the layers. Rank 0 runs every microbatch forward and sends the
activations on; rank 1 finishes the forward, takes the loss and sends the gradients back (GPipe's order,
Huang et al. 2019). While rank 0 waits for the first gradient and rank 1 for the first activation, each
is idle: the bubble, (p - 1) / (m + p - 1) of the step for p stages and m microbatches. More
microbatches shrink it. GPipe holds the whole batch's activations however many microbatches cut it;
1F1B has the same bubble but holds only p microbatches' at once (Narayanan et al. 2021).
"""
from dist_lib import Model


async def train(model: Model, *, microbatches: int = 4) -> None:
    if model.world_size != 2 or model.num_layers < 2 or model.global_batch_size % microbatches:
        raise ValueError(f"this lesson runs on 2 GPUs, at least 2 layers and a batch that splits into "
                         f"{microbatches} microbatches")
    half, size = model.num_layers // 2, model.global_batch_size // microbatches
    mine = range(0, half) if model.rank == 0 else range(half, model.num_layers)
    weights = {layer: model.load_weights(layer) for layer in mine}
    stashes, grads = [], {}
    for k in range(microbatches):  # every forward first
        x = model.get_input_activation(range(k * size, (k + 1) * size)) if model.rank == 0 else await model.recv(0)
        inputs = []
        for layer in mine:
            inputs.append(x)
            x = model.forward(layer, x, weights[layer][0])
        if model.rank == 0:
            await model.send(x, 1)
        stashes.append((inputs, x))
    for k in range(microbatches):  # then every backward
        inputs, out = stashes[k]
        grad = model.loss(out) if model.rank == 1 else await model.recv(1)
        for layer in reversed(mine):
            g, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            grads[layer] = g if layer not in grads else grads[layer] + g
        if model.rank == 1:
            await model.send(grad, 0)
    for layer in mine:
        w, opt = weights[layer]
        model.set_final_weight(layer, model.update(layer, grads[layer], w, opt)[0])


if __name__ == "__main__":
    from pathlib import Path

    from dist_lib import simulate

    one_f_one_b = Path(__file__).resolve().parents[1] / "strategies" / "one_f_one_b.py"
    setup = ("2xA100-80GB", "toy:layers=8", 16)
    for m in (2, 8):
        mine = simulate(__file__, *setup, microbatches=m)
        print(f"hand-written GPipe, {m} microbatches: {mine.time_s * 1e3:.2f} ms, "
              f"bubble {mine.bubble_fraction:.0%}, peak {mine.peak_memory_bytes / 2**30:.2f} GiB")
    builtin = simulate(one_f_one_b, *setup, microbatch_size=2)
    print(f"built-in 1F1B, 8 microbatches: {builtin.time_s * 1e3:.2f} ms, bubble {builtin.bubble_fraction:.0%}, "
          f"peak {builtin.peak_memory_bytes / 2**30:.2f} GiB")

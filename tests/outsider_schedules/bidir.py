"""A bidirectional pipeline in the manner of DualPipe (DeepSeek-AI 2024): two copies of the model run as
pipelines in opposite directions over the same ranks. Copy A has stage s on rank s, copy B on rank p-1-s,
so every rank holds one stage of each; half the microbatches go down copy A, half up copy B, and the two
copies' gradients of each stage are all-reduced between the pair of ranks that hold it. Every rank runs its
ops in the order of their slot in an ideal pipeline, forwards then backwards."""
import asyncio

from dist_lib import Model


async def train(model: Model, *, microbatch_size: int = 1) -> None:
    p, r, L = model.world_size, model.rank, model.num_layers
    assert L % p == 0, f"{L} layers do not split into {p} stages"
    per = L // p
    # (copy, stage) held here; in copy A stage s runs on rank s, in copy B on rank p - 1 - s
    place = {"A": lambda s: s, "B": lambda s: p - 1 - s}
    mine = [("A", r), ("B", p - 1 - r)]
    layers = {s: range(s * per, (s + 1) * per) for _, s in mine}
    weights = {l: model.load_weights(l) for _, s in mine for l in layers[s]}
    m = model.global_batch_size // microbatch_size
    copy_of = lambda k: "A" if k < m // 2 else "B"  # noqa: E731
    plan = sorted([(s + k, "F", c, s, k) for c, s in mine for k in range(m) if copy_of(k) == c]
                  + [(10**6 + (p - 1 - s) + k, "B", c, s, k) for c, s in mine for k in range(m) if copy_of(k) == c])
    stash, grads, pending, losses = {}, {}, [], {}
    for _, kind, c, s, k in plan:
        where = place[c]
        if kind == "F":
            if s == 0:
                x = model.get_input_activation(range(k * microbatch_size, (k + 1) * microbatch_size))
            else:
                x = await model.recv(where(s - 1))
            ins = []
            for l in layers[s]:
                ins.append(x)
                x = model.forward(l, x, weights[l][0])
            stash[k] = ins
            if s == p - 1:
                losses[k] = model.loss(x)
            else:
                pending.append(model.send(x, where(s + 1)))
        else:
            g = losses.pop(k) if s == p - 1 else await model.recv(where(s + 1))
            ins = stash.pop(k)
            for l in reversed(layers[s]):
                wg, g = model.backward(l, ins.pop(), g, weights[l][0])
                grads[l] = wg if l not in grads else grads[l] + wg
            if s > 0:
                pending.append(model.send(g, where(s - 1)))
    await asyncio.gather(*pending)
    pair = model.group([r, p - 1 - r])
    for l, (w, opt) in sorted(weights.items()):
        total = await model.all_reduce(grads[l], group=pair)
        model.set_final_weight(l, model.update(l, total, w, opt)[0])

"""A V-shaped pipeline on 4 ranks (each rank holds two chunks, one from each end: rank r runs stage r and
stage 2p-1-r), the placement of DualPipe/ZB-V. Microbatches flow down the V and back up; every rank runs
its ops in the order of the time slot they would have in an ideal pipeline (stage + microbatch), forwards
first (GPipe-like), then backwards."""
from dist_lib import Model


def owner(stage: int, p: int) -> int:
    return stage if stage < p else 2 * p - 1 - stage


async def train(model: Model, *, microbatch_size: int = 1) -> None:
    p, r, L = model.world_size, model.rank, model.num_layers
    stages = 2 * p
    assert L % stages == 0, f"{L} layers do not split into {stages} stages"
    per = L // stages
    mine = [r, stages - 1 - r]
    layers = {s: range(s * per, (s + 1) * per) for s in mine}
    weights = {l: model.load_weights(l) for s in mine for l in layers[s]}
    m = model.global_batch_size // microbatch_size
    plan = sorted([(s + k, "F", s, k) for s in mine for k in range(m)]
                  + [(10**6 + (stages - 1 - s) + k, "B", s, k) for s in mine for k in range(m)])
    outputs, stash, grads, pending = {}, {}, {}, []
    for _, kind, s, k in plan:
        if kind == "F":
            if s == 0:
                x = model.get_input_activation(range(k * microbatch_size, (k + 1) * microbatch_size))
            elif owner(s - 1, p) == r:
                x = outputs.pop((s - 1, k))
            else:
                x = await model.recv(owner(s - 1, p))
            ins = []
            for l in layers[s]:
                ins.append(x)
                x = model.forward(l, x, weights[l][0])
            stash[(s, k)] = ins
            if s == stages - 1:
                outputs[("loss", k)] = model.loss(x)
            elif owner(s + 1, p) == r:
                outputs[(s, k)] = x
            else:
                pending.append(model.send(x, owner(s + 1, p)))
        else:
            if s == stages - 1:
                g = outputs.pop(("loss", k))
            elif owner(s + 1, p) == r:
                g = outputs.pop(("grad", s + 1, k))
            else:
                g = await model.recv(owner(s + 1, p))
            ins = stash.pop((s, k))
            for l in reversed(layers[s]):
                wg, g = model.backward(l, ins.pop(), g, weights[l][0])
                grads[l] = wg if l not in grads else grads[l] + wg
            if s == 0:
                del g
            elif owner(s - 1, p) == r:
                outputs[("grad", s, k)] = g
            else:
                pending.append(model.send(g, owner(s - 1, p)))
    for work in pending:
        await work
    for l, (w, opt) in weights.items():
        model.set_final_weight(l, model.update(l, grads[l], w, opt)[0])

"""Hybrid-sharded data parallel (HSDP): ZeRO-3 shards inside each node, replicas across nodes. Each layer
is all-gathered within the node before use (prefetching the next), its gradient reduce-scattered within
the node every microbatch (shards accumulate), and the shards all-reduced across nodes at the end."""
import asyncio

from dist_lib import Model


async def train(model: Model, *, per_node: int = 4, microbatch_size: int = 1) -> None:
    r, L = model.rank, model.num_layers
    local, replica = r % per_node, r // per_node
    node_group = model.group(range(replica * per_node, (replica + 1) * per_node))
    cross_group = model.group(range(local, model.world_size, per_node))
    shards = [model.load_weights(l, local, per_node) for l in range(L)]
    share = model.global_batch_size // model.world_size
    acc = [None] * L
    for start in range(r * share, (r + 1) * share, microbatch_size):
        x = model.get_input_activation(range(start, start + microbatch_size))
        inputs = []
        nxt = model.all_gather(shards[0][0], group=node_group)
        for l in range(L):
            w = await nxt
            if l + 1 < L:
                nxt = model.all_gather(shards[l + 1][0], group=node_group)
            inputs.append(x)
            x = model.forward(l, x, w)
        grad = model.loss(x)
        nxt = model.all_gather(shards[L - 1][0], group=node_group)
        scattered = []
        for l in reversed(range(L)):
            w = await nxt
            if l > 0:
                nxt = model.all_gather(shards[l - 1][0], group=node_group)
            g, grad = model.backward(l, inputs.pop(), grad, w)
            scattered.append((l, model.reduce_scatter(g, group=node_group)))
        for l, work in scattered:
            s = await work
            acc[l] = s if acc[l] is None else acc[l] + s
    totals = await asyncio.gather(*(model.all_reduce(acc[l], group=cross_group) for l in range(L)))
    for l, total in enumerate(totals):
        w, opt = shards[l]
        model.set_final_weight(l, model.update(l, total, w, opt)[0])

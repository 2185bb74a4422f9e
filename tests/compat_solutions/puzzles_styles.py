"""Puzzle solutions in the styles seen in published notebooks: adding the all-reduced gradient to
the rank's own (`+=`), keeping every tensor until the end, a ring exchange that only works if sends
never block (it hangs on the original), and a pipeline whose sends wait for the receiver."""

from lib import Model


async def ddp_plus_equals(model: Model) -> Model:
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L = model.LAYERS
    for l in range(L):
        weights[l], opt_states[l] = model.load_weights(l)
    activations[0] = model.get_activation([model.rank])
    for l in range(L):
        activations[l + 1] = model.forward(l, activations[l], weights[l])
    grad_activations[L] = model.loss(activations[L])
    for l in reversed(range(L)):
        grad_weights[l], grad_activations[l] = model.backward(l, activations[l], grad_activations[l + 1], weights[l])
    for l in range(L):
        grad_weights[l] += await model.allreduce(grad_weights[l], l)
        weights[l], opt_states[l] = model.update(l, grad_weights[l], weights[l], opt_states[l])
        model.set_final_weight(l, weights[l])
    return model


async def fsdp_drop_late(model: Model) -> Model:
    """FSDP that keeps the gathered weights and every activation until the updates are done."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L, n = model.LAYERS, model.RANKS
    for l in range(L):
        weights[l], opt_states[l] = model.load_weights(l, model.rank, n)
    activations[0] = model.get_activation([model.rank])
    for l in range(L):
        weights["full", l] = await model.allgather(weights[l], l)
        activations[l + 1] = model.forward(l, activations[l], weights["full", l])
    grad_activations[L] = model.loss(activations[L])
    for l in reversed(range(L)):
        grad_weights[l], grad_activations[l] = model.backward(l, activations[l], grad_activations[l + 1],
                                                              weights["full", l])
    for l in range(L):
        grad_weights[l] = await model.scatterreduce(grad_weights[l], l)
        weights[l], opt_states[l] = model.update(l, grad_weights[l], weights[l], opt_states[l])
        model.set_final_weight(l, weights[l])
    return model


async def ring_sends_first(model: Model) -> Model:
    """Every rank sends two messages to its right neighbour before receiving anything: the second
    send finds the neighbour's mailbox full, and every rank waits on its neighbour."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    right = (model.rank + 1) % model.RANKS
    weights[0], opt_states[0] = model.load_weights(0)
    await model.pass_to(right, weights[0])
    await model.pass_to(right, opt_states[0])
    await model.receive()
    await model.receive()
    return model


async def pipeline_waiting_sends(model: Model) -> Model:
    """A pipeline where rank 0 streams every microbatch to rank 1 at once: each send waits until
    the previous one is received, so rank 0's clock never runs ahead of the mailbox."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    L, n, rank = model.LAYERS, model.RANKS, model.rank
    per = L // n
    first, last = rank * per, (rank + 1) * per
    for l in range(first, last):
        weights[l], opt_states[l] = model.load_weights(l)
    for b in range(model.BATCHES):
        activations[first, b] = model.get_activation([b]) if rank == 0 else await model.receive()
        for l in range(first, last):
            activations[l + 1, b] = model.forward(l, activations[l, b], weights[l])
        if rank != n - 1:
            await model.pass_to(rank + 1, activations[last, b])
    for b in range(model.BATCHES):
        grad_activations[last, b] = model.loss(activations[last, b]) if rank == n - 1 else await model.receive()
        for l in reversed(range(first, last)):
            g, grad_activations[l, b] = model.backward(l, activations[l, b], grad_activations[l + 1, b], weights[l])
            grad_weights[l] = g if l not in grad_weights else grad_weights[l] + g
            del activations[l, b], grad_activations[l + 1, b]
        if rank != 0:
            await model.pass_to(rank - 1, grad_activations[first, b])
        del grad_activations[first, b]
        activations.pop((last, b), None)
    for l in range(first, last):
        weights[l], opt_states[l] = model.update(l, grad_weights[l], weights[l], opt_states[l])
        model.set_final_weight(l, weights[l])
    return model

"""ZeRO data parallelism, stages 1, 2 and 3 (stage 3 is what PyTorch calls FSDP).

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", sec. 5.
With n data-parallel ranks and Psi parameters, per-rank model state falls from DDP's 16 Psi bytes to
  stage 1: 2 + 2 + 12/n   (optimizer state sharded)
  stage 2: 2 + (2 + 12)/n (gradients too: each microbatch's gradient is reduce-scattered at once)
  stage 3: (2 + 2 + 12)/n (weights too: gathered just in time for each layer's forward and backward,
           the next layer's all-gather prefetched while the current one computes)
Communication: stages 1 and 2 move what DDP's all-reduce moves (reduce-scatter + all-gather of the
updated shards); stage 3 adds one all-gather per layer in backward, 1.5x in all. Bubble: none.
On one rank a shard is the whole tensor and there is nothing to gather (DeepSpeed and FSDP run with a
data-parallel world of 1 and skip the gathers' work): the step is plain training with ZeRO's bookkeeping.
"""

from __future__ import annotations

from dist_lib import Model, ReplicaGrid

from ._layout import microbatches, replica_samples


async def train(model: Model, *, stage: int = 3, microbatch_size: int = 4) -> None:
    if stage not in (1, 2, 3):
        raise ValueError(f"stage must be 1, 2 or 3 (ZeRO stage), got {stage!r}")
    rank, n, layers = model.rank, model.world_size, model.num_layers
    first, count = replica_samples(model.global_batch_size, n, rank)
    batches = microbatches(first, count, microbatch_size)
    if stage == 3:
        await _fully_sharded(model, batches)
        return

    # Stages 1 and 2: full 16-bit weights, optimizer state of shard `rank` only.
    weights, opt_states = [], []
    for layer in range(layers):
        weight, opt_state = model.load_sharded_state(layer, shard=rank, num_shards=n)
        weights.append(weight)
        opt_states.append(opt_state)
    full_grads: list = [None] * layers  # stage 1 accumulates whole gradients ...
    shards = _Shards(model)  # ... stage 2 (and stage 1 at the end) reduce-scatter them into shards
    for i, samples in enumerate(batches):
        last = i == len(batches) - 1
        inputs, x = [], model.get_input_activation(samples)
        for layer in range(layers):
            inputs.append(x)
            x = model.forward(layer, x, weights[layer])
        grad = model.loss(x)
        del x
        for layer in reversed(range(layers)):
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer])
            if stage == 1:
                full_grads[layer] = weight_grad if full_grads[layer] is None else full_grads[layer] + weight_grad
                weight_grad = full_grads[layer] if last else None
                full_grads[layer] = None if last else full_grads[layer]
            if weight_grad is not None:  # reduce-scatter now, overlapping the rest of the backward
                await shards.add(layer, weight_grad)
            del weight_grad
        del grad
    # Update this rank's shard with the full weight, then all-gather the updated shards.
    gathered = {}
    for layer in reversed(range(layers)):
        grad = await shards.pop(layer)
        new_shard, _ = model.update(layer, grad, weights[layer], opt_states[layer])
        weights[layer] = opt_states[layer] = grad = None
        gathered[layer] = _gather(model, new_shard)
        del new_shard
    for layer in reversed(range(layers)):
        model.set_final_weight(layer, await gathered.pop(layer))


def _gather(model: Model, shard):
    """Start the all-gather of a weight shard; on one rank the shard is already whole (1 of 1), and
    awaiting the result gives it back unchanged."""
    return model.all_gather(shard) if model.world_size > 1 else _Whole(shard)


class _Whole:
    """An awaitable that gives back a tensor at once, like a finished `Work`. (A coroutine would do the
    same, but one left unawaited when the step fails, a prefetch the failing rank never reached, makes
    Python warn "coroutine was never awaited" beside the step's error.)"""

    __slots__ = ("tensor",)

    def __init__(self, tensor) -> None:
        self.tensor = tensor

    def __await__(self):
        return self.tensor
        yield  # (unreached: makes `__await__` a generator that finishes at once with the tensor)


class _Shards:
    """Accumulates the gradient shards reduce-scatters deliver. A pending reduce-scatter keeps its full
    input gradient alive (as a stream does), so finished ones are collected as the backward goes on, and
    at most `depth` stay in flight."""

    def __init__(self, model: Model, depth: int = 2):
        self.model, self.depth = model, depth
        self.pending: list = []  # (layer, work) in issue order
        self.total: dict = {}

    async def add(self, layer: int, weight_grad) -> None:
        self.pending.append((layer, self.model.reduce_scatter(weight_grad)))
        while self.pending and (len(self.pending) > self.depth or self._finished(self.pending[0][1])):
            await self._collect()

    def _finished(self, work) -> bool:
        return work.done and work.end <= self.model.time

    async def _collect(self) -> None:
        layer, work = self.pending.pop(0)
        shard = await work
        total = self.total.get(layer)
        self.total[layer] = shard if total is None else total + shard

    async def pop(self, layer: int):
        while any(l == layer for l, _ in self.pending):
            await self._collect()
        return self.total.pop(layer)


async def _fully_sharded(model: Model, batches: list[range]) -> None:
    """Stage 3: only shards live between uses; every forward and backward gathers its layer."""
    rank, n, layers = model.rank, model.world_size, model.num_layers
    state = [model.load_weights(layer, shard=rank, num_shards=n) for layer in range(layers)]
    shards = _Shards(model)
    for samples in batches:
        # forward: gather layer l+1 while layer l computes, drop each full weight after use
        inputs, x = [], model.get_input_activation(samples)
        gather = _gather(model, state[0][0])
        for layer in range(layers):
            weight = await gather
            if layer + 1 < layers:
                gather = _gather(model, state[layer + 1][0])
            inputs.append(x)
            x = model.forward(layer, x, weight)
            del weight
        grad = model.loss(x)
        del x
        # backward: the same in reverse; each gradient is reduce-scattered as soon as it exists
        gather = _gather(model, state[layers - 1][0])
        for layer in reversed(range(layers)):
            weight = await gather
            if layer > 0:
                gather = _gather(model, state[layer - 1][0])
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weight)
            del weight
            await shards.add(layer, weight_grad)
            del weight_grad
        del grad
    for layer in reversed(range(layers)):
        weight, opt_state = state[layer]
        state[layer] = None
        new_shard, _ = model.update(layer, await shards.pop(layer), weight, opt_state)
        del weight, opt_state
        model.set_final_weight(layer, new_shard)


def replica_grid(world_size: int, global_batch_size: int, **options) -> ReplicaGrid:
    """Every rank is a replica running one program over its share of the batch: they fold
    (`dist_lib/run/folding.py`)."""
    return ReplicaGrid(world_size)

"""Data parallel (DDP): every rank holds the whole model and trains on its share of the global batch.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", sec. 3.2.
Gradients accumulate locally over microbatches (`no_sync`); during the last microbatch's backward,
layers' gradients are gathered into buckets of about `bucket_mb` megabytes in backward order, and a
bucket's all-reduce starts as soon as its last gradient is ready, overlapping the rest of the backward
pass. (The sandbox all-reduces one tensor per call, so a bucket is issued as its layers' all-reduces back
to back: the bucket decides *when* communication starts; `bucket_mb=0` starts each layer at once.)
Bubble: none. Memory: 16 bytes per parameter on every rank (2 weight + 2 gradient + 12 Adam) plus one
microbatch of activations.
"""

from __future__ import annotations

from dist_lib import Model, ReplicaGrid

from ._layout import microbatches, replica_samples


async def train(model: Model, *, microbatch_size: int = 4, bucket_mb: float = 25.0) -> None:
    if not isinstance(bucket_mb, (int, float)) or not bucket_mb >= 0:  # (NaN too: it compares false)
        raise ValueError(f"bucket_mb must be a number of megabytes >= 0, got {bucket_mb!r}")
    layers = model.num_layers
    first, count = replica_samples(model.global_batch_size, model.world_size, model.rank)
    batches = microbatches(first, count, microbatch_size)

    weights, opt_states = [], []
    for layer in range(layers):
        weight, opt_state = model.load_weights(layer)
        weights.append(weight)
        opt_states.append(opt_state)
    del weight, opt_state
    grads: list = [None] * layers
    reduced: list = [None] * layers  # each layer's all-reduce Work
    bucket: list[int] = []
    bucket_bytes = 0
    for i, samples in enumerate(batches):
        last = i == len(batches) - 1
        # 1. forward, keeping every layer's input (it carries the stash backward needs)
        inputs = []
        x = model.get_input_activation(samples)
        for layer in range(layers):
            inputs.append(x)
            x = model.forward(layer, x, weights[layer])
        grad = model.loss(x)
        del x
        # 2. backward, accumulating; on the last microbatch, all-reduce each bucket once it is full
        for layer in reversed(range(layers)):
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer])
            grads[layer] = weight_grad if grads[layer] is None else grads[layer] + weight_grad
            del weight_grad
            if last:
                bucket.append(layer)
                bucket_bytes += grads[layer].nbytes
                if bucket_bytes >= bucket_mb * 1e6 or layer == 0:
                    for b in bucket:
                        reduced[b] = model.all_reduce(grads[b])
                        grads[b] = None
                    bucket, bucket_bytes = [], 0
        del grad
    # 3. wait for each layer's reduced gradient, update, hand in
    for layer in reversed(range(layers)):
        weight, opt_state = weights[layer], opt_states[layer]
        weights[layer] = opt_states[layer] = None
        work, reduced[layer] = reduced[layer], None
        new_weight, _ = model.update(layer, await work, weight, opt_state)
        model.set_final_weight(layer, new_weight)


def replica_grid(world_size: int, global_batch_size: int, **options) -> ReplicaGrid:
    """Every rank is a replica running one program over its share of the batch: they fold
    (`dist_lib/run/folding.py`)."""
    return ReplicaGrid(world_size)

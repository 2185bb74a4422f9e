"""FSDP2 frees a block's whole gradient once its reduce-scatter is done: the next block's post-backward waits
for the previous reduce-scatter and drops its buffers (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py,
`FSDPParamGroup.post_backward`), so at most two whole layer gradients are alive at once, not one per layer."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate, testing

LAYERS = 6
SMALL = Workload.parse(f"gpt-125m:layers={LAYERS},vocab=8192")
# a gpt-125m layer's parameters, 12h^2 + 13h (QKV, projection, MLP weights and biases, two layernorms), 16-bit;
# layer 0's gradient also holds the embeddings', so layers 1 to 5 are the ones of this size
WHOLE_LAYER_GRAD = 2 * (12 * SMALL.hidden ** 2 + 13 * SMALL.hidden)


def _most_whole_grads_alive(sharding: dict, rank: int = 0) -> int:
    result = simulate("strategies/hybrid.py", "1x2xA100-80GB", SMALL, 2, pp=1, dp=2, microbatch_size=1, **sharding)
    assert result.correct
    return testing.most_alive(result, "weight_grad", WHOLE_LAYER_GRAD, rank)


def test_fsdp_frees_each_whole_layer_gradient_after_its_reduce_scatter():
    assert _most_whole_grads_alive({"fsdp": True}) == 2  # the layer just reduced and the one before it


@pytest.mark.parametrize("sharding", [{}, {"distributed_optimizer": True}])
def test_unsharded_and_distributed_optimizer_gradients_stay_to_the_step(sharding):
    # DDP all-reduces in place and the distributed optimizer keeps its whole gradient buffer to the step
    assert _most_whole_grads_alive(sharding) == LAYERS - 1

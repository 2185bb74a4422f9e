"""What a context-parallel stage keeps, as a plain stage keeps it: with sequence parallelism and full recompute a
checkpointed layer input as its 1/t piece of the CP rank's s/cp tokens (Korthikanti et al. 2022, sec. 4.2.2),
all-gathered in the TP group before the recompute; with FSDP each layer's whole gradient freed once its
reduce-scatter over the dp x cp ranks is done (FSDP2's post-backward,
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py `FSDPParamGroup.post_backward`)."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate, testing

LAYERS = 4
SMALL = Workload.parse(f"gpt-125m:layers={LAYERS},vocab=8192")


def _recompute_run(sequence_parallel: bool):
    """cp = 2 x tp = 2 on four GPUs, one microbatch of b = 2 samples, full recompute."""
    return simulate("strategies/hybrid.py", "1x4xA100-80GB", SMALL, 2, pp=1, tp=2, cp=2, microbatch_size=2,
                    recompute=True, sequence_parallel=sequence_parallel)


def _activation_bytes_before_loss(result) -> int:
    """Live activation bytes on rank 0 once every layer's forward ran, before the LM head."""
    return testing.live_bytes_before(result, "loss", "activation")


def test_cp_full_recompute_with_sequence_parallelism_keeps_each_layer_input_as_its_tp_piece():
    # a CP rank's share of one sample's layer input is 2 (s/cp) h bytes (16-bit); b = 2 samples, t = 2 TP ranks.
    # Before the head: the L checkpointed inputs and the last layer's output (whole: b x 2 (s/cp) h)
    b, t, part = 2, 2, 2 * (SMALL.seq_len // 2) * SMALL.hidden
    assert _activation_bytes_before_loss(_recompute_run(False)) == LAYERS * b * part + b * part
    assert _activation_bytes_before_loss(_recompute_run(True)) == LAYERS * b * part // t + b * part


def test_cp_recompute_gathers_the_checkpointed_piece_before_rerunning_the_layer():
    result = _recompute_run(True)
    assert result.correct
    gathers = [e for e in result.events if e.rank == 0 and e.op == "all_gather" and e.peers == (0, 1)
               and e.detail == "activation slices (TP gather)"]
    assert sorted(g.layer for g in gathers) == list(range(LAYERS))  # one per checkpointed layer input
    part = 2 * (SMALL.seq_len // 2) * SMALL.hidden
    assert {g.nbytes for g in gathers} == {2 * part}  # gathered into the CP part of b = 2 samples


# a gpt-125m layer's parameters, 12h^2 + 13h (QKV, projection, MLP weights and biases, two layernorms), 16-bit;
# layer 0's gradient also holds the embeddings', so layers 1 to 5 are the ones of this size
GRAD_LAYERS = 6
GRAD_MODEL = Workload.parse(f"gpt-125m:layers={GRAD_LAYERS},vocab=8192")
WHOLE_LAYER_GRAD = 2 * (12 * GRAD_MODEL.hidden ** 2 + 13 * GRAD_MODEL.hidden)


def _grad_run(sharding: dict):
    return simulate("strategies/hybrid.py", "1x4xA100-80GB", GRAD_MODEL, 2, pp=1, dp=2, cp=2, microbatch_size=1,
                    **sharding)


def _most_whole_grads_alive(result) -> int:
    return testing.most_alive(result, "weight_grad", WHOLE_LAYER_GRAD)


def test_cp_fsdp_frees_each_whole_layer_gradient_after_its_reduce_scatter():
    """dp = 2 x cp = 2: each layer's gradient of this rank's sequence part is reduce-scattered over the four
    ranks; the next layer's backward waits for it, so at most the layer just reduced and the one before it are
    whole at once."""
    result = _grad_run({"fsdp": True})
    assert result.correct
    assert _most_whole_grads_alive(result) == 2


@pytest.mark.parametrize("sharding", [{}, {"distributed_optimizer": True}])
def test_cp_unsharded_and_distributed_optimizer_gradients_stay_to_the_step(sharding):
    # DDP all-reduces in place and the distributed optimizer keeps its whole gradient buffer to the step
    assert _most_whole_grads_alive(_grad_run(sharding)) == GRAD_LAYERS - 1

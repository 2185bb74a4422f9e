"""Tensor parallelism (partial sums) and ZeRO shards (gather before compute) end to end."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate

from dist_lib.costs import compute as costs

from dist_lib.costs import network
from dist_lib.hardware.devices import DEVICES, NVLINK_3
from dist_lib.errors import CollectiveMismatchError, TensorError

A100 = DEVICES["A100-80GB"]
TOY = Workload.parse("toy:layers=1")


async def tensor_parallel(model):
    """Both ranks run the same two samples on their half of the layer (Megatron)."""
    tp = model.group([0, 1])
    w, o = model.load_weights(0, tp_rank=model.rank, tp_size=2)
    x = model.get_input_activation(range(2))
    partial = model.forward(0, x, w)
    assert partial.is_partial
    out = await model.all_reduce(partial, group=tp)
    assert not out.is_partial
    wg, grad_in = model.backward(0, x, model.loss(out), w)
    grad_in = await model.all_reduce(grad_in, group=tp)
    new_w, _ = model.update(0, wg, w, o)
    model.set_final_weight(0, new_w)


def test_tensor_parallel_step_is_correct_and_costs_two_all_reduces_per_layer_pass():
    result = simulate(tensor_parallel, "2xA100-80GB", TOY, 2)
    f = costs.forward_time(A100, TOY, 0, 2, tp=2)
    b = costs.backward_time(A100, TOY, 0, 2, tp=2)
    loss = costs.loss_time(A100, TOY, 2)
    tp_comm = 2 * network.all_reduce_time(2 * TOY.activation_bytes(), 2, NVLINK_3)
    update = costs.update_time(A100, TOY.layer_params(0) / 2)
    assert result.time_s == pytest.approx(f + tp_comm + loss + b + tp_comm + update)
    assert result.memory_by_kind[0]["optimizer"] == int(12 * TOY.layer_params(0) / 2)


HEAD = Workload.parse("gpt-125m:layers=1,vocab=8192")


async def vocabulary_parallel_head(model):
    """Both ranks hold half of the layer and half of the output embedding (Megatron-LM)."""
    tp = model.group([0, 1])
    w, o = model.load_weights(0, tp_rank=model.rank, tp_size=2)
    x = model.get_input_activation(range(2))
    out = await model.all_reduce(model.forward(0, x, w), group=tp)
    grad = model.loss(out, tp_rank=model.rank, tp_size=2)
    assert grad.is_partial  # each rank's vocabulary slice gives part of the input gradient
    grad = await model.all_reduce(grad, group=tp)
    wg, grad_in = model.backward(0, x, grad, w)
    await model.all_reduce(grad_in, group=tp)
    model.set_final_weight(0, model.update(0, wg, w, o)[0])


def test_vocabulary_parallel_head_costs_half_on_each_of_two_ranks():
    result = simulate(vocabulary_parallel_head, "2xA100-80GB", HEAD, 2)
    [loss] = {e.duration for e in result.events if e.op == "loss"}
    assert loss == pytest.approx(costs.loss_time(A100, HEAD, 2, 2))
    assert loss < 0.6 * costs.loss_time(A100, HEAD, 2, 1)


def test_a_vocabulary_slice_of_the_loss_gradient_must_be_all_reduced_before_backward():
    async def train(model):
        w, o = model.load_weights(0, tp_rank=model.rank, tp_size=2)
        x = model.get_input_activation(range(2))
        out = await model.all_reduce(model.forward(0, x, w), group=[0, 1])
        model.backward(0, x, model.loss(out, tp_rank=model.rank, tp_size=2), w)

    with pytest.raises(TensorError, match="partial"):
        simulate(train, "2xA100-80GB", HEAD, 2)


def test_partial_sums_of_different_tp_degrees_are_not_one_sum():
    """Slice 0 of 2 and slice 1 of 64 of the head's input gradient cover the parts {0, 1}, which is all of
    a split in 2 only: the second rank would pay 1/64 of the head for half the sum."""
    async def train(model):
        w, o = model.load_weights(0)
        x = model.forward(0, model.get_input_activation(range(2)), w)
        tp = 2 if model.rank == 0 else 64
        await model.all_reduce(model.loss(x, tp_rank=model.rank, tp_size=tp), group=[0, 1])

    with pytest.raises(CollectiveMismatchError, match=r"partial sums of different tensor-parallel degrees "
                                                      r"\{0: 2, 1: 64\}"):
        simulate(train, "2xA100-80GB", HEAD, 2)


def test_loss_rejects_a_tp_rank_outside_its_slice():
    async def train(model):
        w, _ = model.load_weights(0)
        model.loss(model.forward(0, model.get_input_activation([0]), w), tp_rank=2, tp_size=2)

    with pytest.raises(TensorError, match="rank 0 loss: tp_rank=2, tp_size=2"):
        simulate(train, "1xA100-80GB", HEAD, 1)


async def zero3(model):
    """Shards gathered before compute, gradients reduce-scattered back to shards."""
    w_shard, o_shard = model.load_weights(0, shard=model.rank, num_shards=2)
    w = await model.all_gather(w_shard)
    assert w.is_complete
    x = model.get_input_activation([model.rank])
    wg, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
    del w
    g_shard = await model.reduce_scatter(wg)
    assert (g_shard.shards, g_shard.num_shards, g_shard.samples) == (1 << model.rank, 2, 0b11)
    new_w, _ = model.update(0, g_shard, w_shard, o_shard)
    model.set_final_weight(0, new_w)


def test_zero3_step_is_correct():
    result = simulate(zero3, "2xA100-80GB", TOY, 2)
    assert result.correct
    gather = network.all_gather_time(2 * TOY.layer_params(0), 2, NVLINK_3)
    assert [e.duration for e in result.events if e.op == "all_gather"] == [pytest.approx(gather)] * 2


async def zero1(model):
    """Full weights and gradients, sharded optimizer: update a shard, then gather the new weights."""
    w, _ = model.load_weights(0)
    _, o_shard = model.load_weights(0, shard=model.rank, num_shards=2)
    x = model.get_input_activation([model.rank])
    wg, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
    wg = await model.all_reduce(wg)
    new_shard, _ = model.update(0, wg, w, o_shard)
    full = await model.all_gather(new_shard)
    assert (full.step, full.is_complete) == (1, True)
    model.set_final_weight(0, full)


def test_zero1_step_is_correct():
    assert simulate(zero1, "2xA100-80GB", TOY, 2).correct


def test_a_missing_shard_fails_the_check():
    async def train(model):
        w_shard, o_shard = model.load_weights(0, shard=model.rank, num_shards=2)
        w = await model.all_gather(w_shard)
        x = model.get_input_activation([model.rank])
        wg, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
        g_shard = await model.reduce_scatter(wg)
        new_w, _ = model.update(0, g_shard, w_shard, o_shard)
        if model.rank == 0:
            model.set_final_weight(0, new_w)

    result = simulate(train, "2xA100-80GB", TOY, 2, check=False)
    assert result.problems == ["layer 0: ZeRO shards 1 of 2 were never handed in"]


def test_split_backward_costs_the_same_as_backward_here():
    async def train(model):
        w, o = model.load_weights(0)
        x = model.get_input_activation([0])
        grad = model.loss(model.forward(0, x, w))
        model.backward_input(0, x, grad, w)
        wg = model.backward_weight(0, x, grad, w)
        model.set_final_weight(0, model.update(0, wg, w, o)[0])

    result = simulate(train, "1xA100-80GB", TOY, 1)
    split = [e.duration for e in result.events if e.op.startswith("backward_")]
    assert split == [pytest.approx(costs.backward_input_time(A100, TOY, 0, 1)),
                     pytest.approx(costs.backward_weight_time(A100, TOY, 0, 1))]

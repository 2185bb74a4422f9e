"""Tensors belong to the step that made them: one kept from an earlier `simulate()` (in a module global, a
closure) and handed to an op of a later step is a `TensorError` naming the rank and the op, in C and Python."""

from __future__ import annotations

import asyncio

import pytest

from dist_lib import TensorError, simulate

EARLIER = ("is a tensor of an earlier step; tensors belong to the step that made them: start each step from "
           "load_weights and get_input_activation, and keep no tensor between simulate() calls")


def full_step(model, kept):
    """A correct step of a 1-layer model on a batch of two samples that one rank computes whole, keeping
    every tensor it makes in `kept` (and the gradient of sample 1 alone)."""
    w, o = kept["w"], kept["o"] = model.load_weights(0)
    x = kept["x"] = model.get_input_activation([0, 1])
    out = kept["out"] = model.forward(0, x, w)
    g = kept["g"] = model.loss(out)
    wg, xg = kept["wg"], kept["xg"] = model.backward(0, x, g, w)
    final = kept["final"] = model.update(0, wg, w, o)[0]
    model.set_final_weight(0, final)
    kept["shard"] = model.load_weights(0, 0, 2)[0]
    kept["wg1"] = _grad(model, [1])


def _grad(model, samples):
    w, _ = model.load_weights(0)
    x = model.get_input_activation(samples)
    return model.backward(0, x, model.loss(model.forward(0, x, w)), w)[0]


def _backward_with(model, op, grad):
    w, _ = model.load_weights(0)
    x = model.get_input_activation([0, 1])
    model.forward(0, x, w)
    return op(0, x, grad, w)


MISTAKES = {
    # name: what the second step does on rank 0 with the first step's tensors `old`; the op and tensor named
    "set_final_weight": (lambda m, old: m.set_final_weight(0, old["final"]),
                         "set_final_weight(layer 0): Weight(layer 0, samples 0-1, step 1, rank 0)"),
    "update_grad": (lambda m, old: m.update(0, old["wg"], *m.load_weights(0)),
                    "update(layer 0): WeightGrad(layer 0, samples 0-1, rank 0)"),
    "update_weight": (lambda m, old: m.update(0, _grad(m, [0, 1]), old["w"], m.load_weights(0)[1]),
                      "update(layer 0): Weight(layer 0, step 0, rank 0)"),
    "forward_input": (lambda m, old: m.forward(0, old["x"], m.load_weights(0)[0]),
                      "forward(layer 0): Activation(layer 0, samples 0-1, rank 0)"),
    "forward_weight": (lambda m, old: m.forward(0, m.get_input_activation([0]), old["w"]),
                       "forward(layer 0): Weight(layer 0, step 0, rank 0)"),
    "backward_grad": (lambda m, old: _backward_with(m, m.backward, old["g"]),
                      "backward(layer 0): ActivationGrad(layer 1, samples 0-1, rank 0)"),
    "backward_input_grad": (lambda m, old: _backward_with(m, m.backward_input, old["g"]),
                            "backward_input(layer 0): ActivationGrad(layer 1, samples 0-1, rank 0)"),
    "loss": (lambda m, old: m.loss(old["out"]), "loss: Activation(layer 1, samples 0-1, rank 0)"),
    "all_reduce": (lambda m, old: m.all_reduce(old["wg"], m.group([0])),
                   "all_reduce(layer 0): WeightGrad(layer 0, samples 0-1, rank 0)"),
    "all_gather": (lambda m, old: m.all_gather(old["shard"], m.group([0, 1])),
                   "all_gather(layer 0): Weight(layer 0, step 0, shards 0 of 2, rank 0)"),
    "reduce_scatter": (lambda m, old: m.reduce_scatter(old["wg"], m.group([0, 1])),
                       "reduce_scatter(layer 0): WeightGrad(layer 0, samples 0-1, rank 0)"),
    "all_reduce_world": (lambda m, old: m.all_reduce(old["wg"]),
                         "all_reduce(layer 0): WeightGrad(layer 0, samples 0-1, rank 0)"),
    "send": (lambda m, old: (m.send(m.get_input_activation([0]), 1), m.send(old["x"], 1)),
             "send to 1: Activation(layer 0, samples 0-1, rank 0)"),
    "split_tp": (lambda m, old: m.split_tp(old["out"], 0, 2), "split_tp: Activation(layer 1, samples 0-1, rank 0)"),
    "split_samples": (lambda m, old: m.split_samples(old["out"], [0]),
                      "split_samples: Activation(layer 1, samples 0-1, rank 0)"),
    "gradient_sum": (lambda m, old: _grad(m, [0]) + old["wg1"],
                     "WeightGrad + WeightGrad (layer 0): gradients of two steps: one of WeightGrad(layer 0, samples "
                     "0, rank 0) and WeightGrad(layer 0, samples 1, rank 0) is a tensor of an earlier step; tensors "
                     "belong to the step that made them"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_tensor_of_an_earlier_step_is_refused_naming_rank_op_and_tensor(mistake):
    """In the second step rank 1 runs a correct step first and rank 0 a forward, so that the ops' C fast
    paths (which need their costs known) meet the kept tensor, not only their Python twins."""
    do, named = MISTAKES[mistake]
    old: dict = {}
    steps = []

    async def train(model):
        if model.rank == 0:
            steps.append(len(steps) + 1)
        if len(steps) == 1:  # the first simulate(): a correct step, rank 0 keeping its tensors
            full_step(model, old if model.rank == 0 else {})
            return
        if model.rank == 1:
            full_step(model, {})
            return
        await asyncio.sleep(0)  # (rank 1 first)
        model.forward(0, model.get_input_activation([0]), model.load_weights(0)[0])
        do(model, old)

    assert simulate(train, "2xA100-80GB", "toy:layers=1", 2).correct
    with pytest.raises(TensorError) as caught:
        simulate(train, "2xA100-80GB", "toy:layers=1", 2)
    if mistake == "gradient_sum":
        assert str(caught.value) == f"rank 0 {named}"
    else:
        assert str(caught.value) == f"rank 0 {named} {EARLIER}"

"""`Model.forward_layers` and `Model.backward_layers` (`dist_lib/model/layer_runs.py`): a run of layers is its
ops one by one, in the same order, with the same checks, events and memory log (run in C and, with
DIST_SANDBOX_PURE_PYTHON=1, in Python); and a plain pipeline stage takes them (`strategies/_pipeline.py`)."""

from __future__ import annotations

import pytest

from dist_lib import TensorError, simulate

LAYERS = 4
MICROBATCHES = 3


def _one_by_one_forward(model, layers, x, loaded):
    xs = [x]
    for layer in layers:
        x = model.forward(layer, x, loaded[layer][0])
        xs.append(x)
    return xs


def _one_by_one_backward(model, layers, held, loaded, grads):
    # as the stage's own loop: the old sum, the weight gradient, the input, then the output gradient let go
    grad = held.pop()
    for layer in reversed(layers):
        x = held.pop()
        weight_grad, grad_in = model.backward(layer, x, grad, loaded[layer][0])
        total = grads.get(layer)
        grads[layer] = weight_grad if total is None else total + weight_grad
        del total, weight_grad, x
        grad = grad_in
    return grad


def _step(runs: bool):
    """A one-rank step of MICROBATCHES forward-backward passes over all layers, each microbatch's layers as a
    run or one op at a time; the gradients summed over the microbatches, then each layer updated."""

    async def train(model):
        forward = model.forward_layers if runs else (lambda *a: _one_by_one_forward(model, *a))
        backward = model.backward_layers if runs else (lambda *a: _one_by_one_backward(model, *a))
        layers = range(model.num_layers)
        loaded = {layer: model.load_weights(layer) for layer in layers}
        grads: dict = {}
        for mb in range(MICROBATCHES):
            held = forward(layers, model.get_input_activation([mb]), loaded)
            held.append(model.loss(held.pop()))
            backward(layers, held, loaded, grads)
            assert held == []
        for layer in reversed(layers):
            weight, opt_state = loaded.pop(layer)
            new_weight, _ = model.update(layer, grads.pop(layer), weight, opt_state)
            del weight, opt_state
            model.set_final_weight(layer, new_weight)

    return simulate(train, "1xA100-80GB", f"toy:layers={LAYERS}", MICROBATCHES)


def _books(result):
    return ([tuple(e) for e in result.raw_events],
            [(list(d), list(k)) for d, _, k in result.memory_log], [list(t) for t, _ in result.timelines])


def test_a_run_of_layers_is_its_ops_one_by_one():
    runs, one_by_one = _step(True), _step(False)
    assert runs.correct and runs.time_s == one_by_one.time_s
    assert _books(runs) == _books(one_by_one)
    # every op an event of its own: a forward and a backward per layer and microbatch, a loss per microbatch
    ops = [e[1] for e in runs.raw_events]
    assert ops.count("forward") == ops.count("backward") == LAYERS * MICROBATCHES
    assert ops.count("loss") == MICROBATCHES


def _failing(runs: bool, wrong: str):
    """What a run (or the same ops one by one) raises when one layer's weight is wrong, and the rank's clock
    then: the ops before it ran, the rest did not."""
    seen = {}

    async def train(model):
        layers = range(model.num_layers)
        loaded = {layer: model.load_weights(layer) for layer in layers}
        x = model.get_input_activation([0])
        if wrong == "forward":
            loaded[2] = loaded[1]  # layer 1's weight where layer 2's belongs
        try:
            held = model.forward_layers(layers, x, loaded) if runs else _one_by_one_forward(model, layers, x, loaded)
            held.append(model.loss(held.pop()))
            loaded[1] = loaded[0]
            grads: dict = {}
            if runs:
                model.backward_layers(layers, held, loaded, grads)
            else:
                _one_by_one_backward(model, layers, held, loaded, grads)
        except (TensorError, KeyError) as exc:
            seen["error"] = f"{type(exc).__name__}: {exc}"
            seen["clock"] = model.time

    simulate(train, "1xA100-80GB", f"toy:layers={LAYERS}", 1, check=False)
    return seen


@pytest.mark.parametrize("wrong", ["forward", "backward"])
def test_a_run_stops_at_the_wrong_op_with_its_message(wrong):
    runs, one_by_one = _failing(True, wrong), _failing(False, wrong)
    assert runs == one_by_one
    layer = 2 if wrong == "forward" else 1
    assert f"layer {layer}" in runs["error"] and runs["clock"] > 0


def test_a_run_names_a_layer_it_was_not_given_weights_for():
    seen = {}

    async def train(model):
        loaded = {0: model.load_weights(0)}
        try:
            model.forward_layers(range(2), model.get_input_activation([0]), loaded)
        except KeyError as exc:
            seen["key"] = exc.args
        seen["forwards"] = model.time > 0

    simulate(train, "1xA100-80GB", "toy:layers=2", 1, check=False)
    assert seen == {"key": (1,), "forwards": True}


def _counting(monkeypatch):
    from dist_lib.model.handle import Model

    calls = {"forward_layers": 0, "backward_layers": 0}
    for name in calls:
        original = getattr(Model, name)

        def counted(self, *args, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(Model, name, counted)
    return calls


def test_a_plain_pipeline_stage_runs_its_chunks_as_runs_but_the_last_microbatch(monkeypatch):
    calls = _counting(monkeypatch)
    # 4 stages of 2 layers, 8 microbatches: a run for each forward, and for each backward but each stage's
    # last, whose layers' gradients complete and start their data-parallel reductions between its ops
    simulate("strategies/hybrid.py", "1x8xA100-80GB", "toy:layers=8", 16, pp=4, dp=2, fold=False)
    assert calls == {"forward_layers": 8 * 8, "backward_layers": 8 * 7}


def test_a_stage_with_tensor_parallelism_runs_op_by_op(monkeypatch):
    calls = _counting(monkeypatch)
    # TP all-reduces run between a TP stage's layers: no runs
    simulate("strategies/hybrid.py", "1x4xA100-80GB", "toy:layers=4", 4, pp=2, tp=2, dp=1, fold=False)
    assert calls == {"forward_layers": 0, "backward_layers": 0}

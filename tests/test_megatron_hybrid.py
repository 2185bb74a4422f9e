"""What `hybrid` does as Megatron-LM does: sequence parallelism, the backward's overlapped TP all-reduce,
recompute that repeats its communication, a vocabulary-parallel head; and the grader's replay re-executes all of it."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate

from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES
from dist_lib.errors import TensorError
from dist_lib.run.recording import record
from dist_lib.run.replay import replay

A100 = DEVICES["A100-80GB"]
SMALL = Workload.parse("gpt-125m:layers=4,vocab=8192")


def test_sequence_parallel_forward_and_backward_cost_and_stash():
    one_layer = Workload.parse("gpt-125m:layers=1,vocab=0")
    grown = {}

    async def train(model):
        tp = model.group([0, 1])
        w, o = model.load_weights(0, tp_rank=model.rank, tp_size=2)
        x = model.get_input_activation(range(2))
        before = model.memory_bytes
        out = model.forward(0, x, w, sequence_parallel=True)
        grown[model.rank] = model.memory_bytes - before
        out = await model.all_reduce(out, tp)
        grad = model.loss(out)
        for _ in range(2):  # the exposed all-gathers before the two row-parallel GEMMs
            grad = await model.all_gather(model.split_tp(grad, model.rank, 2), tp)
        wg, grad_in = model.backward(0, x, grad, w)
        await model.all_reduce(grad_in, tp)
        model.set_final_weight(0, model.update(0, wg, w, o)[0])

    result = simulate(train, "2xA100-80GB", one_layer, 2)
    forward = [e.duration for e in result.events if e.op == "forward"]
    backward = [e for e in result.events if e.op == "backward"]
    assert forward == [pytest.approx(costs.forward_time(A100, one_layer, 0, 2, 2, sequence_parallel=True))] * 2
    assert [e.duration for e in backward] == [pytest.approx(
        costs.backward_time(A100, one_layer, 0, 2, 2, sequence_parallel=True))] * 2
    assert {e.detail for e in backward} == {"sequence-parallel"}
    # the output (2 samples of 2*s*h bytes) and the stash, s*h*(34/t + 5as/(ht)) bytes a sample with
    # sequence parallelism (Korthikanti et al. 2022, Table 2) less the layer input (2*s*h) it includes;
    # gpt-125m: s 2048, h 768, a 12, so 5as/(ht) = 80
    s, h = one_layer.seq_len, one_layer.hidden
    expected = 2 * 2 * s * h + 2 * (34 / 2 + 80 - 2) * s * h
    assert grown == {0: expected, 1: expected}


def _sequence_parallel_step(gather, op="backward"):
    """One layer of gpt-125m over a TP group of two ranks, sequence-parallel, two samples; `gather(model,
    grad, group)` makes the output gradient the backward (or `op`) is given."""
    one_layer = Workload.parse("gpt-125m:layers=1,vocab=0")
    seen = {}

    async def train(model):
        tp = model.group([0, 1])
        w, o = model.load_weights(0, tp_rank=model.rank, tp_size=2)
        x = model.get_input_activation(range(2))
        out = await model.all_reduce(model.forward(0, x, w, sequence_parallel=True), tp)
        grad = await gather(model, model.loss(out), tp)
        seen[model.rank] = repr(grad)
        if op == "backward":
            wg, grad_in = model.backward(0, x, grad, w)
        else:
            grad_in = model.backward_input(0, x, grad, w)
            wg = model.backward_weight(0, x, grad, w)
        await model.all_reduce(grad_in, tp)
        model.set_final_weight(0, model.update(0, wg, w, o)[0])

    return simulate(train, "2xA100-80GB", one_layer, 2), seen


async def _gathered(model, grad, group, sizes=(2, 2)):
    """`grad` split into pieces and all-gathered once per entry of `sizes`, in a group of that many ranks."""
    for size in sizes:
        ranks = [0, 1] if size == 2 else [model.rank]
        grad = await model.all_gather(model.split_tp(grad, ranks.index(model.rank), size), ranks)
    return grad


@pytest.mark.parametrize("op", ["backward", "backward_input"])
def test_a_sequence_parallel_backward_runs_after_two_all_gathers_of_its_output_gradient(op):
    result, seen = _sequence_parallel_step(_gathered, op)
    assert result.correct, result.problems
    assert seen == {r: f"ActivationGrad(layer 1, samples 0-1, gathered in TP groups of 2, 2, rank {r})" for r in (0, 1)}
    # by hand: b*s*h 16-bit values (2 * 2048 * 768 * 2 bytes) all-gathered over two A100s' NVLink at the 240 GB/s
    # NCCL achieves: (t-1)/t * n / B + (t-1) * 3.4 us each; the backward starts when the second one ends
    n = 2 * 2048 * 768 * 2
    one = 1 / 2 * n / 240e9 + 3.4e-6
    for rank in (0, 1):
        events = [e for e in result.events if e.rank == rank]
        gathers = [e for e in events if e.op == "all_gather"]
        assert [g.duration for g in gathers] == [pytest.approx(one)] * 2
        assert gathers[1].start == gathers[0].end
        assert next(e for e in events if e.op == op).start == gathers[1].end


@pytest.mark.parametrize("op", ["backward", "backward_input"])
@pytest.mark.parametrize("sizes, done, fix", [
    ((), 0, "twice"),  # no gather at all: the output gradient as the all-reduce left it
    ((2,), 1, "once more"),  # one of the two
    ((2, 1), 0, "twice"),  # a "gather" in a group of one moves nothing
    ((1, 2), 1, "once more"),
])
def test_a_sequence_parallel_backward_refuses_an_output_gradient_not_gathered_twice(op, sizes, done, fix):
    async def gather(model, grad, group):
        return await _gathered(model, grad, group, sizes)

    with pytest.raises(TensorError, match=rf"rank \d {op}\(layer 0\): layer 0 ran sequence-parallel over 2 TP ranks, "
                                          rf"so its backward needs the output gradient all-gathered in the TP group "
                                          rf"before each of its two row-parallel GEMMs; .* comes out of {done} such "
                                          rf"all-gathers?, not 2: .* of 2, {fix}$"):
        _sequence_parallel_step(gather, op)


def _events(**options):
    return simulate("strategies/hybrid.py", "1x2xA100-80GB", SMALL, 2, pp=1, tp=2, **options).events


def test_input_gradient_all_reduce_runs_beside_the_weight_gradient_gemms():
    events = [e for e in _events() if e.rank == 0]
    inputs = [e for e in events if e.op == "backward_input"]
    weights = [e for e in events if e.op == "backward_weight"]
    reduces = [e for e in events if e.op == "all_reduce" and e.detail.startswith("activation_grad")]
    assert len(inputs) == len(weights) == 4 * 2  # four layers, two microbatches
    for first, second in zip(inputs, weights):
        assert second.start == first.end
        assert any(r.start == first.end and r.layer == first.layer for r in reduces)


def test_full_recompute_repeats_each_layer_forward_all_reduce():
    def forward_reduces(events):
        return sum(1 for e in events if e.rank == 0 and e.op == "all_reduce" and e.detail.startswith("activation "))

    assert forward_reduces(_events()) == 4 * 2
    assert forward_reduces(_events(recompute=True)) == 2 * 4 * 2


@pytest.mark.parametrize("options", [{"sequence_parallel": True, "selective_recompute": True},
                                     {"sequence_parallel": True, "recompute": True}])
def test_the_grader_replays_a_sequence_parallel_hybrid_step_to_the_same_result(options):
    cluster, batch = "2x2xA100-80GB", 8
    result = simulate("strategies/hybrid.py", cluster, SMALL, batch, pp=2, tp=2, **options)
    _, programs = record("strategies/hybrid.py", cluster, SMALL, batch, pp=2, tp=2, **options)
    replayed = replay(programs, cluster, SMALL, batch)
    assert replayed.correct and replayed.time_s == result.time_s
    assert replayed.memory_bytes == result.memory_bytes

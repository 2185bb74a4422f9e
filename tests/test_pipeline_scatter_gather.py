"""Megatron-LM's pipeline messages with TP: each TP rank sends 1/t of the activation and the next stage
all-gathers the pieces (Narayanan et al. 2021, sec. 4.1); and sequence parallelism's exposed backward
all-gathers (Korthikanti et al. 2022, sec. 4.2.2). Values derived by hand from the link figures."""

from __future__ import annotations

import pytest

from dist_lib import Activation, ActivationGrad, Cluster, CollectiveMismatchError, TensorError, Workload, simulate
from dist_lib.tensors import ActivationSlice

TOY = Workload.parse("toy:layers=4")  # h 1024, s 1024: one sample's hidden states are 2 MiB
SAMPLE = 2 * 1024 * 1024


def test_a_tp_piece_holds_a_tth_of_the_bytes_and_the_gather_costs_one_all_gather():
    seen = {}

    async def train(model):
        group = model.group([0, 1])
        x = model.get_input_activation(range(4))
        piece = model.split_tp(x, model.rank, 2)
        seen[model.rank, "piece"] = (type(piece), piece.nbytes, piece.samples)
        del x
        whole = await model.all_gather(piece, group)
        seen[model.rank, "whole"] = (type(whole), whole.nbytes, whole.layer, whole.is_partial)

    result = simulate(train, "1x2xA100-80GB", TOY, 4, check=False)
    for rank in (0, 1):
        assert seen[rank, "piece"] == (ActivationSlice, 4 * SAMPLE // 2, 0b1111)
        assert seen[rank, "whole"] == (Activation, 4 * SAMPLE, 0, False)
    # ring all-gather of the n-byte whole over 2 ranks on NVLink: (p-1)/p * n/B + (p-1) * alpha
    link = Cluster.parse("1x2xA100-80GB").ring_link((0, 1))
    expected = 0.5 * 4 * SAMPLE / link.achieved_bandwidth + link.latency
    gathers = [e for e in result.events if e.op == "all_gather"]
    assert len(gathers) == 2 and {e.nbytes for e in gathers} == {4 * SAMPLE}
    assert [e.duration for e in gathers] == [pytest.approx(expected)] * 2


def _p2p(options: dict, batch: int = 4):
    """hybrid pp=2 tp=2 on two nodes: stage 0 is ranks 0-1 (node 0), stage 1 ranks 2-3 (node 1)."""
    result = simulate("strategies/hybrid.py", "2x2xA100-80GB", TOY, batch, pp=2, tp=2, microbatch_size=1,
                      **options)
    assert result.correct, result.problems
    return result


def test_each_tp_rank_sends_a_tth_of_each_pipeline_message_and_the_receivers_gather_it():
    result = _p2p({})
    sends = [e for e in result.events if e.op == "send"]
    # 4 microbatches, 2 TP ranks, one activation forward and one gradient backward each
    assert len(sends) == 4 * 2 * 2
    assert {e.nbytes for e in sends} == {SAMPLE // 2}
    gathers = [e for e in result.events if e.op == "all_gather"]
    by_rank = {r: sum(1 for e in gathers if e.rank == r) for r in range(4)}
    assert by_rank == {0: 4, 1: 4, 2: 4, 3: 4}  # stage 1 gathers activations, stage 0 gradients
    assert {e.detail for e in gathers if e.rank == 2} == {"activation slices (TP gather)"}
    assert {e.detail for e in gathers if e.rank == 0} == {"activation_grad slices (TP gather)"}
    # each gather ends before the compute it feeds: the receiving stage's forward of that microbatch
    first_forward = min(e.start for e in result.events if e.rank == 2 and e.op == "forward")
    first_gather = min((e for e in gathers if e.rank == 2), key=lambda e: e.start)
    assert first_gather.end <= first_forward


def test_deepspeeds_blocking_messages_are_tp_pieces_too():
    # DeepSpeed's pipeline engine partitions its messages over the model-parallel group
    # (`is_pipe_partitioned`, `is_grad_partitioned`) and gathers them on arrival, as Megatron-LM does
    result = _p2p({"schedule": "deepspeed"})
    sends = [e for e in result.events if e.op == "send"]
    assert len(sends) == 4 * 2 * 2 and {e.nbytes for e in sends} == {SAMPLE // 2}
    gathers = [e for e in result.events if e.op == "all_gather"]
    assert {r: sum(1 for e in gathers if e.rank == r) for r in range(4)} == {0: 4, 1: 4, 2: 4, 3: 4}


def test_without_scatter_gather_every_tp_rank_sends_the_whole_message():
    result = _p2p({"scatter_gather": False})
    sends = [e for e in result.events if e.op == "send"]
    assert len(sends) == 4 * 2 * 2 and {e.nbytes for e in sends} == {SAMPLE}
    assert not [e for e in result.events if e.op == "all_gather"]


def test_a_message_of_half_the_bytes_takes_alpha_plus_half_the_serialization():
    # the two TP ranks of a stage send at once through their own NICs: nothing shares a link
    link = Cluster.parse("2x2xA100-80GB").p2p_link(0, 2)
    result = _p2p({})
    first = min((e for e in result.events if e.op == "send" and e.rank == 0), key=lambda e: e.start)
    assert first.duration == pytest.approx(link.latency + SAMPLE / 2 / link.achieved_bandwidth)


def test_sequence_parallel_backward_gathers_the_output_gradient_twice_before_each_layer_exposed():
    result = simulate("strategies/hybrid.py", "1x2xA100-80GB", TOY, 2, pp=1, tp=2, microbatch_size=1,
                      sequence_parallel=True, selective_recompute=True)
    assert result.correct, result.problems
    events = sorted((e for e in result.events if e.rank == 0), key=lambda e: (e.start, e.end))
    gathers = [e for e in events if e.op == "all_gather"]
    assert len(gathers) == 2 * 4 * 2  # two per layer backward, four layers, two microbatches
    assert {e.nbytes for e in gathers} == {SAMPLE}
    # each backward_input starts when the second of its layer's gathers ends: nothing hides them
    for backward in (e for e in events if e.op == "backward_input"):
        before = [g for g in gathers if g.end <= backward.start and g.layer == backward.layer + 1]
        assert len(before) >= 2 and max(g.end for g in before) == backward.start


def test_split_tp_errors_name_the_op_and_the_fix():
    async def partial(model):
        w, _ = model.load_weights(0, tp_rank=model.rank, tp_size=2)
        out = model.forward(0, model.get_input_activation(range(2)), w)
        model.split_tp(out, model.rank, 2)

    with pytest.raises(TensorError, match="split_tp: .* partial sum; all_reduce it first"):
        simulate(partial, "1x2xA100-80GB", TOY, 2, check=False)

    async def bad_rank(model):
        model.split_tp(model.get_input_activation(range(2)), 2, 2)

    with pytest.raises(TensorError, match=r"split_tp: tp_rank=2, tp_size=2 is not a TP slice"):
        simulate(bad_rank, "1x2xA100-80GB", TOY, 2, check=False)

    async def compute_on_a_piece(model):
        w, _ = model.load_weights(0)
        model.forward(0, model.split_tp(model.get_input_activation(range(2)), 0, 2), w)

    with pytest.raises(TensorError, match="forward.*all_gather the pieces in the TP group first"):
        simulate(compute_on_a_piece, "1xA100-80GB", TOY, 2, check=False)

    async def wrong_group(model):
        piece = model.split_tp(model.get_input_activation(range(2)), model.rank % 2, 2)
        await model.all_gather(piece, model.group([0, 1, 2, 3]))

    with pytest.raises(CollectiveMismatchError, match="pieces of 2 gathered by 4 ranks"):
        simulate(wrong_group, "1x4xA100-80GB", TOY, 2, check=False)


def test_a_gradient_piece_gathers_into_an_activation_gradient():
    kinds = {}

    async def train(model):
        w, _ = model.load_weights(0)
        grad = model.loss(model.forward(0, model.get_input_activation(range(1)), w))
        whole = await model.all_gather(model.split_tp(grad, model.rank, 2), model.group([0, 1]))
        kinds[model.rank] = (type(whole), whole.nbytes, whole.layer)

    simulate(train, "1x2xA100-80GB", Workload.parse("toy:layers=1"), 1, check=False)
    assert kinds == {0: (ActivationGrad, SAMPLE, 1), 1: (ActivationGrad, SAMPLE, 1)}


def test_the_lm_heads_input_gradient_all_reduce_is_one_all_reduce():
    # a layer's TP partial sums stand for its two all-reduces (attention, MLP); the head's gradient is one

    async def train(model):
        group = model.group([0, 1])
        w, _ = model.load_weights(0)
        grad = model.loss(model.forward(0, model.get_input_activation(range(1)), w), tp_rank=model.rank,
                          tp_size=2)
        await model.all_reduce(grad, group)

    result = simulate(train, "1x2xA100-80GB", Workload.parse("toy:layers=1"), 1, check=False)
    link = Cluster.parse("1x2xA100-80GB").ring_link((0, 1))
    # ring all-reduce over 2 ranks: 2(p-1)/p * n/B + 2(p-1) * alpha = n/B + 2 alpha
    expected = SAMPLE / link.achieved_bandwidth + 2 * link.latency
    reduces = [e for e in result.events if e.op == "all_reduce"]
    assert len(reduces) == 2 and [e.duration for e in reduces] == [pytest.approx(expected)] * 2


def test_without_async_tp_allreduce_the_input_gradient_is_all_reduced_after_the_whole_backward():
    def run(**options):
        return simulate("strategies/hybrid.py", "1x2xA100-80GB", TOY, 2, pp=1, tp=2, microbatch_size=1,
                        **options)

    late = run(async_tp_allreduce=False)
    assert late.correct, late.problems
    events = sorted((e for e in late.events if e.rank == 0), key=lambda e: (e.start, e.end))
    backwards = [e for e in events if e.op == "backward"]
    assert len(backwards) == 4 * 2 and not [e for e in events if e.op == "backward_weight"]
    reduces = [e for e in events if e.op == "all_reduce" and e.detail.startswith("activation_grad")]
    for backward in backwards:  # its all-reduce starts when it ends, and the next compute waits for it
        mine = next(r for r in reduces if r.layer == backward.layer and r.start == backward.end)
        later = [e for e in events if e.stream == "compute" and e.start >= backward.end]
        assert not later or min(e.start for e in later) >= mine.end
    # overlapped with the weight-gradient GEMMs, the same step is faster
    assert run().time_s < late.time_s

"""Megatron-LM's pipeline messages with TP: each TP rank sends 1/t of the activation and the next stage
all-gathers the pieces (Narayanan et al. 2021, sec. 4.1); and sequence parallelism's exposed backward
all-gathers (Korthikanti et al. 2022, sec. 4.2.2). Values derived by hand from the link figures."""

from __future__ import annotations

import pytest

from dist_lib import (Activation, ActivationGrad, Cluster, CollectiveMismatchError, StrategyError, TensorError, Workload,
                      simulate)
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


def test_deepspeeds_messages_with_tp_are_meta_and_piece_forward_and_whole_gradients_back():
    # DeepSpeed 0.3's engine (the version AMP ran) partitions activations over the model-parallel group
    # (`is_pipe_partitioned`): the int64 partition metadata, then this rank's 1/t piece, then (GPT2ModelPipe)
    # the 16-bit s x s attention mask; gradients go whole from every TP rank (`is_grad_partitioned` is off)
    result = _p2p({"schedule": "deepspeed", "attention_mask_messages": True})
    sends = sorted(((e.rank, e.start, e.nbytes, e.detail) for e in result.events if e.op == "send"))
    meta = 8 * (1 + 3 + 2 + 2 + 1)  # ndims, b s h, parts, rank, t + 1 offsets: int64 each
    mask = 1024 * 1024 * 2  # s x s in 16 bits, whatever the microbatch
    for rank in (0, 1):  # stage 0: per microbatch meta, piece, mask, in that order
        assert [(n, d) for r, _, n, d in sends if r == rank] == \
            [(meta, "pipe extra"), (SAMPLE // 2, "activation slice"), (mask, "pipe extra")] * 4
    for rank in (2, 3):  # stage 1: the whole gradient of each microbatch
        assert [(n, d) for r, _, n, d in sends if r == rank] == [(SAMPLE, "activation_grad")] * 4
    gathers = [e for e in result.events if e.op == "all_gather"]
    # stage 1 gathers each arriving activation; stage 0 re-gathers its own sent output before each
    # gradient comes in (`_exec_recv_grads`: PartitionedTensor.full); no gradient is gathered
    assert {r: sum(1 for e in gathers if e.rank == r) for r in range(4)} == {0: 4, 1: 4, 2: 4, 3: 4}
    assert {e.detail for e in gathers} == {"activation slices (TP gather)"} and {e.nbytes for e in gathers} == {SAMPLE}
    recvs = sorted((e.start, e.op) for e in result.events if e.rank == 0 and e.op in ("all_gather", "recv"))
    assert [op for _, op in recvs] == ["all_gather", "recv"] * 4


def test_deepspeeds_attention_mask_costs_its_transfer_and_no_mask_no_bytes():
    link = Cluster.parse("2x2xA100-80GB").p2p_link(0, 2)
    with_mask = _p2p({"schedule": "deepspeed", "attention_mask_messages": True})
    masks = [e for e in with_mask.events if e.op == "send" and e.nbytes == 1024 * 1024 * 2 and e.layer == -1]
    assert len(masks) == 2 * 4
    # alpha + n/B on each TP rank's own NIC (one NIC per GPU here: nothing shares it)
    assert {round(e.duration, 12) for e in masks} == {round(link.latency + 2 * 2**20 / link.achieved_bandwidth, 12)}
    without = _p2p({"schedule": "deepspeed"})
    assert not [e for e in without.events if e.nbytes == 1024 * 1024 * 2 and e.layer == -1]
    assert without.time_s < with_mask.time_s


def test_the_attention_mask_option_is_deepspeeds_only():
    with pytest.raises(StrategyError, match="attention_mask_messages=True needs schedule=.deepspeed."):
        _p2p({"attention_mask_messages": True})


def test_pipe_extra_sizes_and_errors():
    seen = {}

    async def train(model):
        seen["mask"] = model.pipe_extra("attention_mask").nbytes
        seen["meta"] = model.pipe_extra("partition_meta", tp_size=4).nbytes
        model.pipe_extra("stash")

    with pytest.raises(TensorError, match="pipe_extra: what='stash'; expected one of 'attention_mask'"):
        simulate(train, "1xA100-80GB", Workload.parse("toy:layers=1,seq=512"), 1, check=False)
    assert seen == {"mask": 512 * 512 * 2, "meta": 8 * (7 + 4)}

    async def bad_tp(model):
        model.pipe_extra("partition_meta", tp_size=0)

    with pytest.raises(TensorError, match="pipe_extra: tp_size=0; need a whole number >= 1"):
        simulate(bad_tp, "1xA100-80GB", TOY, 1, check=False)


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

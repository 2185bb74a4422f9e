"""Analytic checks of the bundled strategies on hand-derivable scenarios, and their error messages.

Compute costs are pinned (F = 1 ms per layer and microbatch, B = 2 ms, I = W = 1 ms, loss and update
free) so expected step times follow from the schedule alone; communication stays as modelled.
"""

from __future__ import annotations

import pytest

from dist_lib import Activation, Cluster, StrategyError, TensorError, simulate, testing

from dist_lib.costs import compute as costs

F, B, I, W = 1e-3, 2e-3, 1e-3, 1e-3


@pytest.fixture
def pinned(monkeypatch):
    monkeypatch.setattr(costs, "forward_time", lambda *a, **k: F)
    monkeypatch.setattr(costs, "backward_time", lambda *a, **k: B)
    monkeypatch.setattr(costs, "backward_input_time", lambda *a, **k: I)
    monkeypatch.setattr(costs, "backward_weight_time", lambda *a, **k: W)
    monkeypatch.setattr(costs, "loss_time", lambda *a, **k: 0.0)
    monkeypatch.setattr(costs, "update_time", lambda *a, **k: 0.0)


def idle(result, rank):
    return result.time_s - result.compute_busy()[rank]


def run(name, cluster, layers, batch, **options):
    return simulate(f"strategies.{name}", cluster, f"toy:layers={layers}", batch, **options)


P, M = 4, 8  # stages, microbatches


@pytest.mark.parametrize("name", ["gpipe", "one_f_one_b"])
def test_gpipe_and_1f1b_step_is_m_plus_p_minus_1_slots(pinned, name):
    result = run(name, "1x4xA100-80GB", P, M)
    ideal = (M + P - 1) * (F + B)  # one layer per stage
    assert ideal <= result.time_s <= ideal * 1.02  # + 2(p-1) activation hops on NVLink
    assert idle(result, 0) == pytest.approx((P - 1) * (F + B), rel=0.05)


def test_deepspeed_schedule_is_lock_step_with_paired_messages():
    from strategies.deepspeed_1f1b import schedule
    # 2(m + p - 1) = 6 steps; stage 0 runs forwards on even steps, stage 1 on odd ones; each step opens
    # with the previous step's output going out and this step's input coming in
    assert [repr(a) for a in schedule(0, 2, 2)] == ["F0", "SA0", "F1", "SA1", "RG0", "B0", "RG1", "B1"]
    assert [repr(a) for a in schedule(1, 2, 2)] == ["RA0", "F0", "B0", "RA1", "SG0", "F1", "B1", "SG1"]


def test_deepspeed_schedule_blocks_on_every_message(pinned):
    # two stages on two nodes behind a slow NIC: each 2 MB message takes d; DeepSpeed's blocking sends
    # keep the sender from computing meanwhile, so every message is on the critical path:
    # s0 F0 | SA0 d | s1 F0 B0 | SA1 d | SG0 d | s0 B0 while s1 F1 B1 | SG1 d | s0 B1 = 3F + 3B + 4d
    cluster = {"name": "two", "nodes": [{"device": "A100-80GB", "count": 2, "gpus": 1, "nics": 1,
                                         "nic_bandwidth_GBps": 0.2}]}
    cluster = Cluster.from_dict(cluster)
    result = simulate("strategies.hybrid", cluster, "toy:layers=2", 2, dp=1, pp=2, schedule="deepspeed",
                      overlap_grad_reduce=False)
    first_send = next(e for e in result.raw_events if e[0] == 0 and e[1] == "send")
    d = first_send[4] - first_send[3]  # the receiver had posted its receive: the transfer alone
    assert d == pytest.approx(2 * 2**20 / 0.2e9, rel=0.01)
    assert result.time_s == pytest.approx(3 * F + 3 * B + 4 * d)
    # stage 0's second forward waits for its first send to complete
    forwards = [e for e in result.raw_events if e[0] == 0 and e[1] == "forward"]
    assert forwards[1][3] == pytest.approx(first_send[4])
    assert result.time_s > simulate("strategies.hybrid", cluster, "toy:layers=2", 2, dp=1, pp=2, schedule="1f1b",
                                    overlap_grad_reduce=False).time_s


def test_in_flight_activations_1f1b_p_versus_gpipe_m(pinned):
    gpipe = run("gpipe", "1x4xA100-80GB", P, M)
    one_f = run("one_f_one_b", "1x4xA100-80GB", P, M)
    assert testing.peak_in_flight(gpipe, 0) == M
    assert [testing.peak_in_flight(one_f, r) for r in range(P)] == [4, 3, 2, 1]
    assert one_f.memory_bytes[0] < gpipe.memory_bytes[0]


def test_interleaving_divides_the_bubble_by_v(pinned):
    plain = run("one_f_one_b", "1x4xA100-80GB", 2 * P, M)  # 2 layers per stage
    inter = run("interleaved", "1x4xA100-80GB", 2 * P, M, chunks=2)  # two 1-layer chunks per rank
    assert idle(plain, 0) == pytest.approx((P - 1) * 2 * (F + B), rel=0.05)
    assert idle(inter, 0) == pytest.approx(idle(plain, 0) / 2, rel=0.1)


@pytest.mark.parametrize("m, ratio", [(4, 0.36), (8, 0.6)])
def test_zb_h1_bubble_is_about_a_third_of_1f1b(pinned, m, ratio):
    one_f = run("one_f_one_b", "1x4xA100-80GB", P, m)
    zb = run("zero_bubble", "1x4xA100-80GB", P, m)
    assert idle(one_f, 0) == pytest.approx((P - 1) * (F + I + W), rel=0.05)
    assert idle(zb, 0) < ratio * idle(one_f, 0)  # (p-1)(F+I-W) = a third; the greedy order gets close
    assert zb.time_s < one_f.time_s


def test_zero_bubble_with_zb_h2_memory_reaches_the_bound(pinned):
    zb = run("zero_bubble", "1x4xA100-80GB", P, M, max_in_flight=2 * P - 1)
    assert idle(zb, 0) == pytest.approx((P - 1) * (F + I - W), rel=0.1)


def _zero3_gap():
    from dist_lib import Workload
    workload = Workload.parse("toy:layers=4")
    ddp = simulate("strategies.ddp", "1x4xA100-80GB", workload, 4, microbatch_size=1)
    z3 = simulate("strategies.zero", "1x4xA100-80GB", workload, 4, stage=3, microbatch_size=1)
    saved = 16 * workload.total_params * (1 - 1 / 4)  # (2 + 2 + 12) bytes per parameter, 3/4 sharded away
    return ddp.peak_memory_bytes - z3.peak_memory_bytes, saved, 2 * workload.layer_params(0)


def test_zero3_saves_most_of_the_sharded_model_state():
    gap, saved, layer_bytes = _zero3_gap()
    assert saved / 2 < gap <= saved


def test_zero3_saves_the_sharded_model_state_less_its_working_buffers():
    gap, saved, layer_bytes = _zero3_gap()
    # ZeRO-3 still holds two gathered layers (the current one and the prefetch) and the full gradients of
    # up to three layers whose reduce-scatter is in flight: five 16-bit layers at most.
    assert saved - 5 * layer_bytes <= gap <= saved - 2 * layer_bytes


def test_zero_stages_order_memory():
    peaks = [min(simulate("strategies.zero", "1x4xA100-80GB", "toy:layers=4", 8, stage=s, microbatch_size=1)
                 .memory_bytes) for s in (1, 2, 3)]
    ddp = simulate("strategies.ddp", "1x4xA100-80GB", "toy:layers=4", 8, microbatch_size=1).peak_memory_bytes
    assert ddp > peaks[0] > peaks[1] > peaks[2]


def test_hetero_beats_an_even_hybrid_on_a_mixed_cluster():
    cluster = "1x2xA100-80GB+1x2xV100-32GB"
    even = run("hybrid", cluster, 8, 8, pp=2)
    hetero = run("hetero", cluster, 8, 8, pp=2)
    assert hetero.time_s < 0.85 * even.time_s
    stage0_layers = {e.layer for e in hetero.events if e.rank == 0 and e.op == "forward"}
    assert len(stage0_layers) > 4  # the A100 stage takes more than half of the layers


def test_hetero_gives_faster_replicas_more_samples():
    result = run("hetero", "1x2xA100-80GB+1x2xV100-32GB", 4, 16, pp=1)
    samples = [sum(bin(e.samples).count("1") for e in result.events if e.rank == r and e.op == "forward"
                   and e.layer == 0) for r in range(4)]
    assert samples[0] == samples[1] > samples[2] == samples[3] and sum(samples) == 16


def test_hetero_partition_is_the_planners_and_respects_memory():
    from dist_lib import Cluster, Workload
    from dist_lib.planner.search import pipeline_partition

    cluster, workload = Cluster.load("1x2xA100-80GB+1x2xV100-32GB"), Workload.load("toy:layers=8")
    result = run("hetero", cluster, 8, 8, pp=2)
    counts = pipeline_partition(cluster, workload, (0, 2), 1, 8)  # replica 0: A100 rank 0, then V100 rank 2
    assert counts[0] > counts[1]
    assert {e.layer for e in result.events if e.rank == 0 and e.op == "forward"} == set(range(counts[0]))
    # GPT-6.7B's model state alone (about 100 GiB) cannot be cut over two 16 GiB T4s
    with pytest.raises(StrategyError, match="fits in device memory"):
        simulate("strategies.hetero", "1x2xT4", "gpt-6.7b", 2, pp=2)


def test_explicit_partition_and_shares_are_followed():
    result = run("hetero", "1x4xA100-80GB", 6, 6, pp=2, partition=[2, 4], shares=[1, 5])
    assert {e.layer for e in result.events if e.rank == 0 and e.op == "forward"} == {0, 1}
    replica1 = sum(bin(e.samples).count("1") for e in result.events if e.rank == 1 and e.op == "forward"
                   and e.layer == 0)
    assert replica1 == 5


@pytest.mark.parametrize("name, options, option", [
    ("gpipe", {"pp": 4}, "pp"),
    ("one_f_one_b", {"microbatch_size": 3}, "microbatch_size"),
    ("interleaved", {"pp": 2, "chunks": 4}, "pp x chunks"),
    ("hybrid", {"pp": 2, "tp": 3}, "tp"),
    ("hybrid", {"pp": 2, "schedule": "zigzag"}, "schedule"),
    ("ddp", {"microbatch_size": 3}, "microbatch_size"),
    ("zero", {"stage": 4}, "stage"),
    ("hetero", {"pp": 2, "partition": [2, 2]}, "partition"),
    ("hetero", {"pp": 2, "shares": [1, 1]}, "shares"),
])
def test_invalid_configurations_name_the_option(name, options, option):
    with pytest.raises(StrategyError, match=option):
        run(name, "1x4xA100-80GB", 6, 8, **options)


@pytest.mark.parametrize("cluster, group, nodes", [
    ("2x6xA100-80GB", "4..7", "[0, 1]"),  # node 1 starts at rank 6, inside the second group of 4
    ("1x4xA100-80GB+2x2xA100-80GB+1x4xA100-80GB", "4..7", "[1, 2]"),  # nodes of 2 pair up, but not in one group
    ("1x8xA100-80GB+1x2xA100-80GB+1x6xA100-80GB", "8..11", "[1, 2]"),
])
def test_a_tp_group_across_nodes_is_refused_naming_the_first_such_group(cluster, group, nodes):
    with pytest.raises(StrategyError, match=rf"tp=4: TP group of ranks {group} spans nodes \{nodes}"):
        simulate("strategies.hybrid", cluster, "toy:layers=2", 4, dp=None, pp=1, tp=4, start_order_seed=3)


def test_tied_embeddings_all_reduce_the_head_gradient_between_first_and_last_stage():
    # two stages on two nodes behind a 1 GB/s NIC: one all-reduce of V x h 16-bit values between them,
    # a ring of two: 2(p-1)/p * n / B + 2(p-1) alpha = n / B + 2 * 14 us (NCCL's network step latency)
    cluster = Cluster.from_dict({"name": "two", "nodes": [{"device": "A100-80GB", "count": 2, "gpus": 1, "nics": 1,
                                                           "nic_bandwidth_GBps": 1.0}]})
    result = simulate("strategies.hybrid", cluster, "gpt-350m:layers=2", 2, dp=1, pp=2, tied_embeddings=True,
                      overlap_grad_reduce=False)
    tied = [e for e in result.raw_events if e[1] == "all_reduce"]
    nbytes = 50257 * 1024 * 2
    assert [(e[0], e[7], e[9]) for e in tied] == [(0, nbytes, (0, 1)), (1, nbytes, (0, 1))]
    assert tied[0][4] - tied[0][3] == pytest.approx(nbytes / 1e9 + 2 * 14e-6)
    untied = simulate("strategies.hybrid", cluster, "gpt-350m:layers=2", 2, dp=1, pp=2, overlap_grad_reduce=False)
    assert result.time_s == pytest.approx(untied.time_s + nbytes / 1e9 + 2 * 14e-6)
    # one stage holds both ends: nothing to all-reduce
    single = simulate("strategies.hybrid", "1x1xA100-80GB", "gpt-350m:layers=2", 2, dp=1, pp=1, tied_embeddings=True)
    assert not [e for e in single.raw_events if e[1] == "all_reduce"]


def test_tied_embedding_grad_is_a_tp_slice_that_cannot_update_a_layer():
    async def train(model):
        grad = model.tied_embedding_grad(tp_rank=1, tp_size=2)
        assert grad.nbytes == 50257 * 1024 * 2 // 2 and grad.layer == 0 and grad.samples == 0
        weight, opt_state = model.load_weights(0, tp_rank=1, tp_size=2)
        with pytest.raises(TensorError, match="update"):
            model.update(0, grad, weight, opt_state)
        with pytest.raises(TensorError, match="tp_rank=2, tp_size=2 is not a TP slice"):
            model.tied_embedding_grad(tp_rank=2, tp_size=2)

    simulate(train, "1x1xA100-80GB", "gpt-350m:layers=1", 1, check=False)


@pytest.mark.parametrize("vocab", [0, 50257])
def test_the_tied_embedding_grad_is_not_a_layers_gradient_to_accumulate_into(vocab):
    """Summed with layer 0's gradient (the left buffer is reused), it would move its own bytes in the layer's
    all-reduce: none in a workload without a vocabulary, a third fewer in gpt-350m's layer 0."""
    async def train(model):
        weight, _ = model.load_weights(0)
        x = model.get_input_activation(range(1))
        grad, _ = model.backward(0, x, model.loss(model.forward(0, x, weight)), weight)
        for left, right in ((model.tied_embedding_grad(), grad), (grad, model.tied_embedding_grad())):
            with pytest.raises(TensorError, match=r"rank 0 WeightGrad \+ WeightGrad \(layer 0\): cannot add .* "
                                                  r"gradients of different parameters"):
                left + right

    simulate(train, "1x1xA100-80GB", f"gpt-350m:layers=1,vocab={vocab}", 1, check=False)


def test_tp_pieces_and_pipe_extras_are_not_all_reduced():
    """Summing n/t-byte pieces would leave n/t bytes that an all-gather in a group of one calls whole: a
    message made whole for 2(t-1)/t * n/t bytes moved instead of the all-gather's (t-1)/t * n."""
    async def train(model):
        x = model.get_input_activation(range(8))
        piece = model.split_tp(x, model.rank, model.world_size)
        with pytest.raises(TensorError, match=rf"rank {model.rank} all_reduce\(layer 0\): ActivationSlice\(.*piece "
                                              rf"{model.rank} of 4.*\) is not a partial sum; TP pieces .* all_gather"):
            model.all_reduce(piece)
        with pytest.raises(TensorError, match=r"PipeExtra.* is not a partial sum; only gradients"):
            model.all_reduce(model.pipe_extra("attention_mask"))
        whole = await model.all_gather(piece)
        assert type(whole) is Activation and whole.nbytes == x.nbytes

    simulate(train, "1x4xA100-80GB", "gpt-350m:layers=1", 8, check=False)

"""Flat-ring and hierarchical collectives, Megatron TP and pipeline messages, against hand-derived values.

Links: NVLink3 300 GB/s and NVLink2 150 GB/s line rate, of which NCCL reaches 0.8 (240 and 120 GB/s),
at 3.4 us per step; IB-HDR 25 GB/s and IB-EDR 12.5 GB/s at 14 us per step (hardware/devices.py). Ring latency
follows NCCL's tuner: all-reduce 2(p-1) steps of which 2(N-1) cross nodes, all-gather/reduce-scatter
p-1 of which N-1 cross nodes.
"""

from __future__ import annotations

import pytest

from dist_lib import Cluster, Workload, simulate

from dist_lib.costs import network
from dist_lib.hardware.devices import GB

US = 1e-6


def test_single_node_group_is_a_flat_ring_on_nvlink():
    topo = Cluster.parse("1x8xA100-80GB").topology(range(8))
    assert (topo.nodes, topo.per_node, topo.inter) == (1, 8, None)
    algo, t = network.collective_algorithm("all_reduce", 1e9, topo)
    assert algo == "ring"
    assert t == pytest.approx(2 * 7 / 8 * 1e9 / 240e9 + 14 * 3.4 * US)


def test_large_all_reduce_across_two_dgx_nodes_prefers_the_ring():
    topo = Cluster.parse("2x8xA100-80GB").topology(range(16))
    assert (topo.nodes, topo.per_node, topo.nics) == (2, 8, 8)
    # flat: 2*15/16 * 1 GB at min(240, 8 NICs * 25) = 200 GB/s -> 9.375 ms; 28 NVLink steps, 2 IB steps
    flat = 2 * 15 / 16 * 1e9 / 200e9 + 28 * 3.4 * US + 2 * 14 * US
    # hierarchical: intra reduce-scatter and all-gather 7/8 * 1 GB / 240 GB/s + 7 steps each,
    # inter all-reduce of 1/8 GB over 2 nodes: 2*1/2 * 125 MB / 25 GB/s + 2 steps
    hier = 2 * (7 / 8 * 1e9 / 240e9 + 7 * 3.4 * US) + (125e6 / 25e9 + 2 * 14 * US)
    assert network.flat_ring_time("all_reduce", 1e9, topo) == pytest.approx(flat)
    assert network.hierarchical_time("all_reduce", 1e9, topo) == pytest.approx(hier)
    assert network.collective_algorithm("all_reduce", 1e9, topo) == ("ring", pytest.approx(flat))
    assert flat == pytest.approx(9.4982e-3, rel=1e-4) and hier == pytest.approx(12.3672e-3, rel=1e-4)


def test_small_all_reduce_across_nodes_prefers_hierarchical():
    topo = Cluster.parse("2x8xA100-80GB").topology(range(16))
    flat = 2 * 15 / 16 * 1e6 / 200e9 + 28 * 3.4 * US + 2 * 14 * US  # 132.575 us
    hier = 2 * (7 / 8 * 1e6 / 240e9 + 7 * 3.4 * US) + (1e6 / 8 / 25e9 + 2 * 14 * US)  # 87.892 us
    assert flat == pytest.approx(132.575 * US) and hier == pytest.approx(87.892 * US, rel=1e-4)
    assert network.collective_algorithm("all_reduce", 1e6, topo) == ("hierarchical", pytest.approx(hier))


def test_mixed_nodes_run_at_their_bottleneck():
    # 4 A100 (NVLink3, HDR) + 4 V100 (NVLink2, EDR): intra bottleneck 150 GB/s (120 achieved), NIC 12.5 GB/s
    topo = Cluster.parse("1x4xA100-80GB+1x4xV100-32GB").topology(range(8))
    assert topo.intra.bandwidth == 150 * GB and topo.inter.bandwidth == 12.5 * GB
    # all-gather of 1 GB. flat: 7/8 GB at min(120, 4 * 12.5) = 50 GB/s + 6 NVLink and 1 IB steps
    flat = 7 / 8 * 1e9 / 50e9 + 6 * 3.4 * US + 14 * US
    # hierarchical: inter all-gather of 1/4 GB over 2 nodes at 12.5 GB/s, then intra 3/4 GB at 120 GB/s
    hier = (1 / 2 * 0.25e9 / 12.5e9 + 14 * US) + (3 / 4 * 1e9 / 120e9 + 3 * 3.4 * US)
    assert network.flat_ring_time("all_gather", 1e9, topo) == pytest.approx(flat)
    assert network.collective_algorithm("all_gather", 1e9, topo) == ("hierarchical", pytest.approx(hier))
    assert network.collective_time("reduce_scatter", 1e9, topo) == pytest.approx(hier)


def test_uneven_group_has_only_the_flat_ring():
    cluster = Cluster.parse("1x4xA100-80GB+1x4xV100-32GB")
    topo = cluster.topology([0, 1, 2, 4])  # three ranks on the A100 node, one on the V100 node
    assert (topo.per_node, topo.nics) == (0, 1)
    assert network.hierarchical_time("all_reduce", 1e9, topo) is None
    # 2*3/4 GB at min(NVLink3 240, 1 * 12.5) GB/s; 6 steps, 2 crossing nodes at the slower 14 us
    expected = 2 * 3 / 4 * 1e9 / 12.5e9 + 4 * 3.4 * US + 2 * 14 * US
    assert network.collective_time("all_reduce", 1e9, topo) == pytest.approx(expected)


def test_one_rank_per_node_uses_only_the_network():
    topo = Cluster.parse("4x8xA100-80GB").topology([0, 8, 16, 24])
    assert (topo.intra, topo.nics) == (None, 1)
    assert network.collective_time("all_reduce", 1e8, topo) == pytest.approx(2 * 3 / 4 * 1e8 / 25e9 + 6 * 14 * US)


def test_megatron_tensor_parallel_communication_per_layer():
    # 22B layer, 4 samples, t = 8 in one node: two all-reduces of b*s*h*2 = 4*2048*6144*2 bytes
    w = Workload.parse("gpt-22b")
    topo = Cluster.parse("1x8xA100-80GB").topology(range(8))
    n = 4 * 2048 * 6144 * 2
    one = 2 * 7 / 8 * n / 240e9 + 14 * 3.4 * US
    assert network.tp_layer_comm_time(w, 4, topo) == pytest.approx(2 * one)
    # sequence parallelism: reduce-scatter + all-gather of the same buffer, the same time on a ring
    assert network.tp_layer_comm_time(w, 4, topo, sequence_parallel=True) == pytest.approx(2 * one)
    # backward, no SP: both all-reduces run beside the weight-gradient GEMMs, none is exposed
    assert network.tp_layer_backward_comm_time(w, 4, topo) == (0.0, pytest.approx(2 * one))
    # backward, SP: the all-gathers of the gradients entering the two row-parallel layers are exposed;
    # the input re-gathers and the input-gradient reduce-scatters overlap GEMMs
    gather = 7 / 8 * n / 240e9 + 7 * 3.4 * US
    exposed, overlapped = network.tp_layer_backward_comm_time(w, 4, topo, sequence_parallel=True)
    assert exposed == pytest.approx(2 * gather) and overlapped == pytest.approx(4 * gather)


def test_embedding_and_head_communication():
    w = Workload.parse("gpt-22b")
    topo = Cluster.parse("1x8xA100-80GB").topology(range(8))
    n = 4 * 2048 * 6144 * 2
    all_reduce, gather = 2 * 7 / 8 * n / 240e9 + 14 * 3.4 * US, 7 / 8 * n / 240e9 + 7 * 3.4 * US
    # the cross-entropy's three all-reduces of 4 * 2048 fp32 values
    small = 3 * (2 * 7 / 8 * 4 * 4 * 2048 / 240e9 + 14 * 3.4 * US)
    # no SP: the embedding's partial lookups all-reduced; the head's input gradient all-reduced
    assert network.tp_embedding_comm_time(w, 4, topo) == (pytest.approx(all_reduce), pytest.approx(all_reduce + small))
    # SP: a reduce-scatter and an all-gather each (forward and backward)
    embedding, head = network.tp_embedding_comm_time(w, 4, topo, sequence_parallel=True)
    assert embedding == pytest.approx(2 * gather) and head == pytest.approx(2 * gather + small)


def test_pipeline_messages_are_split_over_the_tp_ranks():
    w = Workload.parse("gpt-175b")
    # each of the 8 TP ranks sends its 1/8 of b*s*h, with or without sequence parallelism (scatter-gather)
    assert network.pipeline_message_bytes(w, 1, 8) == 2048 * 12288 * 2 / 8
    assert network.pipeline_message_bytes(w, 1, 1) == 2048 * 12288 * 2
    cluster = Cluster.parse("2x8xA100-80GB")
    tp, ib = cluster.topology(range(8)), cluster.p2p_link(0, 8)
    message = 2048 * 12288 * 2 / 8  # 6.29 MB per TP rank over its 25 GB/s NIC
    # SP: one message out and one in share nothing (full duplex): 14 us + message / 25 GB/s
    assert network.pipeline_exchange_time(w, 1, ib, tp, sends=1, receives=1, sequence_parallel=True) == \
        pytest.approx(14 * US + message / 25e9)
    # two messages out (to both neighbours) queue on the NIC; without SP each received one is then
    # all-gathered over NVLink: 7/8 * b*s*h / 240 GB/s + 7 steps
    gather = 7 / 8 * 2048 * 12288 * 2 / 240e9 + 7 * 3.4 * US
    assert network.pipeline_exchange_time(w, 1, ib, tp, sends=2, receives=1) == \
        pytest.approx(14 * US + 2 * message / 25e9 + gather)
    assert network.pipeline_exchange_time(w, 1, ib, tp, sends=0, receives=0) == 0.0


def test_simulator_uses_the_faster_algorithm_for_a_group():
    # a one-layer toy gradient (12*1024^2 + 13*1024 params, 2 bytes each) all-reduced over 2x8 A100
    result = simulate(_train_ddp, "2x8xA100-80GB", "toy:layers=1", 16, check=False)
    event = next(e for e in result.events if e.op == "all_reduce")
    nbytes = (12 * 1024**2 + 13 * 1024) * 2
    topo = Cluster.parse("2x8xA100-80GB").topology(range(16))
    assert event.end - event.start == pytest.approx(network.collective_time("all_reduce", nbytes, topo))
    # flat: 2*15/16 * 25.19 MB / 200 GB/s + 28 NVLink and 2 IB steps = 359.4 us; hierarchical:
    # 2 * (7/8 * 25.19 MB / 240 GB/s + 7 steps) + (25.19 MB / 8 / 25 GB/s + 2 steps) = 385.1 us
    flat = 2 * 15 / 16 * nbytes / 200e9 + 28 * 3.4 * US + 2 * 14 * US
    assert network.collective_algorithm("all_reduce", nbytes, topo) == ("ring", pytest.approx(flat))
    assert network.hierarchical_time("all_reduce", nbytes, topo) == pytest.approx(385.1 * US, rel=1e-3)


async def _train_ddp(model):
    w, opt = model.load_weights(0)
    act = model.get_input_activation([model.rank])
    out = model.forward(0, act, w)
    grad = model.loss(out)
    wg, _ = model.backward(0, act, grad, w)
    wg = await model.all_reduce(wg)
    w, opt = model.update(0, wg, w, opt)
    model.set_final_weight(0, w)


def test_a_node_nic_is_shared_by_the_node_gpus_in_the_collective_cost():
    # two nodes of 4 V100 (NVLink2: 120 GB/s achieved, 3.4 us a step) with one 1.25 GB/s NIC each (14 us)
    topo = Cluster.parse("2x4xV100-16GB:nics=1x1.25").topology(range(8))
    assert (topo.per_node, topo.nics) == (4, 1)
    n = 1e8
    # flat ring: 2*7/8 n through one NIC per node; 12 NVLink steps and 2 crossing nodes
    flat = 2 * 7 / 8 * n / 1.25e9 + 12 * 3.4 * US + 2 * 14 * US
    # hierarchical: the four inter-node all-reduces of n/4 take turns on the one NIC (4x one alone)
    hier = 2 * (3 / 4 * n / 120e9 + 3 * 3.4 * US) + 4 * (2 * 1 / 2 * n / 4 / 1.25e9 + 2 * 14 * US)
    assert network.flat_ring_time("all_reduce", n, topo) == pytest.approx(flat)
    assert network.collective_algorithm("all_reduce", n, topo) == ("hierarchical", pytest.approx(hier))
    assert hier == pytest.approx(81.382e-3, rel=1e-4)

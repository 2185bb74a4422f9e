"""Each cost formula against a number worked out by hand."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, Workload, costs
from dist_lib.devices import DEVICES, GB, IB_EDR, NVLINK_2, NVLINK_3

A100 = DEVICES["A100-80GB"]


def test_ring_all_reduce_of_one_gigabyte_over_four_nvlink3_ranks():
    # 2*(4-1)/4 * 1e9 B / 300e9 B/s = 5 ms, plus 2*(4-1) steps of 3.4 us
    assert costs.all_reduce_time(1e9, 4, NVLINK_3) == pytest.approx(0.005 + 6 * 3.4e-6)


def test_all_gather_and_reduce_scatter_move_half_of_all_reduce():
    # (8-1)/8 * 2e9 / 150e9 + 7 * 3.4 us
    expected = 7 / 8 * 2e9 / 150e9 + 7 * 3.4e-6
    assert costs.all_gather_time(2e9, 8, NVLINK_2) == pytest.approx(expected)
    assert costs.reduce_scatter_time(2e9, 8, NVLINK_2) == pytest.approx(expected)


def test_single_rank_collectives_are_free():
    assert costs.all_reduce_time(1e9, 1, NVLINK_3) == 0.0
    assert costs.all_gather_time(1e9, 1, NVLINK_3) == 0.0


def test_point_to_point_is_latency_plus_size_over_bandwidth():
    # 14 us + 25e6 B / 12.5e9 B/s = 14 us + 2 ms
    assert costs.p2p_time(25e6, IB_EDR) == pytest.approx(14e-6 + 2e-3)


HALF = 20e-6  # costs.HALF_EFFICIENCY_WORK: each GEMM kernel's time is (w + HALF) / 0.62


def test_large_forward_is_gemm_kernels_on_the_curve_plus_memory_bound_kernels():
    # gpt-1.3b layer (s = h = 2048, a = 16), 2 samples: GEMMs 2 * (24*s*h^2 + 4*s^2*h) = 2 * 28 * 2048^3
    # FLOPs in six kernels (QKV, projection, MLP up, MLP down, two attention batched GEMMs), each
    # (w_i + HALF) / 0.62, so together (sum w + 6 HALF) / 0.62.
    # Memory-bound kernels per sample: (22 + 16) * s*h + 9 * a * s^2 = (38 + 144) * 2048^2 bytes.
    w = Workload.parse("gpt-1.3b")
    flops = 2 * 28 * 2048**3
    assert w.layer_forward_flops(3) * 2 == flops
    stream = 2 * 182 * 2048**2 / 2039e9
    assert costs.forward_time(A100, w, 3, 2) == pytest.approx((flops / 312e12 + 6 * HALF) / 0.62 + stream)
    # backward: 4 input-gradient GEMMs + 4 attention backward GEMMs (2 * 32 * 2048^3 FLOPs) and 4
    # weight-gradient GEMMs (2 * 24 * 2048^3); memory-bound (22 + 24) * s*h + 11 * a * s^2 = 222 * 2048^2
    gemms = (2 * 56 * 2048**3 / 312e12 + 12 * HALF) / 0.62
    assert costs.backward_time(A100, w, 3, 2) == pytest.approx(gemms + 2 * 222 * 2048**2 / 2039e9)


def test_selective_recompute_reruns_the_attention_core():
    # attention core 4 * s^2 * h = 4 * 2048^3 FLOPs per sample in two kernels, softmax + dropout 9 a s^2 bytes
    w = Workload.parse("gpt-1.3b")
    expected = (4 * 2048**3 / 312e12 + 2 * HALF) / 0.62 + 9 * 16 * 2048**2 / 2039e9
    assert costs.recompute_time(A100, w, 3, 1) == pytest.approx(expected)
    plain = costs.backward_time(A100, w, 3, 1)
    assert costs.backward_time(A100, w, 3, 1, recompute="selective") == pytest.approx(plain + expected)
    assert costs.backward_time(A100, w, 3, 1, recompute="full") == pytest.approx(
        plain + costs.forward_time(A100, w, 3, 1))


def test_small_ops_lose_efficiency():
    assert costs.efficiency(A100, 1e15) == pytest.approx(0.62, rel=1e-3)
    # an op of exactly HALF of peak work reaches half of max efficiency
    assert costs.efficiency(A100, HALF * 312e12) == pytest.approx(0.31)


def test_tensor_parallel_forward_splits_the_flops_and_the_split_kernels():
    # TP 4: GEMMs 28 * 2048^3 / 4 in six kernels; memory-bound: replicated 22 * s*h stays, the split
    # part (16 * s*h + 9 * a * s^2 = 144 * s*h) is divided by 4
    w = Workload.parse("gpt-1.3b")
    gemms = (28 * 2048**3 / 312e12 / 4 + 6 * HALF) / 0.62
    stream = (22 + (16 + 144) / 4) * 2048**2 / 2039e9
    assert costs.forward_time(A100, w, 3, 1, tp=4) == pytest.approx(gemms + stream)
    # sequence parallelism splits the layernorms and residual adds too: (22 + 160) / 4
    sp = (22 + 16 + 144) / 4 * 2048**2 / 2039e9
    assert costs.forward_time(A100, w, 3, 1, tp=4, sequence_parallel=True) == pytest.approx(gemms + sp)


def test_optimizer_update_is_bound_by_hbm():
    # 1e9 parameters * 28 bytes / 2039e9 B/s
    assert costs.update_time(A100, 1e9) == pytest.approx(28e9 / 2039e9)


def test_memory_bound_op_takes_bytes_over_bandwidth():
    assert costs.compute_time(A100, 1e3, 2039e9) == pytest.approx(1.0)


def test_ring_runs_at_its_slowest_link():
    cluster = Cluster.parse("1x4xA100-80GB+1x4xV100-32GB")
    assert cluster.ring_link(range(4)).bandwidth == 300 * GB
    assert cluster.ring_link([4, 5]).bandwidth == 150 * GB
    mixed = cluster.ring_link(range(8))
    assert mixed.bandwidth == 12.5 * GB  # the V100 node's EDR NIC
    assert mixed.latency == pytest.approx(14e-6)
    assert cluster.p2p_link(0, 4).bandwidth == 12.5 * GB
    assert cluster.p2p_link(0, 1).bandwidth == 300 * GB

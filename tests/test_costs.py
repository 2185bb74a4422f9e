"""Each cost formula against a number worked out by hand."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, Workload

from dist_lib.costs import compute as costs

from dist_lib.costs import network
from dist_lib.errors import SpecError
from dist_lib.hardware.devices import DEVICES, GB, IB_EDR, NVLINK_2, NVLINK_3, Device

A100 = DEVICES["A100-80GB"]


def test_ring_all_reduce_of_one_gigabyte_over_four_nvlink3_ranks():
    # NCCL reaches 0.8 of NVLink3's 300 GB/s line rate, 240 GB/s:
    # 2*(4-1)/4 * 1e9 B / 240e9 B/s = 6.25 ms, plus 2*(4-1) steps of 3.4 us
    assert network.all_reduce_time(1e9, 4, NVLINK_3) == pytest.approx(0.00625 + 6 * 3.4e-6)


def test_all_gather_and_reduce_scatter_move_half_of_all_reduce():
    # (8-1)/8 * 2e9 / (0.8 * 150e9) + 7 * 3.4 us
    expected = 7 / 8 * 2e9 / 120e9 + 7 * 3.4e-6
    assert network.all_gather_time(2e9, 8, NVLINK_2) == pytest.approx(expected)
    assert network.reduce_scatter_time(2e9, 8, NVLINK_2) == pytest.approx(expected)


def test_single_rank_collectives_are_free():
    assert network.all_reduce_time(1e9, 1, NVLINK_3) == 0.0
    assert network.all_gather_time(1e9, 1, NVLINK_3) == 0.0


def test_point_to_point_is_latency_plus_size_over_bandwidth():
    # 14 us + 25e6 B / 12.5e9 B/s = 14 us + 2 ms (the catalog takes InfiniBand at its line rate)
    assert network.p2p_time(25e6, IB_EDR) == pytest.approx(14e-6 + 2e-3)
    # over NVLink3 at 0.8 * 300 GB/s: 3.4 us + 24e6 / 240e9 = 3.4 us + 100 us
    assert network.p2p_time(24e6, NVLINK_3) == pytest.approx(3.4e-6 + 1e-4)


# costs.gemm_time on the A100 (108 SMs, max_efficiency 0.75): output tiles of 256 x 128 run in waves
# of 108; a wave takes a tile's K loop, 2 * 256 * 128 * K FLOPs at 0.75 of one SM's 312e12 / 108,
# plus the store of its tiles' 256 * 128 16-bit outputs over HBM (all 108 of them in a full wave).
PER_K = 2 * 256 * 128 / (312e12 / 108 * 0.75)  # seconds of K loop per unit of K
STORE = 108 * 256 * 128 * 2 / 2039e9  # a full wave's tile stores


def waves(k, count=1):
    return count * (k * PER_K + STORE)


def test_large_forward_is_gemm_waves_plus_memory_bound_kernels():
    # gpt-1.3b layer (s = h = 2048, a = 16, head 128), 2 samples: 4096 tokens. Tiles (long side / 256
    # x short side / 128) and waves (ceil of tiles / 108):
    #   QKV 4096 x 6144 x K 2048: 24 * 32 = 768 tiles, 8 waves;  projection 4096 x 2048 x 2048: 256, 3;
    #   MLP up 4096 x 8192 x 2048: 1024, 10;  MLP down 4096 x 2048 x K 8192: 256, 3;
    #   Q K^T 2048 x 2048 x K 128 for 32 heads: 32 * 8 * 16 = 4096 tiles, 38 waves;
    #   P V 2048 x 128 x K 2048 for 32 heads: 32 * 8 * 1 = 256 tiles, 3 waves.
    # All are slower than their HBM traffic (Q K^T: 32 * 2 * (2 * 2048 * 128 + 2048^2) B = 0.15 ms < 0.29 ms).
    # Memory-bound kernels per sample: layernorms and residual adds 22 * s*h, GeLU 16 * s*h, the
    # attention-output copy 4 * s*h, softmax and dropout 9 * a * s^2 = (42 + 144) * 2048^2 bytes.
    w = Workload.parse("gpt-1.3b")
    gemms = waves(2048, 8 + 3 + 10 + 3) + waves(8192, 3) + waves(128, 38)
    stream = 2 * 186 * 2048**2 / 2039e9
    assert costs.forward_time(A100, w, 3, 2) == pytest.approx(gemms + stream)
    # backward: input gradients dX = dY W^T (M, K, N): QKV 4096 x 2048 x K 6144: 256 tiles, 3 waves;
    # projection 3 waves (K 2048); MLP up 4096 x 2048 x K 8192: 3 waves; MLP down 4096 x 8192 x K 2048:
    # 10 waves. Weight gradients dW = X^T dY (K, N, M), all K 4096: QKV 2048 x 6144: 384 tiles, 4
    # waves; projection 2048 x 2048: 128, 2; MLP up and down 2048 x 8192: 512, 5 each. Attention:
    # dP = dO V^T like Q K^T (38 waves), dQ, dK, dV like P V (3 waves each).
    # Memory-bound per sample, in s*h bytes: layernorms and residual adds 22, the two row-parallel bias
    # gradients 4 and the residual-fork gradient adds 12 (38), GeLU 24, attention-output copy 4,
    # column-parallel bias gradients 14: 80; plus softmax and dropout 11 * a * s^2 = 176 * s*h.
    # 256 * 2048^2 bytes per sample.
    gemms = (waves(6144, 3) + waves(2048, 3 + 10 + 3 * 3) + waves(8192, 3) + waves(4096, 4 + 2 + 5 + 5)
             + waves(128, 38))
    assert costs.backward_time(A100, w, 3, 2) == pytest.approx(gemms + 2 * 256 * 2048**2 / 2039e9)


def test_selective_recompute_reruns_the_attention_core():
    # one sample, 16 heads: Q K^T 16 * 128 = 2048 tiles, 19 waves of K 128; P V 16 * 8 = 128 tiles,
    # 2 waves of K 2048; softmax + dropout 9 a s^2 bytes
    w = Workload.parse("gpt-1.3b")
    expected = waves(128, 19) + waves(2048, 2) + 9 * 16 * 2048**2 / 2039e9
    assert costs.recompute_time(A100, w, 3, 1) == pytest.approx(expected)
    plain = costs.backward_time(A100, w, 3, 1)
    assert costs.backward_time(A100, w, 3, 1, recompute="selective") == pytest.approx(plain + expected)
    assert costs.backward_time(A100, w, 3, 1, recompute="full") == pytest.approx(
        plain + costs.forward_time(A100, w, 3, 1))


def test_wave_and_tile_quantization():
    # 109 tiles need a second wave: as long as 216 tiles
    one_wave = costs.gemm_time(A100, 108 * 256, 128, 4096)
    assert one_wave == pytest.approx(waves(4096))
    assert costs.gemm_time(A100, 109 * 256, 128, 4096) == pytest.approx(2 * one_wave)
    assert costs.gemm_time(A100, 216 * 256, 128, 4096) == pytest.approx(2 * one_wave)
    # a single 100 x 100 output is one partly filled tile on one SM: one tile's K loop and store
    assert costs.gemm_time(A100, 100, 100, 4096) == pytest.approx(4096 * PER_K + STORE / 108)
    # tiny K is bound by its HBM traffic: 2 * (2 * 4096 * 8 + 4096^2) bytes
    assert costs.gemm_time(A100, 4096, 4096, 8) > 2 * (2 * 4096 * 8 + 4096**2) / 2039e9 * 0.999


def test_tensor_parallel_forward_splits_the_flops_and_the_split_kernels():
    # TP 4, one sample (2048 tokens): QKV 2048 x 1536 x 2048: 8 * 12 = 96 tiles, one wave storing
    # 96 tiles; projection 2048 x 2048 x K 512: 128 tiles, 2 waves; MLP up and down 2048 x 2048 x K
    # 2048: 2 waves each; 4 heads: Q K^T 512 tiles, 5 waves of K 128; P V 32 tiles, one wave of 32.
    # Memory-bound: replicated 22 * s*h stays, the split part (GeLU 16 + attention-output copy 4) * s*h
    # + 9 * a * s^2 (= 144 * s*h) is divided by 4
    w = Workload.parse("gpt-1.3b")
    gemms = (2048 * PER_K + STORE * 96 / 108 + waves(512, 2) + waves(2048, 4) + waves(128, 5)
             + 2048 * PER_K + STORE * 32 / 108)
    stream = (22 + (16 + 4 + 144) / 4) * 2048**2 / 2039e9
    assert costs.forward_time(A100, w, 3, 1, tp=4) == pytest.approx(gemms + stream)
    # sequence parallelism splits the layernorms and residual adds too: (22 + 164) / 4
    sp = (22 + 16 + 4 + 144) / 4 * 2048**2 / 2039e9
    assert costs.forward_time(A100, w, 3, 1, tp=4, sequence_parallel=True) == pytest.approx(gemms + sp)


def test_loss_is_three_head_gemms_by_shape_plus_the_cross_entropy_traffic():
    # gpt-1.3b with V = 51200, one sample, vocabulary-parallel over t = 8: 6400 logits per token.
    # Logits 2048 x 6400 x K 2048: 25 * 16 = 400 tiles, 4 waves; input gradient 2048 x 2048 x K 6400:
    # 8 * 16 = 128 tiles, 2 waves; weight gradient 2048 x 6400 x K 2048 (K = tokens): 400 tiles, 4 waves.
    # Memory-bound: 52 bytes per logit (cast, max, subtract, exp, sum, divide; backward scale and cast)
    # and the final layernorm, 5 bytes per s*h element pair (forward 4, backward 6, in 2-byte units).
    w = Workload.parse("gpt-1.3b:vocab=51200")
    gemms = waves(2048, 4 + 4) + waves(6400, 2)
    stream = (52 * 2048 * 6400 + 5 * 2048 * 2048 * 2) / 2039e9
    assert costs.loss_time(A100, w, 1, 8) == pytest.approx(gemms + stream)


def test_lm_head_cost_divides_by_the_tensor_parallel_degree():
    # A device without wave quantization (no SM count) and with HBM so fast that memory-bound work is
    # free: each of the head's three GEMMs (logits, input and weight gradient) is 2 * tokens * (V/t) * h
    # FLOPs at 0.5 of 1e12 FLOP/s. Every dimension is a multiple of the 256 x 128 tile, so no tile
    # overhangs. Two samples of 512 tokens, h = 256, V = 8192: 6 * 1024 * 8192 * 256 / 5e11 = 25.77 ms.
    ideal = Device("ideal", 1e12, 80 * 2**30, 1e30, NVLINK_3, IB_EDR, 0.5)
    w = Workload("head", 1, 256, 4, 512, 8192)
    for t in (1, 2, 4, 8):
        assert costs.loss_time(ideal, w, 2, t) == pytest.approx(6 * 1024 * 8192 / t * 256 / 5e11)


def test_a_layer_pass_takes_the_host_time_when_the_gpu_waits_on_the_host():
    # asynchronous launches: a pass takes max(host, kernels); 50 ms of host time dwarfs a 350M layer's kernels
    bare = Workload.parse("gpt-350m")
    eager = Workload.parse("gpt-350m:framework_overhead_us=50000")
    assert eager.framework_overhead_s == pytest.approx(0.05)
    assert costs.forward_time(A100, bare, 1, 2) < 0.05
    for tp in (1, 2):
        assert costs.forward_time(A100, eager, 1, 2, tp) == pytest.approx(0.05)
        # a backward is two passes (input and weight gradients), each host-bound
        assert costs.backward_time(A100, eager, 1, 2, tp) == pytest.approx(0.1)
        assert costs.backward_weight_time(A100, eager, 1, 2, tp) == pytest.approx(0.05)
    # full recompute re-runs the forward, host time included; selective re-runs only the attention core
    assert costs.recompute_time(A100, eager, 1, 2, recompute="full") == pytest.approx(0.05)
    assert costs.recompute_time(A100, eager, 1, 2) == pytest.approx(costs.recompute_time(A100, bare, 1, 2))


def test_a_layer_pass_hides_the_host_time_behind_longer_kernels():
    bare = Workload.parse("gpt-350m")
    kernels = costs.forward_time(A100, bare, 1, 8)
    # half the shortest pass's kernels (the weight-gradient GEMMs): the GPU is the bottleneck in every pass
    host_us = 0.5 * costs.backward_weight_time(A100, bare, 1, 8) * 1e6
    eager = Workload.parse(f"gpt-350m:framework_overhead_us={host_us}")
    assert costs.forward_time(A100, eager, 1, 8) == pytest.approx(kernels)
    assert costs.backward_time(A100, eager, 1, 8) == pytest.approx(costs.backward_time(A100, bare, 1, 8))


def test_kernel_time_scale_stretches_the_gpu_side_only():
    bare = Workload.parse("gpt-350m")
    kernels = costs.forward_time(A100, bare, 1, 2)
    slow = Workload.parse("gpt-350m:kernel_time_scale=3")
    assert slow.kernel_time_scale == 3.0
    assert costs.forward_time(A100, slow, 1, 2) == pytest.approx(3 * kernels)
    assert costs.backward_weight_time(A100, slow, 1, 2) == pytest.approx(3 * costs.backward_weight_time(A100, bare, 1, 2))
    assert costs.recompute_time(A100, slow, 1, 2) == pytest.approx(3 * costs.recompute_time(A100, bare, 1, 2))
    # host time between the bare and the scaled kernels: the scaled kernels set the pass
    between = Workload.parse(f"gpt-350m:kernel_time_scale=3,framework_overhead_us={2 * kernels * 1e6}")
    assert costs.forward_time(A100, between, 1, 2) == pytest.approx(3 * kernels)
    # host time above them: the host sets it
    above = Workload.parse(f"gpt-350m:kernel_time_scale=3,framework_overhead_us={4 * kernels * 1e6}")
    assert costs.forward_time(A100, above, 1, 2) == pytest.approx(4 * kernels)
    # the LM head is not a layer pass
    assert costs.loss_time(A100, slow, 2) == pytest.approx(costs.loss_time(A100, bare, 2))
    with pytest.raises(SpecError, match="kernel_time_scale: must be more than 0 and at most 100"):
        Workload.parse("gpt-350m:kernel_time_scale=0")
    with pytest.raises(SpecError, match="kernel_time_scale: must be more than 0 and at most 100"):
        Workload("w", 1, 64, 1, 64, 0, kernel_time_scale=-1.0)


def test_tp_overhead_is_added_to_the_host_time_of_tensor_parallel_passes_only():
    eager = Workload.parse("gpt-350m:framework_overhead_us=50000,tp_overhead_us=20000")
    assert costs.forward_time(A100, eager, 1, 2, 1) == pytest.approx(0.05)
    assert costs.forward_time(A100, eager, 1, 2, 4) == pytest.approx(0.07)
    assert costs.backward_time(A100, eager, 1, 2, 4) == pytest.approx(0.14)


def test_framework_overhead_must_be_a_non_negative_number():
    with pytest.raises(SpecError, match="framework_overhead_s: must be at least 0 and at most 1 s"):
        Workload("w", 1, 64, 1, 64, 0, framework_overhead_s=-1.0)
    with pytest.raises(SpecError, match="framework_overhead_us: expected a number at least 0"):
        Workload.parse("gpt-350m:framework_overhead_us=fast")
    assert Workload.parse("gpt-350m:framework_overhead_us=1.5").framework_overhead_s == 1.5e-6


def test_optimizer_update_is_bound_by_hbm():
    # Megatron's step per parameter: zero the fp32 gradient (4), its norm (4), Adam reading gradient,
    # master, m, v (16) and writing the last three (12), copy to the 16-bit weight (4 + 2) = 42 bytes;
    # 1e9 parameters * 42 bytes / 2039e9 B/s
    assert costs.update_time(A100, 1e9) == pytest.approx(42e9 / 2039e9)
    # Megatron's in-place averaging of the fp32 gradient buffer: read and write 4 bytes
    assert costs.grad_average_time(A100, 1e9) == pytest.approx(8e9 / 2039e9)


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

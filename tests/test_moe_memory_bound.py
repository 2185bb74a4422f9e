"""The memory-bound kernels Megatron-Core runs around a rank's experts (costs.experts.memory_bound_bytes) and
the dispatch's backward (costs.moe_ops.unpermute_backward), against hand-counted HBM traffic."""

import pytest

from dist_lib import SpecError, Workload
from dist_lib.costs import compute, experts, moe_ops
from dist_lib.hardware.devices import get_device

H100 = get_device("H100-80GB")


def test_local_permutations_need_more_than_one_local_expert():
    w = Workload.parse("qwen3-30b-a3b")  # h = 2048, 16-bit
    # 8 local experts of 4096 tokens: sorted into expert order and back, each a read and a write of 2048 x 2 B
    assert experts.local_permutation_bytes(w, [4096] * 8) == 2 * 2 * 8 * 4096 * 2048 * 2
    assert experts.local_permutation_bytes(w, [32768]) == 0.0  # one expert: its tokens arrive in order


def test_gpt_oss_down_projection_bias_is_six_element_transfers_a_token():
    w = Workload.parse("gpt-oss-120b")  # h = 2880
    # b x p written; output and it read, sum written; the pieces read and written by the concatenation
    assert experts.expert_bias_bytes(w, 16384) == (1 + 3 + 2) * 16384 * 2880 * 2
    assert experts.expert_bias_bytes(Workload.parse("qwen3-30b-a3b"), 16384) == 0.0  # no biases


def test_gpt_oss_clamp_before_the_glu():
    w = Workload.parse("gpt-oss-120b")  # f = 2880
    assert w.moe.swiglu_limit == 7.0
    # forward: clamp each half (read f, write f) and concatenate them (read 2f, write 2f)
    assert experts.clamp_bytes(w, 100) == (2 + 2 + 4) * 100 * 2880 * 2
    # backward: each clamp's gradient reads gradient and input and writes f; the halves concatenated (4f)
    assert experts.clamp_bytes(w, 100, backward=True) == (3 + 3 + 4) * 100 * 2880 * 2
    assert experts.clamp_bytes(w, 100, etp=2) == 8 * 100 * 1440 * 2  # an expert-TP shard's half of f
    assert experts.clamp_bytes(Workload.parse("gpt-oss-120b:swiglu_limit=0"), 100) == 0.0


def test_gpt_oss_experts_forward_counts_every_kernel_around_the_grouped_gemm():
    w = Workload.parse("gpt-oss-120b")
    n, h, f = 16 * 1024, 2880, 2880
    seconds, _ = moe_ops.experts_cost(H100, w, [1024] * 16, backward=False)
    gemms = compute.gemm_time(H100, 1024, 2 * f, h, 16, 2) + compute.gemm_time(H100, 1024, h, f, 16, 2)
    memory = n * 2 * (3 * f + 8 * f + 6 * h + 4 * h)  # SwiGLU, clamp, bias, sort and unsort
    assert seconds == pytest.approx(gemms + memory / H100.hbm_bandwidth)


def test_the_dispatch_backward_moves_what_the_dispatch_copied():
    nbytes = 4 * 4096 * 2880 * 2  # top-4 copies of a 4096-token sample of GPT-OSS
    assert moe_ops.unpermute_backward(H100, nbytes) == pytest.approx(2 * nbytes / H100.hbm_bandwidth)


def test_swiglu_limit_is_checked():
    with pytest.raises(SpecError, match="swiglu_limit"):
        Workload.parse("gpt-oss-120b:swiglu_limit=-1")

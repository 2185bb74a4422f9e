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


def test_route_backward_runs_the_dispatch_backward_first():
    """One toy MoE layer on two GPUs, ep=2, a sample a rank: the rank's 1024 tokens went to their top-2 experts,
    2048 copies of h = 2048 two-byte elements; route_backward gathers their gradients back before the dense
    part's backward."""
    from pathlib import Path
    from dist_lib import simulate
    spec = "toy:layers=1,hidden=2048,heads=16,seq=1024,experts=4,top_k=2,expert_ffn_hidden=1024"
    strategy = str(Path(__file__).resolve().parent.parent / "strategies" / "moe.py")
    r = simulate(strategy, "1x2xH100-80GB", spec, 2, ep=2)
    assert r.correct, r.problems
    [event] = [e for e in r.events if e.op == "route_backward" and e.rank == 0]
    dense = moe_ops.route_cost(H100, Workload.parse(spec), 0, 1, True)[0]
    assert event.end - event.start == pytest.approx(dense + 2 * 2048 * 2048 * 2 / H100.hbm_bandwidth, rel=1e-12)


def test_qwen3_query_key_norm_is_timed_in_route():
    w = Workload.parse("qwen3-30b-a3b")  # 32 query heads and 4 KV heads of 128, sequence 4096
    width = (32 + 4) * 128
    assert moe_ops.qk_norm_bytes(w, False) == 4096 * width * 2 * 2  # queries and keys read and written
    assert moe_ops.qk_norm_bytes(w, True) == 4096 * width * 3 * 2  # gradient and input read, gradient written
    assert moe_ops.qk_norm_bytes(Workload.parse("gpt-oss-120b"), False) == 0.0
    without = Workload.parse("qwen3-30b-a3b:qk_norm=false")
    for backward in (False, True):
        extra = moe_ops.route_cost(H100, w, 0, 1, backward)[0] - moe_ops.route_cost(H100, without, 0, 1, backward)[0]
        assert extra == pytest.approx(moe_ops.qk_norm_bytes(w, backward) / H100.hbm_bandwidth)
    # forward and backward together: 46 KB a token, about 56 us for a 4096-token sample (the preset's docstring)
    total = moe_ops.qk_norm_bytes(w, False) + moe_ops.qk_norm_bytes(w, True)
    assert total / 4096 == pytest.approx(46e3, rel=0.01)
    assert total / H100.hbm_bandwidth == pytest.approx(56e-6, rel=0.02)

"""The routed experts of a rank as one grouped GEMM (costs.moe_ops.grouped_gemms): the tiles of groups of one
shape share the SMs' waves."""

import pytest

from dist_lib import Workload
from dist_lib.costs import compute, moe_ops
from dist_lib.hardware.devices import get_device

H100 = get_device("H100-80GB")


def test_equal_groups_are_one_batch_of_tiles():
    w = Workload.parse("gpt-oss-120b")
    shape = (128, 5760, 2880)  # 128 tokens into one expert's gate/up projection
    seconds, flops = moe_ops.grouped_gemms(H100, w, [shape] * 16)
    assert seconds == compute.gemm_time(H100, *shape, 16, 2)
    assert flops == 16 * 2.0 * 128 * 5760 * 2880
    # one expert's GEMM is 23 tiles on 132 SMs, one wave with most SMs idle; 16 of them together are 3 waves of
    # tiles, and then bound by reading the 16 experts' weights (and the tokens, and writing the output) once
    alone = compute.gemm_time(H100, *shape, 1, 2)
    traffic = 16 * 2 * (128 * 2880 + 2880 * 5760 + 128 * 5760) / H100.hbm_bandwidth
    assert seconds == pytest.approx(traffic) and seconds < 16 * alone / 2


def test_skewed_groups_are_timed_shape_by_shape():
    w = Workload.parse("gpt-oss-120b")
    shapes = [(128, 5760, 2880), (128, 5760, 2880), (256, 5760, 2880)]
    seconds, _ = moe_ops.grouped_gemms(H100, w, shapes)
    assert seconds == compute.gemm_time(H100, 128, 5760, 2880, 2, 2) + compute.gemm_time(H100, 256, 5760, 2880, 1, 2)


def test_experts_cost_uses_the_grouped_kernel():
    w = Workload.parse("gpt-oss-120b:biases=false,swiglu_limit=0")  # no clamp, no bias: the GEMMs and SwiGLU
    seconds, flops = moe_ops.experts_cost(H100, w, [1024] * 16, backward=False)
    gemms = compute.gemm_time(H100, 1024, 5760, 2880, 16, 2) + compute.gemm_time(H100, 1024, 2880, 2880, 16, 2)
    swiglu = 16 * 1024 * 2880 * 3 * 2 / H100.hbm_bandwidth  # read gate and up, write their product
    # 16 local experts: the received tokens sorted into expert order and back, each a read and a write of h
    sort = 2 * 2 * 16 * 1024 * 2880 * 2 / H100.hbm_bandwidth
    assert seconds == pytest.approx(gemms + swiglu + sort) and flops == 16 * 1024 * 2 * 3 * 2880 * 2880

"""FP8 memory: Transformer Engine's delayed scaling keeps each layer's FP8 weight and its transpose and the
scaling state of its GEMMs' FP8 tensors; torchao's tensorwise scaling keeps nothing between passes."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.costs.fp8 import persistent_bytes
from dist_lib.workload.transformer import Workload

H100 = "1x8xH100-80GB"
LLAMA = "llama-3-8b:layers=2"
# one llama-3-8b layer's linear weights: QKV 4096 x (4096 + 2 x 1024), projection 4096 x 4096, gate and up
# 4096 x 2 x 14336, down 14336 x 4096
LINEAR_PARAMS = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096


def hybrid(**options):
    return simulate("strategies/hybrid.py", H100, LLAMA, 8, pp=1, **options)


def test_a_te_layer_keeps_two_bytes_a_linear_parameter_and_its_scaling_state():
    """At tp=2: half the linear parameters, one byte for the FP8 weight and one for its transpose, and for each
    of the 4 GEMMs 3 FP8 tensors of 12 bytes (fp32 scale, inverse scale, an amax history of 1)."""
    assert LINEAR_PARAMS == 218_103_808
    assert persistent_bytes(Workload.parse(LLAMA), 2, "delayed") == 2 * LINEAR_PARAMS // 2 + 4 * 3 * 12
    assert persistent_bytes(Workload.parse(LLAMA), 2, "tensorwise") == 0


@pytest.mark.parametrize("options", [dict(tp=2, dp=4), dict(tp=2, cp=2), dict(tp=2, dp=4, fsdp=True)])
def test_the_peak_grows_by_the_te_copies_of_the_ranks_layers_and_not_with_torchao(options):
    plain, te, torchao = hybrid(**options), hybrid(fp8="delayed", **options), hybrid(fp8="tensorwise", **options)
    assert te.correct and torchao.correct
    copies = 2 * (LINEAR_PARAMS + 4 * 3 * 12)  # two layers of TP slice LINEAR_PARAMS / 2 at 2 bytes each
    assert te.memory_by_kind[0]["weight"] - plain.memory_by_kind[0]["weight"] == copies
    assert torchao.memory_by_kind[0]["weight"] == plain.memory_by_kind[0]["weight"]
    assert torchao.memory_bytes == plain.memory_bytes


def test_the_copy_is_made_once_per_layer_whatever_the_microbatches():
    """16 samples on 4 replicas in microbatches of 1 or 4: the same FP8 copies (TE reuses its workspace)."""
    one = simulate("strategies/hybrid.py", H100, LLAMA, 16, pp=1, tp=2, dp=4, fp8="delayed")
    four = simulate("strategies/hybrid.py", H100, LLAMA, 16, pp=1, tp=2, dp=4, fp8="delayed", microbatch_size=4)
    assert one.memory_by_kind[0]["weight"] == four.memory_by_kind[0]["weight"]

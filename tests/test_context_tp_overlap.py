"""Context parallelism with TP: a CP rank's layer has the TP collectives of a plain layer at s/cp tokens (two
all-reduces of its partial sums, attention and MLP), and `tp_comm_overlap` (Megatron-Core's
`--tp-comm-overlap`, torchtitan's async TP) pipelines them with the GEMMs as at cp = 1 (`costs.tp_overlap`)."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.costs.network import collective_time
from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload

H100 = "1x8xH100-80GB"
LLAMA = "llama-3-8b:layers=2"


def hybrid(workload: str = LLAMA, batch: int = 8, **options):
    return simulate("strategies/hybrid.py", H100, workload, batch, **options)


def durations(result, op: str, detail: str, layer: int = 1) -> set:
    """The durations (to the picosecond) of layer `layer`'s `op` events with `detail` on rank 0."""
    return {round(e.duration, 12) for e in result.events if e.rank == 0 and e.layer == layer and e.op == op
            and e.detail == detail}


def test_a_cp_layers_tp_partial_sums_are_two_all_reduces_of_its_s_over_cp_tokens():
    """cp = 2 x tp = 2 on one node, microbatches of one sample: each layer's forward output (attention, then
    MLP) and each layer's input gradient are two all-reduces of s/2 x h 16-bit elements in the TP group (the
    gradients reduced after the flush, so that no data-parallel reduction shares the NVLink with them)."""
    workload = Workload.parse(LLAMA)
    nbytes = workload.seq_len // 2 * workload.hidden * 2
    topo = Cluster.parse(H100).topology((0, 1))
    pair = round(2 * collective_time("all_reduce", nbytes, topo), 12)
    result = hybrid(tp=2, pp=1, cp=2, dp=2, microbatch_size=1, overlap_grad_reduce=False)
    assert result.correct
    assert durations(result, "all_reduce", "activation (TP partial sums)", layer=2) == {pair}
    assert durations(result, "all_reduce", "activation_grad (TP partial sums)", layer=1) == {pair}


SMALL = Workload("small", 4, 4096, 32, 2048, 32000)  # h = 4096, 32 heads, s = 2048, GeLU MLP of 4h


def _small(**options):
    return simulate("strategies/hybrid.py", "1x4xH100-80GB", SMALL, 1, dp=1, pp=1, tp=2, cp=2, microbatch_size=1,
                    sequence_parallel=True, overlap_grad_reduce=False, **options)


def test_cp_with_tp_comm_overlap_hides_each_tp_collective_behind_its_gemm_at_s_over_cp_tokens():
    """cp = 2 x tp = 2 (TP fastest), one sample: each rank runs s/2 = 1024 tokens. Its layer's TP all-gathers
    (before QKV and MLP up) run as tp - 1 = 1 ring step beside half the GEMM, then the other half alone:
    max(g/2, c) + g/2; its reduce-scatters (after the projection and MLP down) in 4 splits:
    g/4 + 3 max(g/4, c/4) + c/4. Each collective of s/2 x h 16-bit elements, each GEMM of 1024 rows on a TP
    rank's half of the weight; what exceeds the GEMMs is all the layer's forward collectives still cost."""
    from dist_lib.costs.compute import gemm_time
    cluster = Cluster.parse("1x4xH100-80GB")
    device, topo = cluster.device_of(0), cluster.topology((0, 1))
    tokens, h = SMALL.seq_len // 2, SMALL.hidden
    n = tokens * h * 2
    gather, scatter = collective_time("all_gather", n, topo), collective_time("reduce_scatter", n, topo)
    qkv, proj, up, down = (gemm_time(device, tokens, 3 * h / 2, h), gemm_time(device, tokens, h, h / 2),
                           gemm_time(device, tokens, 4 * h / 2, h), gemm_time(device, tokens, h, 4 * h / 2))
    margin = 132 / (132 - 16)  # the reduce-scatters' 16 SMs, kept clear of the GEMM (Transformer Engine's defaults)
    exposed = sum(max(g / 2, gather) + g / 2 - g for g in (qkv, up)) \
        + sum(g * margin / 4 + 3 * max(g * margin / 4, scatter / 4) + scatter / 4 - g for g in (proj, down))
    # compute-bound at these sizes: each all-gather hides wholly behind its GEMM's first half, and each
    # reduce-scatter behind the next GEMM split but its last quarter, so what is left is 2 x c/4 and what the
    # reduce-scatters' SMs cost the two GEMMs
    assert all(gather <= g / 2 for g in (qkv, up)) and all(scatter <= g for g in (proj, down))
    assert exposed == pytest.approx(2 * scatter / 4 + (proj + down) * (margin - 1), rel=1e-9)

    plain, fast = _small(), _small(tp_comm_overlap=True)
    assert plain.correct and fast.correct
    forward = "activation (TP partial sums)"
    assert durations(plain, "all_reduce", forward) == {round(2 * collective_time("all_reduce", n, topo), 12)}
    assert durations(fast, "all_reduce", forward) == {round(exposed, 12)}
    # the backward's input-gradient all-reduce, beside the weight-gradient GEMMs, takes the same entry (as at
    # cp = 1: Transformer Engine's bulk overlap of the re-gather and the reduce-scatter)
    assert durations(fast, "all_reduce", "activation_grad (TP partial sums)") == {round(exposed, 12)}
    # the attention's key/value ring over the CP group is untouched, and so is the memory
    assert durations(fast, "send", "kv block") == durations(plain, "send", "kv block")
    assert fast.peak_memory_bytes == plain.peak_memory_bytes
    # the backward's two all-gathers of the sequence-split output gradient, before the projection's and MLP
    # down's input-gradient GEMMs, run as one ring step beside half of each (tp = 2), as at cp = 1
    proj_dgrad, down_dgrad = gemm_time(device, tokens, h / 2, h), gemm_time(device, tokens, 4 * h / 2, h)
    backward_exposed = sum(max(g / 2, gather) + g / 2 - g for g in (proj_dgrad, down_dgrad))
    assert durations(plain, "all_gather", "activation_grad slices (TP gather)") == {round(gather, 12)}
    assert sum(durations(fast, "all_gather", "activation_grad slices (TP gather)")) == pytest.approx(backward_exposed / 2)
    # the step shortens by what the overlap hides: four layers, forward and backward each, and the backward's
    # two gathers a layer
    saved = 4 * 2 * (2 * collective_time("all_reduce", n, topo) - exposed) + 4 * (2 * gather - backward_exposed)
    assert plain.time_s - fast.time_s == pytest.approx(saved, rel=1e-6)


def test_cp_with_tp_comm_overlap_in_a_pipeline_with_fsdp_runs_correct_and_faster():
    """torchtitan's Table 6 layout in small: FSDP over dp x cp, CP 2, TP 2 with async TP, two stages."""
    options = dict(tp=2, pp=2, cp=2, framework="torchtitan", microbatch_size=1, recompute=True)
    plain = simulate("strategies/hybrid.py", "2x4xH100-80GB", SMALL, 4, **options)
    fast = simulate("strategies/hybrid.py", "2x4xH100-80GB", SMALL, 4, tp_comm_overlap=True, **options)
    assert plain.correct and fast.correct
    assert fast.time_s < plain.time_s
    assert fast.peak_memory_bytes == plain.peak_memory_bytes

"""Megatron-Core's --tp-comm-overlap (`costs/tp_overlap.py`, hybrid's `tp_comm_overlap`): a TP collective
pipelined with its GEMM costs max(comm, GEMM) plus the unhidden chunk, and nothing else changes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dist_lib import simulate
from dist_lib.comm.tp_overlap import overlap_layer_collectives
from dist_lib.costs import compute
from dist_lib.errors import StrategyError
from dist_lib.costs.fp8 import fp8_device
from dist_lib.costs.network import collective_time
from dist_lib.costs import tp_overlap as tp_costs
from dist_lib.costs.tp_overlap import pipelined_time, ring_exchange_time
from dist_lib.hardware.devices import DEVICES
from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload

SMALL = Workload("small", 4, 4096, 32, 2048, 32000)


def test_chunked_overlap_formulas_by_hand():
    # ring exchange over 4 ranks: 3 steps of max(4/4, 6/3) = 2, then the last GEMM chunk 1
    assert ring_exchange_time(4.0, 6.0, 4) == pytest.approx(7.0)
    # compute-bound: the exchange hides entirely, the GEMM's time is all that is left
    assert ring_exchange_time(8.0, 3.0, 4) == pytest.approx(8.0)
    # pipelined reduce-scatter in 4 splits: first GEMM chunk 2, 3 x max(2, 1), last reduce-scatter chunk 1
    assert pipelined_time(8.0, 4.0) == pytest.approx(9.0)
    assert ring_exchange_time(4.0, 6.0, 1) == 10.0  # no TP group: nothing to overlap


def _one_layer_forward(overlap: bool):
    async def train(model, **_):
        group = model.group([0, 1])
        if overlap:
            overlap_layer_collectives(group, model.device, model.workload, 1)
        weight, _ = model.load_weights(0, tp_rank=model.rank, tp_size=2)
        x = model.forward(0, model.get_input_activation(range(1)), weight, sequence_parallel=True)
        await model.all_reduce(x, group)
    return train


def test_one_layer_forward_with_and_without_overlap_as_hand_derived():
    cluster = Cluster.parse("1x2xH100-80GB")
    device = cluster.device_of(0)
    topo = cluster.topology((0, 1))
    forward = compute.forward_time(device, SMALL, 0, 1, 2, sequence_parallel=True)
    n = SMALL.activation_bytes()  # b s h at 16 bits, b = 1
    gather, scatter = collective_time("all_gather", n, topo), collective_time("reduce_scatter", n, topo)
    # without: the layer's compute, then its two all-reduces (attention, MLP)
    plain = simulate(_one_layer_forward(False), cluster, SMALL, 1, check=False).time_s
    assert plain == pytest.approx(forward + 2 * collective_time("all_reduce", n, topo), rel=1e-9)
    # with: QKV and MLP-up behind their all-gathers as max(g/2, c) + g/2 (t = 2), projection and MLP-down
    # before their reduce-scatters as g'/4 + 3 max(g'/4, c/4) + c/4, g' on the 132 - 16 SMs the reduce-scatter's
    # kernels leave the GEMM (Transformer Engine's default num_sm and SM margin); what exceeds the GEMMs is exposed
    margin = 132 / (132 - 16)
    s, h = SMALL.seq_len, SMALL.hidden
    qkv, proj, up, down = (compute.gemm_time(device, s, 3 * h / 2, h), compute.gemm_time(device, s, h, h / 2),
                           compute.gemm_time(device, s, 4 * h / 2, h), compute.gemm_time(device, s, h, 4 * h / 2))
    exposed = sum(max(g / 2, gather) + g / 2 - g for g in (qkv, up)) \
        + sum(g * margin / 4 + 3 * max(g * margin / 4, scatter / 4) + scatter / 4 - g for g in (proj, down))
    overlapped = simulate(_one_layer_forward(True), cluster, SMALL, 1, check=False).time_s
    assert overlapped == pytest.approx(forward + exposed, rel=1e-9)
    assert overlapped < plain


def test_hybrid_with_overlap_runs_correct_and_faster():
    options = dict(dp=1, pp=2, tp=2, microbatch_size=1, sequence_parallel=True)
    base = simulate("strategies/hybrid.py", "1x4xH100-80GB", SMALL, 4, **options)
    fast = simulate("strategies/hybrid.py", "1x4xH100-80GB", SMALL, 4, tp_comm_overlap=True, **options)
    assert base.correct and fast.correct
    assert fast.time_s < base.time_s
    assert fast.peak_memory_bytes == base.peak_memory_bytes


def test_tp_comm_overlap_needs_sequence_parallelism():
    with pytest.raises(StrategyError, match="tp_comm_overlap=True with tp=2 needs sequence_parallel=True"):
        simulate("strategies/hybrid.py", "1x2xH100-80GB", SMALL, 2, dp=1, pp=1, tp=2, tp_comm_overlap=True)


def test_the_backwards_output_gradient_gathers_take_their_overlapped_entry():
    """hybrid's sequence-parallel backward all-gathers the output gradient twice a layer (`_pipeline`'s
    `_gather_sequence_parallel_grad`); with the overlap each costs half of what the two ring exchanges beside the
    projection's and MLP down's input-gradient GEMMs leave exposed (t = 2: max(g/2, c) + g/2 - g each)."""
    cluster = Cluster.parse("1x2xH100-80GB")
    device, topo = cluster.device_of(0), cluster.topology((0, 1))
    s, h = SMALL.seq_len, SMALL.hidden
    gather = collective_time("all_gather", SMALL.activation_bytes(), topo)
    dgrads = (compute.gemm_time(device, s, h / 2, h), compute.gemm_time(device, s, 4 * h / 2, h))
    each = sum(max(g / 2, gather) + g / 2 - g for g in dgrads) / 2
    options = dict(dp=1, pp=1, tp=2, microbatch_size=1, sequence_parallel=True)
    for overlap, expected in ((False, gather), (True, each)):
        result = simulate("strategies/hybrid.py", cluster, SMALL, 1, tp_comm_overlap=overlap, **options)
        gathers = [e.duration for e in result.events if e.rank == 0 and e.op == "all_gather" and e.layer == 1]
        assert len(gathers) == 2 and gathers == pytest.approx([expected] * 2, rel=1e-9)


def _forward_exposed(device, topo) -> float:
    """What one SMALL layer's forward leaves of its TP collectives over 2 ranks (t = 2): the all-gathers beside QKV
    and MLP up as max(g/2, c) + g/2, the reduce-scatters after the projection and MLP down as
    g'/4 + 3 max(g'/4, c/4) + c/4 on the 132 - 16 SMs, less the GEMMs."""
    n, s, h, margin = SMALL.activation_bytes(), SMALL.seq_len, SMALL.hidden, 132 / (132 - 16)
    gather, scatter = collective_time("all_gather", n, topo), collective_time("reduce_scatter", n, topo)
    qkv, proj, up, down = (compute.gemm_time(device, s, 3 * h / 2, h), compute.gemm_time(device, s, h, h / 2),
                           compute.gemm_time(device, s, 4 * h / 2, h), compute.gemm_time(device, s, h, 4 * h / 2))
    return sum(max(g / 2, gather) + g / 2 - g for g in (qkv, up)) \
        + sum(g * margin / 4 + 3 * max(g * margin / 4, scatter / 4) + scatter / 4 - g for g in (proj, down))


def _micro_forward_exposed(device, topo, fast=None, gathers: bool = True) -> float:
    """PyTorch's symmetric-memory ops under torchtitan's async TP, t = 2: each fused all-gather first copies its
    shard (n/2 bytes, read and written: n over HBM) and then runs as a ring exchange, max(g/2, c) + g/2; each fused
    reduce-scatter runs its two GEMM chunks as a ring exchange beside the chunk's copy, on all 132 SMs, then sums
    the two n/2 partials it holds (n read, n/2 written), less the GEMMs. `fast`: the device the GEMMs run on; with
    `gathers` False the all-gathers are not fused and cost whole."""
    fast = fast or device
    n, s, h, bw = SMALL.activation_bytes(), SMALL.seq_len, SMALL.hidden, device.hbm_bandwidth
    gather, scatter = collective_time("all_gather", n, topo), collective_time("reduce_scatter", n, topo)
    qkv, proj, up, down = (compute.gemm_time(fast, s, 3 * h / 2, h), compute.gemm_time(fast, s, h, h / 2),
                           compute.gemm_time(fast, s, 4 * h / 2, h), compute.gemm_time(fast, s, h, 4 * h / 2))
    gathered = sum(n / bw + max(g / 2, gather) + g / 2 - g for g in (qkv, up)) if gathers else 2 * gather
    return gathered + sum(max(g / 2, scatter) + g / 2 + 1.5 * n / bw - g for g in (proj, down))


def test_torchtitans_async_tp_leaves_the_backwards_input_gradient_reductions_whole():
    """Inductor's micro-pipeline TP pass fuses a reduce-scatter only with the one matmul producing its input: the
    backward's reduce-scatters of the summed Q/K/V and w1/w3 input gradients stay plain collectives, so under
    `framework="torchtitan"` the backward's all-reduce pair of a layer costs two all-reduces of b s h, while the
    forward's pair and the output gradient's all-gathers keep their overlapped entries; Megatron-Core's userbuffers
    (no framework) overlap the backward's pair as well (its `bulk` methods), at the forward's entry."""
    cluster = Cluster.parse("1x2xH100-80GB")
    device, topo = cluster.device_of(0), cluster.topology((0, 1))
    n = SMALL.activation_bytes()
    forward, whole = _forward_exposed(device, topo), 2 * collective_time("all_reduce", n, topo)
    micro = _micro_forward_exposed(device, topo)
    options = dict(dp=1, pp=1, tp=2, microbatch_size=1, sequence_parallel=True, tp_comm_overlap=True)
    for framework, expected in ((None, [forward, forward]), ("torchtitan", [micro, whole])):
        result = simulate("strategies/hybrid.py", cluster, SMALL, 1, framework=framework, **options)
        assert result.correct
        pairs = sorted((e for e in result.events if e.rank == 0 and e.op == "all_reduce" and e.layer == 1),
                       key=lambda e: e.start)
        assert [e.duration for e in pairs] == pytest.approx(expected, rel=1e-9)


def test_overlap_layer_collectives_names_an_unknown_overlap():
    cluster = Cluster.parse("1x2xH100-80GB")

    async def train(model, **_):
        overlap_layer_collectives(model.group([0, 1]), model.device, model.workload, 1, overlap="bulk")

    with pytest.raises(Exception, match="TP overlap must be one of userbuffers, micro_pipeline, got 'bulk'"):
        simulate(train, cluster, SMALL, 1, check=False)


def _entries(overlap: str, fp8: str) -> dict:
    """The cost entries `overlap_layer_collectives` makes on a 2-rank group of H100s for one SMALL sample."""
    entries = {}

    async def train(model, **_):
        group = model.group([0, 1])
        overlap_layer_collectives(group, model.device, model.workload, 1, overlap=overlap, fp8=fp8)
        entries.update(group.costs)

    simulate(train, Cluster.parse("1x2xH100-80GB"), SMALL, 1, check=False)
    return entries


def test_fp8_overlap_takes_the_fp8_gemms_and_rowwise_async_tp_overlaps_only_the_reduce_scatters():
    """With an FP8 recipe the GEMM beside each collective is the FP8 one (the H100's FP8 peak). torchtitan's async TP
    under rowwise FP8 gathers in bf16 and casts after the gather: no all-gather is fused, so the forward's pair keeps
    its two all-gathers whole and the reduce-scatters' pipelined remainder, and the all-gathers have no entry."""
    cluster = Cluster.parse("1x2xH100-80GB")
    device, topo = cluster.device_of(0), cluster.topology((0, 1))
    fast = fp8_device(device)
    assert fast.peak_flops > device.peak_flops
    n, s, h, margin = SMALL.activation_bytes(), SMALL.seq_len, SMALL.hidden, 132 / (132 - 16)
    gather, scatter = collective_time("all_gather", n, topo), collective_time("reduce_scatter", n, topo)
    qkv, proj, up, down = (compute.gemm_time(fast, s, 3 * h / 2, h), compute.gemm_time(fast, s, h, h / 2),
                           compute.gemm_time(fast, s, 4 * h / 2, h), compute.gemm_time(fast, s, h, 4 * h / 2))
    scattered = sum(g * margin / 4 + 3 * max(g * margin / 4, scatter / 4) + scatter / 4 - g for g in (proj, down))
    gathered = sum(max(g / 2, gather) + g / 2 - g for g in (qkv, up))
    dgrads = (compute.gemm_time(fast, s, h / 2, h), compute.gemm_time(fast, s, 4 * h / 2, h))
    output_gradient = sum(max(g / 2, gather) + g / 2 - g for g in dgrads) / 2
    tensorwise = _entries("userbuffers", "tensorwise")
    assert tensorwise[("all_reduce", n, True)] == pytest.approx(gathered + scattered, rel=1e-12)
    assert tensorwise[("all_reduce", n, 2)] == pytest.approx(gathered + scattered, rel=1e-12)
    assert tensorwise[("all_gather", n, False)] == pytest.approx(output_gradient, rel=1e-12)
    rowwise = _entries("micro_pipeline", "rowwise")
    assert rowwise[("all_reduce", n, True)] == pytest.approx(_micro_forward_exposed(device, topo, fast, False),
                                                             rel=1e-12)
    assert ("all_reduce", n, 2) not in rowwise and ("all_gather", n, False) not in rowwise
    # torchtitan's tensorwise recipe gathers in float8 straight into the matmul: its gathers keep their entries,
    # each PyTorch's fused all-gather-matmul (the shard's copy, n over HBM, then the ring exchange)
    micro_gradient = output_gradient + n / device.hbm_bandwidth
    assert _entries("micro_pipeline", "tensorwise")[("all_gather", n, False)] == pytest.approx(micro_gradient,
                                                                                               rel=1e-12)


def test_per_op_recompute_gathers_share_the_entry_with_the_recomputed_k_and_w3_beside_them():
    """torchtitan's per-op recompute all-gathers the two norms' outputs again; the micro-pipeline pass fuses each with
    the one recomputed matmul that takes it as its left operand (wk, w3: wq, wv and w1 are saved). The four gathers
    of TP slices of a layer share one entry: the mean of the output gradient's two ring exchanges (beside wo's and
    w2's input-gradient GEMMs) and the recompute's two (beside wk's and w3's GEMMs). Userbuffers keep the former.
    With grouped keys and values (8 of 32 heads: wk a quarter of wo's width) and a SwiGLU MLP of 3.5h."""
    gqa = Workload("gqa", 4, 4096, 32, 2048, 32000, kv_heads=8, ffn_hidden=14336, mlp="swiglu")
    cluster = Cluster.parse("1x2xH100-80GB")
    device, topo = cluster.device_of(0), cluster.topology((0, 1))
    n, s, h = gqa.activation_bytes(), gqa.seq_len, gqa.hidden
    gather = collective_time("all_gather", n, topo)

    def ring(g: float) -> float:  # t = 2: max(g/2, c) + g/2, less the GEMM
        return max(g / 2, gather) + g / 2 - g

    # input-gradient GEMMs of wo (M s, N h/2 of its input, K h) and w2 (N 14336/2); recomputed wk (N 1024/2), w3
    dgrads = ring(compute.gemm_time(device, s, h / 2, h)) + ring(compute.gemm_time(device, s, 14336 / 2, h))
    recomputed = ring(compute.gemm_time(device, s, 1024 / 2, h)) + ring(compute.gemm_time(device, s, 14336 / 2, h))
    assert recomputed > dgrads  # wk's GEMM hides less of its gather than wo's input-gradient GEMM
    entries = {}

    async def train(model, **_):
        group = model.group([0, 1])
        for overlap in ("micro_pipeline", "userbuffers"):
            group.costs.clear()
            overlap_layer_collectives(group, model.device, model.workload, 1, overlap=overlap, regather=True)
            entries[overlap] = group.costs[("all_gather", n, False)]

    simulate(train, cluster, gqa, 1, check=False)
    # under the micro-pipeline pass each of the four is PyTorch's fused op: its shard copied first (n over HBM)
    assert entries["micro_pipeline"] == pytest.approx((dgrads + recomputed) / 4 + n / device.hbm_bandwidth,
                                                      rel=1e-12)
    assert entries["userbuffers"] == pytest.approx(dgrads / 2, rel=1e-12)


def test_pytorchs_symmetric_memory_ops_by_hand():
    """At t = 8 on a device of 2 TB/s HBM: a GEMM of 8 ms beside a collective of 4 ms. The fused all-gather first
    copies its 1 GB shard (read and written, 1 ms), then 7 max(1, 4/7) + 1 = 8 ms; the fused reduce-scatter runs
    the same 8 ms and then sums the eight 1 GB partials of an 8 GB output, 8 GB read and 1 GB written (4.5 ms)."""
    device = replace(DEVICES["H100-80GB"], hbm_bandwidth=2e12)
    assert tp_costs.symm_mem_gather_time(device, 8e-3, 4e-3, 8, 1e9) == pytest.approx(9e-3, rel=1e-12)
    assert tp_costs.symm_mem_scatter_time(device, 8e-3, 4e-3, 8, 8e9) == pytest.approx(12.5e-3, rel=1e-12)
    # bound by the collective: 7 copies of 2 ms, the first chunk's GEMM (1 ms) before them unhidden
    assert tp_costs.symm_mem_scatter_time(device, 8e-3, 14e-3, 8, 0) == pytest.approx(15e-3, rel=1e-12)

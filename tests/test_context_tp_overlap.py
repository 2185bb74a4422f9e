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

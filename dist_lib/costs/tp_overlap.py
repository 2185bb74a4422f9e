"""Tensor-parallel communication overlapped with the GEMMs it feeds or drains (Megatron-Core's
`--tp-comm-overlap`, Transformer Engine's userbuffers; torchtitan's async TP is the same idea).

Megatron-LM requires sequence parallelism for it (megatron/training/arguments.py `validate_args`: "Tensor
parallel communication/GEMM overlap can happen only when sequence parallelism is enabled").
With sequence parallelism each TP linear layer of a forward is an all-gather of its sequence-split input
before a column-parallel GEMM (QKV, MLP up) or a reduce-scatter of its output after a row-parallel GEMM
(attention projection, MLP down). Transformer Engine splits each pair into chunks and pipelines them
(NVIDIA/TransformerEngine, transformer_engine/pytorch/module/base.py `initialize_ub`, default methods):

* `ring_exchange` for qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad: the all-gather as tp - 1 point-to-point
  steps of one chunk each, the GEMM in tp chunks, chunk i's GEMM beside the step that brings chunk i+1;
  the last chunk's GEMM runs alone:  T = (t - 1) max(g/t, c/(t - 1)) + g/t;
* `pipeline` (num_splits 4) for proj_fprop, fc2_fprop: the GEMM in 4 chunks, each chunk's reduce-scatter
  beside the next chunk's GEMM; the first GEMM chunk and the last reduce-scatter run alone:
  T = g'/4 + 3 max(g'/4, c/4) + c/4, where g' is the GEMM on the SMs its reduce-scatter leaves it: the
  method's default communication kernel takes 16 SMs with an SM margin the GEMM keeps clear (`num_sm` 16,
  `set_sm_margin`), so g' = g x SMs / (SMs - 16) on a device whose SM count is known (132 on an H100 SXM:
  the GEMM chunks run 13.8 % longer). `ring_exchange` takes 1 SM and sets no margin: its GEMM keeps g;
* `bulk` for qkv_dgrad, fc1_dgrad, qkv_wgrad, fc1_wgrad: the backward's re-gather and reduce-scatter beside
  the input- and weight-gradient GEMMs, which the engine already runs side by side (`async_tp_allreduce`).

So a collective c overlapped with a GEMM g costs max(c, g) plus its unhidden first or last chunk, instead of
c + g. The engine charges a layer's compute and then its TP collective; with the overlap the collective
keeps only what the GEMMs do not hide, `exposed = T - g` summed over the layer's pairs. With an FP8 recipe the
GEMM beside a collective is the FP8 one (`costs.fp8.fp8_device`), as the layer's compute charges it.
"""

from __future__ import annotations

from dist_lib.costs.compute import gemm_time
from dist_lib.costs.fp8 import fp8_device
from dist_lib.costs.network import collective_time
from dist_lib.hardware.devices import Device
from dist_lib.hardware.topology import Topology
from dist_lib.workload import architecture as arch
from dist_lib.workload.per_op_checkpoint import recomputed_gemm_shapes
from dist_lib.workload.transformer import Workload

PIPELINE_SPLITS = 4  # Transformer Engine's default num_splits for the `pipeline` reduce-scatter overlap
PIPELINE_COMM_SMS = 16  # its default num_sm for the `pipeline` method, kept clear of the GEMM (set_sm_margin)


def with_comm_sms(device: Device, gemm: float) -> float:
    """`gemm`'s seconds on the SMs a `pipeline` reduce-scatter leaves it (all of them when the SM count is
    unknown, or too small to spare the communication's)."""
    if device.sms <= PIPELINE_COMM_SMS:
        return gemm
    return gemm * device.sms / (device.sms - PIPELINE_COMM_SMS)


def ring_exchange_time(gemm: float, comm: float, tp: int) -> float:
    """An all-gather over tp ranks as tp - 1 chunk exchanges, each beside one of the GEMM's tp chunks."""
    if tp <= 1:
        return gemm + comm
    return (tp - 1) * max(gemm / tp, comm / (tp - 1)) + gemm / tp


def pipelined_time(gemm: float, comm: float, splits: int = PIPELINE_SPLITS) -> float:
    """A GEMM in `splits` chunks, each chunk's reduce-scatter beside the next chunk's GEMM."""
    return gemm / splits + (splits - 1) * max(gemm / splits, comm / splits) + comm / splits


def _gemms(device: Device, workload: Workload, samples: int, tp: int, backward: bool, fp8: str = "") -> list[float]:
    """Seconds of the layer's four weight GEMMs (QKV, projection, MLP up, MLP down) on one TP rank: the
    forward GEMMs, or with `backward` the input-gradient GEMMs; at the FP8 peak with an `fp8` recipe. With separate
    projections (`architecture.projection_groups`) each of the four is the sum of its linear layers' GEMMs: Inductor's
    pass fuses one all-gather with every matmul taking its result (`fused_all_gather_matmul`'s list of Bs)."""
    shapes = arch.weight_gemm_shapes(workload, samples * workload.seq_len, tp)
    if backward:
        shapes = [(m, k, n) for m, n, k in shapes]
    if fp8:
        device = fp8_device(device)
    times = [gemm_time(device, m, n, k, 1, workload.bytes_per_element) for m, n, k in shapes]
    grouped, start = [], 0  # with separate projections, Q/K/V (gate/up) take one gathered input: their GEMMs' sum
    for size in arch.projection_groups(workload):
        grouped.append(sum(times[start:start + size]))
        start += size
    return grouped


def forward_exposed_time(device: Device, workload: Workload, samples: int, tp: int, topo: Topology,
                         fp8: str = "", gathers: bool = True) -> float:
    """What a layer forward's TP communication still costs after its GEMMs: the all-gathers before QKV
    and MLP up by ring exchange (whole, with `gathers` False: not overlapped), the reduce-scatters after the
    projection and MLP down pipelined."""
    nbytes = samples * workload.activation_bytes()
    gather, scatter = collective_time("all_gather", nbytes, topo), collective_time("reduce_scatter", nbytes, topo)
    qkv, proj, up, down = _gemms(device, workload, samples, tp, False, fp8)
    gathered = ring_exchange_time(qkv, gather, tp) - qkv + ring_exchange_time(up, gather, tp) - up if gathers \
        else 2 * gather
    return gathered + pipelined_time(with_comm_sms(device, proj), scatter) - proj \
        + pipelined_time(with_comm_sms(device, down), scatter) - down


def backward_gather_exposed_time(device: Device, workload: Workload, samples: int, tp: int,
                                 topo: Topology, fp8: str = "") -> float:
    """What the backward's all-gathers of the output gradient before the two row-parallel input-gradient
    GEMMs (proj_dgrad, fc2_dgrad) still cost, each by ring exchange beside its GEMM."""
    gather = collective_time("all_gather", samples * workload.activation_bytes(), topo)
    _, proj, _, down = _gemms(device, workload, samples, tp, True, fp8)
    return ring_exchange_time(proj, gather, tp) - proj + ring_exchange_time(down, gather, tp) - down



def regather_exposed_time(device: Device, workload: Workload, samples: int, tp: int, topo: Topology,
                          fp8: str = "") -> float:
    """What the two all-gathers of the norms' outputs that torchtitan's per-op recompute runs again still cost
    when Inductor's micro-pipeline TP pass fuses each with the one recomputed matmul taking the gathered tensor as
    its left operand: the K projection and w3, the column-parallel GEMMs the policy runs again
    (`workload.per_op_checkpoint.recomputed_gemm_shapes`; wq, wv and w1 are saved), each by ring exchange beside
    its GEMM."""
    gather = collective_time("all_gather", samples * workload.activation_bytes(), topo)
    if fp8:
        device = fp8_device(device)
    shapes = recomputed_gemm_shapes(workload, samples * workload.seq_len, tp, True)[:2]  # wk, w3
    gemms = [gemm_time(device, m, n, k, 1, workload.bytes_per_element) for m, n, k in shapes]
    return sum(ring_exchange_time(g, gather, tp) - g for g in gemms)

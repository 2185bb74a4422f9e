"""Tensor-parallel communication overlapped with the GEMMs it feeds or drains (Megatron-Core's
`--tp-comm-overlap`, Transformer Engine's userbuffers; torchtitan's async TP, PyTorch's symmetric-memory ops, is the
same idea: `symm_mem_gather_time`, `symm_mem_scatter_time` below).

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


def symm_mem_gather_time(device: Device, gemm: float, comm: float, tp: int, shard_bytes: float) -> float:
    """PyTorch's fused all-gather-matmul (`_pipelined_all_gather_and_consume`): the local shard copied into the
    symmetric-memory buffer first, read and written over HBM and not overlapped ("we are giving up the chance to
    overlap "mv" and "b" with the first shard_consumer"), then the GEMM in tp chunks of M/tp rows, each remote
    chunk's copy beside the previous chunk's GEMM on two streams, as a ring exchange. The chunks together take the
    whole GEMM's time `gemm`: the two streams let neighbouring chunks share the SMs ("allows for
    computation/computation overlapping, greatly reducing quantization inefficiency")."""
    return 2 * shard_bytes / device.hbm_bandwidth + ring_exchange_time(gemm, comm, tp)


def symm_mem_scatter_time(device: Device, gemm: float, comm: float, tp: int, out_bytes: float) -> float:
    """PyTorch's fused matmul-reduce-scatter (`_pipelined_produce_and_all2all`, then the reduction): the GEMM in tp
    chunks of M/tp rows, one for each destination rank, each chunk's copy to its rank beside the next chunk's GEMM
    (on two streams; the own chunk last, beside the last copy), no SMs kept clear; then the tp partial outputs each
    rank received, M/tp x N each, summed by a kernel of their own: `out_bytes` (the whole M x N partial output)
    read and its 1/tp written over HBM, after the last copy."""
    return ring_exchange_time(gemm, comm, tp) + (1 + 1 / tp) * out_bytes / device.hbm_bandwidth


def _gather_time(device: Device, overlap: str, gemm: float, comm: float, tp: int, nbytes: float) -> float:
    """An all-gather of `nbytes` (the gathered tensor) fused with `gemm`: Transformer Engine's ring exchange, or
    (`overlap` "micro_pipeline") PyTorch's symmetric-memory op."""
    if overlap == "micro_pipeline":
        return symm_mem_gather_time(device, gemm, comm, tp, nbytes / tp)
    return ring_exchange_time(gemm, comm, tp)


def _scatter_time(device: Device, overlap: str, gemm: float, comm: float, tp: int, nbytes: float) -> float:
    """`gemm` fused with the reduce-scatter of its `nbytes` output: Transformer Engine's pipeline method on the SMs
    its communication leaves, or (`overlap` "micro_pipeline") PyTorch's symmetric-memory op."""
    if overlap == "micro_pipeline":
        return symm_mem_scatter_time(device, gemm, comm, tp, nbytes)
    return pipelined_time(with_comm_sms(device, gemm), comm)


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
                         fp8: str = "", gathers: bool = True, overlap: str = "userbuffers") -> float:
    """What a layer forward's TP communication still costs after its GEMMs: the all-gathers before QKV
    and MLP up by ring exchange (whole, with `gathers` False: not overlapped), the reduce-scatters after the
    projection and MLP down pipelined; with `overlap` "micro_pipeline" each as PyTorch's symmetric-memory op runs
    it (`symm_mem_gather_time`, `symm_mem_scatter_time`)."""
    nbytes = samples * workload.activation_bytes()
    gather, scatter = collective_time("all_gather", nbytes, topo), collective_time("reduce_scatter", nbytes, topo)
    qkv, proj, up, down = _gemms(device, workload, samples, tp, False, fp8)
    gathered = _gather_time(device, overlap, qkv, gather, tp, nbytes) - qkv \
        + _gather_time(device, overlap, up, gather, tp, nbytes) - up if gathers else 2 * gather
    return gathered + _scatter_time(device, overlap, proj, scatter, tp, nbytes) - proj \
        + _scatter_time(device, overlap, down, scatter, tp, nbytes) - down


def backward_gather_exposed_time(device: Device, workload: Workload, samples: int, tp: int,
                                 topo: Topology, fp8: str = "", overlap: str = "userbuffers") -> float:
    """What the backward's all-gathers of the output gradient before the two row-parallel input-gradient
    GEMMs (proj_dgrad, fc2_dgrad) still cost, each by ring exchange beside its GEMM (`overlap` as above)."""
    nbytes = samples * workload.activation_bytes()
    gather = collective_time("all_gather", nbytes, topo)
    _, proj, _, down = _gemms(device, workload, samples, tp, True, fp8)
    return _gather_time(device, overlap, proj, gather, tp, nbytes) - proj \
        + _gather_time(device, overlap, down, gather, tp, nbytes) - down



def regather_exposed_time(device: Device, workload: Workload, samples: int, tp: int, topo: Topology,
                          fp8: str = "") -> float:
    """What the two all-gathers of the norms' outputs that torchtitan's per-op recompute runs again still cost
    when Inductor's micro-pipeline TP pass fuses each with the one recomputed matmul taking the gathered tensor as
    its left operand: the K projection and w3, the column-parallel GEMMs the policy runs again
    (`workload.per_op_checkpoint.recomputed_gemm_shapes`; wq, wv and w1 are saved), each as PyTorch's fused
    all-gather-matmul runs it beside its GEMM (`symm_mem_gather_time`)."""
    nbytes = samples * workload.activation_bytes()
    gather = collective_time("all_gather", nbytes, topo)
    fast = fp8_device(device) if fp8 else device
    shapes = recomputed_gemm_shapes(workload, samples * workload.seq_len, tp, True)[:2]  # wk, w3
    gemms = [gemm_time(fast, m, n, k, 1, workload.bytes_per_element) for m, n, k in shapes]
    return sum(symm_mem_gather_time(device, g, gather, tp, nbytes / tp) - g for g in gemms)

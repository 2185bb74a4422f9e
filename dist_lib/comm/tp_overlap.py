"""A TP group whose layer collectives overlap the GEMMs (Megatron-Core's `--tp-comm-overlap`, torchtitan's async
TP): the group's cost table takes, for the layer's collectives, only what the GEMMs leave exposed
(`costs.tp_overlap`).

The engine charges a layer's compute and then its TP collective on the group's stream; a group's durations
are computed once per (op, bytes, layer pair) and kept in `Group.costs`, which the Python and the C paths
both read. Entering the overlapped durations there before the first collective makes every later layer
collective of that size on the group cost its exposed remainder: the forward's all-reduce pair (standing for
the two all-gathers and two reduce-scatters of a sequence-parallel layer) and the backward's all-gathers of
the output gradient before the row-parallel GEMMs; with Megatron-Core's userbuffers also the backward's all-reduce
pair (its input gradients' reduce-scatters and re-gathers, `bulk` beside the weight-gradient GEMMs), which
torchtitan's async TP leaves whole (`OVERLAPS`).
"""

from __future__ import annotations

from dist_lib.comm.groups import Group
from dist_lib.costs.context import block_workload
from dist_lib.costs.tp_overlap import backward_gather_exposed_time, forward_exposed_time, regather_exposed_time
from dist_lib.hardware.devices import Device
from dist_lib.workload.transformer import Workload

# the sequence-parallel backward all-gathers its output gradient in two calls per layer
# (`strategies/_pipeline._gather_sequence_parallel_grad`), each keyed like a layer's pair of collectives
BACKWARD_GATHER_CALLS = 2
# torchtitan's per-op recompute all-gathers the norms' outputs again, b*s*h each (`_pipeline._regather_norm_outputs`)
REGATHER_CALLS = 2

# Which of a layer's TP collectives each kind of overlap credits (the cost key's last field: 1 the forward's pair, 2
# the backward's, `collectives.collective_duration`): Megatron-Core's userbuffers overlap every one (Transformer
# Engine's `initialize_ub` methods, `costs.tp_overlap`); Inductor's micro-pipeline TP pass (torchtitan's async TP,
# `strategies/_frameworks.TP_OVERLAPS`) fuses the forward's all-gathers and reduce-scatters and the backward's
# all-gathers of the output gradient, but not the backward's reduce-scatters of the input gradients, each of a sum
# of matmuls (torch/_inductor/fx_passes/micro_pipeline_tp.py `fuse_matmul_reduce_scatter`: its input must be one
# matmul's output with no other user): its backward pair costs in full. Nor does it fuse an all-gather whose result
# a matmul does not take directly as its left operand (`_find_consumer_matmuls`): under torchao's rowwise FP8 recipe
# torchtitan gathers in bf16 with plain TP ("For rowwise recipes, we use regular TP and all-gather happens in high
# precision", torchtitan/models/llama3/parallelize.py, 2025) and casts each gathered tensor per row before its
# `_scaled_mm`, so none of its all-gathers is fused (the forward's, the output gradient's, the recompute's), only
# the forward's reduce-scatters; tensorwise FP8 casts before the gather (torchao `Float8ColwiseParallel`,
# `PrepareFloat8ModuleInput`, the output gradient by `Float8RowwiseParallel`'s `_NoopFwToFloat8BwDynamic`), whose
# float8 all-gather feeds the `_scaled_mm` and is fused like bf16's. The fused ops are timed as PyTorch's
# symmetric-memory ops run them (`costs.tp_overlap.symm_mem_gather_time`, `symm_mem_scatter_time`), Transformer
# Engine's userbuffers by its `initialize_ub` methods.
OVERLAPS = {"userbuffers": ("forward", "backward", "output gradient"),
            "micro_pipeline": ("forward", "output gradient")}
UNFUSED_GATHERS = {("micro_pipeline", "rowwise")}  # (overlap, fp8 recipe) whose all-gathers are not overlapped


def overlap_layer_collectives(group: Group, device: Device, workload: Workload, samples: int, cp: int = 1,
                              overlap: str = "userbuffers", fp8: str = "", regather: bool = False) -> None:
    """Make `group`'s layer collectives of `samples`-sample microbatches that `overlap` covers (`OVERLAPS`,
    `UNFUSED_GATHERS` with the `fp8` recipe) cost what their GEMMs leave exposed. Call before the group's first
    collective. With `regather` (torchtitan's per-op recompute) the all-gathers of TP slices are, a layer, the
    output gradient's two and the recompute's two, which share one entry: under the micro-pipeline pass each is
    fused with its own matmul (the output gradient's with wo's and w2's input-gradient GEMMs, the recompute's with
    the recomputed K projection and w3), and the entry is their mean.

    With context parallelism (`cp` > 1) a rank's layer runs s/cp tokens of each sample: its TP collectives
    and the GEMMs beside them are those of the s/cp-token workload (`costs.context.block_workload`), and the
    overlap is the same, since it concerns the linear layers only, not how the attention reaches the other
    CP ranks' keys and values. Megatron-LM sizes the userbuffers so, (seq_length x micro_batch_size) //
    context_parallel_size tokens (megatron/training/initialize.py `_initialize_tp_communicators`); torchtitan
    turns async TP on for the TP mesh alone, whatever the CP degree (torchtitan/distributed/compile.py
    `_maybe_enable_async_tp`: symmetric memory for the TP group and Inductor's `_micro_pipeline_tp` pass,
    which fuses the collectives `OVERLAPS` lists with their matmuls)."""
    if overlap not in OVERLAPS:
        raise ValueError(f"TP overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}")
    tp, topo = group.size, group.topology
    if tp <= 1 or topo is None:
        return
    if cp > 1:
        workload = block_workload(workload, cp)
    nbytes = samples * workload.activation_bytes()
    gathers = (overlap, fp8) not in UNFUSED_GATHERS
    forward = forward_exposed_time(device, workload, samples, tp, topo, fp8, gathers, overlap)
    group.costs[("all_reduce", nbytes, True)] = forward
    if "backward" in OVERLAPS[overlap]:  # else the backward's pair is priced in full when it first runs
        group.costs[("all_reduce", nbytes, 2)] = forward
    # (an all-gather of TP slices is not a layer's pair of collectives: `collectives.collective_duration` keys it
    # False, as the C path does)
    if not gathers:
        return
    exposed, calls = backward_gather_exposed_time(device, workload, samples, tp, topo, fp8, overlap), \
        BACKWARD_GATHER_CALLS
    if regather and overlap == "micro_pipeline":
        exposed, calls = exposed + regather_exposed_time(device, workload, samples, tp, topo, fp8), \
            calls + REGATHER_CALLS
    group.costs[("all_gather", nbytes, False)] = exposed / calls

"""What a compute op costs: (seconds, FLOPs) and the bytes a forward stashes, per op, layer, samples, TP
degree and compute mode, from `costs/`. The simulator (`Model`) and the planner's estimates both charge
through here, so that a plan is scored with the durations its simulation will run.
"""

from __future__ import annotations

from dist_lib.costs import compute as costs
from dist_lib.costs.fp8 import RECIPES as FP8_RECIPES
from dist_lib.hardware.devices import Device
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.workload.transformer import Workload

# What a forward's stash tells its backward about how to time it (the `recompute` field of a Stash, a
# compute event's detail, a cost-cache key): what backward re-runs first (the `selective_recompute` value of
# the forward: False nothing, True the attention core, "op" what torchtitan's per-op selective checkpointing
# did not save), whether the layer runs sequence-parallel, and whether its linear layers run in FP8 and with
# which scaling recipe (`costs.fp8`).
SELECTIVE, PER_OP, SEQUENCE_PARALLEL = "selective", "per-op", "sequence-parallel"
RECOMPUTE_OF = {False: "none", True: "selective", "op": "op"}  # a forward's selective_recompute -> its recompute


def _mode_name(selective: bool | str, sp: bool, fp8: str) -> str:
    parts = [{False: "", True: SELECTIVE, "op": PER_OP}[selective]] * bool(selective) + [SEQUENCE_PARALLEL] * sp \
        + [f"fp8 {fp8}"] * bool(fp8)
    return ", ".join(parts) or "none"


COMPUTE_MODES = {(sel, sp, fp8): _mode_name(sel, sp, fp8) for sel in (False, True, "op") for sp in (False, True)
                 for fp8 in ("", *FP8_RECIPES)}
_MODE_FLAGS = {mode: flags for flags, mode in COMPUTE_MODES.items()}
# the modes of a layer that ran sequence-parallel (its backward's output gradient must be gathered first)
SEQUENCE_PARALLEL_MODES = frozenset(mode for (_, sp, _), mode in COMPUTE_MODES.items() if sp)


def compute_mode(selective_recompute: bool | str, sequence_parallel: bool, fp8: str = "") -> str:
    return COMPUTE_MODES[selective_recompute, sequence_parallel, fp8]


def weight_pass_mode(mode: str) -> str:
    """The compute mode of a weight-gradient pass after a forward in `mode`: it re-runs nothing and splits
    nothing along the sequence, so only an FP8 recipe carries over ("none" otherwise)."""
    return mode if mode == "none" else COMPUTE_MODES[False, False, parse_mode(mode)[2]]


def parse_mode(mode: str) -> tuple[bool | str, bool, str]:
    """(selective recompute: False, True or "op"; sequence parallel; FP8 recipe or "") of a compute mode;
    ValueError for anything else."""
    try:
        return _MODE_FLAGS[mode]
    except KeyError:
        raise ValueError(f"unknown compute mode {mode!r} (known: {', '.join(_MODE_FLAGS)})") from None


def forward_stash_bytes(device: Device, workload: Workload, layer: int, n: int, tp: int, mode: str = "none") -> int:
    """Bytes a forward of `n` samples in compute mode `mode` (`COMPUTE_MODES`) keeps for backward besides
    its input."""
    profile = workload.profile
    if profile is None:
        selective, sequence_parallel, _ = parse_mode(mode)  # FP8 linear layers: stash counted in 16 bits
        return n * workload.stash_bytes(layer, tp, recompute=RECOMPUTE_OF[selective],
                                        sequence_parallel=sequence_parallel)
    # measured memory; a profile does not split out what selective recompute drops
    state = workload.layer_params(layer) / tp * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES)
    return profile.stash_bytes(device, layer, n, tp, state, n * workload.activation_bytes())


def input_pass_stash_bytes(device: Device, workload: Workload, layer: int, n: int, tp: int,
                           mode: str = "none") -> int:
    """Bytes the stash of a forward of `n` samples in compute mode `mode` keeps after the layer's
    input-gradient pass (`Model.backward_input`) until its weight-gradient pass (`costs.split_stash_bytes`).
    A measured profile gives the stash as one figure: it keeps the same share of it as the formulas do."""
    selective, sequence_parallel, _ = parse_mode(mode)
    kept = n * costs.split_stash_bytes(workload, tp, sequence_parallel=sequence_parallel)
    if workload.profile is None:
        return kept
    formula = n * workload.stash_bytes(layer, tp, recompute=RECOMPUTE_OF[selective],
                                       sequence_parallel=sequence_parallel)
    measured = forward_stash_bytes(device, workload, layer, n, tp, mode)
    return round(measured * kept / formula) if formula else measured


def compute_cost(device: Device, workload: Workload, op: str, layer: int, n: int, tp: int,
                  mode: str = "none") -> tuple[float, float]:
    """(seconds, FLOPs) of a compute op on `n` samples at TP degree `tp`, in a compute `mode`:
    a backward (or its input half) after a selective-recompute forward first re-runs the attention core
    (Korthikanti et al. 2022, sec. 5), after a per-op checkpointed one what its policy did not save
    (`workload.per_op_checkpoint`); a sequence-parallel layer splits its replicated elementwise work."""
    selective, sp, fp8 = parse_mode(mode)
    recompute = RECOMPUTE_OF[selective]
    if op == "forward":
        duration = costs.forward_time(device, workload, layer, n, tp, sequence_parallel=sp, fp8=fp8)
    elif op == "backward":
        duration = costs.backward_time(device, workload, layer, n, tp, recompute=recompute, sequence_parallel=sp,
                                       fp8=fp8)
    elif op == "backward_input":
        duration = costs.backward_input_time(device, workload, layer, n, tp, sequence_parallel=sp, fp8=fp8) \
            + costs.recompute_time(device, workload, layer, n, tp, recompute=recompute, sequence_parallel=sp, fp8=fp8)
    elif op == "backward_weight":
        duration = costs.backward_weight_time(device, workload, layer, n, tp, fp8=fp8)
    else:
        duration = costs.loss_time(device, workload, n, tp)
    flops_op = "forward" if op == "forward" else op  # a forward's mode names what its backward re-runs
    return duration, costs.compute_flops(workload, flops_op, layer, n, tp,
                                         recompute="none" if op == "forward" else recompute, sequence_parallel=sp)

"""FP8 linear layers: their GEMMs at the device's FP8 tensor-core peak, and the casts that feed them.

What runs in FP8 is what Transformer Engine (Megatron-Core's `--fp8-format hybrid`) and torchao's float8
training (torchtitan's `float8` converter) put there: the weight GEMMs of the linear layers, forward (fprop),
input gradient (dgrad) and weight gradient (wgrad), E4M3 inputs and weights, E5M2 or E4M3 gradients,
16-bit outputs, fp32 accumulation. The attention core stays in 16 bits (TE's `DotProductAttention` unless
`fp8_dpa`; torchao converts `nn.Linear` only), and so do the LM head (torchtitan's llama3 configurations filter
it out, `filter_fqns=["lm_head"]` in torchtitan/models/llama3/config_registry.py), the norms and the optimizer.

Every FP8 GEMM needs its operands cast first, a memory-bound kernel: read the 16-bit tensor, write its
FP8 copy and, since Hopper's FP8 tensor cores take only the "TN" layout, the transposed FP8 copy the
other GEMM of the pair reads (TE's fused `cast_transpose`; NVIDIA Transformer Engine docs, "Using FP8 with
Transformer Engine", and cuBLASLt's FP8 layout requirement). Per linear layer and pass:

* forward: the input (tokens x K) and the weight (K x N): read 2, write 1 + 1 bytes an element;
* backward: the output gradient (tokens x N), the same 4 bytes an element. Transformer Engine saves the FP8
  copies for the backward; torchao saves the 16-bit input and weight (`matmul_with_hp_or_float8_args`) and
  casts them again there: the weight for the input-gradient GEMM, the input for the weight-gradient GEMM.

The scales: with delayed scaling (TE's `DelayedScaling`, Megatron's default recipe) a tensor's scale comes
from the amax history of earlier steps and the cast kernel records this step's amax as it goes: no extra
pass. With dynamic tensorwise scaling (torchao's default `tensorwise` recipe, torchtitan) the amax of the
tensor is computed first, one more 2-byte read per element (torchao docs, "float8 training": "dynamic
scaling ... compute amax, then cast"). The weight is cast at every forward (torchao; TE caches it across
the microbatches of a step with `is_first_microbatch`, which this model does not credit).

Memory (`persistent_bytes`): Transformer Engine keeps, for each linear layer, its weight cast to FP8 and the
transposed FP8 copy the other GEMM reads, one byte each a parameter, between passes: the module caches them as
workspaces (`TransformerEngineBaseModule.get_weight_workspace`, `_fp8_workspaces`,
transformer_engine/pytorch/module/base.py), filled on the first microbatch of a step and reused by the others
(`is_first_microbatch`; TE user guide, "FP8 weight caching"), and kept from step to step. Beside them each FP8
tensor of a GEMM (input, weight, output gradient) carries its scaling state (TE's `FP8TensorMeta`): an fp32
scale, its inverse and an fp32 amax history of `--fp8-amax-history-len` entries (Megatron-LM's default 1,
megatron/training/arguments.py). torchao's dynamic tensorwise scaling computes its scales in each call and keeps
no FP8 tensor or history between passes (`hp_tensor_to_float8_dynamic`): nothing. The saved linear inputs are
still counted in 16 bits (TE saves them in FP8, 1 byte an element where the stash counts 2): not modelled.

Rowwise (torchao's `Float8LinearConfig.from_recipe_name("rowwise")`, torchtitan's `recipe_name = "rowwise"`;
torchao/float8/config.py and float8_linear.py `matmul_with_hp_or_float8_args`, June 2025): all three GEMMs in
FP8 (E4M3 throughout), each operand scaled per row along the GEMM's contraction axis (`ScalingGranularity.AXISWISE`,
`torch.amax(abs(x), dim)`), so no cast serves two GEMMs: forward casts the input along its rows and the weight
along K; the input-gradient GEMM the output gradient along its rows and the weight again along N; the
weight-gradient GEMM the output gradient and the input again, both along the tokens. Six casts a linear layer,
each reading the 16-bit tensor twice (amax, then scale and cast) and writing one FP8 copy: 5 bytes an element.
The layout `_scaled_mm` wants (the first operand row-major, the second column-major; `preprocess_addmm`'s
`.contiguous()` and `.t().contiguous().t()` in float8_ops.py) is taken as written by the compiled cast kernel
itself (torchtitan compiles its Float8 runs, float8.md: "`torch.compile` fuses the float8 scaling/casting
kernels"), no separate copy. The per-row amax (`aten.amax`) is not in torchtitan's per-op checkpoint save list
(which saves tensorwise's `aten.max`), so a recomputed GEMM's casts run their amax pass again. Scales go to the
GEMM's epilogue (PyTorch's CUTLASS rowwise `_scaled_mm`): M + N floats, not counted. The rowwise GEMM is timed
at the same FP8 tile efficiency as the cuBLAS tensorwise one: no measured figure for it was found.

GEMM speed: the catalog's per-SM tile efficiency (`Device.max_efficiency`, set on bf16 GEMMs) over
`Device.fp8_flops`. A cuBLASLt E4M3 8192^3 GEMM with bf16 output was measured at 1,608.6 TFLOP/s mean over
16 H100 SXM GPUs (81 % of the 1,979 dense FP8 peak; d-robotics test_gpu_scripts,
reports_cublaslt_fp8_crosscheck_20260524.md), the same share of peak as the bf16 GEMMs the H100 efficiency
was set on (794.5 of 989 TFLOP/s, 80 %).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from dist_lib.hardware.devices import Device
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload

# TE's delayed scaling; torchao's dynamic tensorwise and rowwise (per-row, `ScalingGranularity.AXISWISE`) scaling
RECIPES = ("delayed", "tensorwise", "rowwise")
# bytes of HBM traffic per element cast: read 16 bits, write the FP8 copy and its transpose
CAST_BYTES = 2 + 1 + 1
# what dynamic scaling adds: the amax pass reads the 16-bit tensor once more
AMAX_BYTES = {"delayed": 0, "tensorwise": 2, "rowwise": 2}
# a rowwise cast: the amax pass reads 16 bits, the cast reads them again and writes one FP8 copy (no transpose)
ROWWISE_CAST_BYTES = 2 + 2 + 1
# Recipes whose TP layout casts a module's input once for all its linear layers: torchtitan's tensorwise TP
# (`Float8ColwiseParallel` with `PrepareFloat8ModuleInput` on `attention` and `feed_forward`,
# torchtitan/models/llama3/parallelize_llama.py at 820504e) casts the attention's and the MLP's input to float8 before
# the all-gather, and Q, K, V (gate and up) take that one float8 tensor. Elsewhere each `Float8Linear` casts its
# input in its own forward (torchao/float8/float8_linear.py `matmul_with_hp_or_float8_args`): with separate
# projections (`architecture.PROJECTION_KINDS`) the input of Q, K and V is cast three times, as torchtitan's rowwise
# runs with plain TP do (pytorch/torchtitan#1207: wk and wv, N = 128 a rank at TP 8, made the 70B rowwise step no
# faster than bf16, and leaving them in bf16 gave about 10 %, pytorch/torchtitan#1319). Delayed scaling is
# Transformer Engine's, whose modules are fused.
SHARED_INPUT_CAST = ("tensorwise",)
# Transformer Engine's cached FP8 weight and its transpose: bytes a parameter of the linear layers
TE_WEIGHT_COPY_BYTES = 2
# the fp32 scaling state of one FP8 tensor: scale, inverse scale and Megatron-LM's default amax history of 1
TE_SCALING_BYTES = 4 * (2 + 1)


def check_recipe(device: Device, recipe: str) -> None:
    """A ValueError naming the problem: an unknown recipe, or a device without FP8 tensor cores."""
    if recipe not in RECIPES:
        raise ValueError(f"fp8 must be one of {', '.join(RECIPES)} (or None), got {recipe!r}")
    if not device.fp8_flops:
        raise ValueError(f"fp8={recipe!r}: {device.name} has no FP8 tensor cores (its catalog entry gives no FP8 "
                         f"peak); run it without fp8")


@lru_cache(maxsize=64)
def fp8_device(device: Device) -> Device:
    """`device` as its FP8 tensor cores see it: the FP8 peak, the same tile efficiency."""
    return replace(device, peak_flops=device.fp8_flops)


def cast_bytes(workload: Workload, samples: int, tp: int, pass_: str, recipe: str) -> float:
    """HBM bytes of the casts one layer pass of `samples` samples on a TP rank runs (`pass_`: forward,
    input or weight; the weight-gradient GEMM reuses the transposed copies the other two made). Each FP8 linear
    layer casts its own operands (`SHARED_INPUT_CAST` says where one cast of a module's input serves them all)."""
    per_module = not (recipe in SHARED_INPUT_CAST and tp > 1)
    return shapes_cast_bytes(arch.weight_gemm_shapes(workload, samples * workload.seq_len, tp, per_module=per_module),
                             pass_, recipe)


def shapes_cast_bytes(shapes: list[tuple[float, float, float]], pass_: str, recipe: str) -> float:
    """HBM bytes of the casts feeding the FP8 GEMMs whose forward shapes (M, N, K) are `shapes`, in one pass
    (as `cast_bytes`; an MoE layer's attention and expert GEMMs give theirs, `costs.moe_ops`)."""
    if recipe == "rowwise":  # each GEMM casts both its operands along its own contraction axis
        operands = {"forward": lambda m, n, k: m * k + k * n, "input": lambda m, n, k: m * n + k * n,
                    "weight": lambda m, n, k: m * n + m * k}[pass_]
        return ROWWISE_CAST_BYTES * sum(operands(m, n, k) for m, n, k in shapes)
    per_element = CAST_BYTES + AMAX_BYTES[recipe]
    again = recipe == "tensorwise"  # torchao casts the saved 16-bit input and weight again in backward
    if pass_ == "forward":
        return per_element * sum(m * k + k * n for m, n, k in shapes)
    if pass_ == "input":
        return per_element * sum(m * n + (k * n if again else 0) for m, n, k in shapes)
    return per_element * sum(m * k for m, n, k in shapes) if again else 0.0


def recompute_cast_bytes(shapes: list[tuple[float, float, float]], recipe: str) -> float:
    """HBM bytes of the casts feeding forward GEMMs of shapes (M, N, K) that per-op checkpointing runs again:
    input and weight cast again, the saved tensorwise amax (`aten.max`) sparing its pass; rowwise's per-row amax
    is not saved, so it runs again."""
    per_element = ROWWISE_CAST_BYTES if recipe == "rowwise" else CAST_BYTES
    return per_element * sum(m * k + k * n for m, n, k in shapes)


def persistent_bytes(workload: Workload, tp: int, recipe: str) -> int:
    """Bytes a TP rank keeps for one layer's FP8 linear layers from its first FP8 forward on: with delayed
    scaling (Transformer Engine) the FP8 weight and its transpose, and the scaling state of each GEMM's three
    FP8 tensors; with tensorwise scaling (torchao) nothing."""
    if recipe != "delayed":
        return 0
    shapes = arch.weight_gemm_shapes(workload, 0, tp)  # (M, N, K): the weight is K x N
    return round(TE_WEIGHT_COPY_BYTES * sum(k * n for _, n, k in shapes)) + 3 * len(shapes) * TE_SCALING_BYTES

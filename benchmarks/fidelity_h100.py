"""A held-out H100 set: Megatron-Core r0.8.0's weak-scaling table, predicted through `simulate()` and
`strategies/hybrid.py` with nothing fitted to it.

Source: NVIDIA/Megatron-LM README, "Performance Benchmarking", images/model_table.png (commit f2e5db4,
2024-07-15; legend "Megatron-Core r0.8.0"): GPT models of 2B to 462B parameters on H100 GPUs, vocabulary 131072,
sequence 4096, DP 48 in every row, --overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap; achieved
TFLOP/s per GPU end to end. The iteration time is the step's model FLOPs (Megatron's
`num_floating_point_operations`, which `Workload.model_flops_per_sample` equals) over that rate and the GPUs.

Every setting the table does not state was chosen before the first run, and is recorded here:
* the model: Megatron's GPT defaults (learned positions, LayerNorm, a 4h GeLU MLP, biases, dropout, tied
  embeddings), head size h / heads = 128 in every row;
* attention: `flash3`, standing for Transformer Engine's cuDNN fused attention (on the flash-attention
  repository's H100 plot cuDNN's causal forward at head size 128 is within 11 % of FlashAttention-3's from 2k
  tokens on, and far above FlashAttention-2's);
* microbatch 1; no recompute; sequence parallelism wherever TP > 1 (Megatron requires it for --tp-comm-overlap);
  the gradient all-reduce overlapped with the backward; --tp-comm-overlap as `hybrid`'s `tp_comm_overlap` wherever
  TP > 1 (the table's legend states it for every row; at TP 1 there is no TP collective to overlap); plain 1F1B
  (no interleaving stated);
  fp32 gradients (Megatron accumulates and reduces bf16 runs' gradients in fp32);
* DGX H100 nodes: 8 GPUs on NVLink4 and one 400 Gb/s NIC per GPU (the catalog's H100-80GB).
* the distributed optimizer with the parameter all-gather overlapped with the forward (`hybrid`'s
  `distributed_optimizer=True, overlap_param_gather=True`: gradients reduce-scattered, each rank steps 1/48 of
  the optimizer state, and the updated shards are all-gathered layer by layer ahead of each forward).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from dist_lib import Workload, simulate

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")


@dataclass(frozen=True)
class WeakScalingRun:
    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops_per_gpu: float

    @property
    def workload(self) -> Workload:
        return Workload(f"mcore-{self.name}", self.layers, self.hidden, self.heads, 4096, 131072,
                        grad_bytes_per_element=4, attention="flash3")

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def measured_s(self) -> float:
        return self.global_batch * self.workload.model_flops_per_sample() / (self.gpus * self.tflops_per_gpu * 1e12)


MEGATRON_CORE_R080 = [
    WeakScalingRun("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    WeakScalingRun("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    WeakScalingRun("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    WeakScalingRun("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    WeakScalingRun("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    WeakScalingRun("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    WeakScalingRun("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    WeakScalingRun("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    WeakScalingRun("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]


def plan(run: WeakScalingRun) -> dict:
    return dict(dp=run.dp, pp=run.pp, tp=run.tp, microbatch_size=1, schedule="1f1b", recompute=False,
                selective_recompute=False, sequence_parallel=run.tp > 1, overlap_grad_reduce=True,
                async_tp_allreduce=True, distributed_optimizer=True, overlap_param_gather=True,
                tp_comm_overlap=run.tp > 1)


def predict(run: WeakScalingRun):
    return simulate(HYBRID, f"{run.gpus // 8}x8xH100-80GB", run.workload, run.global_batch, check=False,
                    enforce_memory=False, **plan(run))


def print_megatron_core(max_ranks: int, rows: set[str] | None = None) -> list[float]:
    print("Megatron-Core r0.8.0 weak scaling (NVIDIA/Megatron-LM README), H100, seq 4096, DP 48; simulate(hybrid)")
    print(f"{'model':>5} {'GPUs':>5} {'TP':>3} {'PP':>3} {'TFLOP/s':>8} {'measured':>9} {'simulated':>9} {'error':>7} "
          f"{'sim TFLOP/s':>11} {'busy':>5} {'wall':>6}")
    errors = []
    for run in MEGATRON_CORE_R080:
        if rows and run.name not in rows:
            continue
        head = f"{run.name:>5} {run.gpus:>5} {run.tp:>3} {run.pp:>3} {run.tflops_per_gpu:>8.1f} {run.measured_s:>9.2f}"
        if run.gpus > max_ranks:
            print(f"{head} {'skipped':>9}   ({run.gpus} ranks > --max-ranks {max_ranks})", flush=True)
            continue
        started = time.perf_counter()
        result = predict(run)
        error = result.time_s / run.measured_s - 1
        errors.append(error)
        simulated_tflops = run.tflops_per_gpu * run.measured_s / result.time_s
        print(f"{head} {result.time_s:>9.2f} {100 * error:>+6.1f}% {simulated_tflops:>11.1f} "
              f"{max(result.compute_busy()):>5.2f} "
              f"{time.perf_counter() - started:>5.0f}s", flush=True)
    if errors:
        mean = 100 * sum(map(abs, errors)) / len(errors)
        print(f"mean |error| {mean:.1f} %, max |error| {100 * max(map(abs, errors)):.1f} % over {len(errors)} rows")
    return errors

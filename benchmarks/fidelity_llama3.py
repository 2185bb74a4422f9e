"""A held-out H100 set at frontier scale: Llama 3 405B's pre-training layouts, predicted through `simulate()` and
`strategies/hybrid.py` with nothing fitted to them.

Source: Llama Team, AI @ Meta, "The Llama 3 Herd of Models" (arXiv 2407.21783, 2024), Table 4 ("Scaling
configurations and MFU for each stage of Llama 3 405B pre-training"): 8,192 and 16,384 H100s, TP 8, PP 16, CP 1 or
16, 16M tokens a batch, achieved BF16 TFLOP/s per GPU (430, 400, 380). The step time a row implies is the batch's
model FLOPs (`Workload.model_flops_per_sample`) over that rate and the GPUs.

Stated in the paper (sec. 3.3) and used as stated:
* the model: the `llama-3-405b` preset (126 layers, hidden 16384, 128 heads, 8 key/value heads, FFN 53248,
  vocabulary 128,256); sequence 8,192 (131,072 for the CP row); batch 16M tokens: 32 sequences a data-parallel
  group at 8,192 GPUs, 16 at 16,384;
* context parallelism (the CP row) by all-gather: each CP rank all-gathers the keys and values and computes the
  attention of its own query chunk (`kv_exchange="all_gather"`), over 2 cp load-balanced chunks of the sequence;
* the hardware: H100 SXM 80 GB at 700 W, 8 a server on NVLink, 400 Gb/s per GPU between servers (RoCE): the
  catalog's `H100-80GB`;
* data parallelism as FSDP, sharding weights, gradients and optimizer state, without resharding after the forward
  (`fsdp=True, reshard_after_forward=False`); gradients accumulated and reduce-scattered in FP32
  (`grad_bytes_per_element=4`);
* one layer fewer on the first and the last pipeline stage (the embedding and the head are there), and an
  interleaved schedule.
Not stated, and chosen before the first run:
* the interleaved schedule's virtual stages: 2 a rank (`chunks=2`), the split 3 + 30 x 4 + 3 layers;
* microbatches of one sequence; sequence parallelism with TP; the attention kernel of the preset
  (FlashAttention-2); no TP communication overlap; no activation recompute, with memory reported and not
  enforced (the paper does not say how the activations fit; the simulated peak is printed as a check).
  (The context-parallel row was first set up with `hybrid`'s ring exchange, against the paper's all-gather; it
  had not finished a run, and was set to the paper's method before it did.)
Every row folds its replicas to one (with context parallelism a replica's stage is its cp x tp ranks, on whole
nodes of its own): the CP row runs 2,048 ranks, its 8 replicas' one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from dist_lib import simulate
from dist_lib.workload.transformer import Workload

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
TOKENS_PER_BATCH = 16 * 2**20  # "16M" (Table 4): 2,048 sequences of 8,192 tokens


@dataclass(frozen=True)
class Llama3Run:
    gpus: int
    cp: int
    seq: int
    tflops_per_gpu: float
    tp: int = 8
    pp: int = 16

    @property
    def name(self) -> str:
        return f"{self.gpus} GPUs cp{self.cp}"  # (no comma: --rows splits at commas)

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def sequences(self) -> int:
        return TOKENS_PER_BATCH // self.seq

    @property
    def workload(self) -> Workload:
        return replace(Workload.load(f"llama-3-405b:seq={self.seq}"), grad_bytes_per_element=4)

    @property
    def measured_s(self) -> float:
        return self.sequences * self.workload.model_flops_per_sample() / (self.gpus * self.tflops_per_gpu * 1e12)

    def options(self) -> dict:
        options = dict(tp=self.tp, pp=self.pp, dp=self.dp, microbatch_size=1, schedule="interleaved", chunks=2,
                       partition=[3] + [4] * 30 + [3], sequence_parallel=True, fsdp=True,
                       reshard_after_forward=False, enforce_memory=False)
        if self.cp > 1:
            options.update(cp=self.cp, kv_exchange="all_gather")
        return options


LLAMA3_TABLE4 = [Llama3Run(8192, 1, 8192, 430.0), Llama3Run(16384, 1, 8192, 400.0),
                 Llama3Run(16384, 16, 131072, 380.0)]


def print_llama3(max_ranks: int = 10**6, rows: set | None = None) -> dict:
    """Simulate each row of Table 4 whose one replica has at most `max_ranks` ranks (each row folds to one
    replica) and print measured against simulated; returns the errors."""
    print("Llama 3 405B pre-training (Llama Team 2024, Table 4), H100, TP 8 x PP 16; simulate(hybrid)")
    print(f"{'row':<18} {'DP':>4} {'CP':>3}  TFLOP/s  measured simulated   error sim TFLOP/s  GiB   wall")
    errors = []
    for run in LLAMA3_TABLE4:
        if rows and run.name not in rows:
            continue
        head = f"{run.name:<18} {run.dp:>4} {run.cp:>3} {run.tflops_per_gpu:>8.0f} {run.measured_s:>9.2f}"
        ran = run.gpus // run.dp  # (one replica's ranks: every row folds)
        if ran > max_ranks:
            print(f"{head}   skipped   ({ran} ranks of one replica > --max-ranks {max_ranks})")
            continue
        started = time.perf_counter()
        result = simulate(HYBRID, f"{run.gpus // 8}x8xH100-80GB", run.workload, run.sequences, **run.options())
        wall = time.perf_counter() - started
        error = (result.time_s - run.measured_s) / run.measured_s
        errors.append(error)
        rate = run.sequences * run.workload.model_flops_per_sample() / (result.time_s * run.gpus) / 1e12
        print(f"{head} {result.time_s:>9.2f} {error:>+7.1%} {rate:>11.1f} {max(result.memory_bytes) / 2**30:>5.1f} "
              f"{wall:>5.0f}s")
    if errors:
        print(f"mean |error| {sum(map(abs, errors)) / len(errors):.1%}, max |error| {max(map(abs, errors)):.1%} "
              f"over {len(errors)} rows")
    return {"errors": errors}


if __name__ == "__main__":
    print_llama3()

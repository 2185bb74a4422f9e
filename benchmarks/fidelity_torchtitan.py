"""A held-out H100 set: torchtitan's published Llama 3.1 throughput, predicted through `simulate()` and
`strategies/hybrid.py` (`framework="torchtitan"`) with nothing fitted to it.

Sources (tokens/s per GPU, torchtitan's own count: the tokens of a step over its time and the GPUs):
* pytorch/torchtitan `benchmarks/llama3_h100_202412_torchtitan.md` (torchtitan 9dec370, 2024-12-26; torch 1963fc8,
  torchao eab345c), Tables 1-6, read at iteration 90;
* `benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md` (torchtitan 820504e, 2025-06-13), vanilla and async TP;
* `docs/performance.md` as of August 2024, 405B on 128 H100 with FSDP 16 x TP 8.
All on Meta's Grand Teton hosts: 8 H100 per host on NVLink, RDMA 400 Gb/s per GPU, and H100s with 96 GB of HBM2e
at 2.4 TB/s and a 500 W power limit (not the stock 700 W SXM5). One more row, from the same folder, ran elsewhere:
* `benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md` (torchtitan e7c0cae, June 2025): 8B on 4 and 8 hosts of
  8 H200 (the catalog's `H200-141GB`, its data sheet's 700 W), compile + Float8, local batch 2, the 8B train
  config's per-op selective checkpointing; the 4-host row (10,938 tokens/s per GPU) is taken. It is T3's run on a
  700 W part with twice the HBM bandwidth, which sets the power limit apart from the rest of the gap. Its Float8
  FSDP all-gather (`enable_fsdp_float8_all_gather`) is charged in bf16, as `hybrid`'s FSDP gathers;

Every setting the sources do not state was chosen before the first run, and is recorded here:
* the device: the catalog's `H100-HBM2e-96GB` (the benchmark file's HBM figures; the SXM's data-sheet peaks, SMs
  and GEMM efficiency, torchtitan itself taking 989 TFLOP/s for its MFU). The first runs of this set left the
  500 W power limit out; it is now a fact of the device: the tensor clock the limit leaves, 0.896 of the SXM5's,
  interpolated between the SXM5's (700 W) and the NVL's (400 W) data-sheet peaks (`devices.hopper_clock_share`),
  scales the GEMM and attention kernels. The benchmark file says the true peak lies "between SXM and NVL"; the
  `NVL peak` column runs each row again on the same device at the H100 NVL's data-sheet peaks (835.5 / 1670.5
  TFLOP/s dense BF16 / FP8: the data sheet's 1,671 / 3,341 with sparsity, halved) at that full clock, the low end
  of that stated range, everything else unchanged;
* the model presets `llama-3-8b/70b/405b` (Llama 3.1 has the same shapes) built as torchtitan builds them, Q, K, V,
  gate and up each an `nn.Linear` (`projections=separate`, torchtitan/models/llama3/model.py at 820504e: each its own
  GEMM and, under Float8, its own casts; the set ran with the fused layers of Megatron-LM until this was read from
  the model code, not set from a result), sequence 8192 (the train configs'
  `seq_len`; the June 2025 study does not state it), FlashAttention-2 for `F.scaled_dot_product_attention`
  (the preset's kernel; which backend PyTorch picked is not stated);
* `torch.compile`: the simulator's per-kernel traffic is that of fused norm, activation and residual kernels
  (one read and one write per tensor, `Workload.elementwise_bytes`), what Inductor's fusion gives; the eager rows
  (no compile: Tables 1 and 3's plain rows, and August 2024's bf16 row, taken as eager since its table lists no
  optimization, although that month's 405B train config sets `compile = true`) run eager PyTorch's unfused kernels
  one by one, the workload's `kernels=eager` (`dist_lib/workload/eager_kernels.py`: the ops of torchtitan's Llama
  block and their autograd formulas, counted before the first run of these rows). Eager PyTorch's host time
  (Python and autograd issuing dozens of kernels a layer pass) is not charged: the eager rows' microbatches are
  16,384 tokens, whose layer kernels take milliseconds, behind which asynchronous launches hide the host's work;
* the batch: torchtitan (at these commits) has no gradient accumulation, so without pipelining the local batch is
  one microbatch; with pipelining the microbatches are the number of stages (`pipeline_parallel_microbatches`
  default), each local_batch / pp samples;
* FSDP2 per block with torchtitan's reshard policy (after forward unless pipelining), gradients reduced as each
  block's backward ends, sequence parallelism with TP: `framework="torchtitan"`'s defaults
  (strategies/_frameworks.py); bf16 parameters and fp32 gradient reduction (torchtitan's default
  `mixed_precision_reduce = "float32"`), which the framework record leaves to the workload: `grad_bytes_per_element=4`
  (the first run of this set left it at 2; corrected to what this docstring stated from the start);
* Float8: torchao's dynamic tensorwise recipe (`fp8="tensorwise"`, its default); the June 2025 rowwise rows
  (`--float8.recipe_name rowwise`) as `fp8="rowwise"` (`dist_lib/costs/fp8.py`: all three GEMMs in FP8, each operand
  cast per row for each GEMM, the rowwise GEMM timed as the tensorwise one); async TP as `tp_comm_overlap=True`,
  which under `framework="torchtitan"` overlaps what Inductor's micro-pipeline TP pass fuses
  (`comm.tp_overlap.OVERLAPS`: not the backward's input-gradient reduce-scatters; with rowwise Float8 no
  all-gather); the backward's TP reductions after the backward GEMMs (the framework's `async_tp_allreduce=False`);
* full activation checkpointing as `recompute=True`; torchtitan's per-op selective checkpointing as
  `recompute="op"` (dist_lib/workload/per_op_checkpoint.py: the policy's `_save_list` and its every-other-`aten.mm`
  count, read in torchtitan 9dec370's parallelize_llama.py and 820504e's llama3/parallelize.py). Chosen before the
  first run of these rows (the first run of T1/T3 "+compile", "+compile+fp8" and J25 8B): the compiled policy,
  keeping only the saved outputs the backward reads (December 2024's list also saves `aten.abs`, dropped in
  February 2025; compiled, the saved amax is taken to leave the abs output unread, so both commits keep the same
  tensors);
  SDPA's flash backend saving its output and log-sum-exp; with TP the recompute's two all-gathers of the norms'
  outputs charged again, under async TP each beside the recomputed matmul Inductor's pass fuses it with (wk, w3;
  none with rowwise Float8: `comm.tp_overlap`; they had taken the output gradient's overlapped entry, whose
  all-gathers share their key);
* pipelining: the split torchtitan generates when no split points are given (`torchtitan_split`), with one stage
  per rank for 1F1B and two for Interleaved 1F1B, embedding on the first stage and the head on the last;
* context parallelism as `cp` with `kv_exchange="torch_all_gather"`: PyTorch's context-parallel SDPA with the
  causal load balancing of 2 cp chunks, its keys and values all-gathered (torchtitan's default
  `--experimental.context_parallel_rotate_method allgather`, torchtitan/config_manager.py, late 2024), its loop of
  cp kernel calls with fp32 merges and, in backward, fp32 dK, dV passed around the ring (`costs.torch_context`;
  the first runs of these rows used Llama 3's `kv_exchange="all_gather"`, which has neither); FSDP sharded
  over dp x cp as torchtitan's `dp_shard_cp` mesh does; with async TP (Table 6) each CP rank's TP collectives
  overlap its s/cp tokens' GEMMs (`comm.tp_overlap`).
The simulated figure is the step of `simulate` (no memory enforcement: the memory column is printed beside the
measured one as a check, not scored); `busy` is the busiest rank's compute time in the simulated step (s), the
rest of the step being communication that compute did not hide and pipeline bubbles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from dataclasses import replace

from dist_lib import Cluster, Result, simulate
from dist_lib.hardware.cluster import Node
from dist_lib.hardware.devices import DEVICES
from dist_lib.workload.transformer import PRESETS

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
DEVICE = "H100-HBM2e-96GB"
NVL_PEAKS = (835.5e12, 1670.5e12)  # NVIDIA H100 NVL data sheet, dense BF16 and FP8 (half the sparse figures)
SEQ = 8192
DEC_2024 = "llama3_h100_202412_torchtitan.md"
JUN_2025 = "asyncTP_llama3_h100_2025-06_torchtitan.md"
AUG_2024 = "docs/performance.md (Aug 2024)"
H200_2025 = "llama3-8b_h200_202506_trainy-whitefiber.md"


@dataclass(frozen=True)
class TorchtitanRun:
    name: str
    source: str
    model: str  # preset name
    gpus: int
    fsdp: int
    tp: int
    local_batch: int  # per FSDP rank
    tokens_per_s_per_gpu: float
    mem_gib: float | None = None
    pp: int = 1
    cp: int = 1
    seq: int = SEQ
    ac: str = "full"  # "full" or "op" (per-op selective)
    compile: bool = True
    fp8: str | None = None  # None, "tensorwise" or "rowwise"
    async_tp: bool = False
    schedule: str = "1f1b"
    device: str = DEVICE  # the catalog's device; every row but the H200 one ran on Grand Teton

    @property
    def tokens_per_step(self) -> int:
        return self.fsdp * self.local_batch * self.seq  # the CP ranks of a replica share its sequences

    @property
    def measured_s(self) -> float:
        return self.tokens_per_step / (self.tokens_per_s_per_gpu * self.gpus)


TORCHTITAN = [
    # Table 1: 8B on 8 GPUs, FSDP 8, local batch 2, per-op selective AC
    TorchtitanRun("T1 8B FSDP", DEC_2024, "llama-3-8b", 8, 8, 1, 2, 5762, 82.4, ac="op", compile=False),
    TorchtitanRun("T1 8B +compile", DEC_2024, "llama-3-8b", 8, 8, 1, 2, 6667, 77.0, ac="op"),
    TorchtitanRun("T1 8B +compile+fp8", DEC_2024, "llama-3-8b", 8, 8, 1, 2, 8532, 76.8, ac="op", fp8="tensorwise"),
    # Table 2: 8B on 8 GPUs, FSDP x CP, local batch 1, full AC, compile + Float8
    *(TorchtitanRun(f"T2 8B cp{cp}", DEC_2024, "llama-3-8b", 8, 8 // cp, 1, 1, tps, mem, cp=cp, seq=SEQ * 4 * cp,
                    fp8="tensorwise")
      for cp, tps, mem in ((1, 3890, 83.9), (2, 2540, 84.2), (4, 1071, 84.0), (8, 548, 84.5))),
    # Table 3: 8B on 128 GPUs, FSDP 128, local batch 2, per-op selective AC
    TorchtitanRun("T3 8B FSDP", DEC_2024, "llama-3-8b", 128, 128, 1, 2, 5605, 67.0, ac="op", compile=False),
    TorchtitanRun("T3 8B +compile", DEC_2024, "llama-3-8b", 128, 128, 1, 2, 6514, 62.0, ac="op"),
    TorchtitanRun("T3 8B +compile+fp8", DEC_2024, "llama-3-8b", 128, 128, 1, 2, 8380, 61.8, ac="op",
                  fp8="tensorwise"),
    # Table 4: 70B on 256 GPUs, FSDP 32 x TP 8, local batch 16, full AC, compile + Float8
    TorchtitanRun("T4 70B 2D", DEC_2024, "llama-3-70b", 256, 32, 8, 16, 829, 71.9, fp8="tensorwise"),
    TorchtitanRun("T4 70B 2D+asyncTP", DEC_2024, "llama-3-70b", 256, 32, 8, 16, 876, 67.6, fp8="tensorwise",
                  async_tp=True),
    # Table 5: 405B on 512 GPUs, FSDP 8 x TP 8 x PP 8, local batch 32, full AC, compile + Float8 + async TP
    TorchtitanRun("T5 405B 1F1B", DEC_2024, "llama-3-405b", 512, 8, 8, 32, 100, 82.5, pp=8, fp8="tensorwise",
                  async_tp=True),
    TorchtitanRun("T5 405B interleaved", DEC_2024, "llama-3-405b", 512, 8, 8, 32, 128, 72.7, pp=8, fp8="tensorwise",
                  async_tp=True, schedule="interleaved"),
    # Table 6: 405B on 512 GPUs, FSDP x CP x TP 8 x PP 8, local batch 8, full AC, 1F1B
    *(TorchtitanRun(f"T6 405B cp{cp}", DEC_2024, "llama-3-405b", 512, 8 // cp, 8, 8, tps, mem, pp=8, cp=cp,
                    seq=SEQ * 4 * cp, fp8="tensorwise", async_tp=True)
      for cp, tps, mem in ((1, 76, 75.3), (2, 47, 75.9), (4, 31, 77.1), (8, 16, 84.9))),
    # June 2025 async TP study: 70B on 256 GPUs (FSDP 32 x TP 8, local 16, full AC) and 8B on 64 (FSDP 8 x TP 8,
    # local 12, per-op SAC), compile, vanilla and async TP
    *(TorchtitanRun(f"J25 70B {q or 'bf16'}{' asyncTP' if a else ''}", JUN_2025, "llama-3-70b", 256, 32, 8, 16, tps,
                    fp8=q, async_tp=a)
      for q, a, tps in ((None, False, 597.3), (None, True, 652.4), ("tensorwise", False, 809.8),
                        ("tensorwise", True, 942.4), ("rowwise", False, 599.6), ("rowwise", True, 624.8))),
    *(TorchtitanRun(f"J25 8B {q or 'bf16'}{' asyncTP' if a else ''}", JUN_2025, "llama-3-8b", 64, 8, 8, 12, tps,
                    ac="op", fp8=q, async_tp=a)
      for q, a, tps in ((None, False, 4378), (None, True, 4809.4), ("tensorwise", False, 5078.1),
                        ("tensorwise", True, 5570.1), ("rowwise", False, 3708.5), ("rowwise", True, 3914.9))),
    # August 2024 performance page: 405B on 128 GPUs, FSDP 16 x TP 8, local batch 2, full AC. Compile is not
    # stated: the plain row is taken as eager; Float8 rows as compiled (async TP is an Inductor pass).
    TorchtitanRun("A24 405B bf16", AUG_2024, "llama-3-405b", 128, 16, 8, 2, 109, compile=False),
    TorchtitanRun("A24 405B fp8", AUG_2024, "llama-3-405b", 128, 16, 8, 2, 177, fp8="tensorwise"),
    TorchtitanRun("A24 405B fp8+asyncTP", AUG_2024, "llama-3-405b", 128, 16, 8, 2, 185, fp8="tensorwise",
                  async_tp=True),
    # Trainy on WhiteFiber, June 2025: 8B on 32 H200 (4 hosts), FSDP 32, local batch 2, per-op SAC, compile + Float8
    TorchtitanRun("W25 8B H200 fp8", H200_2025, "llama-3-8b", 32, 32, 1, 2, 10938, 47.96, ac="op", fp8="tensorwise",
                  device="H200-141GB"),
]


def torchtitan_split(layers: int, stages: int) -> list[int]:
    """Layers per pipeline stage as torchtitan splits them without `pipeline_parallel_split_points`
    (torchtitan/parallelisms/pipelining_utils.py `generate_split_points`, late 2024): every stage
    layers // stages, the remainder one each to the middle stages from the second on; the last takes the rest."""
    base, extra = divmod(layers, stages)
    sizes = [base] + [base + 1 if i < extra else base for i in range(stages - 2)]
    return sizes + [layers - sum(sizes)]


def plan(run: TorchtitanRun) -> dict:
    """hybrid's options for a torchtitan run (see the module docstring for every unstated choice)."""
    options = dict(framework="torchtitan", dp=run.fsdp, pp=run.pp, tp=run.tp, microbatch_size=run.local_batch,
                   schedule=run.schedule, recompute="op" if run.ac == "op" else run.ac == "full", fp8=run.fp8, tp_comm_overlap=run.async_tp)
    if run.cp > 1:  # FSDP shards over dp x cp (torchtitan's dp_shard_cp mesh), as hybrid's fsdp does with cp
        options.update(cp=run.cp, kv_exchange="torch_all_gather")
    if run.pp > 1:  # microbatches = stages (`pipeline_parallel_microbatches` default); 2 stages a rank if looped
        chunks = 2 if run.schedule == "interleaved" else 1
        options.update(microbatch_size=run.local_batch // run.pp, chunks=chunks,
                       partition=torchtitan_split(PRESETS[run.model].num_layers, run.pp * chunks))
    return options


def workload(run: TorchtitanRun) -> str:
    """The preset at the run's sequence, its gradients reduced in fp32 (torchtitan's `mixed_precision_reduce`);
    without torch.compile, eager PyTorch's unfused kernels (`kernels=eager`, `workload/eager_kernels.py`)."""
    return f"{run.model}:seq={run.seq},grad_bytes_per_element=4,projections=separate" + \
        ("" if run.compile else ",kernels=eager")


def cluster(run: TorchtitanRun, nvl_peak: bool = False) -> Cluster | str:
    """Grand Teton hosts of 8; with `nvl_peak` the same device at the H100 NVL's peaks (the stated range's low end)."""
    if not nvl_peak:
        return f"{run.gpus // 8}x8x{run.device}"
    device = replace(DEVICES[DEVICE], peak_flops=NVL_PEAKS[0], fp8_flops=NVL_PEAKS[1], sustained_clock=1.0)
    return Cluster(tuple(Node(device, 8, device.intra_link, device.inter_link) for _ in range(run.gpus // 8)))


def predict(run: TorchtitanRun, nvl_peak: bool = False) -> Result:
    return simulate(HYBRID, cluster(run, nvl_peak), workload(run), run.fsdp * run.local_batch, check=False,
                    enforce_memory=False, **plan(run))


def print_torchtitan(max_ranks: int, rows: set[str] | None = None) -> list[float]:
    print(f"torchtitan's published Llama 3.1 runs on Grand Teton H100 ({DEVICE}; W25 on H200-141GB); "
          f"simulate(hybrid, framework='torchtitan')")
    print(f"{'row':<24} {'GPUs':>4} {'FSDP':>4} {'TP':>2} {'PP':>2} {'TPS/GPU':>8} {'measured':>9} {'simulated':>9} "
          f"{'error':>7} {'sim TPS':>8} {'busy':>5} {'GiB':>5} {'sim GiB':>7} {'NVL peak':>8} {'wall':>6}")
    errors, nvl_errors, simulated_tps = [], [], {}
    for run in TORCHTITAN:
        if rows and run.name not in rows:
            continue
        head = (f"{run.name:<24} {run.gpus:>4} {run.fsdp:>4} {run.tp:>2} {run.pp:>2} {run.tokens_per_s_per_gpu:>8.1f} "
                f"{run.measured_s:>9.2f}")
        if run.gpus > max_ranks:
            print(f"{head} {'skipped':>9}   ({run.gpus} ranks > --max-ranks {max_ranks})", flush=True)
            continue
        started = time.perf_counter()
        result = predict(run)
        error = result.time_s / run.measured_s - 1
        errors.append(error)
        nvl = f"{'-':>8}"  # the NVL's peaks stand in for Grand Teton's part only
        if run.device == DEVICE:
            nvl_errors.append(predict(run, nvl_peak=True).time_s / run.measured_s - 1)
            nvl = f"{100 * nvl_errors[-1]:>+7.1f}%"
        mem = f"{run.mem_gib:>5.1f}" if run.mem_gib else f"{'-':>5}"
        simulated_tps[run.name] = run.tokens_per_step / (result.time_s * run.gpus)
        print(f"{head} {result.time_s:>9.2f} {100 * error:>+6.1f}% "
              f"{run.tokens_per_step / (result.time_s * run.gpus):>8.1f} {max(result.compute_busy()):>5.2f} {mem} "
              f"{result.peak_memory_bytes / 2**30:>7.1f} {nvl} "
              f"{time.perf_counter() - started:>5.0f}s", flush=True)
    for label, errs in (("", errors), (" at the NVL peak", nvl_errors)):
        if errs:
            mean = 100 * sum(map(abs, errs)) / len(errs)
            print(f"mean |error|{label} {mean:.1f} %, max |error| {100 * max(map(abs, errs)):.1f} % over {len(errs)} "
                  f"rows")
    print_async_tp_gains(simulated_tps)
    return errors


def _twin(run: TorchtitanRun) -> TorchtitanRun | None:
    """The run of the set that differs from `run` only by async TP (the vanilla-TP run of the same source)."""
    def same(other: TorchtitanRun) -> bool:
        return replace(other, name=run.name, tokens_per_s_per_gpu=run.tokens_per_s_per_gpu, mem_gib=run.mem_gib,
                       async_tp=run.async_tp) == run
    return next((other for other in TORCHTITAN if other.async_tp != run.async_tp and same(other)), None)


def print_async_tp_gains(simulated_tps: dict[str, float]) -> None:
    """Each async-TP row against its vanilla-TP twin: the throughput gain measured and simulated."""
    pairs = [(twin, run) for run in TORCHTITAN if run.async_tp and (twin := _twin(run)) is not None
             and {run.name, twin.name} <= simulated_tps.keys()]
    if pairs:
        print("async TP gain (tokens/s with async TP over vanilla TP): measured, simulated")
    for vanilla, run in pairs:
        print(f"  {run.name:<26} {run.tokens_per_s_per_gpu / vanilla.tokens_per_s_per_gpu:.3f} "
              f"{simulated_tps[run.name] / simulated_tps[vanilla.name]:.3f}")

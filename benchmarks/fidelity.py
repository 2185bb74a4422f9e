"""Predict published iteration times through `simulate()` and the built-in strategies; print them beside
the measurements.

    python benchmarks/fidelity.py                      # every set (the large Narayanan rows and Llama 3's
                                                       # context-parallel row take long)
    python benchmarks/fidelity.py --sets korthikanti   # or narayanan, amp, zerobubble, table4, megatron_core,
                                                       # torchtitan, llama3, moe_bridge
    python benchmarks/fidelity.py --max-ranks 600      # skip rows with more simulated ranks than this
    python benchmarks/fidelity.py --sets narayanan --rows 76B,145B   # only these rows
    python benchmarks/fidelity.py --calibrate          # every constant set from one published point

Every prediction is one `simulate("strategies/hybrid.py", cluster, workload, batch, **plan)` call, rank for
rank, with the plan the paper ran: TP, PP, DP, microbatch, interleaved chunks, full recompute or sequence
parallelism with selective recompute, gradient all-reduce after the flush or overlapped, the backward's TP
all-reduce beside the weight-gradient GEMMs or after them as the Megatron-LM version measured did, and for
AMP's plans DeepSpeed's lock-step schedule (see `published.py` for the sources). Nothing is fitted to any row:
the A100 GEMM efficiency comes from one layer of Korthikanti et al. 2022 Table 4, the V100 and T4 ones
from one published GEMM each, AMP's kernel scale and host times from one of AMP's layer profiles each
(`--calibrate`); every other figure comes from data sheets, NCCL and the frameworks' code, each cited
where it is defined (dist_lib/hardware/devices.py, dist_lib/costs/).
Qi et al. 2024's zero-bubble set runs each schedule's own built-in strategy instead (`one_f_one_b`,
`interleaved`, `zero_bubble`; see `zerobubble_plan`), pipeline parallelism alone as the paper ran it; its ZB rows
are the period of the overlapping steps the paper's runtime runs them in (`steady_period`).
For Korthikanti et al. 2022 Table 5 a bespoke composition of the same cost formulas outside the
simulator (`megatron_pipeline.compose`) is printed as a cross-check.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import megatron_pipeline  # noqa: E402
from benchmarks.fidelity_h100 import print_megatron_core  # noqa: E402
from benchmarks.fidelity_moe import print_moe_bridge  # noqa: E402
from benchmarks.fidelity_torchtitan import print_torchtitan  # noqa: E402
from benchmarks.fidelity_llama3 import print_llama3  # noqa: E402
from benchmarks.gemm_calibration import gemm_efficiencies  # noqa: E402
from benchmarks.published import (AMP_BATCH, AMP_CLUSTER, AMP_GPT2, AMP_HET_CLUSTER,  # noqa: E402
                                  AMP_LAYER_FORWARD_MS, GPT_22B, KORTHIKANTI_TABLE5, NARAYANAN_TABLE1,
                                  ZB_BUBBLE_RATES, ZB_BUBBLE_SCHEDULES, ZB_MODELS, ZB_PROFILED_MS,
                                  ZERO_BUBBLE_TABLE4, AmpPlan, MegatronRun, ZeroBubbleModel, ZeroBubbleRun)
from dist_lib import Cluster, Result, simulate
from dist_lib.costs import compute as costs  # noqa: E402
from dist_lib.costs import network
from dist_lib.hardware.devices import DEVICES, Device  # noqa: E402
from strategies.interleaved import padded_partition  # noqa: E402

STRATEGIES = Path(__file__).resolve().parent.parent / "strategies"
HYBRID = str(STRATEGIES / "hybrid.py")
A100 = DEVICES["A100-80GB"]

# Korthikanti et al. 2022, Table 4: one 22B layer (microbatch 4, TP 8), forward and backward in ms.
TABLE4 = [  # (experiment, sequence parallel, recompute, forward, backward)
    ("baseline, no recompute", False, "none", 7.7, 11.9),
    ("sequence parallelism", True, "none", 7.2, 11.8),
    ("baseline, full recompute", False, "full", 7.7, 19.5),
    ("selective recompute", False, "selective", 7.7, 13.2),
    ("selective + sequence par.", True, "selective", 7.2, 13.1),
]


def table4(device: Device = A100) -> list[tuple[str, float, float, float, float]]:
    """(experiment, measured forward, predicted forward, measured backward, predicted backward), ms."""
    topo = Cluster.parse(f"1x8x{device.name}").topology(range(8))
    out = []
    for name, sp, recompute, forward, backward in TABLE4:
        f, b = megatron_pipeline.layer_times(device, GPT_22B, 4, topo, sp, recompute)
        out.append((name, forward, 1e3 * f, backward, 1e3 * b))
    return out


def calibrate_a100(target_forward: float = TABLE4[0][3]) -> float:
    """The A100 `max_efficiency` (two decimals) whose Table 4 baseline layer forward is closest to 7.7 ms."""
    candidates = [round(0.5 + i / 100, 2) for i in range(51)]
    return min(candidates, key=lambda e: abs(table4(replace(A100, max_efficiency=e))[0][2] - target_forward))


def _amp_kernels(name: str, tp: int) -> float:
    """GPU seconds of one AMP layer forward at microbatch 1 by the kernel model alone (no host time)."""
    bare = replace(AMP_GPT2, framework_overhead_s=0.0, tp_overhead_s=0.0, kernel_time_scale=1.0)
    return costs.forward_time(DEVICES[name], bare, 1, 1, tp)


def calibrate_kernel_time_scale() -> float:
    """How much longer AMP's kernels run than the kernel model, from AMP's T4 TP-1 layer profile: on the
    T4 the pass is GPU-bound (its time exceeds the V100's host-bound one), so the profile is kernel time."""
    measured = AMP_LAYER_FORWARD_MS["T4", 1] * 1e-3
    assert measured > AMP_LAYER_FORWARD_MS["V100-16GB", 1] * 1e-3, "the T4 profile must be the GPU-bound one"
    return round(measured / _amp_kernels("T4", 1), 3)


def calibrate_framework_overhead() -> float:
    """Host seconds per layer pass, from AMP's V100 TP-1 layer profile: there the pass is host-bound (the
    scaled kernels are shorter), so the profile is the host time."""
    measured = AMP_LAYER_FORWARD_MS["V100-16GB", 1] * 1e-3
    assert _amp_kernels("V100-16GB", 1) * calibrate_kernel_time_scale() < measured, "the V100 pass must be host-bound"
    return round(measured, 6)


def calibrate_tp_overhead() -> float:
    """Host seconds a TP layer pass adds, from AMP's V100 TP-2 profile (host-bound; its two all-reduces
    of the activations on NVLink come after the pass)."""
    device, tp = DEVICES["V100-16GB"], 2
    topo = Cluster.from_dict(AMP_CLUSTER).topology(range(tp))
    host = AMP_LAYER_FORWARD_MS[device.name, tp] * 1e-3 - network.tp_layer_comm_time(AMP_GPT2, 1, topo)
    assert _amp_kernels(device.name, tp) * calibrate_kernel_time_scale() < host, "the V100 TP pass must be host-bound"
    return round(host - calibrate_framework_overhead(), 6)


def calibrate() -> dict[str, float]:
    """Every constant set from one published point (see hardware/devices.py and published.py for the sources)."""
    return {"A100-80GB max_efficiency": calibrate_a100(),
            **gemm_efficiencies(),
            "AMP kernel time scale": calibrate_kernel_time_scale(),
            "AMP framework overhead per layer pass (s)": calibrate_framework_overhead(),
            "AMP extra overhead per TP layer pass (s)": calibrate_tp_overhead()}


# ---- predictions through simulate() -------------------------------------------------------------

def megatron_plan(run: MegatronRun) -> dict:
    """hybrid's options for a Megatron-LM run."""
    return dict(dp=run.dp, pp=run.pp, tp=run.tp, microbatch_size=run.microbatch,
                schedule="interleaved" if run.chunks > 1 else "1f1b", chunks=run.chunks,
                recompute=not run.selective_sp, selective_recompute=run.selective_sp,
                sequence_parallel=run.selective_sp, overlap_grad_reduce=run.overlap_grad_reduce,
                async_tp_allreduce=run.async_tp_allreduce)


def predict_megatron(run: MegatronRun) -> Result:
    """One Megatron-LM run on DGX A100 nodes (8 GPUs on NVLink, one HDR NIC per GPU)."""
    return simulate(HYBRID, f"{run.gpus // 8}x8xA100-80GB", run.workload, run.global_batch, check=False,
                    enforce_memory=False, **megatron_plan(run))


def amp_plan(plan: AmpPlan) -> dict:
    """hybrid's options for an AMP plan: DeepSpeed's pipeline engine runs its lock-step 1F1B with blocking
    messages (strategies/deepspeed_1f1b.py), then all-reduces the tied embedding's gradient between the
    first and last stage (GPT2ModelPipe's TiedLayerSpec) and the gradients across replicas."""
    return dict(dp=plan.dp, pp=plan.pp, tp=plan.tp, microbatch_size=plan.microbatch, schedule="deepspeed",
                partition=plan.partition if plan.pp > 1 else None, overlap_grad_reduce=False, tied_embeddings=True,
                attention_mask_messages=True)


def predict_amp(plan: AmpPlan) -> Result:
    return simulate(HYBRID, Cluster.from_dict(AMP_CLUSTER), AMP_GPT2, AMP_BATCH, check=False, enforce_memory=False,
                    **amp_plan(plan))


def zb_chunks(model: ZeroBubbleModel) -> int:
    """Chunks a rank holds in the paper's 1F1B-I: one layer each (examples/pretrain_zero_bubble.sh,
    `--num-layers-per-virtual-pipeline-stage 1`) of the layers padded to a multiple of the stages
    (`--allow-padding-num-layers`), so the first stage's first chunk and the last stage's last chunk hold
    none (`interleaved.padded_partition`); the reference's bubble arithmetic takes the same count, its
    padded layers over the stages (megatron/core/pipeline_parallel/efficiency.py, `ll = l // p`)."""
    return -(-model.workload.num_layers // model.gpus)


def zb_w_share(model: ZeroBubbleModel) -> float:
    """The share of a microbatch's activations its deferred W still holds after its I, as the paper's runtime
    counts memory for its schedule: 32h of 34h + 5as bytes per token (zb_schedules.py,
    `get_zero_bubble_forward_backward_func`: `w_mem`, `f_mem`)."""
    w = model.workload
    return 32 * w.hidden / (34 * w.hidden + 5 * w.heads * w.seq_len)


def zerobubble_plan(run: ZeroBubbleRun) -> tuple[str, dict] | None:
    """The built-in strategy and options for a Table 4 cell (None where the schedule cannot be expressed):
    1F1B `one_f_one_b`; 1F1B-I `interleaved` (see `zb_chunks`); ZB-1p and ZB-2p `zero_bubble` as the paper's
    runtime schedules them (the reference's heuristic with the profiled pass times; its auto_schedule.py runs
    no ILP): memory limit p M_B (ZB-1p) or 2p M_B (ZB-2p, `--zero-bubble-max-pending-backward`), counted as
    the runtime counts it (`zb_w_share`), and the order with the shortest longest-stage span, the period of
    the overlapping steps its optimizer post-validation runs (see `steady_period`).
    The 1F1B and 1F1B-I baselines are Megatron-LM's own schedules (schedules.py `get_forward_backward_func`
    without --enable-zero-bubble, the paper's commit f68d3879), so they move their messages as Megatron-LM's
    `_communicate` does (`megatron_exchange`): 1F1B blocking, each call waited for with `torch.cuda.synchronize`
    (megatron/arguments.py turns `overlap_p2p_comm` off without virtual stages, so `batch_p2p_comm` is on);
    1F1B-I overlapped, since `overlap_p2p_comm` is on by default there (`--no-overlap-p2p-communication` is a
    `store_false` flag, Megatron-LM commit 4eeff55d of October 2023, and examples/pretrain_zero_bubble.sh does
    not pass it)."""
    model, p = run.model, run.model.gpus
    common = dict(microbatch_size=model.microbatch, pp=p)
    if run.schedule == "1F1B":
        return "one_f_one_b.py", dict(common, partition=model.partition, megatron_exchange="blocking")
    if run.schedule == "1F1B-I":
        chunks = zb_chunks(model)
        if chunks < 2:
            return None
        return "interleaved.py", dict(common, chunks=chunks, megatron_exchange="overlap",
                                      partition=padded_partition(model.workload.num_layers, p, chunks))
    limit = {"ZB-1p": p, "ZB-2p": 2 * p}[run.schedule]
    return "zero_bubble.py", dict(common, partition=model.partition, max_in_flight=limit, w_share=zb_w_share(model),
                                  objective="span", uniform_times=True)


def overlaps_steps(schedule: str) -> bool:
    """Whether the paper's runs of `schedule` overlap consecutive steps: its runtime enables the optimizer's
    post-validation (`--enable-optimizer-post-validation`, which examples/pretrain_zero_bubble.sh sets for
    every fp16 run) only with its zero-bubble schedules (megatron/arguments.py turns it off otherwise), and
    then a stage steps its optimizer and starts the next step without waiting for the other stages (the
    global gradient-norm and inf/nan all-reduce is checked later, during the next step's warm-up; sec. 4).
    Megatron-LM's 1F1B and 1F1B-I all-reduce the gradient norm over every stage before the optimizer step
    (--clip-grad), so their steps do not overlap."""
    return schedule in ("ZB-1p", "ZB-2p")


def steady_period(result: Result) -> float:
    """The period of back-to-back steps that overlap (no barrier between them): the longest of the ranks'
    spans, from the start of a rank's first compute to the end of its last op. Each rank can start the next
    step once it has finished this one, and the next step, shifted by that span, meets every dependency
    of this one (Qi et al. 2024 compute Table 5's bubble rates from the same span: auto_schedule.py,
    `Graph.manual_order`'s `best_time`)."""
    first = [math.inf] * result.cluster.world_size
    last = [0.0] * result.cluster.world_size
    for event in result.raw_events:
        rank, stream, start, end = event[0], event[2], event[3], event[4]
        if stream == "compute" and start < first[rank]:
            first[rank] = start
        if end > last[rank]:
            last[rank] = end
    return max(end - start for start, end in zip(first, last) if start < math.inf)


def zerobubble_cluster(model: ZeroBubbleModel) -> str:
    """The paper's A100 SXM 80GB nodes of 8: its network is a RoCE RDMA fabric of unstated speed, so the
    nodes keep the A100 catalog's per-GPU network link."""
    return f"{model.gpus // 8}x8xA100-80GB"


def predict_zerobubble(run: ZeroBubbleRun) -> Result | None:
    plan = zerobubble_plan(run)
    if plan is None:
        return None
    strategy, options = plan
    return simulate(str(STRATEGIES / strategy), zerobubble_cluster(run.model), run.model.workload, run.global_batch,
                    check=False, enforce_memory=False, **options)


def zerobubble_seconds(run: ZeroBubbleRun, result: Result) -> float:
    """A simulated Table 4 cell's seconds per step: the period of overlapping steps for the schedules the
    paper ran with post-validation (`overlaps_steps`, `steady_period`), else the step."""
    return steady_period(result) if overlaps_steps(run.schedule) else result.time_s


def paper_bubble_rate(result: Result, seconds: float | None = None) -> float:
    """Table 5's measure on a simulated step: the busiest rank's idle share, 1 - its compute time / the step
    (or `seconds`, the period of overlapping steps)."""
    return 1 - max(result.compute_busy()) / (result.time_s if seconds is None else seconds)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks, ties given their mean rank."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var


# ---- printing -----------------------------------------------------------------------------------

def _summary(errors: list[float]) -> str:
    if not errors:
        return "no row simulated"
    mean = 100 * sum(map(abs, errors)) / len(errors)
    return f"mean |error| {mean:.1f} %, max |error| {100 * max(map(abs, errors)):.1f} % over {len(errors)} rows"


def print_table4() -> None:
    print("Korthikanti et al. 2022, Table 4: one 22B layer (microbatch 4, TP 8), ms; dist_lib.costs.compute")
    print(f"{'experiment':<26} {'forward':>8} {'predicted':>9} {'backward':>9} {'predicted':>9}")
    for name, forward, f, backward, b in table4():
        print(f"{name:<26} {forward:>8.1f} {f:>9.2f} {backward:>9.1f} {b:>9.2f}")


def print_megatron(title: str, runs: list[MegatronRun], max_ranks: int, cross_check: bool,
                   rows: set[str] | None = None) -> list[float]:
    print(title)
    extra = f" {'composed':>9}" if cross_check else ""
    print(f"{'model':>5} {'GPUs':>5} {'TP':>3} {'PP':>3} {'DP':>3} {'mode':<15} {'measured':>9} {'simulated':>9} "
          f"{'error':>7} {'MFU':>6}{extra} {'wall':>6}")
    errors = []
    for run in runs:
        if rows and run.name not in rows:
            continue
        mode = "SP + selective" if run.selective_sp else "full recompute"
        head = f"{run.name:>5} {run.gpus:>5} {run.tp:>3} {run.pp:>3} {run.dp:>3} {mode:<15} {run.measured_s:>9.2f}"
        if run.gpus > max_ranks:
            print(f"{head} {'skipped':>9}   ({run.gpus} ranks > --max-ranks {max_ranks})", flush=True)
            continue
        started = time.perf_counter()
        result = predict_megatron(run)
        wall = time.perf_counter() - started
        error = result.time_s / run.measured_s - 1
        errors.append(error)
        composed = ""
        if cross_check:
            composed = f" {megatron_pipeline.compose(run.workload, run.gpus, run.tp, run.pp, run.global_batch, run.microbatch, run.chunks, run.selective_sp, A100):>9.2f}"  # noqa: E501
        print(f"{head} {result.time_s:>9.2f} {100 * error:>+6.1f}% {100 * result.mfu:>5.1f}%{composed} {wall:>5.0f}s",
              flush=True)
    print(_summary(errors))
    return errors


def amp_layer_forwards() -> list[tuple[str, int, float, float]]:
    """(device, TP, measured ms, predicted ms) of one AMP layer forward at microbatch 1, TP all-reduces
    included: the calibration point (V100, TP 1) and its checks."""
    cluster = Cluster.from_dict(AMP_CLUSTER)
    first = {"V100-16GB": 0, "T4": 12}
    out = []
    for (name, tp), measured in AMP_LAYER_FORWARD_MS.items():
        topo = cluster.topology(range(first[name], first[name] + tp))
        seconds = costs.forward_time(DEVICES[name], AMP_GPT2, 1, 1, tp) + network.tp_layer_comm_time(AMP_GPT2, 1, topo)
        out.append((name, tp, measured, 1e3 * seconds))
    return out


def print_amp() -> tuple[list[float], float, bool]:
    print("AMP's profiles: one GPT-2 layer forward at microbatch 1, ms (V100 TP 1 and 2 and T4 TP 1 are the "
          "calibration points)")
    print(f"{'device':<10} {'TP':>3} {'measured':>9} {'predicted':>9} {'error':>7}")
    for name, tp, measured, predicted in amp_layer_forwards():
        print(f"{name:<10} {tp:>3} {measured:>9.2f} {predicted:>9.2f} {100 * (predicted / measured - 1):>+6.1f}%")
    print()
    print("Li et al. 2022 (AMP): GPT-2 (h 1024, s 1024, 24 layers), batch 32, 3 x 4 V100 (10 Gb/s) + 4 T4 (50 Gb/s)")
    print(f"{'plan':<20} {'stages (layers)':<26} {'measured':>9} {'simulated':>9} {'error':>7}")
    measured, predicted, errors = [], [], []
    for plan in AMP_HET_CLUSTER:
        result = predict_amp(plan)
        error = result.time_s / plan.measured_s - 1
        measured.append(plan.measured_s)
        predicted.append(result.time_s)
        errors.append(error)
        stages = "-".join(map(str, plan.partition))
        print(f"{plan.name:<20} {stages:<26} {plan.measured_s:>9.2f} {result.time_s:>9.2f} {100 * error:>+6.1f}%",
              flush=True)
    rho = spearman(predicted, measured)
    best_measured = min(range(len(measured)), key=measured.__getitem__)
    best_predicted = min(range(len(predicted)), key=predicted.__getitem__)
    same = best_measured == best_predicted
    print(_summary(errors))
    for label, keep in (("TP-1 plans", lambda plan: plan.tp == 1), ("TP plans", lambda plan: plan.tp > 1)):
        print(f"{label}: {_summary([e for plan, e in zip(AMP_HET_CLUSTER, errors) if keep(plan)])}")
    print(f"Spearman correlation of simulated and measured times: {rho:.2f}; measured best plan "
          f"{AMP_HET_CLUSTER[best_measured].name} is {'' if same else 'not '}the simulated best"
          + ("" if same else f" ({AMP_HET_CLUSTER[best_predicted].name}, measured "
                             f"{measured[best_predicted]:.2f} s against {measured[best_measured]:.2f} s)"))
    return errors, rho, same


def zb_pass_times(model: ZeroBubbleModel) -> tuple[float, float, float]:
    """A middle stage's F, I (input gradient) and W per microbatch from the cost model, ms: what Table 6
    profiled."""
    layers, b, w = model.partition[1], model.microbatch, model.workload
    return tuple(1e3 * layers * fn(A100, w, 1, b) for fn in (costs.forward_time, costs.backward_input_time,
                                                              costs.backward_weight_time))


def print_zerobubble(rows: set[str] | None = None) -> dict:
    """Table 4 cell by cell, then per setting the ranking of the schedules and ZB's speed-up over 1F1B."""
    print("Qi et al. 2024 (ICLR), Table 4: samples per GPU per second, A100 80GB nodes of 8, PP only, seq 1024; "
          "bubble: Table 5's (computed by the paper) and the simulated busiest rank's")
    print(f"{'model':>5} {'GPUs':>4} {'m':>4} {'schedule':<9} {'measured':>8} {'simulated':>9} {'error':>7} "
          f"{'bubble':>7} {'sim.':>6}")
    errors, settings = [], []
    for model in ZB_MODELS:
        if rows and model.name not in rows:
            continue
        for m in model.microbatch_counts:
            measured, predicted = {}, {}
            for run in (r for r in ZERO_BUBBLE_TABLE4 if r.model is model and r.microbatches == m):
                result = predict_zerobubble(run)
                rate = ZB_BUBBLE_RATES[model.name, m][ZB_BUBBLE_SCHEDULES.index(run.schedule)]
                label = run.schedule + (f" v{zb_chunks(model)}" if run.schedule == "1F1B-I" else "")
                head = (f"{model.name:>5} {model.gpus:>4} {m:>4} {label:<9} {run.samples_per_gpu_s:>8.2f}")
                if result is None:
                    print(f"{head} {'-':>9}   (one layer a chunk fills no two chunks a stage)")
                    continue
                seconds = zerobubble_seconds(run, result)
                simulated = run.global_batch / (seconds * model.gpus)
                error = seconds / run.measured_s - 1
                errors.append(error)
                measured[run.schedule], predicted[run.schedule] = run.samples_per_gpu_s, simulated
                bubble = paper_bubble_rate(result, seconds)
                print(f"{head} {simulated:>9.2f} {100 * error:>+6.1f}% {rate:>7.3f} {bubble:>6.3f}", flush=True)
            names = list(measured)
            rho = spearman([predicted[n] for n in names], [measured[n] for n in names])
            best = max(names, key=measured.get)
            settings.append((model.name, m, rho, best, max(names, key=predicted.get),
                             {zb: (measured[zb] / measured["1F1B"] - 1, predicted[zb] / predicted["1F1B"] - 1)
                              for zb in ("ZB-1p", "ZB-2p")}))
    print("time " + _summary(errors))
    print()
    print("Ranking of the schedules by throughput, and ZB's speed-up over 1F1B, measured / simulated")
    print(f"{'model':>5} {'m':>4} {'Spearman':>8} {'measured best':<14} {'simulated best':<14} "
          f"{'ZB-1p':>15} {'ZB-2p':>15}")
    for name, m, rho, best, sim_best, speedups in settings:
        ups = " ".join(f"{100 * a:>+6.1f}/{100 * b:>+5.1f}%" for a, b in speedups.values())
        print(f"{name:>5} {m:>4} {rho:>8.2f} {best:<14} {sim_best:<14} {ups}")
    same = sum(best == sim_best for _, _, _, best, sim_best, _ in settings)
    print(f"measured best schedule simulated best in {same} of {len(settings)} settings")
    print()
    print("Table 6's profiled pass times of a middle stage against the cost model's, ms")
    print(f"{'model':>5} {'T_F':>7} {'F':>7} {'T_B':>7} {'I':>7} {'T_W':>7} {'W':>7}")
    for model in ZB_MODELS:
        if rows and model.name not in rows:
            continue
        paper, ours = ZB_PROFILED_MS[model.name], zb_pass_times(model)
        print(f"{model.name:>5} " + " ".join(f"{a:>7.2f} {b:>7.2f}" for a, b in zip(paper, ours)))
    return {"errors": errors, "settings": settings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrate", action="store_true", help="print every constant set from one published point")
    parser.add_argument("--sets",
                        default="table4,korthikanti,narayanan,amp,zerobubble,megatron_core,torchtitan,llama3,moe_bridge",
                        help="comma-separated: table4, korthikanti, narayanan, amp, zerobubble, megatron_core, "
                             "torchtitan, llama3, moe_bridge")
    parser.add_argument("--max-ranks", type=int, default=10**6, help="skip rows with more ranks than this")
    parser.add_argument("--rows", default="", help="comma-separated model names (e.g. 22B,175B) to run alone")
    args = parser.parse_args()
    if args.calibrate:
        for name, value in calibrate().items():
            print(f"{name}: {value:g}")
        return
    sets = {s.strip() for s in args.sets.split(",")}
    rows = {r.strip() for r in args.rows.split(",") if r.strip()} or None
    unknown = sets - {"table4", "korthikanti", "narayanan", "amp", "zerobubble", "megatron_core", "torchtitan", "llama3",
                      "moe_bridge"}
    if unknown:
        parser.error(f"unknown set(s) {', '.join(sorted(unknown))}")
    if "table4" in sets:
        print_table4()
        print()
    if "korthikanti" in sets:
        print_megatron("Korthikanti et al. 2022, Table 5: iteration time (s), A100 80GB, seq 2048; simulate(hybrid)",
                       KORTHIKANTI_TABLE5, args.max_ranks, cross_check=True, rows=rows)
        print()
    if "narayanan" in sets:
        print_megatron("Narayanan et al. 2021, Table 1: iteration time (s) from achieved TFLOP/s, A100 80GB, "
                       "full recompute; simulate(hybrid)", NARAYANAN_TABLE1, args.max_ranks, cross_check=False,
                       rows=rows)
        print()
    if "amp" in sets:
        print_amp()
        print()
    if "zerobubble" in sets:
        print_zerobubble(rows)
        print()
    if "megatron_core" in sets:  # H100, held out (benchmarks/fidelity_h100.py)
        print_megatron_core(args.max_ranks, rows)
        print()
    if "torchtitan" in sets:  # H100, held out (benchmarks/fidelity_torchtitan.py)
        print_torchtitan(args.max_ranks, rows)
        print()
    if "llama3" in sets:  # H100 at 8,192 and 16,384 GPUs, held out (benchmarks/fidelity_llama3.py)
        print_llama3(args.max_ranks, rows)
        print()
    if "moe_bridge" in sets:  # H100 mixtures of experts, held out (benchmarks/fidelity_moe.py); --rows: presets
        print_moe_bridge(models=rows, max_ranks=args.max_ranks)


if __name__ == "__main__":
    main()

"""Where a simulated step's time goes: GEMMs, the attention core, the memory-bound elementwise kernels, the LM head
(its GEMMs and the cross-entropy), the optimizer step, and communication that compute did not hide, for the
held-out H100 rows and the A100 rows they are compared with.

    python benchmarks/step_breakdown.py                  # Megatron-Core up to 384 GPUs, torchtitan T2, Korthikanti 22B
    python benchmarks/step_breakdown.py --rows 1.7B,32B

The busiest rank's compute events are summed by op; a layer pass's time is split into its GEMMs, attention core and
elementwise kernels in the proportions `dist_lib.costs.compute` builds it from (one layer, one microbatch, the
run's TP, sequence parallelism, recompute and FP8 recipe; with FP8 the GEMM column holds the casts' traffic too),
and the LM head's into its three GEMMs and the
cross-entropy and final layernorm traffic. `exposed` is the step less the busiest rank's compute. `needed` is what the
measured step leaves for the compute if the exposed communication were right: measured - exposed.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import fidelity_h100, fidelity_torchtitan  # noqa: E402
from benchmarks.published import KORTHIKANTI_TABLE5  # noqa: E402
from dist_lib import Workload  # noqa: E402
from dist_lib.costs import compute as costs  # noqa: E402
from dist_lib.hardware.devices import DEVICES, Device  # noqa: E402

LAYER_OPS = ("forward", "backward", "backward_input", "backward_weight")


def layer_split(device: Device, workload: Workload, samples: int, tp: int, sp: bool, recompute: str,
                fp8: str = "") -> dict[str, float]:
    """Seconds of one layer's forward and backward (with its recompute) by kind of kernel, as the cost model builds
    them (before any host-time floor)."""
    passes = [("forward", False), ("input", True), ("weight", False)]
    gemm = sum(costs._weight_gemms_time(device, workload, samples, tp, p, 0, fp8) for p, _ in passes)
    attention = costs._attention_time(device, workload, samples, tp) \
        + costs._attention_time(device, workload, samples, tp, backward=True)
    stream = costs._stream_time(device, samples * (workload.elementwise_bytes(tp, sp)
                                                   + workload.elementwise_bytes(tp, sp, backward=True)))
    if recompute == "full":
        gemm += costs._weight_gemms_time(device, workload, samples, tp, "forward", 0, fp8)
        attention += costs._attention_time(device, workload, samples, tp)
        stream += costs._stream_time(device, samples * workload.elementwise_bytes(tp, sp))
    elif recompute == "selective":
        attention += costs._attention_time(device, workload, samples, tp)
        stream += costs._stream_time(device, samples * workload.elementwise_bytes(tp, attention_only=True))
    return {"GEMM": gemm, "attention": attention, "elementwise": stream}


def head_split(device: Device, workload: Workload, samples: int, tp: int) -> dict[str, float]:
    """The LM head's GEMMs and its memory-bound part (cross-entropy over the logits, the final layernorm)."""
    total = costs.loss_time(device, workload, samples, tp)
    tokens, h, vocab, e = samples * workload.seq_len, workload.hidden, workload.vocab / tp, workload.bytes_per_element
    gemms = (costs.gemm_time(device, tokens, vocab, h, 1, e) + costs.gemm_time(device, tokens, h, vocab, 1, e)
             + costs.gemm_time(device, h, vocab, tokens, 1, e))
    return {"head GEMM": gemms, "cross-entropy": total - gemms}


def breakdown(result, device: Device, workload: Workload, samples: int, tp: int, sp: bool, recompute: str,
              fp8: str = "") -> dict[str, float]:
    """The busiest rank's step by category (seconds)."""
    busy = result.compute_busy()
    rank = busy.index(max(busy))
    by_op: Counter = Counter()
    for e in result.events:
        if e.rank == rank and e.stream == "compute":
            by_op[e.op] += e.duration
    out: dict[str, float] = {}
    layers = sum(by_op[op] for op in LAYER_OPS)
    split = layer_split(device, workload, samples, tp, sp, recompute, fp8)
    for kind, seconds in split.items():
        out[kind] = layers * seconds / sum(split.values())
    head = head_split(device, workload, samples, tp)
    for kind, seconds in head.items():
        out[kind] = by_op["loss"] * seconds / sum(head.values()) if by_op["loss"] else 0.0
    out["optimizer"] = by_op["update"]
    out["other compute"] = sum(v for op, v in by_op.items() if op not in LAYER_OPS + ("loss", "update"))
    out["exposed"] = result.time_s - max(busy)
    return out


def rows() -> list[tuple[str, float, object, Device, Workload, int, int, bool, str, str]]:
    """(name, measured s, thunk giving the Result, device, workload, microbatch, tp, sp, recompute, fp8)."""
    out = []
    for run in fidelity_h100.MEGATRON_CORE_R080:
        if run.gpus <= 400:
            out.append((f"mcore {run.name}", run.measured_s, lambda run=run: fidelity_h100.predict(run),
                        DEVICES["H100-80GB"], run.workload, 1, run.tp, run.tp > 1, "none", ""))
    for run in fidelity_torchtitan.TORCHTITAN:
        if run.name == "T2 8B cp1":
            out.append((f"torchtitan {run.name}", run.measured_s, lambda run=run: fidelity_torchtitan.predict(run),
                        DEVICES[run.device], Workload.parse(fidelity_torchtitan.workload(run)),
                        run.local_batch, run.tp, run.tp > 1, "full" if run.ac == "full" else "none", run.fp8 or ""))
    from benchmarks.fidelity import predict_megatron  # (fidelity imports this set's neighbours; import late)
    for run in KORTHIKANTI_TABLE5:
        if run.gpus == 8:
            mode = "SP + selective" if run.selective_sp else "full recompute"
            out.append((f"Korthikanti 22B {mode}", run.measured_s, lambda run=run: predict_megatron(run),
                        DEVICES["A100-80GB"], run.workload, run.microbatch, run.tp, run.selective_sp,
                        "selective" if run.selective_sp else "full", ""))
    return out


KINDS = ("GEMM", "attention", "elementwise", "head GEMM", "cross-entropy", "optimizer", "other compute", "exposed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", help="comma-separated substrings of row names (default: all)")
    args = parser.parse_args(argv)
    wanted = args.rows.split(",") if args.rows else None
    print(f"{'row':<32} {'measured':>8} {'sim':>6} " + " ".join(f"{k:>13}" for k in KINDS) + f" {'needed':>7}")
    for name, measured, thunk, device, workload, samples, tp, sp, recompute, fp8 in rows():
        if wanted and not any(w in name for w in wanted):
            continue
        result = thunk()
        parts = breakdown(result, device, workload, samples, tp, sp, recompute, fp8)
        cells = " ".join(f"{parts[k]:>7.3f} {parts[k] / result.time_s:>4.0%}" for k in KINDS)
        print(f"{name:<32} {measured:>8.3f} {result.time_s:>6.3f} {cells} {measured - parts['exposed']:>7.3f}",
              flush=True)


if __name__ == "__main__":
    main()

"""`profile`: measure a workload's layers with PyTorch (`dist_lib.hardware.profiling`), or import a PyTorch
profiler trace (`dist_lib.hardware.kineto`), and write profile files that `--workload profiles:DIR,SPEC` reads."""

from __future__ import annotations

import argparse
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.run.simulator import DEFAULT_GLOBAL_BATCH
from dist_lib.specs import whole
from dist_lib.workload.transformer import MAX_GLOBAL_BATCH, Workload

from .errors import InputError

MAX_REPEATS = 10_000


def _whole_list(flag: str, high: int) -> Any:
    def parse(text: str) -> list[int]:
        try:
            values = [whole(part.strip(), "", 1, high) for part in text.split(",")]
        except SpecError as exc:
            raise argparse.ArgumentTypeError(f"{flag}: {str(exc).removeprefix(': ')}") from None
        return sorted(set(values))
    return parse


def _count(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            return whole(text, "", low, MAX_REPEATS)
        except SpecError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(": ")) from None
    return parse


def add_profile_parser(sub: Any) -> None:
    parser = sub.add_parser("profile", help="measure a workload's layers with PyTorch (or import a profiler "
                                            "trace) into profile files")
    parser.add_argument("--workload", help="the workload whose layers are measured (a spec or file); with "
                                           "--from-trace, the shape the trace's model has")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to measure (default cpu)")
    parser.add_argument("--tp", type=_whole_list("--tp", 4096), default=[1], metavar="N[,N...]",
                        help="tensor-parallel degrees: each measures one rank's shard (default 1)")
    parser.add_argument("--microbatch", type=_whole_list("--microbatch", MAX_GLOBAL_BATCH), default=[1],
                        metavar="M[,M...]", help="microbatch sizes, one file each (default 1)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
                        help="the layers' parameter and activation type (default bf16)")
    parser.add_argument("--warmup", type=_count(0), default=2, help="untimed passes before timing (default 2)")
    parser.add_argument("--repeats", type=_count(1), default=5,
                        help="timed passes; each figure is their median (default 5)")
    parser.add_argument("--type", dest="device_type",
                        help="the device type in the file names (default: CPU, or the GPU's catalog family "
                             "such as A100)")
    parser.add_argument("--from-trace", metavar="FILE",
                        help="import a PyTorch profiler (Kineto) trace of a training step instead of measuring")
    parser.add_argument("--out", default="profiles", help="the folder to write (default profiles)")


def cmd_profile(args: argparse.Namespace) -> int:
    from dist_lib.hardware.profile_writer import write_profiles
    if not args.workload:
        raise InputError("profile: --workload is required (the model whose layers are measured, or with "
                         "--from-trace the traced model's shape)")
    if args.from_trace:
        if len(args.tp) > 1 or len(args.microbatch) > 1:
            raise InputError("profile --from-trace: a trace is one step: give the one --tp and --microbatch it ran")
        from dist_lib.hardware.kineto import import_trace
        steps = [import_trace(args.from_trace, Workload.load(args.workload), tp=args.tp[0], batch=args.microbatch[0],
                              device_type=args.device_type)]
    else:
        from dist_lib.hardware.profiling import measure
        workload = Workload.load(args.workload)
        steps = []
        for tp in args.tp:
            for batch in args.microbatch:
                print(f"measuring {workload.name} on {args.device}: TP {tp}, microbatch {batch}", flush=True)
                steps.append(measure(workload, args.device, tp=tp, batch=batch, dtype=args.dtype,
                                     warmup=args.warmup, repeats=args.repeats, device_type=args.device_type))
    for path, step in zip(write_profiles(steps, args.out), steps):
        print(f"wrote {path}: {len(step.layer_seconds)} layers, "
              f"{sum(step.layer_seconds) * 1e3:.3f} ms forward + backward of the layers, "
              f"head {step.head_seconds * 1e3:.3f} ms")
    shape = f",{args.workload}" if args.workload else ""
    print(f"use them with --workload profiles:{args.out}{shape} on a cluster whose devices are "
          f"{steps[0].device_type}")
    return 0


def add_chakra_parser(sub: Any, default_cluster: str, default_workload: str, batch_type: Any) -> None:
    parser = sub.add_parser("export-chakra", help="simulate a step and write it as Chakra execution traces "
                                                  "(one file per rank, for ASTRA-sim)")
    parser.add_argument("file", help="the strategy file or a built-in strategy's name")
    parser.add_argument("--cluster", default=default_cluster, help=f"cluster spec or file (default {default_cluster})")
    parser.add_argument("--workload", default=default_workload,
                        help=f"workload spec or file (default {default_workload})")
    parser.add_argument("--batch", type=batch_type, default=DEFAULT_GLOBAL_BATCH,
                        help=f"global batch size (default {DEFAULT_GLOBAL_BATCH})")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a strategy option (repeatable)")
    parser.add_argument("--out", default="traces/chakra", help="the folder to write (default traces/chakra)")
    parser.add_argument("--prefix", default="step", help="file names <prefix>.<rank>.et (default step)")


def cmd_export_chakra(args: argparse.Namespace, strategy_path: Any) -> int:
    """Simulate in this process (the strategy is trusted: a built-in one or your own), unfolded so that every
    rank has its events, write the traces, and replay them as a check."""
    from dist_lib import Cluster, simulate
    from dist_lib.output.chakra import SCHEMA, read_chakra, write_chakra
    from dist_lib.output.chakra_replay import replay

    from .scenario import parse_set
    result = simulate(str(strategy_path), Cluster.load(args.cluster), args.workload, args.batch, fold=False,
                      **parse_set(args.set))
    paths = write_chakra(result, args.out, args.prefix)
    replayed = replay(read_chakra(args.out, args.prefix)).end
    print(f"wrote {len(paths)} Chakra traces {args.out}/{args.prefix}.<rank>.et and comm_groups.json ({SCHEMA})")
    print(f"step {result.time_s * 1e3:.6f} ms simulated, {replayed * 1e3:.6f} ms replayed from the traces")
    return 0

"""`export PLAN --to FRAMEWORK` and `run --from FRAMEWORK SETTINGS`: plans as Megatron-LM, torchtitan or
DeepSpeed settings, and those settings simulated with the built-in strategy that runs as the framework does
(`dist_lib.planner.export`, `dist_lib.planner.launch_import`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dist_lib import Cluster, Workload
from dist_lib.errors import SpecError
from dist_lib.planner import Plan
from dist_lib.planner.export import export
from dist_lib.planner.launch_import import from_deepspeed, from_megatron, from_torchtitan
from dist_lib.workload.transformer import override_spec
from .paths import BUILTIN_STRATEGIES

FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")


def add_export_parser(sub: Any, default_cluster: str, default_workload: str) -> None:
    parser = sub.add_parser("export", help="a plan as Megatron-LM, torchtitan or DeepSpeed settings")
    parser.add_argument("plan", help="the plan file (python -m grader plan --out writes one)")
    parser.add_argument("--to", required=True, choices=FRAMEWORKS, help="the framework")
    parser.add_argument("--cluster", default=default_cluster, help="the cluster the plan was made for")
    parser.add_argument("--workload", default=default_workload, help="the workload the plan was made for")
    parser.add_argument("--out", help="write the settings here (default: print them)")


def cmd_export(args: argparse.Namespace) -> int:
    cluster, workload = Cluster.load(args.cluster), Workload.load(args.workload)
    plan = Plan.load(args.plan)
    plan.check(cluster.world_size, workload.num_layers, plan.global_batch_size, cluster, f"plan file {args.plan}",
               workload)
    exported = export(plan, args.to, workload, cluster)
    if args.out:
        Path(args.out).write_text(exported.settings, encoding="utf-8")
        print(f"wrote {args.out}")
        print(exported.text().split("# --- launch ---\n", 1)[1], end="")
    else:
        print(exported.text(), end="")
    return 0


def settings_run(framework: str, settings: str, cluster: str, workload: str | None) -> tuple[Path, dict, str, int]:
    """(strategy file, its options, workload spec, global batch) that simulate a framework's settings file."""
    path = Path(settings)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{framework} settings {settings}: cannot be read ({exc.strerror})") from None
    world = Cluster.load(cluster).world_size
    given = Workload.load(workload) if workload is not None else None
    source = f"{framework} settings {settings}"
    if framework == "megatron":
        imported = from_megatron(text, given, world, source)
    elif given is None:
        raise SpecError(f"{source}: give --workload ({framework} settings do not hold the model's dimensions)")
    else:
        imported = (from_torchtitan if framework == "torchtitan" else from_deepspeed)(text, given, world, source)
    w = imported.workload
    if given is not None and w == given:  # the workload as given (a mixture of experts keeps its experts)
        spec = workload
    elif w.moe is not None:
        raise SpecError(f"{source}: the model flags change workload {given.name}'s dimensions, which a mixture of "
                        f"experts does not take from them; give a workload whose dimensions they state")
    elif given is not None:  # the given workload's architecture, with what the settings change (the sequence...)
        spec = override_spec(workload, given, w)
    else:
        spec = (f"toy:layers={w.num_layers},hidden={w.hidden},heads={w.heads},seq={w.seq_len},vocab={w.vocab},"
                f"bytes_per_element={w.bytes_per_element}")
    name, options = imported.launch.strategy(w.num_layers)
    if "plan" in options:
        options["plan"] = options["plan"].to_dict()
    for flag in imported.ignored:
        print(f"note: {flag} does not change one step; not simulated")
    return BUILTIN_STRATEGIES / f"{name}.py", options, spec, imported.launch.global_batch_size

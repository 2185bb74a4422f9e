"""A plan simulated as its framework runs it: the settings `export` writes, read back as a `Launch`, run by
the built-in strategy `run --from` runs (`Launch.strategy`: hybrid with the framework's schedule, DeepSpeed's
lock-step one included, and torchtitan's sequence parallelism), on the plan's nodes in the launch order (the
hostfile `export` writes). A search for one framework (`plan(..., framework=...)`) times its plans this way,
so that the step it reports is the step `export` then `run --from` gives, by construction.
"""

from __future__ import annotations

from typing import Any

from dist_lib.hardware.cluster import Cluster
from dist_lib.planner.launch import Launch, node_order
from dist_lib.planner.plan import Plan
from dist_lib.run.simulator import simulate
from dist_lib.workload.transformer import Workload


def launch_cluster(plan: Plan, cluster: Cluster) -> Cluster:
    """The plan's nodes in launch order (node rank 0 first): framework rank g is this cluster's rank g."""
    return Cluster(tuple(cluster.nodes[n] for n in node_order(plan, cluster)))


def framework_call(cluster: Cluster, workload: Workload, plan: Plan, framework: str) -> tuple[str, Cluster, dict]:
    """(strategy, cluster, options) of `plan` as `framework` runs it: the built-in strategy `run --from` runs, on
    the plan's nodes in launch order. Raises `SpecError` for a plan the framework cannot launch."""
    launch = Launch.from_plan(plan, framework, workload.num_layers, workload.moe is not None)
    name, options = launch.strategy(workload.num_layers)
    return f"strategies.{name}", launch_cluster(plan, cluster), options


def framework_run(cluster: Cluster, workload: Workload, global_batch: int, plan: Plan, framework: str,
                  reserve: Any = None) -> tuple[Any, list[int]]:
    """(the simulator's `Result` of one step of `plan` as `framework` runs it, the cluster rank of each of its
    ranks). Memory enforced, less `reserve` when given; correctness checked."""
    strategy, on, options = framework_call(cluster, workload, plan, framework)
    return simulate(strategy, on, workload, global_batch, memory_reserve=reserve, **options), plan.ranks

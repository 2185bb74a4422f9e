"""What a plan was made for: each node's device type and its ranks, recorded in the plan file, and the
check (or the remapping) when it runs on a cluster.

A plan names ranks, and a rank is a GPU only through the cluster's order of nodes: the same GPUs listed in
another order would run each stage on other devices, and a stage sized for an A100-80GB could run out of
memory on a V100-32GB. A plan file therefore records, node by node, `[node, device, first rank, last rank]`
(`Plan.hardware`). On a cluster that matches, nothing changes; on one that holds the same nodes in another
order, `fit_to` renames the plan's ranks node for node and says so; anything else is one error naming the
first node that differs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dist_lib.errors import SpecError

Hardware = tuple[tuple[int, str, int, int], ...]


def hardware_of(cluster: Any) -> Hardware:
    """(node, device name, first rank, last rank) of every node of `cluster`, in order."""
    out = []
    for n, node in enumerate(cluster.nodes):
        ranks = cluster.ranks_of_node(n)
        out.append((n, node.device.name, ranks[0], ranks[-1]))
    return tuple(out)


def mismatch(recorded: Hardware, cluster: Any) -> str:
    """'' when `cluster` is the hardware a plan recorded, else the first difference in words."""
    actual = hardware_of(cluster)
    if len(actual) != len(recorded):
        return f"the plan was made for {len(recorded)} nodes, the cluster has {len(actual)}"
    for want, have in zip(recorded, actual):
        if tuple(want) != have:
            n, device, first, last = want
            return (f"node {n} was {last - first + 1} x {device} (ranks {first}..{last}), the cluster's node {n} is "
                    f"{have[3] - have[2] + 1} x {have[1]} (ranks {have[2]}..{have[3]})")
    return ""


def fit_to(plan: Any, cluster: Any, source: str = "plan") -> tuple[Any, str]:
    """(`plan` on `cluster`, a note saying what was remapped or ''): the plan itself when the cluster is
    the one it recorded (or it recorded none); its ranks renamed node for node when the cluster holds the
    same nodes (device and GPU count) in another order; else `SpecError` naming the difference."""
    recorded = plan.hardware
    if not recorded:
        return plan, ""
    why = mismatch(recorded, cluster)
    if not why:
        return plan, ""
    actual = hardware_of(cluster)
    free: dict[tuple[str, int], list[tuple[int, str, int, int]]] = {}
    for entry in actual:
        free.setdefault((entry[1], entry[3] - entry[2] + 1), []).append(entry)
    rename: dict[int, int] = {}
    moves = []
    for n, device, first, last in recorded:
        pool = free.get((device, last - first + 1))
        if not pool or len(actual) != len(recorded):
            raise SpecError(f"{source}: made for other hardware: {why}; plan on this cluster again "
                            f"(python -m grader plan), or list its nodes as the plan's hardware records them")
        target = pool.pop(0)
        for k in range(last - first + 1):
            rename[first + k] = target[2] + k
        if target[0] != n:
            moves.append(f"node {n} ({device}) -> {target[0]}")
    stages = tuple(replace(s, ranks=tuple(rename[r] for r in s.ranks)) for s in plan.stages)
    note = (f"{source}: the cluster lists the plan's nodes in another order; its ranks are remapped node for node "
            f"so that every stage runs on the devices it was planned for ({', '.join(moves)})")
    return replace(plan, stages=stages, hardware=hardware_of(cluster)), note

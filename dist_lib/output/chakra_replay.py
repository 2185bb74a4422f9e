"""Replay Chakra execution traces (`output.chakra`) with their recorded durations and dependencies.

Each node starts when the nodes it depends on (`data_deps` and `ctrl_deps`, on its rank) have ended; a
collective starts when every member of its process group is ready for it (the k-th COMM_COLL_NODE of a
`pg_name` on each rank is one collective; its members are the group's ranks in `comm_groups.json`, or
without that file the ranks whose traces hold it); a message starts when both its send and its receive are ready
(the send and receive of one `comm_tag` on a (`comm_src`, `comm_dst`) channel). Each ends its duration
later. This is the simulator's own rule for when collectives and messages start (`comm.collectives`,
`comm.p2p`), with the durations fixed, so a step exported and replayed ends when the step ended.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from dist_lib.errors import SpecError
from dist_lib.output.chakra import COMM_COLL_NODE, COMM_RECV_NODE, COMM_SEND_NODE, NODE_TYPES, ChakraTrace


@dataclass
class Replayed:
    """When each node of each rank started and ended, in seconds, and the step's end."""

    starts: list[dict[int, float]]
    ends: list[dict[int, float]]

    @property
    def end(self) -> float:
        return max((max(e.values(), default=0.0) for e in self.ends), default=0.0)


def _meeting(rank: int, node, seen: dict) -> tuple:
    """The key all participants of a communication node share."""
    a = node.attrs
    if node.type == COMM_COLL_NODE:
        pg = a.get("pg_name", "")
        k = seen[rank, pg] = seen.get((rank, pg), -1) + 1
        return ("collective", pg, k)
    if node.type in (COMM_SEND_NODE, COMM_RECV_NODE):
        return ("message", a.get("comm_src"), a.get("comm_dst"), a.get("comm_tag"))
    return ("compute", rank, node.id)


def replay(trace: ChakraTrace) -> Replayed:
    """Every node's start and end; `SpecError` naming a node that can never start (a dependency that is not
    in the trace, a collective some member never reaches, a message without its other end)."""
    nodes = {(r, n.id): n for r, rank in enumerate(trace.ranks) for n in rank}
    seen: dict = {}
    meeting = {key: _meeting(key[0], n, seen) for key, n in nodes.items()}
    members: dict[tuple, list] = defaultdict(list)
    for key, m in meeting.items():
        members[m].append(key)
    expected = {m: len(trace.groups.get(m[1], keys)) if m[0] == "collective" else len(keys)
                for m, keys in members.items()}  # a collective waits for its whole group (comm_groups.json)
    waiting: dict[tuple, int] = {}
    children: dict[tuple, list] = defaultdict(list)
    for (rank, nid), n in nodes.items():
        deps = set(n.data_deps) | set(n.ctrl_deps)
        for d in deps:
            if (rank, d) not in nodes:
                raise SpecError(f"rank {rank}: node {nid} ({n.name}) depends on node {d}, which is not in the trace")
            children[rank, d].append((rank, nid))
        waiting[rank, nid] = len(deps)
    ready: dict[tuple, float] = {}
    starts: list[dict[int, float]] = [{} for _ in trace.ranks]
    ends: list[dict[int, float]] = [{} for _ in trace.ranks]
    arrived: dict[tuple, list] = defaultdict(list)
    queue = deque(key for key, count in waiting.items() if count == 0)
    while queue:
        key = queue.popleft()
        rank, nid = key
        n = nodes[key]
        ready[key] = max((ends[rank][d] for d in set(n.data_deps) | set(n.ctrl_deps)), default=0.0)
        m = meeting[key]
        arrived[m].append(key)
        if len(arrived[m]) < expected[m]:
            continue
        start = max(ready[k] for k in arrived[m])
        for k in arrived[m]:
            starts[k[0]][k[1]] = start
            ends[k[0]][k[1]] = start + nodes[k].duration
            for child in children[k]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    queue.append(child)
    stuck = [key for key in nodes if key[1] not in ends[key[0]]]
    if stuck:
        rank, nid = min(stuck)
        n = nodes[rank, nid]
        raise SpecError(f"rank {rank}: node {nid} ({n.name}, {NODE_TYPES.get(n.type, n.type)}) never starts: "
                        f"{len(stuck)} nodes wait on a dependency or a peer that never comes")
    return Replayed(starts, ends)

"""Identical data-parallel replicas on identical hardware: which ranks represent them, and how the links
their transfers load fold onto the representative's.

A `ReplicaGrid(dp, tp)` is Megatron-LM's rank grid (Narayanan et al. 2021, sec. 3): rank =
(stage * dp + replica) * tp + tp_rank, so replica j holds the ranks (s, j, t). When every node is the same
and the nodes cut the grid evenly (`Fold.build`), every permutation of the replicas that keeps each node's
ranks on one node is a symmetry of the cluster (devices, ports, NICs, who shares what), and these
permutations take any replica to any other. Replicas that run the same program (a strategy declares it,
`run/folding.py`) then stay alike for the whole step: each replica's transfers load its own links as
replica 0's load replica 0's, and the transfers that span the replicas (the data-parallel collectives)
are invariant. So the loads of the links in one *orbit* (the links the symmetries map onto one another:
rank (s, j, t)'s port or NIC for all j; the shared NICs of a stage's nodes) are equal at every instant,
and their sum is what the representative's transfers want, each counted once per image: `copies` times
for a transfer inside replica 0, once for one that spans the replicas. The folded scheduler keeps one
link per orbit with the orbit's summed capacity, and charges each transfer its summed demand there: the
share capacity / load is the same ratio of the same whole numbers scaled by the orbit's size, hence the
same float, and every end is the full simulation's to the bit (`engine/transfers.py`).

A pipeline whose stages differ (device types, TP degrees: a plan's) folds the same way when each stage's
nodes are alike and hold whole replicas, and the stages' replicas a node nest (`_stages_alike`): the
symmetries then permute the replicas of every stage at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from dist_lib.hardware.cluster import Cluster


@dataclass(frozen=True)
class ReplicaGrid:
    """`dp` replicas of a (stage, tp_rank) grid laid out as Megatron-LM does (TP fastest, then the replica,
    then the stage). What a strategy declares when its replicas run one program (`run/folding.py`).

    A pipeline whose stages have their own ranks and TP degrees (a plan's, `strategies/planned.py`) gives
    them as `stages`: each stage's ranks, in ascending order, hold `dp` replicas of its `tp` consecutive
    ranks (`tp` is then unused; ranks in no stage are idle). Replica j trains on block j of the global batch
    where replica 0 trains on block 0; with `microbatch`, on block j of every `microbatch` samples (each
    microbatch cut evenly among the replicas). With `parts`, the experts' gradients hold masks over that many
    sequence parts of each sample (bit s x parts + j: an MoE layer under TP, `model/expert_parts.py`). With
    `shards_inside`, a ZeRO sharding is spread over the ranks inside each replica (HSDP's shard groups), so every
    replica holds the very shards replica 0 holds; else it is spread over the replicas (block j on replica j)."""

    dp: int
    tp: int = 1
    stages: tuple[tuple[tuple[int, ...], int], ...] = ()
    microbatch: int = 0
    parts: int = 1  # the sequence parts of a sample that experts' gradients hold apart (MoE under TP)
    shards_inside: bool = False  # ZeRO shards spread inside each replica (HSDP), not over the replicas

    def layout(self, world: int) -> list[tuple[tuple[int, ...], int]]:
        """Each stage's (ranks, tp): the declared stages, or Megatron-LM's grid over `world` ranks."""
        if self.stages:
            return [(tuple(ranks), tp) for ranks, tp in self.stages]
        block = self.dp * self.tp
        return [(tuple(range(s * block, (s + 1) * block)), self.tp) for s in range(world // block)]


class Fold:
    """The representatives (replica 0's ranks) of `grid` on `cluster`, and the folded links."""

    def __init__(self, cluster: Cluster, grid: ReplicaGrid, why_not: str = ""):
        self.cluster = cluster
        self.grid = grid
        self.copies = grid.dp  # replicas each representative stands for
        world = cluster.world_size
        # rank -> (its replica, the representative it mirrors); idle ranks stand for themselves
        self.replica_of = [0] * world
        self.rep_of = list(range(world))
        for ranks, tp in grid.layout(world):
            for i, r in enumerate(ranks):
                self.replica_of[r] = i // tp
                self.rep_of[r] = ranks[i % tp]
        self.reps = [r for r in range(world) if self.rep_of[r] == r]
        self.broken = why_not  # set when a representative does what a replica would not (then not folded)
        nodes = len(cluster.nodes)
        canon = list(range(4 * world + 2 * nodes))
        for r in range(world):
            for d in range(4):
                canon[4 * r + d] = 4 * self.rep_of[r] + d
        # a node's shared NICs fold onto those of the node holding its ranks' representatives
        for n in range(nodes):
            home = cluster.node_of(self.rep_of[cluster.ranks_of_node(n)[0]])
            for d in range(2):
                canon[4 * world + 2 * n + d] = 4 * world + 2 * home + d
        self.canon = canon
        self.orbit = [1] * len(canon)  # links per orbit, counted on the orbit's canonical link
        for link, c in enumerate(canon):
            if c != link:
                self.orbit[c] += 1
        self.rep_set = frozenset(self.reps)
        self.relabelled: dict[tuple[int, int], int] = {}  # (samples, replica) -> its relabelled samples

    @classmethod
    def build(cls, cluster: Cluster, grid: ReplicaGrid) -> tuple[Fold | None, str]:
        """The fold of `grid` on `cluster`, or (None, why not) when the replicas are not provably alike:
        nodes that differ, or nodes that do not cut the grid into whole replicas per node (or whole nodes
        per replica: a wide one, such as an EP group's replicas) and whole nodes per stage."""
        dp, tp, world = grid.dp, grid.tp, cluster.world_size
        if dp < 2:
            return None, "one replica"
        if grid.stages:
            why = _stages_alike(cluster, grid)
            return (None, why) if why else (cls(cluster, grid), "")
        if tp < 1 or world % (dp * tp):
            return None, f"dp={dp} x tp={tp} does not tile the {world} ranks"
        first = cluster.nodes[0]
        if any(node != first for node in cluster.nodes):
            return None, "the nodes differ (devices, links or NICs)"
        gpus, block = first.gpus, dp * tp
        if gpus % tp and tp % gpus:  # (a replica's stage inside a node, or on whole nodes of its own)
            return None, f"tp={tp} and the {gpus} GPUs per node do not divide one another"
        if block % gpus and gpus % block:
            return None, f"the nodes of {gpus} GPUs cut the stages of {block} ranks unevenly"
        return cls(cluster, grid), ""

    def capacities(self) -> list[int]:
        """Each folded link's capacity: its orbit's (the links not representing an orbit carry nothing)."""
        capacity = self.cluster.link_capacities()
        return [capacity[link] * self.orbit[link] if self.canon[link] == link else capacity[link]
                for link in range(len(capacity))]

    def usage(self, usage: tuple[tuple[int, int], ...], images: int) -> tuple[tuple[int, int], ...]:
        """A representative transfer's demand on the folded links: what it wants of each link, summed per
        orbit, times its `images` (its copies in the replicas, or 1 for a transfer spanning them)."""
        folded: dict[int, int] = {}
        canon = self.canon
        for link, rate in usage:
            c = canon[link]
            folded[c] = folded.get(c, 0) + rate * images
        return tuple(folded.items())

    def spans_replicas(self, ranks: tuple[int, ...]) -> bool:
        """Whether `ranks` are some positions of replica 0 and the same positions of every replica (a set the
        symmetries leave as it is), with a representative first."""
        if not ranks or ranks[0] not in self.rep_set:
            return False
        positions = {self.rep_of[r] for r in ranks}
        return len(ranks) == len(positions) * self.copies


def _stages_alike(cluster: Cluster, grid: ReplicaGrid) -> str:
    """Why the declared stages' replicas are not provably alike on `cluster`, or "" when they are.

    Each stage must sit on nodes alike, either inside one node or on whole nodes of its own that each hold
    whole replicas, consecutive ones, `gpus / tp` of them. A permutation of the replicas that keeps every
    such block on one node is then a symmetry of the cluster (its nodes' devices, ports and NICs, and the
    links between them, which depend on the two nodes alone). The blocks' sizes must divide one another,
    so that the blocks nest and those permutations take any replica to any other."""
    dp, world = grid.dp, cluster.world_size
    seen: set[int] = set()
    per_node: set[int] = set()
    for s, (ranks, tp) in enumerate(grid.stages):
        where = f"stage {s}"
        if tp < 1 or len(ranks) != dp * tp:
            return f"{where}: {len(ranks)} ranks are not {dp} replicas of tp={tp}"
        if list(ranks) != sorted(set(ranks)) or ranks[0] < 0 or ranks[-1] >= world or seen & set(ranks):
            return f"{where}: its ranks are not ascending, distinct ranks of the cluster"
        seen |= set(ranks)
        nodes = sorted({cluster.node_of(r) for r in ranks})
        if any(cluster.nodes[n] != cluster.nodes[nodes[0]] for n in nodes):
            return f"{where}: the nodes differ (devices, links or NICs)"
        if len(nodes) == 1:
            continue
        gpus = cluster.nodes[nodes[0]].gpus
        if gpus % tp or any(len(cluster.ranks_of_node(n)) != len(set(cluster.ranks_of_node(n)) & set(ranks))
                            for n in nodes):
            return f"{where}: the nodes of {gpus} GPUs cut the stage's replicas of tp={tp} unevenly"
        block = gpus // tp
        for j in range(dp):
            held = {cluster.node_of(r) for r in ranks[j * tp:(j + 1) * tp]}
            if held != {nodes[j // block]}:
                return f"{where}: replica {j} is not on its node"
        per_node.add(block)
    sizes = sorted(per_node)
    if any(b % a for a, b in zip(sizes, sizes[1:])):
        return f"the stages hold {', '.join(map(str, sizes))} replicas a node, which do not nest"
    return ""

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
"""

from __future__ import annotations

from dataclasses import dataclass

from dist_lib.hardware.cluster import Cluster


@dataclass(frozen=True)
class ReplicaGrid:
    """`dp` replicas of a (stage, tp_rank) grid laid out as Megatron-LM does (TP fastest, then the replica,
    then the stage). What a strategy declares when its replicas run one program (`run/folding.py`)."""

    dp: int
    tp: int = 1


class Fold:
    """The representatives (replica 0's ranks) of `grid` on `cluster`, and the folded links."""

    def __init__(self, cluster: Cluster, grid: ReplicaGrid, why_not: str = ""):
        self.cluster = cluster
        self.grid = grid
        self.copies = grid.dp  # replicas each representative stands for
        world, dp, tp = cluster.world_size, grid.dp, grid.tp
        self.block = dp * tp  # ranks of one pipeline stage
        # rank -> (its replica, the representative it mirrors)
        self.replica_of = [r // tp % dp for r in range(world)]
        self.rep_of = [r - self.replica_of[r] * tp for r in range(world)]
        self.reps = [r for r in range(world) if self.replica_of[r] == 0]
        self.broken = why_not  # set when a representative does what a replica would not (then not folded)
        gpus = cluster.nodes[0].gpus
        nodes = len(cluster.nodes)
        node_orbit = self.block // gpus if self.block % gpus == 0 else 1
        links = 4 * world + 2 * nodes
        self.canon = list(range(links))
        self.orbit = [1] * links
        for r in range(world):
            rep = self.rep_of[r]
            for d in range(4):
                self.canon[4 * r + d] = 4 * rep + d
                self.orbit[4 * r + d] = dp
        for n in range(nodes):
            home = cluster.node_of(self.rep_of[n * gpus])
            for d in range(2):
                self.canon[4 * world + 2 * n + d] = 4 * world + 2 * home + d
                self.orbit[4 * world + 2 * n + d] = node_orbit
        self.rep_set = frozenset(self.reps)

    @classmethod
    def build(cls, cluster: Cluster, grid: ReplicaGrid) -> tuple[Fold | None, str]:
        """The fold of `grid` on `cluster`, or (None, why not) when the replicas are not provably alike:
        nodes that differ, or nodes that do not cut the grid into whole replicas per node or whole nodes
        per stage."""
        dp, tp, world = grid.dp, grid.tp, cluster.world_size
        if dp < 2:
            return None, "one replica"
        if tp < 1 or world % (dp * tp):
            return None, f"dp={dp} x tp={tp} does not tile the {world} ranks"
        first = cluster.nodes[0]
        if any(node != first for node in cluster.nodes):
            return None, "the nodes differ (devices, links or NICs)"
        gpus, block = first.gpus, dp * tp
        if gpus % tp:
            return None, f"tp={tp} does not divide the {gpus} GPUs per node"
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

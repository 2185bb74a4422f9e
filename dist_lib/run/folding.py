"""Folding a step's identical data-parallel replicas: whether it is exact, and the full step's books from the
representatives'.

Folding is exact when three things hold (`plan_fold`):

* the hardware is alike for every replica: `Fold.build` (`hardware/replicas.py`) checks that every node is
  the same and that the nodes cut the replica grid evenly, so that the cluster's symmetries take any
  replica to any other;
* the replicas run one program, relabelled: the strategy *declares* its replica grid for the options given,
  with a module-level `replica_grid(world_size, global_batch_size, **options)` returning a
  `ReplicaGrid(dp, tp)` (or None when its replicas differ: per-replica shares, a layout of its own).
  Declaring it is a promise that replica j does what replica 0 does, with block j of the global batch (an
  even share) and block j of any ZeRO shards spread over the replicas where replica 0 has block 0, and that
  its ranks meet other replicas only in collectives over the same positions of every replica. The
  built-in data-parallel strategies declare it (their layouts are `strategies/_layout.py`'s);
* the representatives keep that promise as far as the simulator can see: a group that neither stays in
  replica 0 nor spans every replica alike, a message across replicas, or a ZeRO sharding that is not
  spread over the replicas breaks the fold (`FoldBroken`), and the step runs again unfolded. So does any
  error, so that errors read exactly as the full step's do.

A mixture of experts folds the same way when its routing is alike in every replica (uniform or measured
shares, not zipf's draw per microbatch): the replicas that exchange tokens fold as one wider replica (the
strategy declares it so), and the experts' books are checked on the representatives, who hold every expert; a
problem there runs the step again unfolded, for the full step's lines.

The representatives' books then stand for every replica's (`expand_books`): the same times, peaks and
FLOPs, and the weights each handed in and loaded relabelled to its replica (`comm/folding.py`), so that the
end-of-step check sees every rank's records, as the full step would give them. (Where no piece is
relabelled, a replica's loaded records are its representative's own list, and the check of what each rank
kept reads the representatives first: `check_kept_folded`.)
"""

from __future__ import annotations

import sys
from typing import Any

from dist_lib.comm.folding import relabel_shards, relabelled_samples, shards_stay
from dist_lib.model.correctness import check_kept
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.replicas import Fold, ReplicaGrid
from dist_lib.workload.moe import MoE
from dist_lib.workload.routing import alike_in_every_replica


def declared_grid(train: Any, world_size: int, global_batch_size: int, options: dict[str, Any]) -> ReplicaGrid | None:
    """The replica grid `train`'s strategy declares for these options (its module's `replica_grid`), or
    None when it declares none, declares None, or cannot say (its options are wrong: the step will say why)."""
    declare = getattr(train, "replica_grid", None)
    if declare is None:
        declare = getattr(sys.modules.get(getattr(train, "__module__", "") or ""), "replica_grid", None)
    if not callable(declare):
        return None
    try:
        grid = declare(world_size, global_batch_size, **options)
    except Exception:  # (the strategy's own checks raise the real error when the step runs)
        return None
    return grid if isinstance(grid, ReplicaGrid) else None


def plan_fold(train: Any, cluster: Cluster, global_batch_size: int, options: dict[str, Any],
              moe: MoE | None = None) -> Fold | None:
    """The fold of this step's replicas when it is exact (see the module docstring), else None. A mixture of
    experts (`moe`, the workload's) folds only where its routing loads every replica's experts alike."""
    if moe is not None and not alike_in_every_replica(moe):
        return None
    grid = declared_grid(train, cluster.world_size, global_batch_size, options)
    if grid is None or global_batch_size % max(grid.dp, 1):
        return None
    if grid.microbatch and (global_batch_size % grid.microbatch or grid.microbatch % grid.dp):
        return None
    fold, _ = Fold.build(cluster, grid)
    return fold


def spread_shards(shards: int, num_shards: int, fold: Fold) -> int:
    """The ZeRO shards a representative's `shards` stand for across its replicas (replica j holds block j where
    replica 0 holds block 0; with `shards_inside`, each replica the same)."""
    if fold.grid.shards_inside or shards_stay(shards, num_shards) or num_shards % fold.copies:
        return shards
    out = 0
    for j in range(fold.copies):
        out |= relabel_shards(shards, num_shards, j, fold.copies)
    return out


def expand_books(books: Any, fold: Fold, global_batch_size: int) -> Any:
    """The whole step's `Books` from the representatives' (in `fold.reps` order): each rank's from its
    representative's, with what it handed in and loaded relabelled to its replica."""
    world = fold.cluster.world_size
    at = {rep: i for i, rep in enumerate(fold.reps)}
    source = [at[fold.rep_of[r]] for r in range(world)]
    replicas = fold.copies
    by_rep: dict[int, list[tuple]] = {}
    for record in books.finals:
        by_rep.setdefault(record[0], []).append(record)
    finals: list[tuple] = []
    loaded: list[list] = []
    # a representative whose loaded pieces are all whole (unsharded, or every shard) lends its replicas its
    # own list of them: relabelled, each would be the same
    inside = fold.grid.shards_inside  # (HSDP: every replica holds replica 0's shards)
    lent = [inside or all(shards_stay(shards, num_shards) for _, shards, num_shards, _, _ in loads)
            for loads in books.loaded]
    for r in range(world):
        j, rep = fold.replica_of[r], fold.rep_of[r]
        if not j:
            finals += by_rep.get(rep, [])
            loaded.append(books.loaded[source[r]])
            continue
        for (_, layer, step, samples, shards, num_shards, tp_rank, tp_size) in by_rep.get(rep, []):
            finals.append((r, layer, step, relabelled_samples(samples, j, fold, global_batch_size),
                           shards if inside else relabel_shards(shards, num_shards, j, replicas), num_shards,
                           tp_rank, tp_size))
        if lent[source[r]]:
            loaded.append(books.loaded[source[r]])
            continue
        loaded.append([(layer, relabel_shards(shards, num_shards, j, replicas), num_shards, tp_rank, tp_size)
                       for layer, shards, num_shards, tp_rank, tp_size in books.loaded[source[r]]])

    def spread(values: list) -> list:
        return [values[i] for i in source]

    # a replica's communicators are its representative's: the groups the representative joined name every
    # member (`simulator.communicator_counts`)
    return type(books)(books.leftovers, spread(books.logs), loaded, finals, spread(books.times),
                       spread(books.peaks), spread(books.flops), spread(books.communicators))


def check_kept_folded(loaded: list, finals: list[tuple], fold: Fold) -> list[str]:
    """`check_kept` of a folded step's books (`expand_books`'), the representatives' first. Where every piece
    a representative loaded or handed in is whole (unsharded, or every shard), each of its replicas loaded
    and handed in the very same pieces, so the check of a replica's rank is its representative's: when the
    representatives have no problem, no rank has. Otherwise the whole step is checked, for the lines the
    full step gives."""
    reps = set(fold.reps)
    ours = [record for record in finals if record[0] in reps]
    if fold.grid.shards_inside or all(shards_stay(record[4], record[5]) for record in ours) and all(
            shards_stay(shards, num_shards) for r in reps for _, shards, num_shards, _, _ in loaded[r]):
        if not check_kept([loaded[r] if r in reps else () for r in range(len(loaded))], ours):
            return []
    return check_kept(loaded, finals)

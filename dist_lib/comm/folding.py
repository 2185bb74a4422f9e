"""The other replicas' side of a collective that spans folded replicas (`hardware/replicas.py`).

In a folded step only replica 0 runs; a collective over a `FoldedGroup` resolves once its representatives
have issued it. Each other member's input is its representative's, relabelled to its replica: replica j
trains on block j of the global batch where replica 0 trains on block 0 (an even data-parallel share), or
on block j of every microbatch where the grid cuts each microbatch among the replicas,
and holds ZeRO shard block j of a tensor sharded over the replicas where replica 0 holds block 0. The
relabelling rotates such a mask by j blocks (`rotate`): a whole mask stays whole, so what every replica
holds alike (an updated weight, a reduced gradient) stays as it is. The collective's rules (`rules.combine`)
then see every member's input as the full step would, and check and combine them as they would there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from dist_lib.comm.groups import Collective, FoldBroken
from dist_lib.tensors import ExpertGrad, full_mask

# the fields of any tensor class a collective's rules read (an expert's gradient or weight names its experts,
# which the replicas at the same place of every folded replica hold alike)
_FIELDS = ("layer", "samples", "shards", "num_shards", "tp_rank", "tp_size", "tp_parts", "step", "gathers", "cp_rank",
           "cp_size", "seq_parts", "experts")


class Mirror:
    """Another replica's copy of a representative's tensor: its fields, relabelled, and no memory."""

    __slots__ = ("rank", "nbytes", "kind", "cls") + _FIELDS

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)}" for name in _FIELDS if hasattr(self, name))
        return f"{self.cls.__name__}(rank={self.rank}, {fields})"


class MirrorWork:
    """Another replica's issue of a collective: when (its representative's issue), what, and its output."""

    __slots__ = ("rank", "issue", "input", "result")

    def __init__(self, rank: int, issue: float, input: Mirror, result: Mirror | None):
        self.rank, self.issue, self.input, self.result = rank, issue, input, result


def rotate(mask: int, replica: int, width: int, replicas: int, periods: int = 1) -> int:
    """`mask` over `periods` runs of `replicas` blocks of `width` bits, each block moved `replica` blocks on
    within its run (cyclically)."""
    if not replica or not mask:
        return mask
    period = width * replicas
    shift = replica * width
    if periods == 1:
        return ((mask << shift) | (mask >> (period - shift))) & full_mask(period)
    stay = _moving_up(period, shift, periods)
    return ((mask & stay) << shift) | ((mask & ~stay) >> (period - shift))


@lru_cache(maxsize=256)
def _moving_up(period: int, shift: int, periods: int) -> int:
    """The bits of each run of `period` that a rotation by `shift` moves up within the run."""
    return full_mask(period * periods) // full_mask(period) * full_mask(period - shift)


def relabel_samples(mask: int, replica: int, fold: Any, global_batch_size: int, parts: int = 1) -> int:
    """The samples replica `replica` holds where its representative holds `mask`: block j of the global
    batch, or of every microbatch when the grid cuts each microbatch among the replicas. With `parts`, a mask
    over sample parts (bit s x parts + j for part j of sample s: an expert's gradient under TP), whose blocks
    are `parts` times as wide."""
    period = fold.grid.microbatch or global_batch_size
    return rotate(mask, replica, period // fold.copies * parts, fold.copies, global_batch_size // period)


def relabelled_samples(mask: int, replica: int, fold: Any, global_batch_size: int, parts: int = 1) -> int:
    """`relabel_samples`, remembered by the fold: a step relabels the same few masks for every replica."""
    key = (mask, replica, parts)
    found = fold.relabelled.get(key)
    if found is None:
        found = fold.relabelled[key] = relabel_samples(mask, replica, fold, global_batch_size, parts)
    return found


def shards_stay(shards: int, num_shards: int) -> bool:
    """Whether every replica holds these shards as they are (the whole tensor, unsharded or all shards)."""
    return shards == 1 == num_shards or shards == full_mask(num_shards)


def relabel_shards(shards: int, num_shards: int, replica: int, replicas: int) -> int:
    """The ZeRO shards replica `replica` holds where replica 0 holds `shards` of `num_shards`."""
    if not replica or shards_stay(shards, num_shards):
        return shards
    if num_shards % replicas:
        raise FoldBroken(f"a tensor sharded {num_shards} ways is not shared out over the {replicas} replicas alike")
    return rotate(shards, replica, num_shards // replicas, replicas)


_ABSENT = object()


def _template(t: Any) -> tuple:
    """What every mirror of `t` copies: (nbytes, kind, class, the fields kept as they are, samples, shards),
    samples and shards None where `t` has none; worked out once per collective and representative. (An
    expert's gradient names its experts; its samples are over the grid's sample parts, `mirror`.)"""
    kept, samples, shards = [], None, None
    for name in _FIELDS:
        value = getattr(t, name, _ABSENT)
        if value is _ABSENT:
            continue
        if name == "samples":
            samples = value
        elif name == "shards":
            shards = value
        else:
            kept.append((name, value))
    return t.nbytes, t.kind, t.__class__, kept, samples, shards


def mirror(t: Any, rank: int, replica: int, engine: Any, template: tuple | None = None) -> Mirror:
    """Replica `replica`'s copy (on `rank`) of the representative's tensor `t` (whose `_template` may be
    given)."""
    fold = engine.fold
    nbytes, kind, cls, kept, samples, shards = template or _template(t)
    copy = Mirror()
    copy.rank, copy.nbytes, copy.kind, copy.cls = rank, nbytes, kind, cls
    for name, value in kept:
        setattr(copy, name, value)
    if samples is not None:
        parts = fold.grid.parts if cls is ExpertGrad else 1  # (the experts' token masks under TP)
        copy.samples = relabelled_samples(samples, replica, fold, engine.global_batch_size, parts)
    if shards is not None:
        copy.shards = shards if fold.grid.shards_inside else relabel_shards(shards, copy.num_shards, replica,
                                                                           fold.copies)
    return copy


def mirrored_works(engine: Any, coll: Collective) -> list[Any]:
    """`coll`'s works with every other replica's issue filled in from its representative's."""
    fold = engine.fold
    works = list(coll.works)
    ranks = coll.group.ranks
    by_rank = {w.rank: w for w in works if w is not None}
    templates: dict[int, tuple] = {}
    rep_of, replica_of = fold.rep_of, fold.replica_of
    for i, work in enumerate(works):
        if work is None:
            rank = ranks[i]
            rep = by_rank[rep_of[rank]]
            replica = replica_of[rank]
            result = rep.result
            made = templates.get(rep.rank)
            if made is None:
                made = templates[rep.rank] = (_template(rep.input), None if result is None else _template(result))
            works[i] = MirrorWork(rank, rep.issue, mirror(rep.input, rank, replica, engine, made[0]),
                                  None if result is None else mirror(result, rank, replica, engine, made[1]))
    return works

"""The end-of-step correctness check: is what the ranks handed in one correct training step?

A step is correct when, for every layer and every tensor-parallel slice, the final weights handed in
with `set_final_weight` cover all ZeRO shards, and each was updated exactly once (step 1) with
gradients from every sample of the global batch; and when each rank hands in, updated, every part of a
layer it loaded (`check_kept`): the next step starts from what each rank holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from bisect import bisect_right
from fractions import Fraction
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

from dist_lib.tensors import describe_mask, full_mask, mask_runs


class HandedIn(NamedTuple):
    """What a rank handed in for a layer with `set_final_weight`: the fields of its `Weight`. Records
    are plain tuples in this order (`Result.final_weights`); this names them."""

    rank: int
    layer: int
    step: int
    samples: int
    shards: int
    num_shards: int
    tp_rank: int
    tp_size: int


def check_final_weights(finals: Iterable[tuple], num_layers: int, global_batch_size: int) -> list[str]:
    """Problems with the handed-in weights (`HandedIn` records), one line each; empty when the step is
    correct."""
    by_layer: list[list[tuple]] = [[] for _ in range(num_layers)]
    for record in finals:
        by_layer[record[1]].append(record)
    everything = full_mask(global_batch_size)
    problems: list[str] = []
    for layer, weights in enumerate(by_layer):
        if not weights:
            problems.append(f"layer {layer}: no rank handed in its final weight (call set_final_weight)")
            continue
        _, _, steps, samples, _, _, tp_ranks, tp_sizes = zip(*weights)  # columns: compared at C speed
        if steps.count(1) + samples.count(everything) != 2 * len(weights):
            problems.extend(_update_problems(layer, map(HandedIn._make, weights), everything))
        if len(set(tp_sizes)) > 1:
            problems.append(f"layer {layer}: final weights mix tensor-parallel degrees {sorted(set(tp_sizes))}")
            continue
        tp_size = tp_sizes[0]
        if tp_size == 1:
            problems.extend(_shard_coverage(layer, 0, 1, weights))
            continue
        # the slices handed in, then one line for those none was (a TP degree may be 65536: the check
        # is linear in the weights handed in, not in the slices that might have been)
        slices: dict[int, list[tuple]] = {}
        for w, tp_rank in zip(weights, tp_ranks):
            slices.setdefault(tp_rank, []).append(w)
        for tp_rank in sorted(slices):
            problems.extend(_shard_coverage(layer, tp_rank, tp_size, slices[tp_rank]))
        problems.extend(_missing_slices(layer, tp_size, slices))
    return problems


def _missing_slices(layer: int, tp_size: int, slices: dict[int, list[tuple]]) -> list[str]:
    """The tensor-parallel slices of a layer that no rank handed in, in one line."""
    if len(slices) == tp_size:
        return []
    missing = full_mask(tp_size)
    for tp_rank in slices:
        missing &= ~(1 << tp_rank)
    if missing & (missing - 1) == 0:
        return [f"layer {layer} TP slice {missing.bit_length() - 1}/{tp_size}: no rank handed in this "
                f"tensor-parallel slice"]
    return [f"layer {layer}: no rank handed in tensor-parallel slices {describe_mask(missing)} of {tp_size}"]


def _update_problems(layer: int, weights: Iterable[HandedIn], everything: int) -> list[str]:
    """Weights not updated exactly once with the gradient of every sample."""
    problems: list[str] = []
    for w in weights:
        if w.step == 0:
            problems.append(f"layer {layer}: rank {w.rank} handed in a weight that was never updated")
        elif w.step != 1:
            problems.append(f"layer {layer}: rank {w.rank} handed in a weight updated {w.step} times")
        elif w.samples != everything:
            problems.append(f"layer {layer}: rank {w.rank}'s weight was updated with gradients of samples "
                            f"{describe_mask(w.samples)}, missing {describe_mask(everything & ~w.samples)}")
    return problems


def _shard_coverage(layer: int, tp_rank: int, tp_size: int, weights: list[tuple]) -> list[str]:
    where = f"layer {layer}" + (f" TP slice {tp_rank}/{tp_size}" if tp_size > 1 else "")
    if not weights:
        return [f"{where}: no rank handed in this tensor-parallel slice"]
    if any(w[4] == full_mask(w[5]) for w in weights):  # someone holds it whole
        return []
    _, _, _, _, shards, num_shards, _, _ = zip(*weights)
    counts = set(num_shards)
    if len(counts) > 1:
        return [f"{where}: final shards use different shard counts {sorted(counts)}"]
    n = counts.pop()
    held = 0
    for s in shards:
        held |= s
    if held != full_mask(n):
        return [f"{where}: ZeRO shards {describe_mask(full_mask(n) & ~held)} of {n} were never handed in"]
    return []


class Loaded(NamedTuple):
    """What `load_weights` gave a rank (`RankState.loaded` records, plain tuples in this order)."""

    layer: int
    shards: int
    num_shards: int
    tp_rank: int
    tp_size: int


SHOWN = 20  # ranks' problems listed one by one; the rest are counted
_RANK = itemgetter(0)  # of a `HandedIn` record
_PIECE = itemgetter(1, 4, 5, 6, 7)  # a `HandedIn` record as the `Loaded` record of what it holds
_NOTHING: frozenset = frozenset()


def check_kept(loaded: Sequence[Iterable[tuple]], finals: Iterable[tuple]) -> list[str]:
    """Problems, one line each, with ranks that loaded part of a layer and did not hand it in updated
    (`loaded[rank]`: `Loaded` records; `finals`: `HandedIn` records). A rank that holds a weight during
    the step holds it in the next one too, so it must end the step with it updated: with ZeRO-1 and -2,
    each rank all-gathers the updated shards (Rajbhandari et al. 2020, sec. 5.1), and handing in only
    its own shard would leave the rest of its copy a step behind. Linear in the records: what a rank
    handed in of a layer is merged into spans once, and each piece it loaded is looked up in them (a
    program may load and hand in thousands of pieces of one layer)."""
    finals = finals if isinstance(finals, (list, tuple)) else list(finals)
    # The common case first, at C speed: a rank that handed in exactly each piece it loaded (the same
    # (layer, shards, num_shards, tp_rank, tp_size)) has no problem, whatever else it handed in. Only the
    # other ranks are looked at piece by piece below.
    pieces_of: dict[int, set[tuple]] = {}
    for rank, records in groupby(finals, _RANK):
        pieces_of.setdefault(rank, set()).update(map(_PIECE, records))
    kept: dict[tuple[int, int], list[tuple]] | None = None
    problems: list[str] = []
    left = 0
    for rank, loads in enumerate(loaded):
        if not loads or pieces_of.get(rank, _NOTHING).issuperset(loads):
            continue
        if kept is None:
            kept = {}
            for record in finals:
                kept.setdefault((record[0], record[1]), []).append(record[4:8])
        pieces: dict[int, list[tuple]] = {}
        for layer, *piece in loads:
            pieces.setdefault(layer, []).append(tuple(piece))
        for layer in sorted(pieces):
            held = kept.get((rank, layer), [])
            exact, cover = set(held), None
            missing = []
            for piece in dict.fromkeys(pieces[layer]):
                if piece in exact:
                    continue
                if cover is None:
                    cover = _Cover(held)
                if not cover.holds(piece):
                    missing.append(piece)
            if not missing:
                continue
            if len(problems) == SHOWN:
                left += 1
                continue
            what = " and ".join(_describe_piece(*piece) for piece in missing)
            handed = ", ".join(_describe_piece(*piece) for piece in held) or "nothing of it"
            problems.append(f"layer {layer}: rank {rank} loaded {what} but handed in {handed}: a rank ends the "
                            f"step holding, updated, every weight it loaded (with ZeRO-1/2, all_gather the "
                            f"updated shards and hand in the whole)")
    if left:
        problems.append(f"... and {left} more")
    return problems


class _Cover:
    """The parameters of some pieces of a layer, as merged spans of [0, 1): TP slice t of T is
    [t/T, (t+1)/T), ZeRO shard i of n of it the i-th n-th of that (exact fractions)."""

    __slots__ = ("starts", "ends")

    def __init__(self, pieces: list[tuple]):
        merged: list[list[Fraction]] = []
        for start, end in sorted(span for piece in pieces for span in _spans(*piece)):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [start for start, _ in merged]
        self.ends = [end for _, end in merged]

    def holds(self, piece: tuple) -> bool:
        """Whether every parameter of `piece` (shards, num_shards, tp_rank, tp_size) is in these spans."""
        for start, end in _spans(*piece):
            at = bisect_right(self.starts, start) - 1
            if at < 0 or self.ends[at] < end:
                return False
        return True


def _spans(shards: int, num_shards: int, tp_rank: int, tp_size: int) -> list[tuple[Fraction, Fraction]]:
    """A piece's parameters as spans of [0, 1), one per run of consecutive shards it holds."""
    width = Fraction(1, tp_size * num_shards)
    base = Fraction(tp_rank, tp_size)
    return [(base + first * width, base + stop * width) for first, stop in mask_runs(shards)]


def _describe_piece(shards: int, num_shards: int, tp_rank: int, tp_size: int) -> str:
    slice_ = f"TP slice {tp_rank}/{tp_size}" if tp_size > 1 else ""
    if shards == full_mask(num_shards):
        return slice_ or "the whole layer"
    zero = f"ZeRO shard{'s' if shards & (shards - 1) else ''} {describe_mask(shards)} of {num_shards}"
    return f"{zero} of {slice_}" if slice_ else zero

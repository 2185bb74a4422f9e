"""The end-of-step correctness check: is what the ranks handed in one correct training step?

A step is correct when, for every layer and every tensor-parallel slice, the final weights handed in
with `set_final_weight` cover all ZeRO shards, and each was updated exactly once (step 1) with
gradients from every sample of the global batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .tensors import describe_mask, full_mask


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
        for tp_rank in range(tp_size):
            held = weights if tp_size == 1 else [w for w, t in zip(weights, tp_ranks) if t == tp_rank]
            problems.extend(_shard_coverage(layer, tp_rank, tp_size, held))
    return problems


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

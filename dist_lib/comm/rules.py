"""What a collective does to tensors: which inputs each op takes (`unfit`, `explain_input`), that the
members issued the same op on like tensors (`check_match`), and what the members' inputs combine into
(`combine`): gradients of disjoint samples sum, TP partial sums of one split add up to the whole, ZeRO
shards and TP pieces gather, a whole gradient reduce-scatters into shards. Anything else is a
`TensorError` or `CollectiveMismatchError` naming the ranks and tensors (`native/_comm.c` has the C
twins of the common cases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dist_lib.errors import CollectiveMismatchError, TensorError
from dist_lib.tensors import CONTEXT_HIDDEN, Activation, ActivationGrad, ActivationGradSlice, ActivationSlice, ContextActivationGrad, ContextActivationGradSlice, ContextActivationSlice, ContextWeightGrad, ExpertGrad, ExpertWeight, KVBlock, OptState, Tensor, Weight, WeightGrad, cp_part, describe_mask, full_mask

if TYPE_CHECKING:
    from dist_lib.comm.groups import Collective, Group
    from dist_lib.engine.core import Engine


class Reduced:
    """What an all-reduce leaves each member: a view of the member's own input (the reduction is in
    place) with the reduced samples, or for TP partial sums the reduced parts. One object serves every
    member and each member's tensor is made when it awaits the op, so that a thousand ranks waiting on
    their gradients' all-reduces do not also hold a reduced copy of each."""

    __slots__ = ("samples", "tp_parts", "tp_size")

    def __init__(self, samples: int, tp_parts: int = 1, tp_size: int = 1):
        self.samples = samples
        self.tp_parts = tp_parts
        self.tp_size = tp_size

    def materialize(self, t: Tensor) -> Tensor:
        if t.__class__ is WeightGrad:
            return WeightGrad(t, 0, t.rank, t.layer, self.samples, t.shards, t.num_shards, t.tp_rank, t.tp_size)
        if t.__class__ is ContextWeightGrad:  # `tp_parts` of `tp_size` hold the sequence parts summed
            if self.tp_parts == full_mask(self.tp_size):  # every part: a sample's whole gradient
                return WeightGrad(t, 0, t.rank, t.layer, self.samples, t.shards, t.num_shards, t.tp_rank, t.tp_size)
            return ContextWeightGrad(t, 0, t.rank, t.layer, self.samples, t.shards, t.num_shards, t.tp_rank,
                                     t.tp_size, self.tp_parts, self.tp_size)
        if t.__class__ in CONTEXT_HIDDEN:  # a sequence part's TP partial sums (after `gathers`, if a gradient)
            extra = ((),) if t.__class__ is ContextActivationGrad else ()
            return t.__class__(t, 0, t.rank, t.layer, t.samples, self.tp_parts, self.tp_size, *extra, t.cp_rank,
                               t.cp_size)
        if isinstance(t, WeightGrad):  # an ExpertGrad: the same, of its experts
            return t.__class__(t, 0, t.rank, t.layer, self.samples, t.shards, t.num_shards, t.tp_rank, t.tp_size,
                               t.experts)
        return t.__class__(t, 0, t.rank, t.layer, t.samples, self.tp_parts, self.tp_size)


def unfit(op: str, t: Tensor) -> bool:
    """Can `op` not take `t`? (`explain_input` says why.)"""
    cls = t.__class__
    if op == "all_reduce":
        return cls is Weight or cls is OptState or ((cls is Activation or cls is ActivationGrad) and not t.is_partial) \
            or cls is KVBlock or (cls in CONTEXT_HIDDEN and not t.is_partial)
    if op == "all_gather":
        if cls is ActivationSlice or cls is ActivationGradSlice or cls is ContextActivationGradSlice \
                or cls is ContextActivationSlice:
            return False
        if cls is KVBlock:  # a CP rank's keys and values (Llama 3's all-gather)
            return t.grad or t.parts == full_mask(t.cp_size)
        return not (cls is Weight or cls is OptState or cls is WeightGrad or cls is ExpertWeight) or t.is_complete
    if cls is KVBlock:  # the gradients of every rank's keys and values, each summed at its owner
        return not t.grad or t.parts != full_mask(t.cp_size)
    # a layer's gradient, a CP rank's sequence parts of it (sharded over dp x cp: `_scattered_parts`), or an
    # expert's (the distributed optimizer's, over the expert-data-parallel group)
    return (cls is not WeightGrad and cls is not ContextWeightGrad and cls is not ExpertGrad) or not t.is_complete


def explain_input(op: str, t: Any, group: Group, rank: int) -> None:
    """Reject tensors an op cannot take, with the fix in the message."""
    where = f"rank {rank} {op}(layer {getattr(t, 'layer', '?')})"
    if not isinstance(t, Tensor):
        raise TensorError(f"{where}: expected a tensor, got {type(t).__name__}")
    if t.rank != rank:
        raise TensorError(f"{where}: {t!r} lives on rank {t.rank}, not here")
    if rank not in group.index:
        raise TensorError(f"{where}: rank {rank} is not a member of group {list(group.ranks)}")
    if op == "all_reduce":
        if isinstance(t, (Weight, OptState)):
            raise TensorError(f"{where}: all_reduce of a {type(t).__name__}; reduce gradients (WeightGrad) "
                              f"instead, or all_gather ZeRO shards")
        raise TensorError(f"{where}: {t!r} is complete; only tensor-parallel partial sums need all_reduce")
    if op == "all_gather":
        if not isinstance(t, (Weight, OptState, WeightGrad)):
            raise TensorError(f"{where}: all_gather takes ZeRO shards of weights or gradients, or TP pieces of "
                              f"an activation (split_tp), got {t!r}")
        raise TensorError(f"{where}: {t!r} is already complete; nothing to gather")
    if not isinstance(t, WeightGrad):
        raise TensorError(f"{where}: reduce_scatter takes a WeightGrad, got {t!r}")
    raise TensorError(f"{where}: reduce_scatter needs the full gradient of the layer, got {t!r}")


def check_match(coll: Collective, op: str, t: Tensor, rank: int) -> None:
    first = coll.first
    f = first.input  # type: ignore[union-attr]
    if op == coll.op and type(t) is type(f) and t.layer == f.layer and t.nbytes == f.nbytes:
        return
    other = first.rank  # type: ignore[union-attr]
    head = f"collective #{coll.seq} on group {list(coll.group.ranks)}"
    if op != coll.op:
        raise CollectiveMismatchError(f"{head}: rank {other} issued {coll.op}({f!r}) but rank {rank} issued "
                                      f"{op}({t!r}) at the same position")
    raise CollectiveMismatchError(f"{head}: {op} tensors differ: rank {other} gave {f!r} "
                                  f"({f.nbytes} bytes), rank {rank} gave {t!r} ({t.nbytes} bytes)")


def combine(engine: Engine, coll: Collective, inputs: list[Tensor]) -> tuple[list[Any], int, str]:
    """The per-member results of a collective (tensors, or for an all-reduce one shared `Reduced`),
    the bytes its cost is based on, and a label."""
    op, ranks, works = coll.op, coll.group.ranks, coll.works
    head = coll  # formatted only in an error message
    if op == "all_reduce":
        reduced, nbytes, label = summed(coll, inputs)
        return [reduced] * len(inputs), nbytes, label
    _same_tp_slice(coll, inputs)
    first = inputs[0]
    if first.__class__ is ExpertGrad or first.__class__ is ExpertWeight:  # the distributed optimizer's experts
        if len({t.experts for t in inputs}) > 1:
            raise CollectiveMismatchError(f"{head}: members hold different experts "
                                          f"{ {r: describe_mask(t.experts) for r, t in zip(ranks, inputs)} }; "
                                          f"{op} an expert's tensors among the ranks that hold that expert")
    if first.__class__ is KVBlock:
        return _kv_blocks(coll, op, inputs)
    if op == "all_gather" and first.__class__ in (ActivationSlice, ActivationGradSlice, ContextActivationGradSlice,
                                                   ContextActivationSlice):
        if len({t.samples for t in inputs}) > 1 or len({t.tp_size for t in inputs}) > 1 \
                or len({(t.__class__, getattr(t, "cp_rank", None), getattr(t, "cp_size", None)) for t in inputs}) > 1:
            raise CollectiveMismatchError(f"{head}: TP pieces of different samples, piece counts or sequence parts: "
                                          f"{ {r: t for r, t in zip(ranks, inputs)} }")
        if first.tp_size != len(inputs):
            raise CollectiveMismatchError(f"{head}: pieces of {first.tp_size} gathered by {len(inputs)} ranks; "
                                          f"gather in a group of {first.tp_size}, one piece each")
        _disjoint_union(head, "TP pieces", ranks, [t.tp_parts for t in inputs], "a piece is held twice")
        results = [w.result for w in works]  # allocated at issue as the whole tensor
        return results, results[0].nbytes, f"{first.kind}s (TP gather)"
    if op == "all_gather":
        if len({t.num_shards for t in inputs}) > 1 or len({getattr(t, "step", 0) for t in inputs}) > 1 \
                or len({t.samples for t in inputs}) > 1:
            raise CollectiveMismatchError(f"{head}: shards disagree in num_shards, step or samples: "
                                          f"{ {r: t for r, t in zip(ranks, inputs)} }")
        shards = _disjoint_union(head, "shards", ranks, [t.shards for t in inputs], "a shard is held twice")
        num_shards = first.num_shards
        if shards == full_mask(num_shards):  # complete tensors are always 1 shard of 1
            shards, num_shards = 1, 1
        results = [w.result for w in works]  # allocated at issue as copies of the inputs
        for out in results:
            out.shards, out.num_shards = shards, num_shards
        return results, results[0].nbytes, first.kind
    # reduce_scatter: sum complete gradients of disjoint samples, keep shard i on member i
    if first.__class__ is ContextWeightGrad:
        samples = _scattered_parts(coll, inputs)
    else:
        samples = _disjoint_union(head, "samples", ranks, [t.samples for t in inputs],
                                  "a sample's gradient would be counted twice")
    p = len(inputs)
    results = [w.result for w in works]  # allocated at issue as copies of the inputs
    for i, out in enumerate(results):
        out.samples, out.shards, out.num_shards = samples, 1 << i, p
    return results, first.nbytes, first.kind


def _same_tp_slice(head: Collective, inputs: list[Tensor]) -> None:
    """Members reducing or gathering a layer's parameters (or their gradients) hold one TP slice."""
    if isinstance(inputs[0], (Weight, OptState, WeightGrad)):
        if len({(t.tp_rank, t.tp_size) for t in inputs}) > 1:
            slices = {r: (t.tp_rank, t.tp_size) for r, t in zip(head.group.ranks, inputs)}
            raise CollectiveMismatchError(f"{head}: members hold different tensor-parallel slices "
                                          f"{slices}; reduce within one TP slice")


def summed(coll: Collective, inputs: list[Tensor]) -> tuple[Reduced, int, str]:
    """What the members' inputs to a sum (an all-reduce, or a reduce to one root) add up to, the bytes the
    cost is based on, and a label: gradients of disjoint samples, or TP partial sums of one split."""
    head, ranks = coll, coll.group.ranks  # (the collective is formatted only in an error message)
    _same_tp_slice(coll, inputs)
    first = inputs[0]
    if first.__class__ is ContextWeightGrad:
        return _summed_sequence_parts(coll, inputs)
    if isinstance(first, WeightGrad):
        samples = _disjoint_union(head, "samples", ranks, [t.samples for t in inputs],
                                  "a sample's gradient would be counted twice")
        if len({getattr(t, "experts", None) for t in inputs}) > 1:
            raise CollectiveMismatchError(f"{head}: members hold gradients of different experts "
                                          f"{ {r: describe_mask(getattr(t, 'experts', 0)) for r, t in zip(ranks, inputs)} }; "
                                          f"reduce an expert's gradient among the ranks that hold that expert")
        shards = {(t.shards, t.num_shards) for t in inputs}
        if len(shards) > 1:
            raise CollectiveMismatchError(f"{head}: members hold different ZeRO shards; "
                                          f"all-reduce the same shard on every member")
        return Reduced(samples), first.nbytes, first.kind
    # tensor-parallel partial sums of one activation (or its gradient)
    if len({t.samples for t in inputs}) > 1:
        raise CollectiveMismatchError(f"{head}: partial sums of different samples "
                                      f"{ {r: describe_mask(t.samples) for r, t in zip(ranks, inputs)} }")
    if len({t.tp_size for t in inputs}) > 1:  # (a part of 2 and a part of 64 are not halves of one sum)
        raise CollectiveMismatchError(f"{head}: partial sums of different tensor-parallel degrees "
                                      f"{ {r: t.tp_size for r, t in zip(ranks, inputs)} }; all-reduce the "
                                      f"parts of one TP split")
    parts = _disjoint_union(head, "tensor-parallel parts", ranks, [t.tp_parts for t in inputs],
                            "a partial sum would be added twice")
    tp_size = first.tp_size
    if parts == full_mask(tp_size):
        parts, tp_size = 1, 1
    return Reduced(first.samples, parts, tp_size), first.nbytes, f"{first.kind} (TP partial sums)"


def _summed_sequence_parts(coll: Collective, inputs: list[Tensor]) -> tuple[Reduced, int, str]:
    """Gradients of (samples x sequence parts) rectangles: no sample's part may be counted twice, and the sum
    must be whole rectangle again (the union of the samples, each with the union of the parts), as the
    all-reduce over dp x cp ranks of Megatron-Core makes it. The `Reduced` carries the parts in `tp_parts`."""
    head, ranks = coll, coll.group.ranks
    first = inputs[0]
    if len({(t.cp_size, t.shards, t.num_shards) for t in inputs}) > 1:
        raise CollectiveMismatchError(f"{head}: members hold gradients of different ZeRO shards or CP splits "
                                      f"{ {r: t for r, t in zip(ranks, inputs)} }")
    samples, parts, area = 0, 0, 0
    for k, t in enumerate(inputs):
        for other, o in zip(ranks[:k], inputs[:k]):
            if t.samples & o.samples and t.seq_parts & o.seq_parts:
                raise CollectiveMismatchError(
                    f"{head}: ranks {other} and {ranks[k]} both hold the gradient of samples "
                    f"{describe_mask(t.samples & o.samples)}, sequence parts {describe_mask(t.seq_parts & o.seq_parts)}; "
                    f"a sample's gradient would be counted twice")
        samples, parts = samples | t.samples, parts | t.seq_parts
        area += t.samples.bit_count() * t.seq_parts.bit_count()
    if area != samples.bit_count() * parts.bit_count():
        raise CollectiveMismatchError(f"{head}: the members' gradients cover some samples with fewer sequence parts "
                                      f"than others { {r: t for r, t in zip(ranks, inputs)} }; reduce every CP rank "
                                      f"of each data-parallel replica together (dp x cp)")
    return Reduced(samples, parts, first.cp_size), first.nbytes, f"{first.kind}"


def _scattered_parts(coll: Collective, inputs: list[Tensor]) -> int:
    """The samples a reduce-scatter of CP ranks' sequence parts (`ContextWeightGrad`) sums to: the members
    must hold every sequence part of each of their samples, as the dp x cp group of Megatron-Core's
    distributed optimizer and of torchtitan's FSDP mesh (`dp_shard_cp`) does, since each keeps a shard of a
    whole gradient (a plain `WeightGrad`, allocated so at issue)."""
    reduced, _, _ = _summed_sequence_parts(coll, inputs)
    if reduced.tp_parts != full_mask(reduced.tp_size):
        raise CollectiveMismatchError(f"{coll}: reduce_scatter of sequence parts {describe_mask(reduced.tp_parts)} "
                                      f"of {reduced.tp_size} only; a shard is of a whole gradient: reduce-scatter "
                                      f"over every CP rank of each data-parallel replica (dp x cp)")
    return reduced.samples


def _kv_blocks(coll: Collective, op: str, inputs: list[Tensor]) -> tuple[list[Any], int, str]:
    """Llama 3's context parallelism: the CP ranks all-gather their key/value blocks (each its own part) and
    reduce-scatter their gradients (each keeps its own part, the sum of every rank's)."""
    head, ranks, first = coll, coll.group.ranks, inputs[0]
    if len({(t.layer, t.samples, t.cp_size, t.tp_rank, t.tp_size) for t in inputs}) > 1 \
            or first.cp_size != len(inputs):
        raise CollectiveMismatchError(f"{head}: key/value blocks of different layers, samples or CP splits, or a "
                                      f"group that is not the CP group: { {r: t for r, t in zip(ranks, inputs)} }")
    results = [w.result for w in coll.works]  # allocated at issue
    if op == "all_gather":
        parts = _disjoint_union(head, "sequence parts", ranks, [t.parts for t in inputs], "a part is held twice")
        for out in results:
            out.parts = parts
        return results, results[0].nbytes, f"{first.kind}s (CP gather)"
    for i, out in enumerate(results):
        out.parts = 1 << i
    return results, first.nbytes, f"{first.kind} gradients (CP reduce-scatter)"


def _disjoint_union(head: Collective, what: str, ranks: tuple[int, ...], masks: list[int], why: str) -> int:
    union = 0
    for m in masks:
        if union & m:
            pair, clash = _first_clash(ranks, masks)
            raise CollectiveMismatchError(f"{head}: {pair} both hold {what} {clash}; {why}")
        union |= m
    return union


def _first_clash(ranks: tuple[int, ...], masks: list[int]) -> tuple[str, str]:
    """('ranks 0 and 3', '4-5'): the first member whose mask overlaps an earlier member's, with whom,
    and the bits they share."""
    union = 0
    for r, m in zip(ranks, masks):
        clash = union & m
        if clash:
            other = next(o for o, om in zip(ranks, masks) if om & clash)
            return f"ranks {other} and {r}", describe_mask(clash)
        union |= m
    return "", ""

"""What broadcast, reduce, barrier and all-to-all do to tensors (their timing: `other_collectives.py`).

* `broadcast(x, root)`: the root gives a tensor, every other member gives None and receives a copy of it
  (a new buffer on the receiver, as a received message is).
* `reduce(x, root)`: the members give what an all-reduce takes (gradients of disjoint samples, or TP
  partial sums of one split) and the root ends with their sum, in place; the others end with nothing.
* `barrier()`: no tensor; it ends once every member issued it.
* `all_to_all(pieces)`: member i gives one tensor (or None) per member, in the group's order, `pieces[j]`
  addressed to member j (uneven: any sizes, any samples; a sample may go to several members, as a token
  routed to k experts does); it receives, from each member j, a copy of what j addressed to it. A member
  may say what it expects from each member (`expect`, per member the samples or None), and the pieces
  addressed to it must be exactly those: a piece sent to the wrong member, or of other samples, is a
  `CollectiveMismatchError` naming both ranks; for MoE token pieces it may also say the experts each
  piece must hold (`expect_experts`), so a token sent to the wrong expert rank is caught there. The pieces of one all-to-all are tensors of one kind and
  layer, on every member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dist_lib.comm.rules import summed, unfit
from dist_lib.errors import CollectiveMismatchError, TensorError
from dist_lib.tensors import Tensor, describe_mask

if TYPE_CHECKING:
    from dist_lib.comm.groups import Collective, Group

OTHER_COLLECTIVES = ("broadcast", "reduce", "barrier", "all_to_all")


class Pieces(tuple):
    """What one member gives an all-to-all: a tensor or None per member of the group, in its order."""

    __slots__ = ()

    @property
    def _first(self) -> Tensor | None:
        return next((t for t in self if t is not None), None)

    @property
    def kind(self) -> str:
        first = self._first
        return f"{first.kind} pieces" if first is not None else "no pieces"

    @property
    def layer(self) -> int:
        first = self._first
        return first.layer if first is not None else -1

    @property
    def samples(self) -> int:
        """Every sample the member sends somewhere."""
        mask = 0
        for t in self:
            if t is not None:
                mask |= t.samples
        return mask

    def __repr__(self) -> str:
        return f"Pieces({list(self)!r})"


def check_rooted(op: str, x: Any, root: Any, group: Group, rank: int) -> None:
    """A member's side of a broadcast or reduce, checked as it issues it."""
    where = f"rank {rank} {op}(root {root!r})"
    if isinstance(root, bool) or not isinstance(root, int) or root not in group.index:
        raise TensorError(f"{where}: the root must be a member of group {list(group.ranks)}, given as its rank")
    if op == "broadcast":
        if rank == root and not isinstance(x, Tensor):
            raise TensorError(f"{where}: the root gives the tensor to broadcast, got {x!r}")
        if rank != root and x is not None:
            raise TensorError(f"{where}: only the root (rank {root}) gives a tensor; the others pass None and "
                              f"receive the root's, got {x!r}")
    elif not isinstance(x, Tensor) or unfit("all_reduce", x):
        raise TensorError(f"{where}: reduce sums gradients (WeightGrad) of disjoint samples or tensor-parallel "
                          f"partial sums, as all_reduce does; got {x!r}")
    if x is not None and x.rank != rank:
        raise TensorError(f"{where}: {x!r} lives on rank {x.rank}, not here")


def check_pieces(pieces: Any, group: Group, rank: int) -> Pieces:
    """A member's pieces for an all-to-all: one per member, tensors of this rank of one kind and layer."""
    where = f"rank {rank} all_to_all"
    if not isinstance(pieces, (list, tuple)) or len(pieces) != group.size:
        raise TensorError(f"{where}: give a list of {group.size} pieces (a tensor or None for each member of "
                          f"group {list(group.ranks)}, in its order), got {pieces!r}")
    first = None
    for j, t in enumerate(pieces):
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TensorError(f"{where}: piece {j} (for rank {group.ranks[j]}) is not a tensor: {t!r}")
        if t.rank != rank:
            raise TensorError(f"{where}: piece {j} {t!r} lives on rank {t.rank}, not here")
        if first is None:
            first = t
        elif t.__class__ is not first.__class__ or t.layer != first.layer:
            raise TensorError(f"{where}: pieces {first!r} and {t!r} differ in kind or layer; one all_to_all "
                              f"moves pieces of one tensor kind and layer")
    return Pieces(pieces)


def check_match_other(coll: Collective, op: str, root: Any, rank: int, given: Any) -> None:
    """A member issued `op` at the position of `coll` on its group: the same op, with the same root."""
    first = coll.first
    head = f"collective #{coll.seq} on group {list(coll.group.ranks)}"
    if op != coll.op:
        raise CollectiveMismatchError(f"{head}: rank {first.rank} issued {coll.op}({first.input!r}) but rank "
                                      f"{rank} issued {op}({given!r}) at the same position")
    if root != getattr(coll, "root", None):
        raise CollectiveMismatchError(f"{head}: {op} roots differ: rank {first.rank} named root {coll.root}, "
                                      f"rank {rank} named root {root}")


def combine_other(coll: Collective, inputs: list[Any], expect: list[Any]) -> tuple[list[Any], int, str]:
    """Each member's result (a tensor, a `Reduced`, a list of received pieces, or None; a copy to make on
    its receiver is given as the tensor it copies, marked by `arrivals`), the bytes the cost is based on,
    and a label."""
    op, ranks = coll.op, coll.group.ranks
    if op == "barrier":
        return [None] * len(inputs), 0, "barrier"
    if op == "broadcast":
        x = inputs[coll.group.index[coll.root]]
        return [x] * len(inputs), x.nbytes, x.kind
    if op == "reduce":
        _same_kind(coll, inputs)
        reduced, nbytes, label = summed(coll, inputs)
        root = coll.group.index[coll.root]
        return [reduced if i == root else None for i in range(len(inputs))], nbytes, label
    # all_to_all: member i receives, from each j, what j addressed to it
    kinds = {(t.__class__, t.layer) for pieces in inputs for t in pieces if t is not None}
    if len(kinds) > 1:
        given = {r: pieces.kind + f" of layer {pieces.layer}" for r, pieces in zip(ranks, inputs) if pieces._first}
        raise CollectiveMismatchError(f"{coll}: members give pieces of different kinds or layers {given}; one "
                                      f"all_to_all moves pieces of one tensor kind and layer")
    received = [[pieces[i] for pieces in inputs] for i in range(len(inputs))]
    for i, wanted in enumerate(expect):
        if wanted is None:
            continue
        for j, ((mask, experts), piece) in enumerate(zip(wanted, received[i])):
            if experts is not None and getattr(piece, "experts", None) != experts:
                what = "nothing" if piece is None else f"{piece!r}"
                raise CollectiveMismatchError(
                    f"{coll}: rank {ranks[i]} expects from rank {ranks[j]} the tokens of experts "
                    f"{describe_mask(experts)}, but rank {ranks[j]} addressed {what} to it (piece {i} of its list): "
                    f"tokens sent to the wrong expert rank")
            if mask is None:
                continue
            got = 0 if piece is None else piece.samples
            if got != mask or (mask == 0 and piece is not None):
                what = "nothing" if piece is None else f"{piece!r} (samples {describe_mask(got)})"
                raise CollectiveMismatchError(
                    f"{coll}: rank {ranks[i]} expects samples {describe_mask(mask)} from rank {ranks[j]}, but rank "
                    f"{ranks[j]} addressed {what} to it (piece {i} of its list); a piece goes to the member at "
                    f"its place in the list")
    label = next((p.kind for p in inputs if p._first is not None), "no pieces")
    return received, 0, label


def _same_kind(coll: Collective, inputs: list[Tensor]) -> None:
    first = inputs[0]
    for r, t in zip(coll.group.ranks, inputs):
        if t.__class__ is not first.__class__ or t.layer != first.layer or t.nbytes != first.nbytes:
            raise CollectiveMismatchError(f"{coll}: reduce tensors differ: rank {coll.group.ranks[0]} gave "
                                          f"{first!r} ({first.nbytes} bytes), rank {r} gave {t!r} "
                                          f"({t.nbytes} bytes)")

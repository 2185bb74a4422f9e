"""`expert_backward` of `MoEModel`: the local experts' backward, piece by piece or as one grouped GEMM.

Megatron-Core's `TEGroupedMLP` runs the backward of a rank's local experts as one grouped GEMM pass (the
input gradient grouped, the weight gradient grouped; Transformer Engine's `GroupedLinear`) over every token
the rank received from its EP peers, as its forward ran them: autograd runs the backward of the one grouped
forward call. So `expert_backward` takes either

    expert_backward(layer, tokens, grad, weight)      -> (expert gradient, input gradient)        one piece
    expert_backward(layer, [tokens...], [grad...], weight) -> (expert gradient, [input gradient...])  grouped

The grouped form takes the pieces an `expert_forward` took (every one of them: a piece left out is refused
at the op, naming its samples), with each piece's output gradient in the same order, and times them as one
grouped GEMM a pass (`moe_ops.experts_cost` on the tokens of all pieces); its expert gradient holds the
tokens of every piece. The piece-wise form times each piece as its own grouped GEMM and stays for
strategies that interleave pieces with their exchange (`strategies/moe.py` keeps it).

Memory: as in the piece-wise op, the stashes the forward left on the pieces are freed when the op ends,
then the expert gradient (one buffer of the local experts' weight-gradient size) and each piece's input
gradient are allocated. Piece by piece, each call allocates an expert gradient of that size too, which
`ExpertGrad + ExpertGrad` folds into the running sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dist_lib.costs import moe_ops
from dist_lib.errors import TensorError
from dist_lib.memory.tracker import WEIGHT_BYTES
from dist_lib.model.expert_parts import collapse_mask, stash_fp8, stash_recomputes
from dist_lib.tensors import ExpertGrad, ExpertWeight, Tokens, describe_mask


def expert_counts(experts: int, tokens: Sequence[int]) -> str:
    """The trace's detail of an expert op: tokens per local expert."""
    chosen = [e for e in range(experts.bit_length()) if experts >> e & 1]
    return "tokens per expert: " + ", ".join(f"{e}: {n}" for e, n in zip(chosen, tokens))


class ExpertBackward:
    """The experts' backward side of `MoEModel` (which supplies the checks, `_advance`, the books and the
    forward groups `_groups`: the id of each live stash an `expert_forward` left -> its call's pieces, as
    stash id -> samples)."""

    __slots__ = ()
    rank: int
    device: Any
    workload: Any
    _mem: Any
    _books: Any
    _groups: dict[int, dict[int, int]]

    def _remember_group(self, pieces: Sequence[Tokens]) -> None:
        """The pieces one `expert_forward` stashed together, for the grouped backward's completeness check."""
        group = {id(t._stash): t.samples for t in pieces}
        groups = self._groups
        for key in group:
            groups[key] = group

    def expert_backward(self, layer: int, tokens: Tokens | Sequence[Tokens], grad: Tokens | Sequence[Tokens],
                        weight: ExpertWeight) -> tuple[ExpertGrad, Tokens | list[Tokens]]:
        """The local experts' backward: their weight gradient from the tokens given and the tokens' input
        gradient, consuming the stash `expert_forward` left on them. `tokens` one piece and `grad` its output
        gradient (returns one input gradient), or lists of the pieces an `expert_forward` took and their
        output gradients in the same order, run as one grouped GEMM (returns a list of input gradients)."""
        where = f"rank {self.rank} expert_backward(layer {layer})"
        self._check_experts_weight(weight, layer, where)  # type: ignore[attr-defined]
        grouped = tokens.__class__ in (list, tuple)
        pieces: list = list(tokens) if grouped else [tokens]  # type: ignore[arg-type]
        if grouped:
            if grad.__class__ not in (list, tuple) or len(grad) != len(pieces):  # type: ignore[arg-type]
                got = f"{len(grad)} gradients" if grad.__class__ in (list, tuple) else repr(grad)  # type: ignore
                raise TensorError(f"{where}: {len(pieces)} token pieces need their {len(pieces)} output gradients, "
                                  f"a list in the same order; got {got}")
            if not pieces:
                raise TensorError(f"{where}: no token pieces given")
            grads = list(grad)  # type: ignore[arg-type]
        else:
            grads = [grad]
        seen = 0
        for t, g in zip(pieces, grads):
            self._check_piece(layer, t, g, weight, where)
            if seen & t.samples:
                raise TensorError(f"{where}: samples {describe_mask(seen & t.samples)} appear in two pieces ({t!r}); "
                                  f"each token's gradient goes through its experts once")
            seen |= t.samples
        parts, fp8, again = pieces[0].parts, stash_fp8(pieces[0]._stash), stash_recomputes(pieces[0]._stash)
        for t in pieces:
            if stash_fp8(t._stash) != fp8 or t.parts != parts or stash_recomputes(t._stash) != again:
                raise TensorError(f"{where}: {t!r} and {pieces[0]!r} went through different expert_forward calls "
                                  f"(another FP8 recipe, sequence split or activation recompute); group the pieces "
                                  f"of one call")
        if grouped:
            self._check_whole_groups(pieces, where)
        counts = self._local_tokens(layer, pieces, weight.experts)  # type: ignore[attr-defined]
        seconds, flops = self._priced(moe_ops.experts_cost, tuple(counts), True, weight.tp_size, fp8)  # type: ignore
        if again:  # the activation again first (`recompute_activation`)
            seconds += moe_ops.activation_recompute(self.device, self.workload, sum(counts), weight.tp_size)
        self._advance("expert_backward", layer, collapse_mask(seen, parts), seconds, flops,  # type: ignore
                      detail=expert_counts(weight.experts, counts))
        groups = self._groups
        for t in pieces:
            group = groups.pop(id(t._stash), None)
            if group is not None:
                group.pop(id(t._stash), None)
            t._stash = None
        mem = self._mem
        mem.context = ("expert_backward", layer)
        params = weight.experts.bit_count() * self._books.expert_params // weight.tp_size
        nbytes = int(params * WEIGHT_BYTES * self.workload.grad_bytes_per_element / self.workload.bytes_per_element)
        shard = (weight.tp_rank, weight.tp_size)
        expert_grad = ExpertGrad(mem, nbytes, self.rank, layer, seen, 1, 1, *shard, weight.experts)
        outs = [Tokens(mem, t.nbytes, self.rank, layer, t.samples, t.experts, "input grad", t.parts,
                       1 << weight.tp_rank, weight.tp_size) for t in pieces]
        return expert_grad, (outs if grouped else outs[0])

    def _check_piece(self, layer: int, tokens: Any, grad: Any, weight: ExpertWeight, where: str) -> None:
        """One piece of an expert backward: stashed tokens of these experts (and expert-TP shard) and their
        output gradient, of the same samples."""
        self._check_tokens(tokens, layer, "dispatched", where)  # type: ignore[attr-defined]
        self._check_tokens(grad, layer, "output grad", where)  # type: ignore[attr-defined]
        if tokens._stash is None:
            raise TensorError(f"{where}: {tokens!r} carries no stash: expert_forward has not run on it, or its "
                              f"backward already did")
        if (grad.samples, grad.experts) != (tokens.samples, tokens.experts) or tokens.experts != weight.experts \
                or (tokens._stash.tp_rank, tokens._stash.tp_size) != (weight.tp_rank, weight.tp_size):
            raise TensorError(f"{where}: gradient {grad!r}, tokens {tokens!r} and weight {weight!r} must be of the "
                              f"same samples and experts (and expert-TP shard)")

    def _check_whole_groups(self, pieces: Sequence[Tokens], where: str) -> None:
        """A grouped backward takes every piece still to go back of each `expert_forward` call it touches:
        autograd runs the grouped forward's backward over all its tokens (a piece left out would never reach
        its experts' gradient, nor its sender)."""
        given = {id(t._stash) for t in pieces}
        touched = {id(group): group for group in map(self._groups.get, given) if group is not None}
        missing = 0
        for group in touched.values():
            for key, samples in group.items():
                if key not in given:
                    missing |= samples
        if missing:
            raise TensorError(f"{where}: the pieces of samples {describe_mask(missing)} went through expert_forward "
                              f"with these but are not given; a grouped backward takes every piece its forward "
                              f"took, each with its output gradient")

"""`Model.broadcast`, `Model.reduce`, `Model.barrier` and `Model.all_to_all`: the collectives beside
all_reduce, all_gather and reduce_scatter (what they do: `comm/other_rules.py`; their time and memory:
`comm/other_collectives.py`). A mixin of `Model`; the C accelerator has no twin of them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dist_lib.comm.collectives import Work
from dist_lib.comm.groups import Group
from dist_lib.comm.other_collectives import issue_other
from dist_lib.comm.other_rules import check_pieces, check_rooted
from dist_lib.costs.other_collectives import probs_bytes
from dist_lib.errors import TensorError
from dist_lib.model.expert_parts import run_mask
from dist_lib.tensors import Tokens, samples_mask

if TYPE_CHECKING:
    from dist_lib.engine.core import Engine
    from dist_lib.engine.rank_state import RankState


DISPATCHERS = ("alltoall", "deepep", "hybridep")  # Megatron-Core's alltoall, and its flex dispatcher's backends
PROBS_STAGES = ("dispatched", "input grad")  # the token pieces whose probabilities go with them (`probs`)


class OtherCollectiveOps:
    """The ops of this module, on a `Model` (which supplies the engine, the rank and group resolution)."""

    __slots__ = ()
    _engine: Engine
    _state: RankState
    rank: int
    global_batch_size: int

    def broadcast(self, x: Any, root: int, group: Group | Iterable[int] | None = None) -> Work:
        """Send the root's tensor to every member of `group` (default: all ranks). The root (a rank of the
        group) gives `x`; every other member passes None and, awaiting the work, gets a copy of it (allocated
        on the receiver when the broadcast ends). Costs n/B over NCCL's pipelined ring."""
        where = f"rank {self.rank} broadcast"
        self._check_given(x, where)  # type: ignore[attr-defined]
        resolved = self._resolve_group(group, "broadcast")  # type: ignore[attr-defined]
        check_rooted("broadcast", x, root, resolved, self.rank)
        return issue_other(self._engine, self._state, "broadcast", x, resolved, root)

    def reduce(self, x: Any, root: int, group: Group | Iterable[int] | None = None) -> Work:
        """Sum what every member of `group` gives (gradients of disjoint samples, or TP partial sums, as for
        all_reduce) onto the root, in place: the root's work returns the sum, the others' return None.
        Costs n/B over NCCL's pipelined ring."""
        where = f"rank {self.rank} reduce"
        self._check_given(x, where)  # type: ignore[attr-defined]
        resolved = self._resolve_group(group, "reduce")  # type: ignore[attr-defined]
        check_rooted("reduce", x, root, resolved, self.rank)
        return issue_other(self._engine, self._state, "reduce", x, resolved, root)

    def barrier(self, group: Group | Iterable[int] | None = None) -> Work:
        """A work that ends once every member of `group` issued it (and the group's earlier ops ended);
        it returns None. Costs the all-reduce of one float32, as PyTorch's NCCL barrier runs it."""
        resolved = self._resolve_group(group, "barrier")  # type: ignore[attr-defined]
        return issue_other(self._engine, self._state, "barrier", None, resolved)

    def all_to_all(self, pieces: list, group: Group | Iterable[int] | None = None, *,
                   expect: list | None = None, expect_experts: list | None = None,
                   dispatcher: str = "alltoall", probs: bool = False) -> Work:
        """Exchange pieces with every member of `group`: `pieces[j]` (a tensor of this rank, or None) goes to
        the group's j-th member; sizes may differ. Awaiting the work returns a list whose j-th entry is a copy
        of what member j addressed here (or None), allocated when the exchange ends. All pieces are tensors
        of one kind and layer (e.g. the rows of an activation cut with `split_samples`, which `join_samples`
        puts together again). `expect`, optional, says what this rank must receive: per member, the sample
        indices (a range or iterable) or None for nothing; a member that addresses anything else here is a
        `CollectiveMismatchError` at the op. `expect_experts`, optional, does the same for the token pieces of
        an MoE layer (`Tokens`): per member, the experts its piece must hold (or None, unchecked), so a token
        sent to the rank of other experts is caught here. `dispatcher`, for the token pieces of an MoE layer:
        "alltoall" (each piece sent directly, as NCCL's all-to-all does) or "deepep" / "hybridep" (Megatron-Core's
        flex dispatcher backends: each token crosses to another node once and is forwarded there over NVLink,
        `costs.hierarchical_dispatch`); the same exchange, on other links. `probs=True`, with the flat dispatcher's
        token pieces on their way to the experts (`Tokens` dispatched) or their input gradients on the way back:
        the routing probabilities of those token copies go too, as a second all-to-all after the tokens' over the
        same peers (`probs_bytes`)."""
        resolved = self._resolve_group(group, "all_to_all")  # type: ignore[attr-defined]
        if isinstance(pieces, (list, tuple)):
            for t in pieces:
                self._check_given(t, f"rank {self.rank} all_to_all")  # type: ignore[attr-defined]
        given = check_pieces(pieces, resolved, self.rank)
        samples = None if expect is None else self._expected(expect, resolved)
        experts = None if expect_experts is None else self._expected_experts(expect_experts, resolved)
        wanted = None if samples is None and experts is None else list(zip(
            samples or [None] * resolved.size, experts or [None] * resolved.size))
        relay = self._dispatcher(dispatcher, given)
        shares = self._probs(probs, dispatcher, given)
        return issue_other(self._engine, self._state, "all_to_all", given, resolved, expect=wanted, relay=relay,
                           probs=shares)

    def _probs(self, probs: Any, dispatcher: Any, pieces: Any) -> tuple[int, int] | None:
        """`all_to_all`'s `probs` as `issue_other` takes it: None, or (the bytes of one routing probability, the
        bytes of one token copy) for pricing the probabilities' exchange (`probs_bytes`)."""
        where = f"rank {self.rank} all_to_all"
        if probs is not True and probs is not False:
            raise TensorError(f"{where}: probs must be True or False, got {probs!r}")
        if not probs:
            return None
        if dispatcher != "alltoall":
            raise TensorError(f"{where}: probs=True is the flat all-to-all dispatcher's exchange of the routing "
                              f"probabilities; dispatcher={dispatcher!r} carries them in its own exchange")
        other = next((t for t in pieces if t is not None and (type(t) is not Tokens or t.stage not in PROBS_STAGES)),
                     None)
        if getattr(self, "moe", None) is None or other is not None:
            raise TensorError(f"{where}: probs=True goes with the token pieces of an MoE layer sent to their experts "
                              f"or their input gradients coming back (Tokens {' or '.join(PROBS_STAGES)}), not "
                              f"{other!r}")
        w = self.workload  # type: ignore[attr-defined]
        return probs_bytes(w), w.hidden * w.bytes_per_element

    def _dispatcher(self, dispatcher: Any, pieces: Any) -> Any:
        """`all_to_all`'s dispatcher as `issue_other` takes it: None for the flat all-to-all, else its name and
        the distinct-token bytes of a list of token pieces."""
        where = f"rank {self.rank} all_to_all"
        if dispatcher not in DISPATCHERS:
            raise TensorError(f"{where}: dispatcher must be one of {', '.join(map(repr, DISPATCHERS))}, got "
                              f"{dispatcher!r}")
        if dispatcher == "alltoall":
            return None
        moe = getattr(self, "moe", None)
        other = next((t for t in pieces if t is not None and type(t) is not Tokens), None)
        if moe is None or other is not None:
            raise TensorError(f"{where}: dispatcher={dispatcher!r} moves the token pieces of an MoE layer (Tokens), "
                              f"not {other!r}")
        if moe.capacity_factor:
            raise TensorError(f"{where}: dispatcher={dispatcher!r} is dropless (Megatron-Core refuses its flex "
                              f"dispatcher with moe_pad_expert_input_to_capacity); the workload's capacity_factor "
                              f"is {moe.capacity_factor:g}")
        return dispatcher, self._relayed_bytes

    def _relayed_bytes(self, pieces: list) -> int:
        """The bytes of the distinct tokens among token pieces of one owner's tokens (`costs.hierarchical_dispatch`)."""
        samples = experts = 0
        for t in pieces:
            samples |= t.samples
            experts |= t.experts
        first = pieces[0]
        return self._distinct_bytes(first.layer, samples, experts, first.parts)  # type: ignore[attr-defined]

    def _expected(self, expect: Any, group: Group) -> list[int]:
        """`expect` as one samples mask per member (0: nothing)."""
        where = f"rank {self.rank} all_to_all"
        if not isinstance(expect, (list, tuple)) or len(expect) != group.size:
            raise TensorError(f"{where}: expect is a list of {group.size} entries (the samples, or None, this rank "
                              f"receives from each member of group {list(group.ranks)}), got {expect!r}")
        masks = []
        for j, samples in enumerate(expect):
            if samples is None:
                masks.append(0)
                continue
            try:
                masks.append(samples_mask(samples, self.global_batch_size))
            except (TypeError, ValueError) as exc:
                raise TensorError(f"{where}: expect[{j}] (from rank {group.ranks[j]}): {exc}") from None
        return masks

    def _expected_experts(self, expect: Any, group: Group) -> list[int | None]:
        """`expect_experts` as one experts mask per member (None: unchecked)."""
        where = f"rank {self.rank} all_to_all"
        count = getattr(getattr(self, "moe", None), "experts", 0)
        if not count:
            raise TensorError(f"{where}: expect_experts is for the token pieces of a mixture-of-experts workload")
        if not isinstance(expect, (list, tuple)) or len(expect) != group.size:
            raise TensorError(f"{where}: expect_experts is a list of {group.size} entries (the experts, or None, of "
                              f"the piece each member of group {list(group.ranks)} sends here), got {expect!r}")
        masks: list[int | None] = []
        for j, experts in enumerate(expect):
            if experts is None:
                masks.append(None)
                continue
            mask = run_mask(experts, count)
            if mask:
                masks.append(mask)
                continue
            try:
                for e in experts:
                    if e.__class__ is not int or not 0 <= e < count or mask >> e & 1:
                        raise ValueError
                    mask |= 1 << e
            except (TypeError, ValueError):
                raise TensorError(f"{where}: expect_experts[{j}] (from rank {group.ranks[j]}) must be distinct expert "
                                  f"numbers in 0..{count - 1}, got {experts!r}") from None
            if not mask:
                raise TensorError(f"{where}: expect_experts[{j}] (from rank {group.ranks[j]}) names no expert; give "
                                  f"None to leave it unchecked")
            masks.append(mask)
        return masks

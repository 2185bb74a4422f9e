"""Expert parallelism's layout (EP groups over the data-parallel ranks) and the token exchange between an EP
group's ranks (the all-to-all of dispatch and combine, and the dispatcher that runs it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dist_lib import Model, Work

from ._layout import microbatches, replica_samples


@dataclass(frozen=True)
class ExpertLayout:
    """Where this rank's experts and peers are: EP groups of `ep` consecutive ranks (inside a node when `ep`
    divides the node, as Megatron-Core places them), each holding every expert once."""

    ep: int
    ep_group: tuple[int, ...]  # the ranks that exchange tokens, in order of the experts they hold
    expert_dp_group: tuple[int, ...]  # the ranks that hold this rank's experts
    my_experts: range
    moe_layers: tuple[int, ...]
    microbatches: tuple[range, ...]
    per_rank: int
    global_batch: int
    world: int
    microbatch_size: int

    @classmethod
    def build(cls, model: Model, ep: int | None, microbatch_size: int) -> ExpertLayout:
        moe = getattr(model, "moe", None)
        if moe is None:
            raise ValueError(f"workload {model.workload.name} has no experts; strategies/moe.py trains mixtures "
                             f"of experts (try mixtral-8x7b)")
        world = model.world_size
        if ep is None:  # every rank, or one expert group per rank when the experts are fewer
            ep = world if moe.experts % world == 0 else 1
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or world % ep or moe.experts % ep:
            raise ValueError(f"ep={ep!r} must be a whole number dividing both the {world} ranks and the "
                             f"{moe.experts} experts")
        first_peer = model.rank - model.rank % ep
        per_rank = moe.experts // ep
        index = model.rank % ep
        first, count = replica_samples(model.global_batch_size, world, model.rank)
        return cls(ep=ep, ep_group=tuple(range(first_peer, first_peer + ep)),
                   expert_dp_group=tuple(range(index, world, ep)),
                   my_experts=range(index * per_rank, (index + 1) * per_rank),
                   moe_layers=tuple(layer for layer in range(model.num_layers) if moe.is_moe(layer)),
                   microbatches=tuple(microbatches(first, count, microbatch_size)), per_rank=per_rank,
                   global_batch=model.global_batch_size, world=world, microbatch_size=microbatch_size)

    def samples_of(self, peer: int, index: int) -> range:
        """The samples of microbatch `index` of EP peer `peer` (its own replica's share, cut the same way)."""
        first, count = replica_samples(self.global_batch, self.world, peer)
        return list(microbatches(first, count, self.microbatch_size))[index]

    def experts_of(self, peer: int) -> range:
        i = self.ep_group.index(peer)
        return range(i * self.per_rank, (i + 1) * self.per_rank)


def exchange(model: Model, pieces: Sequence, group: Sequence[int], *, samples: Sequence,
             experts: Sequence, **how: str) -> Work:
    """The all-to-all of a dispatch or a combine: `pieces[i]` goes to `group[i]`, and this rank receives, from
    each member j, the tokens of `samples[j]` for the experts `experts[j]` (checked at the op, so a token sent
    to the wrong expert rank fails there). Returns the work; awaiting it gives the received pieces in group
    order. NCCL runs it as grouped sends and receives, each pair's message sharing the links; with
    `dispatcher=` "deepep" or "hybridep", each token crosses to another node once (`Model.all_to_all`)."""
    return model.all_to_all(list(pieces), list(group), expect=list(samples), expect_experts=list(experts), **how)


DISPATCHERS = ("alltoall", "deepep", "hybridep")


def check_dispatcher(dispatcher: object, moe: object) -> None:
    """The `moe_dispatcher` of hybrid and moe.py: Megatron-Core's token dispatchers
    (megatron/core/transformer/transformer_config.py): "alltoall" (`--moe-token-dispatcher-type alltoall`), or
    the flex dispatcher with its DeepEP or HybridEP backend (`--moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep|hybridep`), which send a token once to each other node holding its
    experts and forward it there over NVLink (DeepSeek-AI 2024, arXiv 2412.19437 sec. 3.2.2;
    `dist_lib/costs/hierarchical_dispatch.py`). Both backends cost the same here."""
    if not isinstance(dispatcher, str) or dispatcher not in DISPATCHERS:
        raise ValueError(f"moe_dispatcher must be one of {', '.join(map(repr, DISPATCHERS))} (Megatron-Core's "
                         f"alltoall dispatcher, or its flex dispatcher's DeepEP or HybridEP backend), got "
                         f"{dispatcher!r}")
    capacity = getattr(moe, "capacity_factor", 0)
    if dispatcher != "alltoall" and capacity:
        raise ValueError(f"moe_dispatcher={dispatcher!r} is dropless: Megatron-Core refuses its flex dispatcher "
                         f"with moe_pad_expert_input_to_capacity; the workload's capacity_factor is {capacity:g} "
                         f"(use 0, or moe_dispatcher='alltoall')")

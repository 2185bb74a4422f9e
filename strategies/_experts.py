"""Expert parallelism's layout (EP groups over the data-parallel ranks) and the token exchange between an EP
group's ranks (the all-to-all of dispatch and combine)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from dist_lib import Model

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
                   microbatches=tuple(microbatches(first, count, microbatch_size)), per_rank=per_rank)

    def experts_of(self, peer: int) -> range:
        i = self.ep_group.index(peer)
        return range(i * self.per_rank, (i + 1) * self.per_rank)


def exchange(model: Model, pieces: Sequence, group: Sequence[int]) -> asyncio.Future:
    """Send `pieces[i]` to `group[i]` and receive one piece from each, in group order: the all-to-all of a
    dispatch or a combine, as NCCL runs it (grouped sends and receives; each pair's message on its own
    channel, sharing the links). Returns an awaitable of the received pieces (this rank's own piece stays)."""
    me = model.rank
    sends = [model.send(piece, peer) for piece, peer in zip(pieces, group) if peer != me]
    receives = [model.recv(peer) if peer != me else None for peer in group]
    own = [piece for piece, peer in zip(pieces, group) if peer == me]

    async def finish() -> list:
        received = []
        for work in receives:
            received.append(own[0] if work is None else await work)
        for work in sends:
            await work
        return received

    return finish()

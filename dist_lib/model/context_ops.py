"""Context parallelism (`Model.context_input`, `context_forward`, `context_backward`, `context_loss`): each of
a CP group's ranks holds s/cp tokens of every sample (`ContextActivation`), and a layer's attention runs its
queries against every rank's keys and values, which travel around the group (ring attention, Megatron-Core's
`--context-parallel-size`) or are all-gathered first (Llama 3, Dubey et al. 2024, sec. 3.3.2; PyTorch's
context-parallel SDPA, `kv_exchange="torch_all_gather"`, all-gathers them beside its first kernel). What each
piece costs: `costs.context`. A mixin of `Model`; the C accelerator has no twin of these ops.

The ring is real messages on the engine: each step issues the send of the block at hand to the next rank and
the receive from the previous one, runs the attention of the block at hand, then waits for both, so the
exchange overlaps the attention (TransformerEngine's `AttnFuncWithCPAndKVP2P` does the same with
`batch_isend_irecv`, double-buffering the blocks). A layer's weight gradient covers only this rank's sequence
part (`ContextWeightGrad`) until it is all-reduced over the CP ranks (with the data-parallel ones: dp x cp).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dist_lib.comm.collectives import Work
from dist_lib.comm.groups import Group
from dist_lib.comm.p2p import issue_recv, issue_send
from dist_lib.costs import context as cp_costs
from dist_lib.costs import torch_context as torch_costs
from dist_lib.costs.ops import SEQUENCE_PARALLEL_MODES, compute_mode, parse_mode
from dist_lib.errors import SpecError, TensorError
from dist_lib.tensors import (ContextActivation, ContextActivationGrad, ContextWeightGrad, KVBlock, Stash, Weight,
                              full_mask, samples_mask)

if TYPE_CHECKING:
    from dist_lib.engine.core import Engine
    from dist_lib.engine.rank_state import RankState
    from dist_lib.workload.transformer import Workload


class ContextOps:
    """The ops of this module, on a `Model` (which supplies the engine, the rank, the costs cache)."""

    __slots__ = ()
    _engine: Engine
    _state: RankState
    _cache: dict
    _mem: Any
    _events: list
    rank: int
    num_layers: int
    global_batch_size: int
    workload: Workload

    def context_input(self, samples: Iterable[int] | range, cp_rank: int, cp_size: int) -> ContextActivation:
        """Embedded inputs of these samples' sequence part `cp_rank` of `cp_size` (chunks cp_rank and
        2 cp_size - 1 - cp_rank of 2 cp_size: Megatron-Core's load-balanced causal split)."""
        where = f"rank {self.rank} context_input"
        _check_part(where, cp_rank, cp_size)
        self._block_workload(where, cp_size)
        try:
            mask = samples_mask(samples, self.global_batch_size)
        except (TypeError, ValueError) as exc:
            raise TensorError(f"{where}: {exc}") from None
        self._mem.context = ("context_input", None)
        nbytes = cp_costs.activation_bytes(self.workload, mask.bit_count(), cp_size)
        return ContextActivation(self._mem, nbytes, self.rank, 0, mask, 1, 1, cp_rank, cp_size)

    async def context_forward(self, layer: int, act: ContextActivation, weight: Weight,
                              group: Group | Iterable[int], *, kv_exchange: str = "ring", stash: bool = True,
                              selective_recompute: bool = False, sequence_parallel: bool = False,
                              fp8: str = "") -> ContextActivation:
        """Run `layer` on this rank's sequence part; the attention takes every CP rank's keys and values over
        `group` (the CP group, its i-th rank holding part i): `kv_exchange="ring"` passes them around in
        cp - 1 exchanges, each overlapped with the attention of the block at hand; `"all_gather"` gathers
        them all first; `"torch_all_gather"` gathers them (at the query heads) beside the first block and merges
        each block's output in fp32, as PyTorch's context-parallel SDPA (`costs.torch_context`). Keeps the stash
        on `act` unless `stash=False` (full recompute: run it again, exchange included, before the backward);
        `selective_recompute`, `sequence_parallel` (of the s/cp tokens over the TP group) and `fp8` as for
        `forward`. With a TP slice of the weight, returns a partial sum."""
        where = f"rank {self.rank} context_forward(layer {layer})"
        group = self._check_context(where, layer, act, weight, group, kv_exchange)
        if fp8 != "" or selective_recompute is not False or sequence_parallel is not False \
                or stash.__class__ is not bool:
            if stash.__class__ is not bool:
                raise TensorError(f"{where}: stash must be True or False, got {stash!r}")
            self._forward_modes(layer, weight, selective_recompute, sequence_parallel, fp8,  # type: ignore
                                "context_forward")
        mode = compute_mode(selective_recompute, sequence_parallel, fp8)
        samples, cp, i = act.samples, act.cp_size, act.cp_rank
        tp_rank, tp = weight.tp_rank, weight.tp_size
        n = samples.bit_count()
        rest, block, flops, stash_bytes, kv_bytes = self._context_cost("forward", layer, n, tp, cp, mode)
        self._charge("forward", layer, samples, rest, flops * (1 - _block_share(self.workload, layer)),
                     "context-parallel")
        block_flops = flops * _block_share(self.workload, layer) / cp
        mem = self._mem
        mem.context = ("context_forward", layer)
        if kv_exchange == "torch_all_gather" and cp > 1:
            await self._torch_forward(layer, samples, tp_rank, tp, i, cp, group, block, block_flops)
        elif kv_exchange == "all_gather" and cp > 1:
            kv = KVBlock(mem, kv_bytes, self.rank, layer, samples, 1 << i, cp, tp_rank, tp)
            kv = await self.all_gather(kv, group)  # type: ignore[attr-defined]
            for step in range(cp):
                self._charge("forward", layer, samples, block, block_flops, f"attention block {step + 1} of {cp}")
            del kv
        else:
            kv = KVBlock(mem, kv_bytes, self.rank, layer, samples, 1 << i, cp, tp_rank, tp)
            ranks = group.ranks
            nxt, prev = ranks[(i + 1) % cp], ranks[(i - 1) % cp]
            for step in range(cp):
                if step < cp - 1:
                    sending, receiving = issue_send(self._engine, self._state, kv, nxt), \
                        issue_recv(self._engine, self._state, prev)
                self._charge("forward", layer, samples, block, block_flops, f"attention block {step + 1} of {cp}")
                if step < cp - 1:
                    kv = _expect(where, await receiving, layer, samples, (i - step - 1) % cp, False)
                    await sending
                    del sending, receiving  # (a work holds its result: the block goes with the last reference)
            del kv
        mem.context = ("context_forward", layer)
        if stash:
            act._stash = Stash(mem, stash_bytes, tp_rank, tp, mode)
        return ContextActivation(mem, act.nbytes, self.rank, layer + 1, samples, 1 << tp_rank, tp, i, cp)

    async def context_backward(self, layer: int, act: ContextActivation, grad: ContextActivationGrad,
                               weight: Weight, group: Group | Iterable[int], *,
                               kv_exchange: str = "ring") -> tuple[ContextWeightGrad, ContextActivationGrad]:
        """Gradients of `layer` for this rank's sequence part; consumes the stash. The ring passes the key/value
        blocks around again and, beside them, the gradient of each block, accumulated by every rank it visits,
        which ends at its owner after one more hop (cp - 1 key/value and cp gradient exchanges); with
        `"all_gather"`, the keys and values are gathered again and their gradients reduce-scattered; with
        `"torch_all_gather"`, gathered again beside the first block, and the fp32 dK, dV passed around the ring
        (cp messages), dq accumulated in fp32. The weight gradient covers this sequence part only
        (`ContextWeightGrad`): all-reduce it over the CP ranks."""
        where = f"rank {self.rank} context_backward(layer {layer})"
        group = self._check_context(where, layer, act, weight, group, kv_exchange)
        samples, cp, i = act.samples, act.cp_size, act.cp_rank
        if grad.__class__ is not ContextActivationGrad or grad.layer != layer + 1 or grad.samples != samples \
                or (grad.cp_rank, grad.cp_size) != (i, cp) or grad.tp_parts != full_mask(grad.tp_size):
            raise TensorError(f"{where}: expected the complete gradient of layer {layer}'s output for the same "
                              f"samples and sequence part as {act!r}, got {grad!r}")
        self._check_own(grad, where)  # type: ignore[attr-defined]
        if act._stash is None:
            raise TensorError(f"{where}: {act!r} carries no stash; run context_forward on it first (again, with "
                              f"stash=True, after a forward with stash=False)")
        tp_rank, tp = weight.tp_rank, weight.tp_size
        if act._stash.recompute in SEQUENCE_PARALLEL_MODES:  # (the output gradient gathered twice in the TP group)
            self._check_sequence_parallel_grad("context_backward", layer, grad, tp)  # type: ignore[attr-defined]
        n = samples.bit_count()
        rest, block, flops, _, kv_bytes = self._context_cost("backward", layer, n, tp, cp, act._stash.recompute)
        self._charge("backward", layer, samples, rest, flops * (1 - _block_share(self.workload, layer)),
                     "context-parallel")
        block_flops = flops * _block_share(self.workload, layer) / cp
        mem = self._mem
        mem.context = ("context_backward", layer)
        engine, state = self._engine, self._state
        if kv_exchange == "torch_all_gather" and cp > 1:
            await self._torch_backward(layer, samples, tp_rank, tp, i, cp, group, block, block_flops,
                                       act._stash.recompute)
        elif kv_exchange == "all_gather" and cp > 1:
            kv = KVBlock(mem, kv_bytes, self.rank, layer, samples, 1 << i, cp, tp_rank, tp)
            kv = await self.all_gather(kv, group)  # type: ignore[attr-defined]
            for step in range(cp):
                self._charge("backward", layer, samples, block, block_flops, f"attention block {step + 1} of {cp}")
            dkv = KVBlock(mem, kv.nbytes, self.rank, layer, samples, kv.parts, cp, tp_rank, tp, True)
            dkv = await self.reduce_scatter(dkv, group)  # type: ignore[attr-defined]
            del kv  # (dkv, this rank's part of the gradients, lives to the end of the op, as it always has)
        else:
            kv = KVBlock(mem, kv_bytes, self.rank, layer, samples, 1 << i, cp, tp_rank, tp)
            ranks = group.ranks
            nxt, prev = ranks[(i + 1) % cp], ranks[(i - 1) % cp]
            dkv_works: tuple[Work, Work] | None = None
            for step in range(cp):
                if step < cp - 1:
                    sending, receiving = issue_send(engine, state, kv, nxt), issue_recv(engine, state, prev)
                self._charge("backward", layer, samples, block, block_flops, f"attention block {step + 1} of {cp}")
                owner = (i - step) % cp
                if dkv_works is not None:  # the block's gradient so far, from the ranks it visited before
                    _expect(where, await dkv_works[1], layer, samples, owner, True)
                    await dkv_works[0]
                    dkv_works = None
                dkv = KVBlock(mem, kv_bytes, self.rank, layer, samples, 1 << owner, cp, tp_rank, tp, True)
                if cp > 1:
                    dkv_works = issue_send(engine, state, dkv, nxt), issue_recv(engine, state, prev)
                del dkv
                if step < cp - 1:
                    kv = _expect(where, await receiving, layer, samples, (i - step - 1) % cp, False)
                    await sending
                    del sending, receiving
            if dkv_works is not None:  # this rank's own block's gradient, home
                _expect(where, await dkv_works[1], layer, samples, i, True)
                await dkv_works[0]
                dkv_works = None
            del kv
        act._stash = None
        mem.context = ("context_backward", layer)
        sizes = self._shard_bytes(layer, tp)  # type: ignore[attr-defined]
        grad_bytes = sizes[2] if len(sizes) > 2 else sizes[0]
        return (ContextWeightGrad(mem, grad_bytes, self.rank, layer, samples, 1, 1, tp_rank, tp, 1 << i, cp),
                ContextActivationGrad(mem, act.nbytes, self.rank, layer, samples, 1 << tp_rank, tp, (), i, cp))

    def context_loss(self, act: ContextActivation, *, tp_rank: int = 0, tp_size: int = 1) -> ContextActivationGrad:
        """LM head and loss over this rank's s/cp tokens (vocabulary-parallel with `tp_size` > 1, as `loss`)."""
        where = f"rank {self.rank} context_loss"
        if act.__class__ is not ContextActivation or act.layer != self.num_layers or act.tp_parts != 1 \
                or act.tp_size != 1:
            raise TensorError(f"{where}: expected the complete ContextActivation after the last layer, got {act!r}")
        self._check_own(act, where)  # type: ignore[attr-defined]
        _check_part(where, tp_rank, tp_size, "tp")
        n, cp = act.samples.bit_count(), act.cp_size
        key = ("context_loss", n, tp_size, cp)
        cost = self._cache.get(key)
        if cost is None:
            device = self._state.device
            cost = self._cache[key] = (cp_costs.loss_time(device, self.workload, n, tp_size, cp),
                                       cp_costs.layer_flops(self.workload, "loss", 0, n, tp_size, cp))
        self._charge("loss", self.num_layers, act.samples, cost[0], cost[1], "context-parallel")
        self._mem.context = ("context_loss", None)
        return ContextActivationGrad(self._mem, act.nbytes, self.rank, self.num_layers, act.samples, 1 << tp_rank,
                                     tp_size, (), act.cp_rank, cp)

    # ---- internals ----------------------------------------------------------------------------

    def _block_workload(self, where: str, cp: int) -> Workload:
        try:
            return cp_costs.block_workload(self.workload, cp)
        except SpecError as exc:
            raise TensorError(f"{where}: {exc}") from None

    def _check_context(self, where: str, layer: Any, act: Any, weight: Any, group: Any, kv_exchange: Any) -> Group:
        if kv_exchange not in cp_costs.KV_EXCHANGES:
            raise TensorError(f"{where}: kv_exchange must be one of {', '.join(cp_costs.KV_EXCHANGES)}, "
                              f"got {kv_exchange!r}")
        self._check_layer(layer, where)  # type: ignore[attr-defined]
        if act.__class__ is not ContextActivation or act.layer != layer or act.tp_parts != 1 or act.tp_size != 1:
            raise TensorError(f"{where}: expected the complete ContextActivation entering layer {layer}, got {act!r}"
                              + ("; all_reduce the TP partial sum first" if isinstance(act, ContextActivation)
                                 and act.tp_size > 1 else ""))
        if weight.__class__ is not Weight or weight.layer != layer or weight.shards != full_mask(weight.num_shards):
            raise TensorError(f"{where}: expected the complete Weight (or TP slice) of layer {layer}, got {weight!r}")
        self._check_own(act, where)  # type: ignore[attr-defined]
        self._check_own(weight, where)  # type: ignore[attr-defined]
        resolved = self._resolve_group(group, where.split(" ", 2)[2])  # type: ignore[attr-defined]
        cp = act.cp_size
        if resolved.size != cp or resolved.ranks[act.cp_rank] != self.rank:
            raise TensorError(f"{where}: group {list(resolved.ranks)} is not this activation's CP group: it must "
                              f"have {cp} ranks with this rank ({self.rank}) at position {act.cp_rank}")
        self._block_workload(where, cp)
        return resolved

    def _context_cost(self, op: str, layer: int, n: int, tp: int, cp: int,
                      mode: str = "none") -> tuple[float, float, float, int, int]:
        """(seconds besides the attention blocks, seconds of one block, FLOPs, stash bytes, key/value block
        bytes) of a CP rank's forward or backward in compute mode `mode`, once per device type and shape."""
        key = ("context", op, layer, n, tp, cp, mode)
        cost = self._cache.get(key)
        if cost is None:
            device, workload = self._state.device, self.workload
            rest, block = cp_costs.layer_times(device, workload, layer, n, tp, cp, op == "backward", mode)
            cost = self._cache[key] = (rest, block, cp_costs.layer_flops(workload, op, layer, n, tp, cp, mode),
                                       cp_costs.stash_bytes(workload, layer, n, tp, cp, mode),
                                       cp_costs.kv_block_bytes(workload, n, tp, cp))
        return cost

    async def _torch_forward(self, layer: int, samples: int, tp_rank: int, tp: int, i: int, cp: int, group: Group,
                             block: float, block_flops: float) -> None:
        """PyTorch's context-parallel SDPA forward (`costs.torch_context`): the keys and values (at the query
        heads) copied and all-gathered beside step 0's kernel, waited for at step 1; each step's kernel, then its
        merge into the fp32 output; the cast back."""
        prologue, steps, epilogue = self._torch_ring_times("forward", samples.bit_count(), tp, cp, i)
        self._charge_extra("forward", layer, samples, prologue, "context-parallel K/V copies")
        kv = KVBlock(self._mem, torch_costs.kv_bytes(self.workload, samples.bit_count(), tp, cp), self.rank, layer,
                     samples, 1 << i, cp, tp_rank, tp)
        gathering = self.all_gather(kv, group)  # type: ignore[attr-defined]
        for step in range(cp):
            self._charge("forward", layer, samples, block, block_flops, f"attention block {step + 1} of {cp}")
            self._charge_extra("forward", layer, samples, steps[step], f"attention merge {step + 1} of {cp}")
            if step == 0:
                kv = await gathering
                del gathering
        del kv
        self._charge_extra("forward", layer, samples, epilogue, "context-parallel output cast")

    async def _torch_backward(self, layer: int, samples: int, tp_rank: int, tp: int, i: int, cp: int,
                              group: Group, block: float, block_flops: float, mode: str) -> None:
        """PyTorch's context-parallel SDPA backward: the keys and values all-gathered again (waited for at step 1),
        each step's flash backward, then the fp32 accumulation of dq and of the running dk, dv received from the
        previous rank (waited for after the kernel) and their send to the next; the last arrive after the
        loop. After a selective-recompute forward, each step re-runs its forward kernel and merge first."""
        n = samples.bit_count()
        prologue, steps, epilogue = self._torch_ring_times("backward", n, tp, cp, i)
        if parse_mode(mode)[0]:
            f_prologue, f_steps, f_epilogue = self._torch_ring_times("forward", n, tp, cp, i)
            prologue, steps = prologue + f_prologue + f_epilogue, tuple(map(sum, zip(steps, f_steps)))
        mem, engine, state, workload = self._mem, self._engine, self._state, self.workload
        self._charge_extra("backward", layer, samples, prologue, "context-parallel K/V copies")
        kv = KVBlock(mem, torch_costs.kv_bytes(workload, n, tp, cp), self.rank, layer, samples, 1 << i, cp, tp_rank, tp)
        gathering = self.all_gather(kv, group)  # type: ignore[attr-defined]
        ranks = group.ranks
        nxt, prev = ranks[(i + 1) % cp], ranks[(i - 1) % cp]
        where = f"rank {self.rank} context_backward(layer {layer})"
        dkv_works: tuple[Work, Work] | None = None
        for step in range(cp):
            if step == 1:
                kv = await gathering
                del gathering
            self._charge("backward", layer, samples, block, block_flops, f"attention block {step + 1} of {cp}")
            owner = (i - step) % cp
            if dkv_works is not None:  # the block's fp32 dk, dv so far, from the ranks it visited before
                _expect(where, await dkv_works[1], layer, samples, owner, True)
                await dkv_works[0]
                dkv_works = None
            self._charge_extra("backward", layer, samples, steps[step], f"gradient accumulation {step + 1} of {cp}")
            dkv = KVBlock(mem, torch_costs.dkv_bytes(workload, n, tp, cp), self.rank, layer, samples, 1 << owner, cp,
                          tp_rank, tp, True)
            dkv_works = issue_send(engine, state, dkv, nxt), issue_recv(engine, state, prev)
            del dkv
        del kv
        assert dkv_works is not None
        _expect(where, await dkv_works[1], layer, samples, i, True)  # this rank's own block's gradient, home
        await dkv_works[0]
        del dkv_works
        self._charge_extra("backward", layer, samples, epilogue, "context-parallel gradient casts")

    def _torch_ring_times(self, op: str, n: int, tp: int, cp: int, cp_rank: int) -> tuple[float, tuple, float]:
        """`torch_context.seconds` of the ring's traffic beside its kernels, once per device type and shape."""
        key = ("torch_ring", op, n, tp, cp, cp_rank)
        cost = self._cache.get(key)
        if cost is None:
            bytes_of = torch_costs.forward_bytes if op == "forward" else torch_costs.backward_bytes
            cost = self._cache[key] = torch_costs.seconds(self._state.device, self.workload,
                                                          bytes_of(self.workload, n, tp, cp, cp_rank))
        return cost

    def _charge_extra(self, op: str, layer: int, samples: int, seconds: float, detail: str) -> None:
        if seconds > 0:
            self._charge(op, layer, samples, seconds, 0.0, detail)

    def _charge(self, op: str, layer: int, samples: int, seconds: float, flops: float, detail: str) -> None:
        state = self._state
        start = state.clock
        state.clock = end = start + seconds
        state.flops += flops
        self._events.append((self.rank, op, "compute", start, end, layer, samples, 0, flops, None, 0, detail))


def _block_share(workload: Workload, layer: int) -> float:
    """The attention core's share of a layer's FLOPs (the blocks' FLOPs, split off the rest for the trace)."""
    return workload.attention_core_flops() / workload.layer_forward_flops(layer)


def _expect(where: str, x: Any, layer: int, samples: int, owner: int, grad: bool) -> KVBlock:
    """The block a ring step received: of this layer and these samples, owned by `owner`."""
    if x.__class__ is not KVBlock or x.layer != layer or x.samples != samples or x.parts != 1 << owner \
            or x.grad != grad:
        what = "gradient of the key/value block" if grad else "key/value block"
        raise TensorError(f"{where}: expected the {what} of sequence part {owner} from the previous CP rank, got "
                          f"{x!r}; the CP ranks' layers or microbatches disagree")
    return x


def _check_part(where: str, part: Any, size: Any, name: str = "cp") -> None:
    if size.__class__ is not int or part.__class__ is not int or size < 1 or not 0 <= part < size:
        raise TensorError(f"{where}: {name}_rank={part!r}, {name}_size={size!r} is not a part; need whole numbers "
                          f"with 0 <= {name}_rank < {name}_size")

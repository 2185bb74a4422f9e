"""`Model`: the per-rank handle a strategy drives. Compute ops run at once on the rank's clock;
communication ops return a `Work` to await.

Every op checks its tensors and raises `TensorError` naming the rank, the op and the layer, so a wrong
schedule fails where it goes wrong rather than at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dist_lib.costs import compute as costs
from dist_lib.costs import network
from dist_lib.comm.collectives import Work, issue_collective
from dist_lib.comm.groups import Group, get_group
from dist_lib.hardware.devices import Device
from dist_lib.engine.core import Engine
from dist_lib.engine.rank_state import RankState
from dist_lib.errors import TensorError
from dist_lib.engine.eventlog import PACK_AT
from dist_lib.hardware.cluster import Cluster
from dist_lib.memory.tracker import WEIGHT_BYTES
from dist_lib.costs.ops import weight_pass_mode, compute_cost, compute_mode, forward_stash_bytes, input_pass_stash_bytes
from dist_lib.model.op_checks import OpChecks, _covers, _first_time, _shard_key, buffer_log
from dist_lib.model.other_collective_ops import OtherCollectiveOps
from dist_lib.model.context_ops import ContextOps
from dist_lib.model.fp8_weights import FP8Weights
from dist_lib.model.state_loads import StateLoads
from dist_lib.model.layer_runs import LayerRuns
from dist_lib.comm.p2p import issue_recv, issue_send
from dist_lib.tensors import SLICES, Activation, ActivationGrad, ActivationGradSlice, ActivationSlice, ContextActivationSlice, OptState, PipeExtra, Stash, Weight, WeightGrad, cp_part, describe_mask, samples_mask
from dist_lib.workload.transformer import Workload


class Model(OpChecks, OtherCollectiveOps, ContextOps, FP8Weights, StateLoads, LayerRuns):
    """What one rank sees: its identity, its device, the model shape, and the ops."""

    __slots__ = ("_engine", "_state", "_mem", "_events", "_cache", "rank", "world_size", "num_layers",
                 "global_batch_size", "device", "node", "cluster", "workload", "_world", "_params", "_act_bytes",
                 "_shard_sizes", "_full_batch", "_fp8_weights")

    def __init__(self, engine: Engine, rank: int):
        self._engine = engine
        self._state: RankState = engine.ranks[rank]
        self._mem = self._state.memory
        self._events = engine.events.recent  # appended to on every op; packed in place by the engine
        # op costs by (op, layer, shape...), shared by the ranks of one device type
        self._cache: dict[tuple, tuple] = engine.cost_cache.setdefault(self._state.device.name, {})
        self.rank = rank
        self.world_size = engine.world_size
        self.num_layers = engine.workload.num_layers
        self.global_batch_size = engine.global_batch_size
        self.device: Device = self._state.device
        self.node: int = self._state.node
        self.cluster: Cluster = engine.cluster
        self.workload: Workload = engine.workload
        self._world: Group | None = None
        self._params = engine.layer_params  # parameters of each layer
        self._act_bytes = engine.workload.activation_bytes()  # one sample's hidden states
        self._shard_sizes = engine.shard_bytes  # (layer, parts) -> (weight bytes, optimizer bytes)
        self._full_batch = engine.full_batch  # the samples mask of a whole step's gradient

    def __repr__(self) -> str:
        return f"Model(rank {self.rank} of {self.world_size}, {self.device.name}, node {self.node})"

    @property
    def time(self) -> float:
        """This rank's compute-stream clock, in seconds."""
        return self._state.clock

    @property
    def memory_bytes(self) -> int:
        """Bytes of tensors this rank holds alive now."""
        return self._mem.live

    # ---- weights and inputs -------------------------------------------------------------------

    def load_weights(self, layer: int, shard: int = 0, num_shards: int = 1, *, tp_rank: int = 0,
                     tp_size: int = 1) -> tuple[Weight, OptState]:
        """Weights and optimizer state of ZeRO shard `shard` of `num_shards`, TP slice `tp_rank` of `tp_size`."""
        if layer.__class__ is not int or not 0 <= layer < self.num_layers or shard.__class__ is not int \
                or num_shards.__class__ is not int or not 0 <= shard < num_shards \
                or tp_rank.__class__ is not int or tp_size.__class__ is not int or not 0 <= tp_rank < tp_size:
            self._explain_load(layer, shard, num_shards, tp_rank, tp_size)
        weight_bytes, optimizer_bytes = self._shard_bytes(layer, tp_size * num_shards)[:2]
        mem = self._mem
        mem.context = ("load_weights", layer)
        shards = 1 << shard
        self._state.loaded.append((layer, shards, num_shards, tp_rank, tp_size))
        return (Weight(mem, weight_bytes, self.rank, layer, 0, shards, num_shards, tp_rank, tp_size, 0),
                OptState(mem, optimizer_bytes, self.rank, layer, 0, shards, num_shards, tp_rank, tp_size, 0))

    def get_input_activation(self, samples: Iterable[int] | range) -> Activation:
        """Embedded inputs for these sample indices of the global batch (a `range` or any iterable)."""
        try:
            mask = samples_mask(samples, self.global_batch_size)
        except (TypeError, ValueError) as exc:
            raise TensorError(f"rank {self.rank} get_input_activation: {exc}") from None
        nbytes = mask.bit_count() * self._act_bytes
        self._mem.context = ("get_input_activation", None)
        return Activation(self._mem, nbytes, self.rank, 0, mask)

    # ---- compute ------------------------------------------------------------------------------

    def forward(self, layer: int, act: Activation, weight: Weight, *, stash: bool = True,
                selective_recompute: bool = False, sequence_parallel: bool = False, fp8: str = "") -> Activation:
        """Run `layer` on `act`; keeps the stash backward needs on `act` unless `stash=False` (activation
        checkpointing: backward will need this forward run again first). `selective_recompute=True` keeps the
        stash without the attention core's softmax and dropout (the 5as/ht term of Korthikanti et al. 2022,
        Table 2), which backward then re-runs. `sequence_parallel=True` (with a TP slice of the weight): the
        layernorms, dropouts and residual adds run on 1/t of the sequence and their stash is split t ways (same
        paper, sec. 4.2.2); the stash remembers it, so the backward is timed the same way. `fp8` ("delayed",
        "tensorwise", "rowwise"): the linear layers' GEMMs run in FP8 with that scaling recipe (`costs.fp8`),
        backward too."""
        rank = self.rank
        if fp8 != "" or selective_recompute.__class__ is not bool or sequence_parallel.__class__ is not bool:
            self._forward_modes(layer, weight, selective_recompute, sequence_parallel, fp8)
        mem = self._mem
        if act.__class__ is not Activation or weight.__class__ is not Weight or act.rank != rank \
                or weight.rank != rank or act.layer != layer or weight.layer != layer or act.tp_size != 1 \
                or weight.shards != (1 << weight.num_shards) - 1 or (act._base or act)._mem is not mem \
                or (weight._base or weight)._mem is not mem:
            self._explain_compute("forward", layer, act, weight, layer)
        state = self._state
        samples = act.samples
        tp_rank, tp = weight.tp_rank, weight.tp_size
        # a forward of samples this layer (and TP slice) has already seen on this rank is a recompute
        recompute = state.seen_before(tp_rank, layer, samples)
        n = samples.bit_count()
        mode = compute_mode(selective_recompute, sequence_parallel, fp8)
        duration, flops, stash_bytes = self._cache.get(("forward", layer, n, tp, mode)) \
            or self._cost("forward", layer, n, tp, mode)
        start = state.clock
        state.clock = end = start + duration
        state.flops += flops
        events = self._events
        events.append((rank, "forward", "compute", start, end, layer, samples, 0, flops, None, 0,
                       "recompute" if recompute else ""))
        if len(events) >= PACK_AT:
            self._engine.events.pack()
        mem.context = ("forward", layer)
        if stash:
            act._stash = Stash(mem, stash_bytes, tp_rank, tp, mode)
        # a TP slice yields its part of the sum (with tp 1: part 0 of 1, complete)
        return Activation(mem, n * self._act_bytes, rank, layer + 1, samples, 1 << tp_rank, tp)

    def backward(self, layer: int, act: Activation, grad: ActivationGrad,
                 weight: Weight) -> tuple[WeightGrad, ActivationGrad]:
        """Gradients of `layer` for the samples of `act`; consumes the stash `forward` left on `act`. A layer
        that ran sequence-parallel over t TP ranks takes `grad` all-gathered twice in its TP group (`split_tp`,
        then `all_gather` of the pieces), once for each of its row-parallel GEMMs; so does `backward_input`."""
        stash = self._check_backward("backward", layer, act, grad, weight, need_input_done=False)
        self._compute("backward", layer, act.samples, weight.tp_size, stash.recompute)
        act._stash = stash = None  # freed before the gradients are allocated
        self._mem.context = ("backward", layer)
        return self._weight_grad(layer, act, weight), self._activation_grad(act, weight)

    def backward_input(self, layer: int, act: Activation, grad: ActivationGrad, weight: Weight) -> ActivationGrad:
        """First half of a split backward (zero-bubble): the input gradient only. The stash shrinks to
        what `backward_weight` needs, the linear layers' inputs and output gradients
        (`costs.split_stash_bytes`; Qi et al. 2024): the forward's stash is freed and a smaller one, marked
        `input_done`, takes its place before the input gradient is allocated."""
        stash = self._check_backward("backward_input", layer, act, grad, weight, need_input_done=False)
        mode, tp_rank, tp = stash.recompute, stash.tp_rank, stash.tp_size
        n = act.samples.bit_count()
        kept = self._cost("backward_input", layer, n, tp, mode)[2]
        self._compute("backward_input", layer, act.samples, tp, mode)
        mem = self._mem
        act._stash = stash = None  # the forward's stash goes first, as in `backward`
        mem.context = ("backward_input", layer)
        act._stash = Stash(mem, kept, tp_rank, tp, mode, True)
        return self._activation_grad(act, weight)

    def backward_weight(self, layer: int, act: Activation, grad: ActivationGrad, weight: Weight) -> WeightGrad:
        """Second half of a split backward: the weight gradient; consumes the stash."""
        mode = weight_pass_mode(self._check_backward("backward_weight", layer, act, grad, weight, True).recompute)
        self._compute("backward_weight", layer, act.samples, weight.tp_size, mode)
        act._stash = None
        self._mem.context = ("backward_weight", layer)
        return self._weight_grad(layer, act, weight)

    def loss(self, act: Activation, *, tp_rank: int = 0, tp_size: int = 1) -> ActivationGrad:
        """LM head, loss and its gradient for the final activations of some samples.

        With `tp_size` > 1 the head is vocabulary-parallel, as in Megatron-LM (Shoeybi et al. 2019,
        sec. 3): TP rank `tp_rank` holds V/t of the output embedding, computes those logits and its
        part of the cross-entropy, at 1/t of the cost, and returns its partial sum of the input gradient
        (dX = dY E over its vocabulary slice), which an all-reduce in the TP group completes."""
        where = f"rank {self.rank} loss"
        if type(act) is not Activation:
            raise TensorError(f"{where}: expected the Activation after the last layer, got {act!r}")
        self._check_own(act, where)
        if act.layer != self.num_layers:
            raise TensorError(f"{where}: {act!r} has only passed {act.layer} of {self.num_layers} layers")
        if act.is_partial:
            raise TensorError(f"{where}: {act!r} is a tensor-parallel partial sum; all_reduce it first")
        _check_tp_slice(where, tp_rank, tp_size)
        self._compute("loss", self.num_layers, act.samples, tp_size)
        self._mem.context = ("loss", None)
        return ActivationGrad(self._mem, act.samples.bit_count() * self._act_bytes, self.rank, self.num_layers,
                              act.samples, 1 << tp_rank, tp_size)

    def tied_embedding_grad(self, *, tp_rank: int = 0, tp_size: int = 1) -> WeightGrad:
        """The word-embedding gradient a pipeline's first and last stage all-reduce when the LM head shares
        the input embedding (Megatron-LM's embedding group, DeepSpeed's `TiedLayerSpec`; Shoeybi et al.
        2019, sec. 3): V/t x h elements in the model's 16-bit type (DeepSpeed all-reduces the module's
        `weight.grad`). It stands for that transfer only: it covers no samples, so it cannot update a
        layer, and the last stage's copy of the embedding is not otherwise held (its memory, optimizer
        step and data-parallel reduction are not modelled)."""
        _check_tp_slice(f"rank {self.rank} tied_embedding_grad", tp_rank, tp_size)
        workload = self.workload
        nbytes = workload.vocab * workload.hidden * workload.bytes_per_element // tp_size
        self._mem.context = ("tied_embedding_grad", 0)
        return WeightGrad(self._mem, nbytes, self.rank, 0, 0, 1, 1, tp_rank, tp_size)

    def pipe_extra(self, what: str, *, tp_size: int = 1) -> PipeExtra:
        """A buffer DeepSpeed's pipeline engine sends beside the hidden states (`network.attention_mask_bytes`,
        `network.partition_meta_bytes`): `what` is "attention_mask", the 16-bit 1 x 1 x s x s mask a GPT stage
        passes on with every activation, or "partition_meta", the int64 metadata before a message
        partitioned over `tp_size` TP ranks. It holds no layer data and feeds no compute op."""
        if what not in PIPE_EXTRAS:
            raise TensorError(f"rank {self.rank} pipe_extra: what={what!r}; expected one of "
                              f"{', '.join(map(repr, PIPE_EXTRAS))}")
        if tp_size.__class__ is not int or tp_size < 1:
            raise TensorError(f"rank {self.rank} pipe_extra: tp_size={tp_size!r}; need a whole number >= 1")
        nbytes = network.attention_mask_bytes(self.workload) if what == "attention_mask" \
            else network.partition_meta_bytes(tp_size)
        self._mem.context = ("pipe_extra", None)
        return PipeExtra(self._mem, nbytes, self.rank, -1, 0, what)

    def split_samples(self, x: Activation | ActivationGrad, samples: Iterable[int] | range):
        """The rows of `x` for some of its samples, as a tensor of their own: what a pipeline stage sends
        a next stage of another data-parallel width (Metis, Um et al. ATC'24, sec. 4). Copying the rows
        into a send buffer reads and writes their bytes once over HBM; `x` itself when it is all of them."""
        mask = self._resample_mask(x, samples, "split_samples")
        if mask == x.samples:
            return x
        if mask & ~x.samples:
            raise TensorError(f"rank {self.rank} split_samples: {x!r} has no samples "
                              f"{describe_mask(mask & ~x.samples)}")
        return self._resampled("split_samples", type(x), x.layer, mask)

    def join_samples(self, parts: list) -> Activation | ActivationGrad:
        """One tensor from tensors of the same layer and disjoint samples (torch.cat along the batch):
        a new buffer written once, each part read once over HBM. The inverse of `split_samples`."""
        where = f"rank {self.rank} join_samples"
        if not isinstance(parts, (list, tuple)) or not parts:
            raise TensorError(f"{where}: expected a non-empty list of tensors, got {parts!r}")
        mask = 0
        for part in parts:
            self._resample_mask(part, range(0), "join_samples")
            if type(part) is not type(parts[0]) or part.layer != parts[0].layer:
                raise TensorError(f"{where}: {part!r} and {parts[0]!r} differ in kind or layer")
            if mask & part.samples:
                raise TensorError(f"{where}: samples {describe_mask(mask & part.samples)} appear twice")
            mask |= part.samples
        if len(parts) == 1:
            return parts[0]
        return self._resampled("join_samples", type(parts[0]), parts[0].layer, mask)

    def split_tp(self, x: Activation | ActivationGrad, tp_rank: int,
                 tp_size: int) -> ActivationSlice | ActivationGradSlice:
        """Piece `tp_rank` of `tp_size` equal pieces of a complete activation or gradient: what one TP rank
        of a pipeline stage sends the same TP rank of the next stage under Megatron-LM's scatter-gather
        optimization (Narayanan et al. 2021, sec. 4.1), so that the t ranks together move one copy of the
        message over the inter-node links instead of t copies; `all_gather(piece, tp_group)` on the
        receiving side makes the whole tensor again. Takes no time (Megatron cuts a view of the flattened
        tensor); the piece is a buffer of its own of 1/t of the bytes."""
        cls = SLICES.get(x.__class__)
        if cls is None or x.rank != self.rank or x.tp_parts != (1 << x.tp_size) - 1 \
                or (x._base or x)._mem is not self._mem or tp_size.__class__ is not int \
                or tp_rank.__class__ is not int or not 0 <= tp_rank < tp_size:
            self._explain_split_tp(x, tp_rank, tp_size)  # (one test on the path every message takes)
        mem = self._mem
        mem.context = ("split_tp", x.layer)
        if cls is ActivationSlice:
            return cls(mem, x.nbytes // tp_size, self.rank, x.layer, x.samples, 1 << tp_rank, tp_size)
        if cls is ContextActivationSlice:  # a CP part's piece remembers its part
            return cls(mem, x.nbytes // tp_size, self.rank, x.layer, x.samples, 1 << tp_rank, tp_size, x.cp_rank,
                       x.cp_size)
        # a gradient's piece remembers its gathers (and a CP part, its part)
        return cls(mem, x.nbytes // tp_size, self.rank, x.layer, x.samples, 1 << tp_rank, tp_size, x.gathers, *cp_part(x))

    def _explain_split_tp(self, x: Any, tp_rank: Any, tp_size: Any) -> None:
        where = f"rank {self.rank} split_tp"
        if type(x) not in SLICES:
            raise TensorError(f"{where}: expected a complete Activation or ActivationGrad, got {x!r}")
        self._check_own(x, where)
        if x.is_partial:
            raise TensorError(f"{where}: {x!r} is a tensor-parallel partial sum; all_reduce it first")
        _check_tp_slice(where, tp_rank, tp_size)

    def _resample_mask(self, x: Any, samples: Iterable[int] | range, op: str) -> int:
        where = f"rank {self.rank} {op}"
        if type(x) not in (Activation, ActivationGrad):
            raise TensorError(f"{where}: expected an Activation or ActivationGrad, got {x!r}")
        self._check_own(x, where)
        if x.is_partial or getattr(x, "_stash", None) is not None:
            raise TensorError(f"{where}: {x!r} is a tensor-parallel partial sum or carries a stash; "
                              f"only complete layer outputs and gradients are re-split")
        if isinstance(samples, range) and not samples:
            return 0
        try:
            return samples_mask(samples, self.global_batch_size)
        except (TypeError, ValueError) as exc:
            raise TensorError(f"{where}: {exc}") from None

    def _resampled(self, op: str, cls: type, layer: int, mask: int):
        """A new `cls` tensor of `mask`'s samples, after an HBM copy of its bytes (read + write)."""
        nbytes = mask.bit_count() * self._act_bytes
        state = self._state
        start = state.clock
        state.clock = end = start + costs.compute_time(self.device, 0.0, 2.0 * nbytes)
        self._events.append((self.rank, op, "compute", start, end, layer, mask, nbytes, 0.0, None, 0, ""))
        self._mem.context = (op, layer)
        return cls(self._mem, nbytes, self.rank, layer, mask)

    def update(self, layer: int, grad: WeightGrad, weight: Weight, opt_state: OptState) -> tuple[Weight, OptState]:
        """Adam step on the shard `opt_state` holds; the gradient must cover the whole global batch."""
        rank = self.rank
        shards, num_shards, tp_rank, tp = (opt_state.shards, opt_state.num_shards, opt_state.tp_rank, opt_state.tp_size) \
            if opt_state.__class__ is OptState else (0, 0, -1, -1)  # (anything else is explained below)
        if layer.__class__ is not int or grad.__class__ is not WeightGrad or weight.__class__ is not Weight \
                or opt_state.__class__ is not OptState or grad.rank != rank or weight.rank != rank \
                or opt_state.rank != rank or grad.layer != layer or weight.layer != layer \
                or opt_state.layer != layer or grad.tp_rank != tp_rank or weight.tp_rank != tp_rank \
                or grad.tp_size != tp or weight.tp_size != tp or not _covers(grad, opt_state) \
                or not _covers(weight, opt_state) or weight.step or opt_state.step \
                or not _on(self._mem, grad, weight, opt_state):
            self._explain_update(layer, grad, weight, opt_state)
        full = self._full_batch
        if grad.samples != full:  # (before the shard counts as updated: a refused update changes nothing)
            raise TensorError(f"rank {rank} update(layer {layer}): the gradient covers samples "
                              f"{describe_mask(grad.samples)} but not {describe_mask(full & ~grad.samples)}; "
                              f"accumulate microbatches and all_reduce/reduce_scatter across data-parallel "
                              f"ranks first, and update with what awaiting that op returns (the tensor given to "
                              f"it keeps this rank's samples)")
        state = self._state
        if not _first_time(state.updated, layer, _shard_key(shards, num_shards, tp_rank)):
            raise TensorError(f"rank {rank} update(layer {layer}): this shard of layer {layer} was already "
                              f"updated on rank {rank}")
        held = shards.bit_count()
        key = ("update", layer, held, num_shards, tp)
        cost = self._cache.get(key)
        if cost is None:  # (seconds, bytes of optimizer traffic), once per device type and shard size
            params = self._params[layer] / tp * held / num_shards
            cost = self._cache[key] = (costs.update_time(self.device, params),
                                       int(params * costs.ADAM_BYTES_PER_PARAM))
        start = state.clock
        state.clock = end = start + cost[0]
        self._events.append((rank, "update", "compute", start, end, layer, full, cost[1], 0.0, None, 0, ""))
        if weight.shards == shards and weight.num_shards == num_shards:
            buffer, nbytes = weight, 0  # updated in place
        else:
            buffer, nbytes = self._mem, int(self._params[layer] / tp * held / num_shards * WEIGHT_BYTES)
            buffer.context = ("update", layer)
        return (Weight(buffer, nbytes, rank, layer, 1, shards, num_shards, tp_rank, tp, full),
                OptState(opt_state, 0, rank, layer, 1, shards, num_shards, tp_rank, tp, full))

    def set_final_weight(self, layer: int, weight: Weight) -> None:
        """Hand in this rank's updated weights (or shard of them) for the end-of-step check."""
        if layer.__class__ is not int or weight.__class__ is not Weight or weight.rank != self.rank \
                or weight.layer != layer or (weight._base or weight)._mem is not self._mem:
            where = f"rank {self.rank} set_final_weight(layer {layer})"
            self._check_layer(layer, where)
            if type(weight) is not Weight:
                raise TensorError(f"{where}: expected a Weight, got {weight!r}")
            self._check_own(weight, where)
            raise TensorError(f"{where}: {weight!r} is not layer {layer}")
        state = self._state
        if not _first_time(state.handed, layer, _shard_key(weight.shards, weight.num_shards, weight.tp_rank)):
            raise TensorError(f"rank {self.rank} set_final_weight(layer {layer}): this shard of layer {layer} "
                              f"was already handed in")
        state.final_weights.append(weight)

    # ---- communication ------------------------------------------------------------------------

    def group(self, ranks: Iterable[int]) -> Group:
        """The group of these ranks (the same object for the same set, whoever asks)."""
        return get_group(self._engine, ranks, f"rank {self.rank} group")

    def _resolve_group(self, group: Group | Iterable[int] | None, op: str) -> Group:
        if group is None:
            if self._world is None:  # built once per engine, not once per rank (its key is O(ranks))
                engine = self._engine
                if engine.world_group is None:
                    engine.world_group = get_group(engine, range(self.world_size))
                self._world = engine.world_group
            return self._world
        if isinstance(group, Group):
            return group
        return get_group(self._engine, group, f"rank {self.rank} {op}")

    def all_reduce(self, x: Any, group: Group | Iterable[int] | None = None) -> Work:
        """Sum gradients of disjoint samples, or TP partial sums, over `group` (default: all ranks)."""
        self._check_given(x, f"rank {self.rank} all_reduce(layer {x.layer})")
        if x.__class__ in _NOT_SUMMED:  # (the C twin leaves these to this method)
            raise TensorError(f"rank {self.rank} all_reduce(layer {x.layer}): {x!r} is not a partial sum; "
                              + ("TP pieces of a message are gathered, not summed: all_gather them in the TP group"
                                 if x.__class__ is not PipeExtra else "only gradients and TP partial sums are "
                                 "all-reduced"))
        return issue_collective(self._engine, self._state, "all_reduce", x, self._resolve_group(group, "all_reduce"))

    def all_gather(self, x: Any, group: Group | Iterable[int] | None = None) -> Work:
        """Gather the ZeRO shards the members hold into the complete tensor on every member."""
        self._check_given(x, f"rank {self.rank} all_gather(layer {x.layer})")
        return issue_collective(self._engine, self._state, "all_gather", x, self._resolve_group(group, "all_gather"))

    def reduce_scatter(self, x: Any, group: Group | Iterable[int] | None = None) -> Work:
        """Sum complete gradients over `group`; member i keeps shard i of len(group)."""
        self._check_given(x, f"rank {self.rank} reduce_scatter(layer {x.layer})")
        return issue_collective(self._engine, self._state, "reduce_scatter", x,
                                self._resolve_group(group, "reduce_scatter"))

    def send(self, x: Any, dst: int) -> Work:
        """Send tensor `x` to rank `dst`; matched in order with `dst`'s recvs from this rank (`comm/p2p.py`)."""
        self._check_given(x, f"rank {self.rank} send to {dst}")
        return issue_send(self._engine, self._state, x, dst)

    def recv(self, src: int) -> Work:
        """Receive the next message rank `src` sends here; awaiting it returns the tensor (`comm/p2p.py`)."""
        return issue_recv(self._engine, self._state, src)

    # ---- internals ----------------------------------------------------------------------------

    def _cost(self, op: str, layer: int, n: int, tp: int, mode: str = "none") -> tuple[float, float, int]:
        """(seconds, FLOPs, stash bytes) of a compute op in a compute mode (`COMPUTE_MODES`), computed once
        per device type and shape. For a forward, the mode also says what its backward will re-run, which
        decides the stash; for `backward_input`, the stash bytes are what the stash keeps for the weight
        gradient (`op_costs.input_pass_stash_bytes`); 0 for the other ops."""
        key = (op, layer, n, tp, mode)
        cost = self._cache.get(key)
        if cost is None:
            duration, flops = compute_cost(self.device, self.workload, op, layer, n, tp, mode)
            stash = 0
            if op == "forward":
                stash = forward_stash_bytes(self.device, self.workload, layer, n, tp, mode)
            elif op == "backward_input":  # what the stash keeps for backward_weight
                stash = input_pass_stash_bytes(self.device, self.workload, layer, n, tp, mode)
            cost = self._cache[key] = (duration, flops, stash)
        return cost

    def _compute(self, op: str, layer: int, samples: int, tp: int, mode: str = "none") -> None:
        """Advance the compute stream by the op's duration and record it (the detail names the compute
        mode, selective recompute or sequence parallelism, which changes the duration)."""
        n = samples.bit_count()
        duration, flops, _ = self._cache.get((op, layer, n, tp, mode)) or self._cost(op, layer, n, tp, mode)
        state = self._state
        start = state.clock
        state.clock = end = start + duration
        state.flops += flops
        self._events.append((self.rank, op, "compute", start, end, layer, samples, 0, flops, None, 0,
                             "" if mode == "none" else mode))

    def _weight_grad(self, layer: int, act: Activation, weight: Weight) -> WeightGrad:
        tp = weight.tp_size
        sizes = self._shard_bytes(layer, tp)
        nbytes = sizes[2] if len(sizes) > 2 else sizes[0]  # the weights' size, unless the gradients are wider
        return WeightGrad(self._mem, nbytes, self.rank, layer, act.samples, 1, 1, weight.tp_rank, tp)

    def _activation_grad(self, act: Activation, weight: Weight) -> ActivationGrad:
        return ActivationGrad(self._mem, act.samples.bit_count() * self._act_bytes, self.rank, act.layer,
                              act.samples, 1 << weight.tp_rank, weight.tp_size)  # a TP slice: partial sum


def _on(mem: Any, *tensors: Any) -> bool:
    """Are these tensors all on the memory log `mem` (a rank's of this step)?"""
    return all(buffer_log(t) is mem for t in tensors)


# what all_reduce refuses though it is neither a weight nor a complete tensor: a TP piece of a message
# (`split_tp`) is 1/t of the bytes, and summing pieces is not gathering them
_NOT_SUMMED = (ActivationSlice, ActivationGradSlice, PipeExtra)

# the buffers `Model.pipe_extra` makes, in the recorder's numbering
PIPE_EXTRAS = ("attention_mask", "partition_meta")


def _check_tp_slice(where: str, tp_rank: Any, tp_size: Any) -> None:
    """One TP slice's coordinates, as the ops that take `tp_rank` / `tp_size` keywords need them."""
    if tp_size.__class__ is not int or tp_rank.__class__ is not int or tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise TensorError(f"{where}: tp_rank={tp_rank!r}, tp_size={tp_size!r} is not a TP slice; need whole "
                          f"numbers with 0 <= tp_rank < tp_size")

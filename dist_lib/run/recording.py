"""Record a strategy's decisions as a program: per rank, its `Model` calls, awaits and drops.

A graded submission is untrusted, so what it computes is not taken as the result. It only says what
it *decided*: for each rank, the sequence of `Model` calls (the op, its plain arguments, and its tensors
as handles), each `await` of a `Work`, and the moment the strategy dropped its last reference to each
tensor or work (memory is by reference lifetime, so a drop is a decision too). `replay.py` runs that
program through the simulator again, in the trusted process, and computes every time, byte and
verdict from it: an edited program is just another program.

The strategy gets a `RecordingModel`, which forwards to the real `Model` and returns `Handle`s in place
of tensors and works. A handle forwards attribute reads to its tensor and claims its class, so
`isinstance(x, Work)` and `x.samples` behave as before; its death appends the drop to its rank's program.

A program is one `array('q')` per rank: each entry an opcode followed by its operands. Results take the
next handle numbers of the rank, in order (a `backward` makes two). The opcodes:

    LOAD layer shard num_shards tp_rank tp_size   -> weight, optimizer state
    INPUT k (start stop) x k                      -> activation (samples: k half-open intervals)
    FORWARD layer act weight flags                -> activation (flags: 1 stash, 2 selective recompute,
                                                     4 sequence parallel, 8 / 16 / 24 FP8 delayed /
                                                     tensorwise / rowwise, 32 per-op selective checkpointing: selective_recompute="op")
    BACKWARD layer act grad weight                -> weight gradient, activation gradient
    BACKWARD_INPUT / BACKWARD_WEIGHT (the same)   -> activation gradient / weight gradient
    LOSS act tp_rank tp_size                      -> activation gradient (its TP slice of the LM head)
    UPDATE layer grad weight opt                  -> weight, optimizer state
    FINAL layer weight                            -> (nothing)
    ALL_REDUCE / ALL_GATHER / REDUCE_SCATTER x k rank x k (k = 0: every rank) -> work
    SEND x dst, RECV src                          -> work
    ADD a b                                       -> weight gradient (a + b)
    SPLIT x k (start stop) x k                    -> those samples of activation (gradient) x
    JOIN k part x k                               -> the parts as one activation (gradient)
    SPLIT_TP x tp_rank tp_size                    -> that TP piece of activation (gradient) x
    AWAIT work                                    -> its result (None after a send); a list (an all_to_all's)
                                                     takes a handle per entry
    DROP handle
    BROADCAST / REDUCE x root k rank x k          -> work (x = -1: None, a broadcast's receivers)
    BARRIER k rank x k                            -> work
    ALL_TO_ALL k rank x k n piece x n e [c (start stop) x c] x n (e & 1) [d (start stop) x d] x n (e & 2)
                                                  -> work (piece = -1: None; e & 1 when `expect` was given: per
                                                     member c intervals of samples, 0 for None; e & 2 when
                                                     `expect_experts` was: per member d intervals of experts;
                                                     e >> 2 & 3 the dispatcher's index, e & 16 `probs`)
    the MoE ops of an `MoEModel`, opcodes 26 on: `recording_experts.py`
    the context-parallel ops, opcodes 37 on: `recording_context.py`
    LOAD_SHARDED_STATE layer shard num_shards tp_rank tp_size (42) -> weight (whole), optimizer state (shard)
    EXPERT_BACKWARD_GROUPED (43): the grouped expert backward, `recording_experts.py`
"""

from __future__ import annotations

from array import array
from typing import Any

from dist_lib.comm.collectives import Work
from dist_lib.errors import TensorError
from dist_lib.model.experts import MoEModel
from dist_lib.model.handle import PIPE_EXTRAS
from dist_lib.model.layer_runs import LayerRuns
from dist_lib.model.other_collective_ops import DISPATCHERS
from dist_lib.run.recording_context import CONTEXT_OPCODES, ContextOpsRecording
from dist_lib.run.recording_experts import (EXPERT_BACKWARD_GROUPED, EXPERT_GROUPED_OPCODES, EXPERT_OPCODES,
                                            EXPERT_QUERIES, EXPERT_TP_OPCODES, REDUCE_ROUTED, ExpertOpsRecording,
                                            mask_intervals)
from dist_lib.tensors import samples_mask

# a forward's FP8 recipe in its flags (`costs.fp8`), bits 8 and 16 together a two-bit field
FP8_FLAGS = {"": 0, "delayed": 8, "tensorwise": 16, "rowwise": 24}

(LOAD, INPUT, FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, LOSS, UPDATE, FINAL, ALL_REDUCE, ALL_GATHER,
 REDUCE_SCATTER, SEND, RECV, ADD, AWAIT, DROP, SPLIT, JOIN, SPLIT_TP, TIED, EXTRA, BROADCAST, REDUCE, BARRIER,
 ALL_TO_ALL) = range(26)
OPCODES = ("load_weights", "get_input_activation", "forward", "backward", "backward_input", "backward_weight",
           "loss", "update", "set_final_weight", "all_reduce", "all_gather", "reduce_scatter", "send", "recv",
           "add", "await", "drop", "split_samples", "join_samples", "split_tp",
           "tied_embedding_grad", "pipe_extra", "broadcast", "reduce", "barrier", "all_to_all") + EXPERT_OPCODES + CONTEXT_OPCODES \
    + EXPERT_TP_OPCODES + ("load_sharded_state",) + EXPERT_GROUPED_OPCODES
assert OPCODES[REDUCE_ROUTED] == "reduce_routed" and OPCODES[EXPERT_BACKWARD_GROUPED] == "expert_backward"
LOAD_SHARDED_STATE = 42  # added after the MoE and context ops, which keep their numbers
assert OPCODES[LOAD_SHARDED_STATE] == "load_sharded_state"
COLLECTIVE_CODES = {"all_reduce": ALL_REDUCE, "all_gather": ALL_GATHER, "reduce_scatter": REDUCE_SCATTER}
UNRECORDED_OPS = ("group",) + EXPERT_QUERIES  # methods that decide nothing (a group is named by its ranks where used)


class Recorder:
    """Every rank's program as it is decided. Closed once the step is over: what a strategy drops after
    that (a module-level list emptied at exit) is not part of the step."""

    __slots__ = ("programs", "counts", "open", "busy", "held")

    def __init__(self, world_size: int):
        self.programs = [array("q") for _ in range(world_size)]
        self.counts = [0] * world_size  # handles numbered so far on each rank
        self.open = True
        self.busy: list[str | None] = [None] * world_size  # the context op in flight on each rank
        self.held: list[array | None] = [None] * world_size  # its rank's program meanwhile

    def emit(self, rank: int, *words: int) -> None:
        if self.open:
            if self.busy[rank] is not None:
                raise TensorError(f"rank {rank} {_name(words[0])}: {self.busy[rank]} is still in flight on this "
                                  f"rank; a graded run records a context op as one decision, so the rank may do "
                                  f"nothing else until it returns (await it first)")
            self.programs[rank].extend(words)

    def begin(self, rank: int, op: str) -> None:
        """A context op (a coroutine that messages and awaits inside) starts on `rank`: until `finish`, the
        rank's drops go aside, to follow the op's entry, and any other op of the rank is refused."""
        if self.busy[rank] is not None:
            raise TensorError(f"rank {rank} {op}: {self.busy[rank]} is still in flight on this rank; a graded run "
                              f"records a context op as one decision, so await it before starting another")
        self.busy[rank] = op
        self.held[rank] = self.programs[rank]
        self.programs[rank] = array("q")  # where `Handle.__del__` writes the drops meanwhile

    def finish(self, rank: int, entry: tuple[int, ...]) -> None:
        """The context op begun on `rank` returned (its `entry`) or failed (no entry): record it, then the
        drops made while it ran."""
        dropped, self.programs[rank] = self.programs[rank], self.held[rank]  # type: ignore[assignment]
        self.held[rank] = self.busy[rank] = None
        if self.open:
            self.programs[rank].extend(entry)
            self.programs[rank].extend(dropped)

    def wrap(self, rank: int, obj: Any) -> Any:
        """The next handle of `rank` for `obj` (a tensor or a work; None stays None but takes a number)."""
        if obj.__class__ is list:  # an all_to_all's received pieces: a handle each
            return [self.wrap(rank, t) for t in obj]
        number = self.counts[rank]
        self.counts[rank] = number + 1
        if obj is None:
            return None
        return (WorkHandle if obj.__class__ is Work else Handle)(obj, rank, number, self)


class Handle:
    """What the strategy holds in place of a tensor: reads go to the tensor; its death is a DROP."""

    __slots__ = ("_t", "_rank", "_number", "_recorder")

    def __init__(self, target: Any, rank: int, number: int, recorder: Recorder):
        _SET_T(self, target)  # the slots' own setters: this class forwards setattr to the tensor
        _SET_RANK(self, rank)
        _SET_NUMBER(self, number)
        _SET_RECORDER(self, recorder)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(handle, Activation) holds, as for the tensor itself
        return self._t.__class__

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._t, name, value)  # fields are read-only by convention; a replay never sees this

    def __repr__(self) -> str:
        return repr(self._t)

    def __add__(self, other: Any) -> Any:
        target = _target(other, self._rank, "WeightGrad + WeightGrad")
        total = self._t + target
        if total is NotImplemented:
            return NotImplemented
        self._recorder.emit(self._rank, ADD, self._number, other._number)
        return self._recorder.wrap(self._rank, total)

    def __del__(self) -> None:
        recorder = self._recorder  # Recorder.emit, inlined: a drop is every other entry
        if recorder.open:
            recorder.programs[self._rank].extend((DROP, self._number))


_SET_T, _SET_RANK, _SET_NUMBER, _SET_RECORDER = (getattr(Handle, name).__set__ for name in Handle.__slots__)


class WorkHandle(Handle):
    """A handle of a `Work`: awaiting it awaits the work and records the AWAIT."""

    __slots__ = ()

    def __await__(self):
        result = yield from self._t.__await__()
        self._recorder.emit(self._rank, AWAIT, self._number)
        return self._recorder.wrap(self._rank, result)


def _target(x: Any, rank: int, where: str) -> Any:
    """The tensor or work behind a handle; a value that is no handle goes through unchanged (the op
    then rejects it as usual), except a tensor reached around the model, which a program cannot name."""
    if type(x) is Handle or type(x) is WorkHandle:
        return x._t
    from dist_lib.memory.tracker import Buffer
    if isinstance(x, (Buffer, Work)):
        raise TensorError(f"rank {rank} {where}: {x!r} was not returned by this model's ops (tensors must be "
                          f"the values the ops and awaits return)")
    return x


class RecordingModel(ContextOpsRecording):
    """The `Model` a recorded strategy drives: the same ops, recorded, with handles for tensors (context
    parallelism's from the mixin)."""

    __slots__ = ("_model", "_recorder", "_rank")

    def __init__(self, model: Any, recorder: Recorder):
        self._model = model
        self._recorder = recorder
        self._rank = model.rank

    def __getattr__(self, name: str) -> Any:  # rank, world_size, time, memory_bytes, device, group, ...
        value = getattr(self._model, name)
        if callable(value) and not name.startswith("_") and name not in UNRECORDED_OPS:
            raise TensorError(f"rank {self._rank} {name}: this op is not recorded, so a graded run cannot use it "
                              f"(the grader re-executes only recorded ops)")
        return value

    def __repr__(self) -> str:
        return repr(self._model)

    def _emit(self, *words: int) -> None:
        self._recorder.emit(self._rank, *words)

    def _wrap(self, obj: Any) -> Any:
        return self._recorder.wrap(self._rank, obj)

    def _t(self, x: Any, where: str) -> Any:
        return _target(x, self._rank, where)

    # a run of layers is recorded as its ops, one by one (their handles dropped where the run drops them)
    forward_layers = LayerRuns.forward_layers
    backward_layers = LayerRuns.backward_layers

    def load_weights(self, layer: int, shard: int = 0, num_shards: int = 1, *, tp_rank: int = 0,
                     tp_size: int = 1) -> tuple[Any, Any]:
        weight, opt = self._model.load_weights(layer, shard, num_shards, tp_rank=tp_rank, tp_size=tp_size)
        self._emit(LOAD, layer, shard, num_shards, tp_rank, tp_size)
        return self._wrap(weight), self._wrap(opt)

    def load_sharded_state(self, layer: int, shard: int, num_shards: int, *, tp_rank: int = 0,
                           tp_size: int = 1) -> tuple[Any, Any]:
        weight, opt = self._model.load_sharded_state(layer, shard, num_shards, tp_rank=tp_rank, tp_size=tp_size)
        self._emit(LOAD_SHARDED_STATE, layer, shard, num_shards, tp_rank, tp_size)
        return self._wrap(weight), self._wrap(opt)

    def get_input_activation(self, samples: Any) -> Any:
        act = self._model.get_input_activation(samples)
        spans = _intervals(act.samples)
        self._emit(INPUT, len(spans) // 2, *spans)
        return self._wrap(act)

    def forward(self, layer: int, act: Any, weight: Any, *, stash: bool = True,
                selective_recompute: bool | str = False, sequence_parallel: bool = False, fp8: str = "") -> Any:
        out = self._model.forward(layer, self._t(act, "forward"), self._t(weight, "forward"), stash=stash,
                                  selective_recompute=selective_recompute, sequence_parallel=sequence_parallel,
                                  fp8=fp8)
        self._emit(FORWARD, layer, act._number, weight._number,
                   (1 if stash else 0) | (32 if selective_recompute == "op" else 2 if selective_recompute else 0)
                   | (4 if sequence_parallel else 0) | FP8_FLAGS[fp8])
        return self._wrap(out)

    def _backward(self, op: int, name: str, layer: int, act: Any, grad: Any, weight: Any) -> Any:
        out = getattr(self._model, name)(layer, self._t(act, name), self._t(grad, name), self._t(weight, name))
        self._emit(op, layer, act._number, grad._number, weight._number)
        return out

    def backward(self, layer: int, act: Any, grad: Any, weight: Any) -> tuple[Any, Any]:
        weight_grad, act_grad = self._backward(BACKWARD, "backward", layer, act, grad, weight)
        return self._wrap(weight_grad), self._wrap(act_grad)

    def backward_input(self, layer: int, act: Any, grad: Any, weight: Any) -> Any:
        return self._wrap(self._backward(BACKWARD_INPUT, "backward_input", layer, act, grad, weight))

    def backward_weight(self, layer: int, act: Any, grad: Any, weight: Any) -> Any:
        return self._wrap(self._backward(BACKWARD_WEIGHT, "backward_weight", layer, act, grad, weight))

    def loss(self, act: Any, *, tp_rank: int = 0, tp_size: int = 1) -> Any:
        out = self._model.loss(self._t(act, "loss"), tp_rank=tp_rank, tp_size=tp_size)
        self._emit(LOSS, act._number, tp_rank, tp_size)
        return self._wrap(out)

    def tied_embedding_grad(self, *, tp_rank: int = 0, tp_size: int = 1) -> Any:
        out = self._model.tied_embedding_grad(tp_rank=tp_rank, tp_size=tp_size)
        self._emit(TIED, tp_rank, tp_size)
        return self._wrap(out)

    def update(self, layer: int, grad: Any, weight: Any, opt_state: Any) -> tuple[Any, Any]:
        new_weight, new_opt = self._model.update(layer, self._t(grad, "update"), self._t(weight, "update"),
                                                 self._t(opt_state, "update"))
        self._emit(UPDATE, layer, grad._number, weight._number, opt_state._number)
        return self._wrap(new_weight), self._wrap(new_opt)

    def set_final_weight(self, layer: int, weight: Any) -> None:
        self._model.set_final_weight(layer, self._t(weight, "set_final_weight"))
        self._emit(FINAL, layer, weight._number)

    def _collective(self, name: str, x: Any, group: Any) -> Any:
        resolved = self._model._resolve_group(group, name)
        work = getattr(self._model, name)(self._t(x, name), resolved)
        ranks = () if group is None else resolved.ranks
        self._emit(COLLECTIVE_CODES[name], x._number, len(ranks), *ranks)
        return self._wrap(work)

    def all_reduce(self, x: Any, group: Any = None) -> Any:
        return self._collective("all_reduce", x, group)

    def all_gather(self, x: Any, group: Any = None) -> Any:
        return self._collective("all_gather", x, group)

    def reduce_scatter(self, x: Any, group: Any = None) -> Any:
        return self._collective("reduce_scatter", x, group)

    def _group_words(self, group: Any, name: str) -> tuple[Any, list[int]]:
        resolved = self._model._resolve_group(group, name)
        ranks = [] if group is None else list(resolved.ranks)
        return resolved, [len(ranks), *ranks]

    def broadcast(self, x: Any, root: int, group: Any = None) -> Any:
        return self._rooted(BROADCAST, "broadcast", x, root, group)

    def reduce(self, x: Any, root: int, group: Any = None) -> Any:
        return self._rooted(REDUCE, "reduce", x, root, group)

    def _rooted(self, op: int, name: str, x: Any, root: int, group: Any) -> Any:
        resolved, words = self._group_words(group, name)
        work = getattr(self._model, name)(None if x is None else self._t(x, name), root, resolved)
        self._emit(op, -1 if x is None else x._number, root, *words)
        return self._wrap(work)

    def barrier(self, group: Any = None) -> Any:
        resolved, words = self._group_words(group, "barrier")
        work = self._model.barrier(resolved)
        self._emit(BARRIER, *words)
        return self._wrap(work)

    def all_to_all(self, pieces: Any, group: Any = None, *, expect: Any = None, expect_experts: Any = None,
                   dispatcher: Any = "alltoall", probs: Any = False) -> Any:
        resolved, words = self._group_words(group, "all_to_all")
        if isinstance(expect, (list, tuple)):  # read twice below: a generator of samples becomes a list
            expect = [_listed(samples) for samples in expect]
        if isinstance(expect_experts, (list, tuple)):
            expect_experts = [_listed(experts) for experts in expect_experts]
        if not isinstance(pieces, (list, tuple)):  # refused there, with its message
            return self._model.all_to_all(pieces, resolved, expect=expect, expect_experts=expect_experts,
                                          dispatcher=dispatcher, probs=probs)
        work = self._model.all_to_all([None if p is None else self._t(p, "all_to_all") for p in pieces], resolved,
                                      expect=expect, expect_experts=expect_experts, dispatcher=dispatcher,
                                      probs=probs)
        words += [len(pieces), *(-1 if p is None else p._number for p in pieces)]
        # flags: bit 0 expect, bit 1 expect_experts, bits 2-3 the dispatcher (0: alltoall; checked by the op), bit 4
        # probs
        words.append((expect is not None) | (expect_experts is not None) << 1 | DISPATCHERS.index(dispatcher) << 2
                     | (probs is True) << 4)
        for samples in expect or ():  # (checked by the op: one entry per member, each None or samples)
            spans = [] if samples is None else _intervals(samples_mask(samples, self._model.global_batch_size))
            words += [len(spans) // 2, *spans]
        for experts in expect_experts or ():  # (each None or distinct expert numbers)
            spans = [] if experts is None else _intervals(sum(1 << e for e in experts))
            words += [len(spans) // 2, *spans]
        self._emit(ALL_TO_ALL, *words)
        return self._wrap(work)

    def send(self, x: Any, dst: int) -> Any:
        work = self._model.send(self._t(x, "send"), dst)
        self._emit(SEND, x._number, dst)
        return self._wrap(work)

    def recv(self, src: int) -> Any:
        work = self._model.recv(src)
        self._emit(RECV, src)
        return self._wrap(work)

    def split_samples(self, x: Any, samples: Any) -> Any:
        out = self._model.split_samples(self._t(x, "split_samples"), samples)
        spans = _intervals(out.samples)  # what was taken, however the samples were named
        self._emit(SPLIT, x._number, len(spans) // 2, *spans)
        return self._wrap(out)

    def join_samples(self, parts: Any) -> Any:
        if not isinstance(parts, (list, tuple)):
            return self._model.join_samples(parts)  # refused there, with the model's message
        out = self._model.join_samples([self._t(part, "join_samples") for part in parts])
        self._emit(JOIN, len(parts), *(part._number for part in parts))
        return self._wrap(out)

    def split_tp(self, x: Any, tp_rank: int, tp_size: int) -> Any:
        out = self._model.split_tp(self._t(x, "split_tp"), tp_rank, tp_size)
        self._emit(SPLIT_TP, x._number, tp_rank, tp_size)
        return self._wrap(out)

    def pipe_extra(self, what: str, *, tp_size: int = 1) -> Any:
        out = self._model.pipe_extra(what, tp_size=tp_size)
        self._emit(EXTRA, PIPE_EXTRAS.index(what), tp_size)
        return self._wrap(out)


class RecordingMoEModel(RecordingModel, ExpertOpsRecording):
    """The recording `Model` of a rank training a mixture of experts: also its MoE ops."""

    __slots__ = ()


def _listed(samples: Any) -> Any:
    """Samples that can be read twice (the op refuses what is not samples, with its message)."""
    if samples is None or isinstance(samples, (range, list, tuple)):
        return samples
    try:
        return list(samples)
    except TypeError:
        return samples


def _name(op: int) -> str:
    return OPCODES[op] if 0 <= op < len(OPCODES) else f"opcode {op}"


_intervals = mask_intervals  # a samples mask as flat [start, stop, start, stop, ...] half-open intervals


def record(strategy: Any, cluster: Any, workload: Any, global_batch_size: int, *, enforce_memory: bool = True,
           memory_reserve: Any = None, **options: Any) -> tuple[Any, list[array]]:
    """Simulate `strategy` (as `simulate` does, with `check=False`) and return its result and its program."""
    from dist_lib.hardware.cluster import Cluster
    from dist_lib.run.simulator import check_options, load_strategy, simulate
    train, name = load_strategy(strategy)
    check_options(train, options, name)
    cluster = Cluster.load(cluster)
    recorder = Recorder(cluster.world_size)

    async def recorded(model: Any) -> None:
        await train((RecordingMoEModel if isinstance(model, MoEModel) else RecordingModel)(model, recorder), **options)

    try:
        result = simulate(recorded, cluster, workload, global_batch_size, check=False, enforce_memory=enforce_memory,
                          memory_reserve=memory_reserve)
    finally:
        recorder.open = False
    result.strategy = name
    result.options = dict(options)
    return result, recorder.programs

"""Groups, `Work` handles, and what collectives do to time (to tensors: `rules.py`;
point-to-point: `p2p.py`).

Timing (DESIGN.md, "Semantics"):

* each group is a communicator with its own stream on every member, as each PyTorch process group has
  its own NCCL communicator and stream: a collective on group G is the k-th op each member issues on G;
  it starts once every member has issued it and the group's (k-1)-th op has ended (ops on one
  communicator run in issue order): start = max(issue times, group stream free). It then takes its
  cost (costs/), stretched while other transfers share its links (`engine/transfers.py`); its end is final
  at the engine's next quiescence, when the member Works complete and their waiting ranks wake.
  Collectives of different groups do not wait for each other, so a data-parallel gradient all-reduce
  overlaps the tensor-parallel all-reduces that follow it;
* `send`/`recv` match in order per (src, dst) pair on their own channel (`p2p.py`).

Buffers follow NCCL: an all-reduce works in place (its result shares the input's memory), all-gather
and reduce-scatter outputs are allocated when the op is issued, a received tensor when its message
arrives (made when `recv` is awaited, or at the message's end if no one waits on it then). The engine holds an op's Works until the op ends, as a stream keeps its buffers, and a Work
holds its input until it is awaited; a send's tensor is let go of when the message ends.
"""

from __future__ import annotations

import asyncio
import threading
from itertools import islice
from operator import attrgetter
from typing import Any


from dist_lib.costs import network
# (the C twins look up Group, Collective and Tensor in this module)
from dist_lib.comm.groups import COLLECTIVES, Collective, CrossGroup, FoldedGroup, Group  # noqa: F401
from dist_lib.comm.folding import mirrored_works
from dist_lib.comm.rules import Reduced, check_match, combine, explain_input, unfit
from dist_lib.engine.core import Engine
from dist_lib.engine.rank_state import SHOWN, WAKE_ME, RankState, more
from dist_lib.errors import TensorError
from dist_lib.memory.tracker import AllocLog
# (the C twins load WeightGrad, Reduced and the activation classes from this module)
from dist_lib.tensors import Activation, ActivationGrad, ActivationGradSlice, ActivationSlice, ContextActivation, ContextActivationGrad, ContextActivationGradSlice, ContextActivationSlice, ContextWeightGrad, Tensor, WeightGrad  # noqa: F401
from dist_lib.engine.transfers import Transfer

class Work:
    """Handle of an issued communication op; `await work` returns its result and moves the clock."""

    __slots__ = ("engine", "rank", "op", "issue", "end", "result", "input", "future", "peer")

    def __init__(self, engine: Engine, rank: int, op: str, issue: float, tensor: Tensor | None, peer: Any):
        self.engine = engine
        self.rank = rank
        self.op = op
        self.issue = issue
        self.end: float | None = None
        self.result: Any = None
        self.input = tensor
        self.future = None  # how its rank waits on it: WAKE_ME, an asyncio future, several (`engine._Waits`), None
        self.peer = peer  # the Collective, or the (src, dst) pair

    @property
    def detail(self) -> str:
        """What is being sent or reduced (while the op is pending, its input is alive)."""
        t = self.input
        return f"{t.kind} layer {t.layer}" if t is not None else ""

    @property
    def done(self) -> bool:
        """True once the op's end is final: every peer has issued its side and the engine has run the
        links up to the end (at a quiescence, see `engine/core.py`)."""
        return self.end is not None

    def __await__(self):
        engine = self.engine
        if engine.driving == self.rank and threading.get_ident() == engine.thread:
            # the rank's own coroutine: the engine resumes it (`Engine._drive`)
            if self.end is None:
                engine.block_direct(engine.ranks[self.rank], self)
                if self.end is None:  # (else the quiescence it reached completed this work)
                    yield WAKE_ME
        elif engine.stopped is not None and engine.stopped.done():
            raise TensorError(f"rank {self.rank} awaits {self!r}, a work of an earlier step (kept from one "
                              f"simulate() to the next?); a step's works and tensors are its own")
        elif threading.get_ident() != engine.thread or _running_loop() is not engine.loop:
            raise TensorError(f"rank {self.rank} awaits {self!r} in another thread or event loop than its step's; "
                              f"a rank awaits its works in the step's own (not through asyncio.to_thread or "
                              f"asyncio.run)")
        elif engine.driving >= 0:  # another rank's coroutine
            raise self._not_yours(engine.driving)
        else:  # inside an asyncio task (a `gather`'s): the rank whose coroutine made it
            owner = engine.task_ranks.get(asyncio.current_task())
            if owner is not None and owner != self.rank:
                raise self._not_yours(owner)
            if self.end is None:
                state = engine.ranks[self.rank]
                future = engine.block(state, self)
                try:
                    yield from future.__await__()
                except BaseException:  # the task was cancelled (a `wait_for`'s timeout): this wait is over
                    engine.unblock(state, self, future)
                    raise
        return self._complete()

    def _not_yours(self, rank: int) -> TensorError:
        return TensorError(f"rank {rank} awaits {self!r}, which rank {self.rank} issued; a rank awaits only its "
                           f"own works (tensors reach another rank by send/recv or a collective)")

    def _complete(self) -> Any:
        state = self.engine.ranks[self.rank]
        if state.clock < self.end:
            state.clock = self.end
        result = self.result
        cls = result.__class__
        if cls is Reduced:  # an all-reduce's result is made on each member as it awaits it
            result = self.result = result.materialize(self.input)
        elif cls is _Pending:  # a received tensor materializes on the receiver now
            result = self.result = result.materialize(state)
        self.input = None
        return result

    def describe(self) -> str:
        if self.op in COLLECTIVES:
            coll: Collective = self.peer
            missing = [r for r, w in zip(coll.group.ranks, coll.works) if w is None]
            if missing and self.engine.partition is not None:  # (a step in two processes: run/split.py)
                missing = self.engine.partition.still_missing(coll, missing)
            if missing:
                why = f"ranks {missing} have not issued it"
            elif coll in coll.group.ready:
                why = "earlier ops on the group's stream"
            else:
                why = "every member issued it; in flight"
            return f"{self.op} #{coll.seq} on group {list(coll.group.ranks)} ({self.detail}): {why}"
        src, dst = self.peer
        channel = self.engine.channels[self.peer]
        # a matched message waits only when some rank waits on asyncio instead (a hang)
        where = "queued behind earlier messages" if any(self in pair for pair in channel.ready) else "in flight"
        if self.op == "send":
            if self not in channel.sends:
                return f"send to rank {dst} ({self.detail}): matched by rank {dst}'s recv({src}); {where}"
            return f"send to rank {dst} ({self.detail}): rank {dst} has not posted a matching recv({src})"
        if self not in channel.recvs:
            return f"recv from rank {src}: matched by rank {src}'s send; {where}"
        return f"recv from rank {src}: rank {src} has not sent to rank {dst}"

    def __repr__(self) -> str:
        return f"Work({self.op} on rank {self.rank}, {'done' if self.done else 'pending'})"


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # (a work's `__await__` driven by hand, outside any loop)
        return None


class _Pending:
    """A tensor to create on its receiver when the receiver awaits it: class, fields and size, no buffer
    (the sender's tensor may be freed meanwhile)."""

    __slots__ = ("cls", "values", "nbytes", "layer")

    def __init__(self, tensor: Tensor):
        self.cls = tensor.__class__
        self.values = _values(tensor)  # the constructor fields after `rank`, without a stash
        self.nbytes = tensor.nbytes
        self.layer = tensor.layer

    def materialize(self, state: RankState) -> Tensor:
        state.memory.context = ("recv", self.layer)  # what an out-of-memory error names
        return self.cls(state.memory, self.nbytes, state.rank, *self.values)


# class -> (getter of the constructor fields after `rank`, whether the last of them is a stash): every
# tensor class's `_args` starts with `rank`, and a stash, where a class has one, comes last
_FIELD_GETTERS: dict[type, tuple[Any, bool]] = {}


def _values(t: Tensor) -> tuple:
    """t's constructor fields after `rank`, in order, without a stash."""
    cls = t.__class__
    getter = _FIELD_GETTERS.get(cls)
    if getter is None:
        names = cls._args
        if names[0] != "rank" or "_stash" in names[1:-1]:  # a new tensor class breaking the layout above
            raise TypeError(f"{cls.__name__}._args must start with 'rank' and end with any '_stash'")
        getter = _FIELD_GETTERS[cls] = (attrgetter(*names[1:]), names[-1] == "_stash")
    get, stashed = getter
    values = get(t)
    return values[:-1] + (None,) if stashed else values


def _fields(t: Tensor) -> dict[str, Any]:
    """t's constructor fields in order, without a stash."""
    return dict(zip(t._args, (t.rank, *_values(t))))


def clone(t: Tensor, rank: int, buffer: AllocLog | Tensor, nbytes: int = 0, **changes: Any) -> Tensor:
    """A new tensor with t's fields (and `changes`) on `rank`, with no stash: `nbytes` allocated on the
    memory log `buffer`, or a view of the tensor `buffer`."""
    fields = _fields(t)
    fields["rank"] = rank
    fields.update(changes)
    return t.__class__(buffer, nbytes, *fields.values())


# ---- collectives ---------------------------------------------------------------------------------

def issue_collective(engine: Engine, state: RankState, op: str, tensor: Tensor, group: Group) -> Work:
    rank = state.rank
    pos = group.index.get(rank)
    if not isinstance(tensor, Tensor) or tensor.rank != rank or pos is None or unfit(op, tensor):
        explain_input(op, tensor, group, rank)
    seq = group.next_seq[pos]
    coll = group.pending.get(seq)
    if coll is not None:
        check_match(coll, op, tensor, rank)
    result = None
    if op != "all_reduce":  # the output is allocated now (`combine` fills in its fields)
        state.memory.context = (op, tensor.layer)  # what an out-of-memory error names
        if tensor.__class__ is ContextActivationGradSlice:  # the CP part's gradient, gathered once more
            result = ContextActivationGrad(state.memory, tensor.nbytes * group.size, rank, tensor.layer, tensor.samples,
                                           1, 1, tensor.gathers + (group.size,), tensor.cp_rank, tensor.cp_size)
        elif tensor.__class__ is ContextActivationSlice:  # a checkpointed CP part, whole for its recompute
            result = ContextActivation(state.memory, tensor.nbytes * group.size, rank, tensor.layer, tensor.samples,
                                       1, 1, tensor.cp_rank, tensor.cp_size)
        elif tensor.__class__ is ActivationSlice or tensor.__class__ is ActivationGradSlice:
            # TP pieces gather into the whole activation (or gradient) of their samples
            nbytes = tensor.samples.bit_count() * engine.workload.activation_bytes()
            if tensor.__class__ is ActivationGradSlice:  # a gradient counts the gathers that made it whole
                result = ActivationGrad(state.memory, nbytes, rank, tensor.layer, tensor.samples, 1, 1,
                                        tensor.gathers + (group.size,))
            else:
                result = tensor.whole(state.memory, nbytes, rank, tensor.layer, tensor.samples)
        elif tensor.__class__ is ContextWeightGrad:  # a shard of the whole gradient (`rules._scattered_parts`)
            result = WeightGrad(state.memory, tensor.nbytes // group.size, rank, tensor.layer, tensor.samples, 1, 1,
                                tensor.tp_rank, tensor.tp_size)
        else:
            nbytes = tensor.nbytes * group.size if op == "all_gather" else tensor.nbytes // group.size
            result = clone(tensor, rank, state.memory, nbytes)
    # the books change only now: a rejected or out-of-memory issue leaves the group as it was
    group.next_seq[pos] = seq + 1
    if coll is None:
        coll = group.pending[seq] = Collective(group, seq, op)
    work = Work(engine, rank, op, state.clock, tensor, coll)
    work.result = result
    coll.works[pos] = work
    coll.issued += 1
    if coll.first is None:
        coll.first = work
    if coll.issued == group.size:
        _resolve_ready(engine, coll)
    elif group.__class__ is CrossGroup and coll.issued == group.local:
        engine.partition.joined(coll)
    elif group.__class__ is FoldedGroup and coll.issued == group.local:
        _resolve_folded(engine, coll)
    return work


def _resolve_ready(engine: Engine, coll: Collective) -> None:
    """Every member has issued `coll`: check and combine the inputs, price it, and start it on the
    group's stream, or queue it behind the collective in flight there. (Its predecessor on the group is
    issued already: the member whose issue completes `coll` issued the predecessor before.)"""
    group = coll.group
    works: list[Work] = coll.works  # type: ignore[assignment]
    coll.results, coll.nbytes, coll.label = combine(engine, coll, [w.input for w in works])
    coll.duration = collective_duration(engine, coll)
    del group.pending[coll.seq]
    if group.busy:
        group.ready.append(coll)
    else:
        _start(engine, coll)


def _resolve_folded(engine: Engine, coll: Collective) -> None:
    """`_resolve_ready` for a collective spanning folded replicas, once its representatives issued it: the
    other replicas' inputs are mirrored from theirs (`folding.py`) for the rules and the cost; only the
    representatives' works go on."""
    group: FoldedGroup = coll.group  # type: ignore[assignment]
    works = coll.works = mirrored_works(engine, coll)
    results, coll.nbytes, coll.label = combine(engine, coll, [w.input for w in works])
    coll.duration = collective_duration(engine, coll)
    coll.works = [works[i] for i in group.positions]
    coll.results = [results[i] for i in group.positions]
    del group.pending[coll.seq]
    if group.busy:
        group.ready.append(coll)
    else:
        _start(engine, coll)


def collective_duration(engine: Engine, coll: Collective) -> float:
    """`coll`'s time with its links to itself, once per group and kind of op."""
    group, first = coll.group, coll.works[0].input
    # Megatron TP: a layer's partial sums are two all-reduces (attention and MLP), each of b*s*h; the LM
    # head's input gradient (the gradient of the last layer's output) is one. A context-parallel layer's
    # (b*s/cp*h each) are two as well: CP changes the attention's keys and values, not the layer's TP linears.
    # An MoE layer's input gradient is one, its attention's: its experts' tokens come back by all-to-all, with
    # no TP collective of their own (Megatron-Core's MoE layer with sequence parallelism; its forward is the
    # attention's reduce-scatter and one all-gather, `_expert_stage`).
    # The key's last field: 1 (True) for a forward layer's pair, 2 for a backward layer's pair (its input
    # gradient's), 0 (False) for a single collective; a TP group whose overlap credits the forward's pair and not
    # the backward's (`comm.tp_overlap`, torchtitan's async TP) tells them apart by it.
    cls = first.__class__
    workload = engine.workload
    key = (coll.op, coll.nbytes, True if cls is Activation or cls is ContextActivation
           else 2 if ((cls is ActivationGrad or cls is ContextActivationGrad) and first.layer != workload.num_layers
                      and not (workload.moe is not None and workload.moe.is_moe(first.layer)))
           else False)
    duration = group.costs.get(key)
    if duration is None:
        duration = group.costs[key] = network.collective_time(coll.op, coll.nbytes, group.topology) * \
            (2 if key[2] else 1)
    return duration


def _start(engine: Engine, coll: Collective) -> None:
    """The group's stream takes `coll`: it starts once the last member issued it and the stream is free."""
    group = coll.group
    group.busy = True
    start = max(max(w.issue for w in coll.works), group.free)  # type: ignore[union-attr]
    # (a broadcast, reduce, barrier or all-to-all, `other_collectives.py`, names the links it crosses)
    usage = group.usage if coll.__class__ is Collective else coll.usage
    engine.schedule(Transfer(start, coll.duration, usage, _finish, coll, (0, group.ranks, coll.seq)))


def _finish(engine: Engine, transfer: Transfer) -> None:
    """`coll` ended (its end is final): each member's Work completes, its event is logged, its waiting rank
    wakes; the stream releases the buffers and takes the next collective queued on the group."""
    coll: Collective = transfer.owner
    if coll.__class__ is not Collective:  # a broadcast, reduce, barrier or all-to-all: `other_collectives.py`
        return coll.finish(engine, transfer)
    group, start, end = coll.group, transfer.start, transfer.end
    works: list[Work] = coll.works  # type: ignore[assignment]
    first = works[0].input
    peers = group.ranks
    events = engine.events
    ranks = engine.ranks
    wake = engine.wake
    op, layer, op_id, nbytes, label = coll.op, first.layer, engine.new_op_id(), coll.nbytes, coll.label
    group.free = end
    group.busy = False
    for work, result in zip(works, coll.results):
        state = ranks[work.rank]
        if end > state.comm_end:
            state.comm_end = end
        work.end = end
        work.result = result
        events.append((work.rank, op, "collective", start, end, layer, result.samples, nbytes, 0.0, peers, op_id,
                       label))
        if work.future is not None:  # its rank waits on it
            wake(work)
    events.maybe_pack()
    # resolved: no Work <-> Collective cycle may outlive the step
    coll.works, coll.first, coll.results = [], None, []
    release(engine, works, end)
    if group.ready:
        _start(engine, group.ready.pop(0))


def release(engine: Engine, works: list[Work], end: float) -> None:
    """A stream lets go of an op's buffers when the op ends: the engine's references to each Work go at
    `end` (or at its rank's clock, if that is later), so a Work its strategy dropped frees its tensors
    then, and a send, which needs its tensor no more, frees it even while its Work is held."""
    ranks = engine.ranks
    while works:
        work = works.pop()
        state = ranks[work.rank]
        clock = state.clock
        if end > clock:  # every rank is blocked or done here, and wakes at or after `end`
            state.clock = end
        if work.op == "send":
            work.input = None
        del work
        state.clock = clock


def unfinished(engine: Engine) -> list[str]:
    """Ops still pending after every rank returned: each is a bug in the strategy. The first `SHOWN`
    are described, then one line counts the rest (describing a work scans its channel or group, so
    describing every one of a step's thousands of pending ops would take time quadratic in them)."""
    problems: list[str] = []
    extra = 0
    for group in engine.groups.values():
        for coll in group.pending.values():
            if len(problems) == SHOWN:
                extra += 1
                continue
            work = next(w for w in coll.works if w is not None)
            problems.append(work.describe())
    for channel in engine.channels.values():
        for queue in (channel.sends, channel.recvs):
            room = SHOWN - len(problems)
            extra += max(0, len(queue) - room)
            for work in islice(queue, max(0, room)):
                problems.append(f"rank {work.rank} {work.describe()}")
    if extra:
        problems.append(more(extra))
    return problems


# The Python twins of what the C accelerator (`native/_comm.c`) replaces in this module, kept as the
# specification and the fallback for anything off the common case. Installing the C ops adds the Python
# `Model.all_reduce`, `all_gather`, `reduce_scatter` and `Work._complete`, so that tests can run either
# implementation.
PYTHON_TWINS = {"_resolve_ready": _resolve_ready, "_start": _start, "_finish": _finish}

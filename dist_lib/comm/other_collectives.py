"""What broadcast, reduce, barrier and all-to-all do to time and memory (to tensors: `other_rules.py`).

They are collectives like the others (`collectives.py`): the k-th op each member issues on a group, on the
group's stream, started once every member issued it and the stream is free, for their cost
(`costs.other_collectives`), stretched while other transfers share their links. Broadcast, reduce and
barrier cross the group's ring (`Group.usage`); an all-to-all crosses the links its pieces cross, each as
much as they need.

Buffers: a reduce works in place (the root's result shares its input's memory, as an all-reduce's does); a
broadcast's copy on each receiver, and each piece an all-to-all delivers, is allocated on the receiver at the
op's end (its arrival), as a received message is. A Work holds its input until it is awaited.

Their `OtherCollective` is not the class the C accelerator's fast paths take, so they always run this
Python code (`collectives._start` and `collectives._finish` hand them here).
"""

from __future__ import annotations

from typing import Any

from dist_lib.comm import collectives
from dist_lib.comm.collectives import Work, _Pending, release
from dist_lib.comm.groups import Collective, CrossGroup, Group
from dist_lib.comm.other_rules import combine_other, check_match_other
from dist_lib.costs.hierarchical_dispatch import relayed_all_to_all_cost
from dist_lib.costs.other_collectives import all_to_all_cost, barrier_time, probs_sizes, rooted_time
from dist_lib.engine.core import Engine
from dist_lib.engine.rank_state import RankState
from dist_lib.errors import CollectiveMismatchError, TensorError
from dist_lib.engine.transfers import Transfer


class OtherCollective(Collective):
    """The k-th collective on a group when it is a broadcast, reduce, barrier or all-to-all: its root (for
    broadcast and reduce), what each member expects (all-to-all), and the links it crosses."""

    __slots__ = ("root", "expect", "usage", "arrivals", "relays", "probs")

    def __init__(self, group: Group, seq: int, op: str, root: int | None):
        super().__init__(group, seq, op)
        self.root = root
        self.expect: list[Any] = [None] * group.size
        self.usage: tuple[tuple[int, int], ...] = group.usage
        self.arrivals: list[bool] = []  # whether each member's result is made on it at the end
        self.relays: list[Any] = [None] * group.size  # each member's hierarchical dispatcher, if any
        self.probs: list[Any] = [None] * group.size  # each member's routing probabilities' share, if any

    def __str__(self) -> str:
        return f"{self.op} #{self.seq} on group {list(self.group.ranks)}"

    def finish(self, engine: Engine, transfer: Transfer) -> None:
        _finish(engine, transfer)


def issue_other(engine: Engine, state: RankState, op: str, given: Any, group: Group, root: int | None = None,
                expect: list[tuple[int | None, int | None]] | None = None, relay: Any = None,
                probs: tuple[int, int] | None = None) -> Work:
    """Issue `op` on `group` for `state`'s rank with its (checked) input `given`. `relay`, for an MoE token
    all-to-all run by a hierarchical dispatcher: (its name, the distinct-token bytes of a list of token
    pieces), see `costs.hierarchical_dispatch`. `probs`, for an MoE token all-to-all whose routing
    probabilities follow it (`Model.all_to_all`'s `probs`): (bytes of a probability, bytes of a token copy)."""
    rank = state.rank
    pos = group.index.get(rank)
    if pos is None:
        raise TensorError(f"rank {rank} {op}: rank {rank} is not a member of group {list(group.ranks)}")
    if group.__class__ is CrossGroup:
        raise TensorError(f"rank {rank} {op} on group {list(group.ranks)}: a {op} across the two processes of a "
                          f"split step is not supported; run it with workers=1")
    seq = group.next_seq[pos]
    coll = group.pending.get(seq)
    if coll is not None:
        check_match_other(coll, op, root, rank, given)
    group.next_seq[pos] = seq + 1
    if coll is None:
        coll = group.pending[seq] = OtherCollective(group, seq, op, root)
    work = Work(engine, rank, op, state.clock, given, coll)
    coll.works[pos] = work
    coll.expect[pos] = expect
    coll.relays[pos] = relay
    coll.probs[pos] = probs
    coll.issued += 1
    if coll.first is None:
        coll.first = work
    if coll.issued == group.size:
        _resolve(engine, coll)
    return work


def _resolve(engine: Engine, coll: OtherCollective) -> None:
    """Every member issued `coll`: combine the inputs, price it, start it or queue it on the group's stream."""
    group = coll.group
    inputs = [w.input for w in coll.works]
    results, nbytes, label = combine_other(coll, inputs, coll.expect)
    op = coll.op
    if op == "all_to_all":
        sizes = tuple(tuple(0 if t is None else t.nbytes for t in pieces) for pieces in inputs)
        relay, probs = _relay(coll), _probs(coll)
        if relay is None:  # (a layer's exchanges repeat their sizes microbatch after microbatch)
            key = sizes if probs is None else (sizes, probs)
            priced = group.costs.get(key)
            if priced is None:
                priced = group.costs[key] = _flat_cost(engine, group, sizes, probs)
            coll.duration, coll.usage = priced
        else:
            coll.duration, coll.usage = relayed_all_to_all_cost(engine.cluster, group.ranks, sizes,
                                                                _crossing(engine, group, inputs, relay))
        fold = engine.fold
        if fold is not None:  # (inside the representative replica: once per replica, as its group's ring)
            coll.usage = fold.usage(coll.usage, fold.copies)
        coll.arrivals = [True] * group.size
    else:
        key = (op, nbytes)
        duration = group.costs.get(key)
        if duration is None:
            duration = group.costs[key] = barrier_time(group.topology) if op == "barrier" \
                else rooted_time(nbytes, group.topology)
        coll.duration = duration
        root = None if coll.root is None else group.index[coll.root]
        coll.arrivals = [op == "broadcast" and i != root for i in range(group.size)]
    coll.results, coll.nbytes, coll.label = results, nbytes, label
    coll.expect, coll.relays, coll.probs = [], [], []
    del group.pending[coll.seq]
    if group.busy:
        group.ready.append(coll)
    else:
        collectives._start(engine, coll)


OUTGOING = ("dispatched", "output grad")  # token stages sent from their owner to the experts (the rest come back)


def _flat_cost(engine: Engine, group: Group, sizes: tuple[tuple[int, ...], ...],
               probs: tuple[int, int] | None) -> tuple[float, tuple[tuple[int, int], ...]]:
    """(seconds, link usage) of a flat all-to-all of pieces of `sizes` bytes; with `probs` (bytes of a
    probability, of a token copy), followed on the same stream by the all-to-all of the pieces' routing
    probabilities, one a token copy (`Model.all_to_all`'s `probs`), whose time is added whole: its few bytes
    share the links the tokens' exchange has left, and its pairwise steps' latency dominates it."""
    seconds, usage = all_to_all_cost(engine.cluster, group.ranks, sizes)
    if probs is not None:
        each, token = probs
        seconds += all_to_all_cost(engine.cluster, group.ranks, probs_sizes(sizes, each, token))[0]
    return seconds, usage


def _probs(coll: OtherCollective) -> tuple[int, int] | None:
    """Whether the routing probabilities follow a token exchange (`Model.all_to_all`'s `probs`); members that
    disagree are a mismatch, named."""
    given = coll.probs
    if any((p is None) != (given[0] is None) for p in given):
        i = next(i for i, p in enumerate(given) if (p is None) != (given[0] is None))
        ranks = coll.group.ranks
        raise CollectiveMismatchError(f"{coll}: rank {ranks[0]} sends the routing probabilities with probs="
                                      f"{given[0] is not None} but rank {ranks[i]} with probs={given[i] is not None}; "
                                      f"every member of the exchange sends them, or none")
    return given[0]


def _relay(coll: OtherCollective) -> Any:
    """The hierarchical dispatcher every member named, None if none did; members that disagree are a
    mismatch, named."""
    names = [None if r is None else r[0] for r in coll.relays]
    if len(set(names)) > 1:
        i = next(i for i, n in enumerate(names) if n != names[0])
        ranks = coll.group.ranks
        raise CollectiveMismatchError(f"{coll}: rank {ranks[0]} dispatches with {names[0] or 'alltoall'!r} but "
                                      f"rank {ranks[i]} with {names[i] or 'alltoall'!r}; every member of the "
                                      f"exchange uses the same dispatcher")
    return coll.relays[0]


def _crossing(engine: Engine, group: Group, inputs: list[Any], relay: Any) -> dict[tuple[int, int], tuple[int, bool]]:
    """For each member and each other node: the bytes of its distinct tokens the pieces between them carry,
    and whether they go out from it (`costs.hierarchical_dispatch.relayed_flows`)."""
    node_of, ranks, distinct = engine.cluster.node_of, group.ranks, relay[1]
    nodes = [node_of(r) for r in ranks]
    crossing: dict[tuple[int, int], tuple[int, bool]] = {}
    for owner in range(len(ranks)):
        for outgoing in (True, False):
            by_node: dict[int, list[Any]] = {}
            for j in range(len(ranks)):
                t = inputs[owner][j] if outgoing else inputs[j][owner]
                if nodes[j] != nodes[owner] and t is not None and getattr(t, "stage", None) is not None \
                        and (t.stage in OUTGOING) == outgoing:
                    by_node.setdefault(nodes[j], []).append(t)
            for node, pieces in by_node.items():
                crossing[(owner, node)] = (distinct(pieces), outgoing)
    return crossing


def _arrive(state: RankState, op: str, result: Any, end: float) -> Any:
    """What arrives on a member at `end`, made on it then (at its clock, if that is later)."""
    clock = state.clock
    if end > clock:
        state.clock = end
    try:
        if result.__class__ is list:
            return [None if t is None else _copy(state, op, t) for t in result]
        return _copy(state, op, result)
    finally:
        state.clock = clock


def _copy(state: RankState, op: str, t: Any) -> Any:
    """A copy of tensor `t` in a new buffer on `state`'s rank, without a stash (as a received message)."""
    pending = _Pending(t)
    state.memory.context = (op, pending.layer)  # what an out-of-memory error names
    return pending.cls(state.memory, pending.nbytes, state.rank, *pending.values)


def _finish(engine: Engine, transfer: Transfer) -> None:
    """`coll` ended: each member's result arrives, its Work completes, its event is logged, its rank wakes;
    the stream releases the buffers and takes the next collective queued on the group."""
    coll: OtherCollective = transfer.owner
    group, start, end = coll.group, transfer.start, transfer.end
    works: list[Work] = coll.works
    op_id = engine.new_op_id()
    layer = next((w.input.layer for w in works if w.input is not None), -1)
    events = engine.events
    group.free = end
    group.busy = False
    for i in range(len(works)):  # (no local may hold a tensor past `release`: it frees at the right clocks)
        _complete(engine, coll, works[i], coll.results[i], coll.arrivals[i], (start, end, layer, op_id))
    events.maybe_pack()
    coll.works, coll.first, coll.results = [], None, []
    release(engine, works, end)
    if group.ready:
        collectives._start(engine, group.ready.pop(0))


def _complete(engine: Engine, coll: OtherCollective, work: Work, result: Any, arrives: bool, when: tuple) -> None:
    """One member's end of `coll`: its result (made on it now if it arrives), its Work, its event, its wake-up."""
    start, end, layer, op_id = when
    state = engine.ranks[work.rank]
    if end > state.comm_end:
        state.comm_end = end
    work.end = end
    if arrives:
        result = _arrive(state, coll.op, result, end)
    work.result = result
    if coll.op == "all_to_all":  # what the member received
        pieces = [t for t in result if t is not None]
        samples, nbytes = 0, sum(t.nbytes for t in pieces)
        for t in pieces:
            samples |= t.samples
    else:
        shown = result if result is not None else work.input
        samples, nbytes = (0 if shown is None else shown.samples), coll.nbytes
    engine.events.append((work.rank, coll.op, "collective", start, end, layer, samples, nbytes, 0.0,
                          coll.group.ranks, op_id, coll.label))
    if work.future is not None:  # its rank waits on it
        engine.wake(work)

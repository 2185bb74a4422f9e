"""Point-to-point messages: `send`/`recv` match in order per (src, dst) pair on their own channel (PyTorch
gives every peer pair its own NCCL communicator), so they never queue behind collectives: a matched
pair starts at max(issue times, channel free) and takes the link cost, stretched while other transfers
share its links (`engine/transfers.py`); both ends complete then. A received tensor counts from the message's
end: it is made when the receiver awaits it (see `comm._Pending`), or at the end if no one waits on it
then (`land`); the sender's stream lets go of the sent tensor at the end.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from dist_lib.costs import network
from dist_lib.comm.collectives import Work, _Pending
from dist_lib.comm.groups import FoldBroken
from dist_lib.engine.core import Engine
from dist_lib.engine.rank_state import RankState
from dist_lib.errors import TensorError
from dist_lib.hardware.cluster import Link
from dist_lib.tensors import Tensor
from dist_lib.engine.transfers import Transfer


class Channel:
    """Messages from one rank to another, matched in order."""

    __slots__ = ("src", "dst", "peers", "sends", "recvs", "free", "link", "usage", "busy", "ready", "started",
                 "durations")

    def __init__(self, src: int, dst: int, link: Link, usage: tuple[tuple[int, int], ...] = ()):
        self.src, self.dst, self.link = src, dst, link
        self.peers = (src, dst)  # one tuple for every event of the channel: the event log keeps it once
        self.sends: deque[Work] = deque()
        self.recvs: deque[Work] = deque()
        self.free = 0.0  # the end of the channel's latest message
        self.busy = False  # a message is in flight; matched ones queue in `ready`
        self.ready: deque[tuple[Work, Work]] = deque()
        self.usage = usage  # the links a message crosses (`Cluster.p2p_usage`)
        self.started = 0  # messages started so far
        self.durations: dict[int, float] = {}  # a message's time alone by its bytes (`network.p2p_time`)


class CrossChannel(Channel):
    """A channel between the two processes of a split step (`run/split.py`): the first process pairs its
    messages and times them."""

    __slots__ = ()


def _channel(engine: Engine, src: int, dst: int) -> Channel:
    by_dst = engine.channels_from[src]
    channel = by_dst.get(dst)
    if channel is None:
        cluster = engine.cluster
        cross = engine.partition is not None and engine.partition.local_members((src, dst)) == 1
        usage = cluster.p2p_usage(src, dst)
        fold = engine.fold
        if fold is not None:  # folded replicas (`hardware/replicas.py`): a message inside replica 0 stands for one per replica
            if src not in fold.rep_set or dst not in fold.rep_set:
                fold.broken = f"rank {src} sends to rank {dst}, across the replicas"
                raise FoldBroken(fold.broken)
            usage = fold.usage(usage, fold.copies)
        channel = by_dst[dst] = engine.channels[(src, dst)] = (CrossChannel if cross else Channel)(
            src, dst, cluster.p2p_link(src, dst), usage)
    return channel


def _check_peer(engine: Engine, rank: int, peer: Any, op: str, name: str) -> None:
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < engine.world_size:
        raise TensorError(f"rank {rank} {op}: {name} must be a rank in 0..{engine.world_size - 1}, got {peer!r}")
    if peer == rank:
        raise TensorError(f"rank {rank} {op}: cannot {op} to or from itself")


def issue_send(engine: Engine, state: RankState, tensor: Tensor, dst: int) -> Work:
    rank = state.rank
    if dst.__class__ is not int or not 0 <= dst < engine.world_size or dst == rank:
        _check_peer(engine, rank, dst, "send", "dst")
    if not isinstance(tensor, Tensor):
        raise TensorError(f"rank {rank} send to {dst}: expected a tensor, got {type(tensor).__name__}")
    if tensor.rank != rank:
        raise TensorError(f"rank {rank} send to {dst}: {tensor!r} lives on rank {tensor.rank}, not here")
    channel = _channel(engine, rank, dst)
    work = Work(engine, rank, "send", state.clock, tensor, channel.peers)
    channel.sends.append(work)
    if channel.__class__ is CrossChannel:
        engine.partition.issued(channel, work)
    elif channel.recvs:
        _match(engine, channel)
    return work


def issue_recv(engine: Engine, state: RankState, src: int) -> Work:
    rank = state.rank
    if src.__class__ is not int or not 0 <= src < engine.world_size or src == rank:
        _check_peer(engine, rank, src, "recv", "src")
    channel = _channel(engine, src, rank)
    work = Work(engine, rank, "recv", state.clock, None, channel.peers)
    channel.recvs.append(work)
    if channel.__class__ is CrossChannel:
        engine.partition.issued(channel, work)
    elif channel.sends:
        _match(engine, channel)
    return work


def _match(engine: Engine, channel: Channel) -> None:
    """Pair the channel's queued sends and recvs in order and start (or queue) each pair."""
    while channel.sends and channel.recvs:
        send, recv = channel.sends.popleft(), channel.recvs.popleft()
        recv.result = _Pending(send.input)  # type: ignore[arg-type]
        if channel.busy:
            channel.ready.append((send, recv))
        else:
            _start(engine, channel, send, recv)


def _start(engine: Engine, channel: Channel, send: Work, recv: Work, finish: Any = None) -> None:
    channel.busy = True
    channel.started += 1
    start = max(send.issue, recv.issue, channel.free)
    nbytes = send.input.nbytes  # type: ignore[union-attr]
    duration = channel.durations.get(nbytes)
    if duration is None:
        duration = channel.durations[nbytes] = network.p2p_time(nbytes, channel.link)
    engine.schedule(Transfer(start, duration, channel.usage, finish or _finish, (channel, send, recv),
                             (1, channel.peers, channel.started)))


def _finish(engine: Engine, transfer: Transfer) -> None:
    """The message arrived (its end is final): both Works complete, both ranks log it and wake; the
    sender's stream lets go of the tensor; the channel takes its next matched message."""
    channel, send, recv = transfer.owner
    transfer.owner = None
    start, end = transfer.start, transfer.end
    tensor: Tensor = send.input  # type: ignore[assignment]
    channel.free = end
    channel.busy = False
    op_id = engine.new_op_id()
    append, peers = engine.events.append, channel.peers
    for work in (send, recv):
        append((work.rank, work.op, "p2p", start, end, tensor.layer, tensor.samples, tensor.nbytes, 0.0, peers,
                op_id, tensor.kind))
    del tensor, work
    sent(engine, send, end)
    landing = received(engine, recv, end)
    del recv
    if landing is not None:
        landed(*landing)
    if channel.ready:
        _start(engine, channel, *channel.ready.popleft())


def received(engine: Engine, recv: Work, end: float) -> tuple[RankState, float] | None:
    """The receiving end of a message that arrived at `end`: it completes and its rank wakes, or, if no
    one waits on it, the message lands in a buffer now. Then the receiver's clock stands at `end` until the
    caller has let go of `recv` and called `landed` with what this returns: a receive its strategy dropped
    frees its tensor at `end`, not at the receiver's earlier clock."""
    recv.end = end
    state = engine.ranks[recv.rank]
    if end > state.p2p_end:
        state.p2p_end = end
    if recv.future is not None:  # its rank waits on it
        engine.wake(recv)
        return None
    if recv.result.__class__ is not _Pending:
        return None
    clock = state.clock
    if end > clock:  # every rank is blocked or done here, and wakes at or after `end`
        state.clock = end
    try:
        land(state, recv)
    except BaseException:
        state.clock = clock
        raise
    return state, clock


def landed(state: RankState, clock: float) -> None:
    """After a message landed (`received`) and its caller let go of the receive: the receiver's clock back."""
    state.clock = clock


def sent(engine: Engine, send: Work, end: float) -> None:
    """The sending end of a message that arrived at `end`: it completes, its rank wakes, and the sender's
    stream lets go of the tensor (`comm.release` for one send)."""
    send.end = end
    send.result = None
    state = engine.ranks[send.rank]
    if end > state.p2p_end:
        state.p2p_end = end
    if send.future is not None:
        engine.wake(send)
    clock = state.clock
    if end > clock:  # every rank is blocked or done here, and wakes at or after `end`
        state.clock = end
    send.input = None
    del send
    state.clock = clock


def land(state: RankState, recv: Work) -> None:
    """A message no rank waits on has arrived: its tensor is allocated on the receiver now (the caller
    stamps it with the message's end), as the receive buffer NCCL writes into is. A received tensor counts
    from its arrival, not from the `await` that hands it over: otherwise a message left unawaited would
    hold its bytes on no rank (a sender's stream lets go of them at the end)."""
    recv.result = recv.result.materialize(state)

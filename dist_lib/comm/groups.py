"""Communicators: a `Group` of ranks (one object per distinct set, with its own stream), the k-th
`Collective` on it as its members issue it, and `get_group`, which checks and interns a set of ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dist_lib.errors import TensorError
from dist_lib.hardware.devices import Link
from dist_lib.hardware.topology import Topology
from dist_lib.specs import shown

if TYPE_CHECKING:
    from dist_lib.engine.core import Engine


# every collective op's name: these three (`collectives.py`), then broadcast, reduce, barrier and all_to_all
# (`other_collectives.py`)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "barrier", "all_to_all")


class Group:
    """An ordered set of ranks. One object per distinct set, so collectives on it can be matched."""

    __slots__ = ("ranks", "index", "size", "link", "topology", "next_seq", "pending", "costs", "free", "busy",
                 "ready", "usage")

    def __init__(self, ranks: tuple[int, ...], link: Link, topology: Topology | None = None,
                 usage: tuple[tuple[int, int], ...] = ()):
        self.ranks = ranks
        self.index = {r: i for i, r in enumerate(ranks)}
        self.size = len(ranks)
        self.link = link  # the ring's bottleneck hop
        # nodes spanned and links, for choosing flat ring or hierarchical (computed once per group)
        self.topology = topology or Topology(len(ranks), 1, len(ranks), link)
        self.next_seq = [0] * len(ranks)
        self.pending: dict[int, Collective] = {}
        self.costs: dict[tuple, Any] = {}  # seconds by (op, bytes, TP partial sums); all-to-alls by sizes
        # The communicator's stream: every member's stream on this group holds the same ops in the same
        # order, so one stream serves them all. `free` is the end of its latest collective, `busy` while
        # one is in flight, `ready` the issued ones queued behind it.
        self.free = 0.0
        self.busy = False
        self.ready: list[Collective] = []
        self.usage = usage  # the links a collective on the group crosses (`Cluster.collective_usage`)

    def __repr__(self) -> str:
        return f"Group({list(self.ranks)})"

    def __iter__(self):
        return iter(self.ranks)

    def __len__(self) -> int:
        return self.size

    def __contains__(self, rank: object) -> bool:
        return rank in self.index


class CrossGroup(Group):
    """A group with members in both processes of a split step (`run/split.py`): its members' issues are
    counted here, and the first process resolves its collectives once both sides issued them."""

    __slots__ = ("local",)


def get_group(engine: Engine, ranks: Any, where: str = "group") -> Group:
    """The communicator of `ranks` (the same object for the same set); an error's message starts with
    `where`, the rank and op that asked."""
    try:
        key = None if isinstance(ranks, (str, bytes)) else tuple(sorted(set(ranks)))
    except TypeError:  # not iterable, or members that neither hash nor order (a list, a str beside ints)
        key = None
    if key is not None and isinstance(ranks, (list, tuple)) and len(ranks) != len(key):
        twice = next(r for r in key if ranks.count(r) > 1)
        raise TensorError(f"{where}: group {list(ranks)} lists rank {twice!r} more than once")
    group = engine.groups.get(key)
    if group is None:
        last = engine.world_size - 1
        if key is None:
            raise TensorError(f"{where}: a group is a Group or a list of ranks in 0..{last}, got {shown(ranks)}")
        for r in key:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < engine.world_size:
                raise TensorError(f"{where}: group {list(key)}: rank {r!r} is not in 0..{last}")
        if not key:
            raise TensorError(f"{where}: a group needs at least one rank")
        cluster = engine.cluster
        if engine.fold is not None:
            group = engine.groups[key] = folded_group(engine.fold, cluster, key)
            return group
        local = engine.partition.local_members(key) if engine.partition is not None else len(key)
        group = engine.groups[key] = (Group if local == len(key) or not local else CrossGroup)(
            key, cluster.ring_link(key), cluster.topology(key), cluster.collective_usage(key))
        if group.__class__ is CrossGroup:
            group.local = local
    return group


class FoldedGroup(Group):
    """A group spanning folded replicas (`hardware/replicas.py`): some positions of the representative
    replica and the same positions of every other. It looks whole to the strategy (ranks, size, index);
    only its `local` representatives issue, and the collective resolves once they have, with the other
    replicas' inputs mirrored from theirs (`comm/folding.py`)."""

    __slots__ = ("local", "positions")


def folded_group(fold: Any, cluster: Any, key: tuple[int, ...]) -> Group:
    """The group of `key` in a folded step: inside the representative replica, a group whose transfers load
    the folded links once per replica; spanning the replicas alike, a `FoldedGroup` whose transfers load
    them once; without a representative, a group no rank here can issue on. Anything else would make a
    replica differ from its representative: the fold is broken and the step runs unfolded
    (`run/folding.py`)."""
    usage = cluster.collective_usage(key)
    link, topology = cluster.ring_link(key), cluster.topology(key)
    positions = [i for i, r in enumerate(key) if r in fold.rep_set]
    if len(positions) == len(key):
        return Group(key, link, topology, fold.usage(usage, fold.copies))
    if not positions:
        return Group(key, link, topology, usage)
    if not fold.spans_replicas(key):
        fold.broken = f"a group of ranks {list(key)} neither stays in one replica nor spans them alike"
        raise FoldBroken(fold.broken)
    group = FoldedGroup(key, link, topology, fold.usage(usage, 1))
    group.local = len(positions)
    group.positions = positions
    return group


class FoldBroken(Exception):
    """A representative did what its replicas would not do alike: the folded step is abandoned and run
    again unfolded (`run/folding.py`)."""


class Collective:
    """The k-th collective on a group, filled in as members issue it."""

    __slots__ = ("group", "seq", "op", "works", "issued", "first", "results", "nbytes", "label", "duration")

    def __init__(self, group: Group, seq: int, op: str):
        self.group = group
        self.seq = seq
        self.op = op
        self.works: list[Any] = [None] * group.size  # each member's `Work`, as it issues
        self.issued = 0
        self.first: Any = None  # the first member's work, to check the others against
        self.results: list[Any] = []  # once every member issued it: each member's result, bytes, label,
        self.nbytes = 0  # and its time with the links to itself
        self.label = ""
        self.duration = 0.0

    def __str__(self) -> str:
        """Names a complete collective in error messages (formatting the group costs O(members): only
        when an error is raised)."""
        return f"{self.op} #{self.seq} on group {list(self.group.ranks)} (layer {self.works[0].input.layer})"

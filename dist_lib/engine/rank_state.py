"""One rank's state in a step (`RankState`: its clocks, memory, what it waits on and what it has done), and
the small vocabulary the engine and the communication ops share about waiting ranks."""

from __future__ import annotations

from typing import Any, NamedTuple

from dist_lib.hardware.cluster import Cluster
from dist_lib.memory.tracker import MemoryTracker


WAKE_ME = object()
"""What a rank's own coroutine yields to the engine when it waits on one of its works (`Work.__await__`);
also the marker in `Work.future` of such a wait."""


class _Waits(list):
    """`Work.future` when the rank waits on the work more than once (a task and its own coroutine, two
    tasks): WAKE_ME and asyncio futures, each resolved when the work completes."""

    __slots__ = ()

SHOWN = 20  # pending ops a deadlock or leftovers message describes one by one; the rest are counted


def more(count: int) -> str:
    """The line that ends a list of pending ops cut after `SHOWN` entries."""
    return f"... and {count} more"


class FinalClock(NamedTuple):
    """A rank's clock once its step is over."""

    clock: float


class RankState:
    """Per-rank simulator state: clocks, memory, the works it waits on."""

    __slots__ = ("rank", "device", "clock", "comm_end", "p2p_end", "memory", "waiting",
                 "finished", "flops", "final_weights", "handed", "updated", "forwarded", "node", "loaded")

    def __init__(self, rank: int, cluster: Cluster, num_layers: int, enforce_memory: bool, reserve: Any = None):
        self.rank = rank
        self.device = cluster.device_of(rank)
        self.node = cluster.node_of(rank)
        self.clock = 0.0  # compute stream
        self.comm_end = 0.0  # the latest end of a collective (awaited or not); each group has its stream
        self.p2p_end = 0.0  # the latest end of a send or recv (awaited or not)
        capacity, name = self.device.memory_bytes, self.device.name
        if reserve is not None:  # (the out-of-memory message names the device and the bytes left for tensors)
            capacity = reserve.usable(capacity)
            name = f"{name} of {self.device.memory_bytes / 2**30:.2f} GiB less its runtime reserve"
        self.memory = MemoryTracker(rank, name, capacity, self, enforce_memory)
        self.waiting: list[Any] = []  # works this rank is blocked on
        self.finished = False
        self.flops = 0.0  # executed, including recompute (HFU)
        self.final_weights: list[Any] = []  # the Weights handed in
        # what `load_weights` gave: (layer, shards, num_shards, tp_rank, tp_size), plain ints (`check.Loaded`)
        self.loaded: list[tuple] = []
        # per layer, the shards handed in and the shards updated (see `op_checks._first_time`)
        self.handed: list[Any] = [None] * num_layers
        self.updated: list[Any] = [None] * num_layers
        # per TP slice (a weight's `tp_rank`), per layer, the samples forwarded so far (`seen_before`): a repeat
        # is a recompute. Keyed by slice rather than one mask shifted by tp_rank global batches, so that
        # each test and update is an operation on masks of the batch's width; a slice's list is made on its
        # first forward (`forward_slice`), and a rank usually runs one slice
        self.forwarded: list[list[Any] | None] = [[0] * num_layers]

    def seen_before(self, tp_rank: int, layer: int, samples: int) -> bool:
        """Whether TP slice `tp_rank` has forwarded all of `samples` (a mask) at `layer` before (a recompute);
        if not, they are added to those it has. The samples a layer has forwarded are a mask, or, while they
        are one run of samples, the run's bounds [first, stop] (a list, its stop moved on in place):
        microbatches forwarded in order extend it without a new mask of the batch's width for each forward."""
        forwarded = self.forwarded
        masks = forwarded[tp_rank] if tp_rank < len(forwarded) else None
        if masks is None:
            masks = self.forward_slice(tp_rank)
        before = masks[layer]
        first, stop = (samples & -samples).bit_length() - 1, samples.bit_length()
        one_run = samples.bit_count() == stop - first
        if before.__class__ is list:
            if before[0] <= first and stop <= before[1]:
                return True
            if one_run and first == before[1]:  # the next samples after the run: the run goes on
                before[1] = stop
                return False
            before = (1 << before[1]) - (1 << before[0])  # a mask again from here on
        elif not before and one_run:
            masks[layer] = [first, stop]
            return False
        if before & samples == samples:
            masks[layer] = before
            return True
        masks[layer] = before | samples if before else samples  # shares the mask when it can
        return False

    def forward_slice(self, tp_rank: int) -> list[int]:
        """The per-layer masks of TP slice `tp_rank`'s forwards (see `forwarded`), made on first use."""
        forwarded = self.forwarded
        if tp_rank >= len(forwarded):
            forwarded.extend([None] * (tp_rank + 1 - len(forwarded)))
        if forwarded[tp_rank] is None:
            forwarded[tp_rank] = [0] * len(forwarded[0])  # one mask per layer, as slice 0's list from the start
        return forwarded[tp_rank]

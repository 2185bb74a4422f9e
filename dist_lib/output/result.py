"""`Result`: what one simulated step produced, derived from the event log and the memory trackers."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, NamedTuple

from dist_lib.engine.eventlog import EventLog
from dist_lib.hardware.cluster import Cluster
from dist_lib.memory.tracker import RankLog, format_bytes
from dist_lib.workload.transformer import Workload


class Event(NamedTuple):
    """One op on one rank. `stream` is 'compute', 'collective' or 'p2p'; `samples` is a bit mask;
    `peers` is the group (collectives) or the (src, dst) pair (p2p); `op_id` is shared by the members of
    one collective and by the two ends of one message (0 for compute), numbered from 1 in the order the
    ops end (at one instant: ops of no duration last, collectives before messages, then by group or
    channel)."""

    rank: int
    op: str
    stream: str
    start: float
    end: float
    layer: int
    samples: int
    nbytes: int
    flops: float
    peers: tuple[int, ...] | None
    op_id: int
    detail: str

    @property
    def duration(self) -> float:
        return self.end - self.start


class PerRank(Sequence):
    """A read-only per-rank view derived on access from each rank's allocation log, so a step's result
    does not hold the same log twice (`derive` is a `RankLog` method such as `RankLog.timeline`)."""

    __slots__ = ("_logs", "_derive")

    def __init__(self, logs: list[RankLog], derive: Callable[[RankLog], Any]):
        self._logs = logs
        self._derive = derive

    def __len__(self) -> int:
        return len(self._logs)

    def __getitem__(self, rank):  # type: ignore[override]
        if isinstance(rank, slice):
            return [self[r] for r in range(len(self))[rank]]
        return self._derive(self._logs[check_rank(rank, len(self._logs))])


def check_rank(rank: Any, world_size: int) -> int:
    """`rank` as an index of per-rank data, Python's negative indices included; anything else is one
    `IndexError` or `TypeError` naming the rank and the ranks there are."""
    if isinstance(rank, bool) or not hasattr(rank, "__index__"):
        raise TypeError(f"rank must be a whole number, got {type(rank).__name__} {rank!r}")
    if not -world_size <= rank < world_size:
        raise IndexError(f"rank {rank}: the cluster has ranks 0-{world_size - 1}" if world_size
                         else f"rank {rank}: the cluster has no ranks")
    return rank.__index__()


@dataclass(repr=False)
class Result:
    """Step time, memory, utilisation, correctness and the full event log of one simulated step."""

    cluster: Cluster
    workload: Workload
    global_batch_size: int
    options: dict[str, Any]
    time_s: float
    rank_times: list[float]
    memory_bytes: list[int]  # peak live bytes per rank
    memory_by_kind: Sequence[dict[str, int]]  # the breakdown at each rank's peak
    model_flops: float
    hardware_flops: float
    correct: bool
    problems: list[str]
    raw_events: list[tuple] = field(repr=False)
    timelines: Sequence[tuple[array, array]] = field(repr=False)  # per rank: (times, live bytes)
    strategy: str = ""
    # per rank: (signed bytes, buffer id, kind index into memory.KINDS) for every entry of `timelines`
    memory_log: Sequence[tuple[array, array, array]] = field(default_factory=list, repr=False)
    # what each rank handed in: (rank, layer, step, samples, shards, num_shards, tp_rank, tp_size)
    final_weights: list[tuple[int, ...]] = field(default_factory=list, repr=False)
    # the runtime reserve the step ran with (`hardware.reserve.MemoryReserve`, None: off), and the
    # communicators each rank belongs to (what the reserve's NCCL buffers count)
    memory_reserve: Any = field(default=None, repr=False)
    communicators: list[int] = field(default_factory=list, repr=False)
    # folded replicas (`run/folding.py`): per rank, the rank whose events stand for it (None: every rank ran)
    representatives: list[int] | None = field(default=None, repr=False)
    _events: list[Event] | None = field(default=None, repr=False)
    _busy: list[float] | None = field(default=None, repr=False)  # compute_busy(), summed once

    @property
    def events(self) -> list[Event]:
        """Every op of the step as an `Event`, in the order they were logged (`raw_events` as tuples)."""
        if self._events is None:
            self._events = [Event._make(e) for e in self.raw_events]
        return self._events

    @property
    def peak_memory_bytes(self) -> int:
        return max(self.memory_bytes)

    @property
    def peak_memory_rank(self) -> int:
        return self.memory_bytes.index(self.peak_memory_bytes)

    def usable_memory(self, rank: int) -> int:
        """Bytes of tensors `rank`'s GPU holds: its capacity, less the runtime reserve when there is one."""
        capacity = self.cluster.device_of(rank).memory_bytes
        if self.memory_reserve is None:
            return capacity
        communicators = self.communicators[rank] if rank < len(self.communicators) else 0
        return self.memory_reserve.usable(capacity, communicators)

    def memory_fraction(self, rank: int) -> float:
        """Share of `rank`'s GPU its step takes at its peak: tensors, and the runtime reserve when there is
        one (what `nvidia-smi` would show of a real run)."""
        capacity = self.cluster.device_of(rank).memory_bytes
        return (self.memory_bytes[rank] + capacity - self.usable_memory(rank)) / capacity

    @property
    def fullest_rank(self) -> int:
        """The rank whose GPU is fullest by share of its capacity (on a mixed cluster not always the rank of
        the most bytes: a 32 GB GPU at 30 GB is fuller than an 80 GB one at 60 GB); the first on a tie."""
        fractions = [self.memory_fraction(r) for r in range(len(self.memory_bytes))]
        return fractions.index(max(fractions))

    def fullest_text(self) -> str:
        """The fullest GPU in a few words: `rank 9 (V100-32GB): 25.10 + 2.90 reserve of 32.00 GiB, 88 %`."""
        r = self.fullest_rank
        device = self.cluster.device_of(r)
        reserve = "" if self.memory_reserve is None else \
            f" + {(device.memory_bytes - self.usable_memory(r)) / 2**30:.2f} reserve"
        return (f"rank {r} ({device.name}): {self.memory_bytes[r] / 2**30:.2f}{reserve} of "
                f"{device.memory_bytes / 2**30:.2f} GiB, {self.memory_fraction(r) * 100:.0f} %")

    @property
    def peak_flops(self) -> float:
        """Sum over ranks of each device's dense 16-bit peak."""
        return sum(self.cluster.device_of(r).peak_flops for r in range(self.cluster.world_size))

    @property
    def mfu(self) -> float:
        """Model FLOPs (3x forward, no recompute, every sample) / (step time x sum of peaks)."""
        return self.model_flops / (self.time_s * self.peak_flops) if self.time_s > 0 else 0.0

    @property
    def hfu(self) -> float:
        """FLOPs actually executed, recompute included, / (step time x sum of peaks)."""
        return self.hardware_flops / (self.time_s * self.peak_flops) if self.time_s > 0 else 0.0

    def compute_busy(self) -> list[float]:
        """Seconds each rank's compute stream was busy (a new list each call; the sum over the events is
        made once, as `bubble_fraction`, `summary()` and `to_dict()` all read it: column-wise for a
        simulated step's log, `EventLog.busy_seconds`)."""
        if self._busy is None:
            if isinstance(self.raw_events, EventLog):
                self._busy = self.raw_events.busy_seconds("compute", self.cluster.world_size)
            else:
                busy = [0.0] * self.cluster.world_size
                for e in self.raw_events:
                    if e[2] == "compute":
                        busy[e[0]] += e[4] - e[3]
                self._busy = busy
            if self.representatives is not None:  # a folded replica was as busy as its representative
                self._busy = [self._busy[rep] for rep in self.representatives]
        return list(self._busy)

    @property
    def bubble_fraction(self) -> float:
        """Mean over ranks of the share of the step their compute stream sat idle."""
        if self.time_s <= 0:
            return 0.0
        busy = self.compute_busy()
        return sum(1 - b / self.time_s for b in busy) / len(busy)

    def memory_timeline(self, rank: int) -> list[tuple[float, int]]:
        """(time s, live bytes) after every allocation and free on `rank`, in the order they happened
        (several at one time are several points); its highest value is `memory_bytes[rank]`."""
        if check_rank(rank, self.cluster.world_size) < 0:  # (a rank here, not a Python index from the end)
            raise IndexError(f"rank {rank}: the cluster has ranks 0-{self.cluster.world_size - 1}")
        times, values = self.timelines[rank]
        return [(t, int(v)) for t, v in zip(times, values)]

    def write_chrome_trace(self, path: str | Path) -> Path:
        """Write a Perfetto / chrome://tracing JSON trace; returns the path."""
        from dist_lib.output.trace_text import write_chrome_trace
        return write_chrome_trace(self, path)

    def __repr__(self) -> str:
        """One line, whatever the cluster's size (`summary()` has more; the fields have everything)."""
        return (f"Result({self.strategy or '?'} on {self.cluster.name}, {self.workload.name}: "
                f"{self.time_s * 1e3:.2f} ms, peak {format_bytes(self.peak_memory_bytes)} on rank "
                f"{self.peak_memory_rank}, MFU {self.mfu * 100:.1f}%, {'correct' if self.correct else 'INCORRECT'})")

    def summary(self) -> str:
        """A few lines for a terminal: the options, step time, peak memory and its rank, MFU/HFU, bubble
        and correctness, each figure as the field of that name gives it."""
        peak = self.peak_memory_rank
        lines = [
            f"strategy      {self.strategy or '?'}  {_options(self.options)}",
            f"cluster       {self.cluster.name} ({self.cluster.world_size} ranks)",
            f"workload      {self.workload.name}, global batch {self.global_batch_size}",
            f"step time     {self.time_s * 1e3:.2f} ms",
            f"peak memory   {format_bytes(self.peak_memory_bytes)} on rank {peak} "
            f"({self.cluster.device_of(peak).name}, {format_bytes(self.cluster.device_of(peak).memory_bytes)})",
            f"fullest GPU   {self.fullest_text()}",
            f"MFU / HFU     {self.mfu * 100:.1f} % / {self.hfu * 100:.1f} %",
            f"bubble        {self.bubble_fraction * 100:.1f} % of compute idle",
            f"correct       {'yes' if self.correct else 'NO: ' + '; '.join(self.problems[:3])}",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The step's figures as plain JSON values: `json.loads(json.dumps(d)) == d`. Options become JSON
        (a tuple a list, a path its text, a `Plan` its `to_dict()`, anything else its repr); for a step
        `simulate` ran, `mfu == model_flops / (time_s * peak_flops)` holds in the dict itself. Per-rank
        lists are indexed by rank; `peak_memory_by_kind` is the breakdown on `peak_memory_rank` at its peak."""
        return {"strategy": self.strategy, "cluster": self.cluster.name, "workload": self.workload.name,
                "world_size": self.cluster.world_size, "global_batch_size": self.global_batch_size,
                "options": _json_ready(self.options), "time_s": self.time_s, "rank_times": list(self.rank_times),
                "peak_memory_bytes": self.peak_memory_bytes, "peak_memory_rank": self.peak_memory_rank,
                "memory_bytes": list(self.memory_bytes), "fullest_rank": self.fullest_rank,
                "fullest_fraction": self.memory_fraction(self.fullest_rank),
                "memory_reserve": None if self.memory_reserve is None else self.memory_reserve.to_dict(),
                "peak_memory_by_kind": dict(self.memory_by_kind[self.peak_memory_rank]),
                "model_flops": self.model_flops, "hardware_flops": self.hardware_flops,
                "peak_flops": self.peak_flops, "mfu": self.mfu, "hfu": self.hfu,
                "bubble_fraction": self.bubble_fraction, "correct": self.correct, "problems": list(self.problems)}


def _json_ready(value: Any) -> Any:
    """`value` as JSON that reads back equal: containers element by element, numbers and text as they are."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # NaN would not read back equal to itself
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, range)):
        return [_json_ready(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _json_ready(to_dict())
    return repr(value)


def _options(options: dict[str, Any], width: int = 60) -> str:
    """`k=v` for each option, a value longer than `width` characters cut short (a plan is hundreds)."""
    shown = (f"{k}={v}" for k, v in options.items())
    return " ".join(text if len(text) <= width else text[:width - 3] + "..." for text in shown)

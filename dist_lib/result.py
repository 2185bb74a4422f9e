"""`Result`: what one simulated step produced, derived from the event log and the memory trackers."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .hardware import Cluster
from .memory import RankLog, format_bytes
from .workload import Workload


class Event(NamedTuple):
    """One op on one rank. `stream` is 'compute', 'collective' or 'p2p'; `samples` is a bit mask;
    `peers` is the group (collectives) or the (src, dst) pair (p2p); `op_id` is shared by the members of
    one collective and by the two ends of one message."""

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
        return self._derive(self._logs[rank])


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
    _events: list[Event] | None = field(default=None, repr=False)

    @property
    def events(self) -> list[Event]:
        if self._events is None:
            self._events = [Event._make(e) for e in self.raw_events]
        return self._events

    @property
    def peak_memory_bytes(self) -> int:
        return max(self.memory_bytes)

    @property
    def peak_memory_rank(self) -> int:
        return self.memory_bytes.index(self.peak_memory_bytes)

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
        """Seconds each rank's compute stream was busy."""
        busy = [0.0] * self.cluster.world_size
        for e in self.raw_events:
            if e[2] == "compute":
                busy[e[0]] += e[4] - e[3]
        return busy

    @property
    def bubble_fraction(self) -> float:
        """Mean over ranks of the share of the step their compute stream sat idle."""
        if self.time_s <= 0:
            return 0.0
        busy = self.compute_busy()
        return sum(1 - b / self.time_s for b in busy) / len(busy)

    def memory_timeline(self, rank: int) -> list[tuple[float, int]]:
        """(time s, live bytes) after every allocation and free on `rank`."""
        times, values = self.timelines[rank]
        return [(t, int(v)) for t, v in zip(times, values)]

    def write_chrome_trace(self, path: str | Path) -> Path:
        """Write a Perfetto / chrome://tracing JSON trace; returns the path."""
        from .trace import write_chrome_trace
        return write_chrome_trace(self, path)

    def __repr__(self) -> str:
        """One line, whatever the cluster's size (`summary()` has more; the fields have everything)."""
        return (f"Result({self.strategy or '?'} on {self.cluster.name}, {self.workload.name}: "
                f"{self.time_s * 1e3:.2f} ms, peak {format_bytes(self.peak_memory_bytes)} on rank "
                f"{self.peak_memory_rank}, MFU {self.mfu * 100:.1f}%, {'correct' if self.correct else 'INCORRECT'})")

    def summary(self) -> str:
        peak = self.peak_memory_rank
        lines = [
            f"strategy      {self.strategy or '?'}  {_options(self.options)}",
            f"cluster       {self.cluster.name} ({self.cluster.world_size} ranks)",
            f"workload      {self.workload.name}, global batch {self.global_batch_size}",
            f"step time     {self.time_s * 1e3:.2f} ms",
            f"peak memory   {format_bytes(self.peak_memory_bytes)} on rank {peak} "
            f"({self.cluster.device_of(peak).name}, {format_bytes(self.cluster.device_of(peak).memory_bytes)})",
            f"MFU / HFU     {self.mfu * 100:.1f} % / {self.hfu * 100:.1f} %",
            f"bubble        {self.bubble_fraction * 100:.1f} % of compute idle",
            f"correct       {'yes' if self.correct else 'NO: ' + '; '.join(self.problems[:3])}",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "cluster": self.cluster.name, "workload": self.workload.name,
                "global_batch_size": self.global_batch_size, "options": self.options, "time_s": self.time_s,
                "peak_memory_bytes": self.peak_memory_bytes, "peak_memory_rank": self.peak_memory_rank,
                "memory_bytes": self.memory_bytes, "mfu": self.mfu, "hfu": self.hfu,
                "bubble_fraction": self.bubble_fraction, "correct": self.correct, "problems": self.problems}


def _options(options: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in options.items())

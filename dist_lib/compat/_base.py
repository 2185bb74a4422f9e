"""The machinery under both toy `Model` classes: tracked storage, the event records, and the `Result`.

Memory follows the toy APIs: a rank holds what its five storage dicts hold, read at each event
(before the op's output is stored, as the originals do), in the API's own units. In 'real' timing
the same dicts are also counted in bytes (`RealCosts.nbytes`), and that is what the `Result` reports.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace
from operator import itemgetter
from collections.abc import Sequence
from typing import Any

from dist_lib.memory.tracker import format_bytes
from dist_lib.output.result import Result
from dist_lib.compat._runtime import World
from dist_lib.compat._storage import STORAGE_NAMES, Ledger, Storage, storage_property
from dist_lib.compat.real_costs import RealCosts, default_cluster, default_workload, kind_of
from dist_lib.compat.report import memory_text

COMPUTE_OPS = {"forward", "backward", "loss", "update", "load_weights"}
COLLECTIVE_OPS = {"allreduce", "allgather", "scatterreduce", "all_reduce", "all_gather", "reduce_scatter"}
CORE_OP = {"allreduce": "all_reduce", "allgather": "all_gather", "scatterreduce": "reduce_scatter"}


class ToyModel:
    """Shared state of a puzzles or lab `Model`; subclasses name the public API."""

    # called with the model just before an event reads its memory, when set (`recording.py` snapshots
    # the storage there: what the event's memory figure and the lab's "is it stored?" checks see)
    _event_hook: Any = None

    weights = storage_property("weights")
    opt_states = storage_property("opt_states")
    activations = storage_property("activations")
    grad_activations = storage_property("grad_activations")
    grad_weights = storage_property("grad_weights")

    def _setup(self, rank: int, dist: Any, layers: int, batches: int) -> None:
        self.rank = rank
        self.dist = dist
        self.log: list = []
        self.time = 0
        self.final_weights: dict[int, Any] = {}
        world: World = dist._world
        self._world = world
        if world.settings.timing == "real" and world.costs is None:
            world.costs = RealCosts.build(world.settings, world.api, world.n, layers)
        self._real: RealCosts | None = world.costs
        self._ledger = Ledger(self._real.nbytes, kind_of) if self._real else Ledger()
        self._untracked = world.settings.exact_memory  # True: sum the storage at each event
        for name in STORAGE_NAMES:
            object.__setattr__(self, "_" + name, Storage(self._ledger))
        world.models.append(self)
        self._layers = layers
        self._batches = batches
        self._records: list[tuple] = []
        self._mem_times = array("d")
        self._mem_values = array("d")
        self._peak = 0.0
        self._peak_by_kind: dict[str, float] = {}
        self._flops = 0.0

    def storage(self) -> tuple[dict, dict, dict, dict, dict]:
        return self.weights, self.opt_states, self.activations, self.grad_activations, self.grad_weights

    def memory(self) -> int | float:
        """What the storage dicts hold, in the API's own units."""
        ledger = self._ledger
        if self._untracked or ledger.opaque or ledger.fractional:
            return self._summed()  # the originals' own float sum, rounding and all
        return ledger.total()

    def _summed(self) -> int | float:
        mem = 0
        for d in self.storage():
            assert isinstance(d, dict)
            for v in d.values():
                mem += v.memory()
        return mem

    def _bytes_by_kind(self) -> dict[str, float]:
        if not (self._untracked or self._ledger.opaque):
            return dict(self._ledger.by_kind)
        by_kind: dict[str, float] = {}
        for d in self.storage():
            for v in d.values():
                by_kind[kind_of(v)] = by_kind.get(kind_of(v), 0.0) + self._real.nbytes(v)
        return by_kind

    def status(self) -> None:
        """Print every stored key and its type, as the original: its tensor types are `lib`'s, so one of
        this API's shows as `<class 'lib.Weight'>` (the module a file imports it from), not this module."""
        api_module = type(self).__module__
        for d in self.storage():
            for k, v in d.items():
                kind = type(v)
                print(k, f"<class 'lib.{kind.__qualname__}'>" if kind.__module__ == api_module else kind, end=",")
        print()

    def _record(self, op: str, layer: Any, samples: frozenset, start: float, length: float, units: float, *,
                peers: Any = None, op_id: int = 0, value: Any = None, flops: float = 0.0) -> None:
        """One event for the `Result` and trace, starting at `start`; `units` is the toy memory figure."""
        if self._real is None:
            held, by_kind = units, None
        else:
            by_kind = self._bytes_by_kind()
            held = sum(by_kind.values())
        self._mem_times.append(start)
        self._mem_values.append(held)
        if held > self._peak or not self._records:
            self._peak = held
            self._peak_by_kind = by_kind if by_kind is not None else {"units": held}
        stream = "compute" if op in COMPUTE_OPS else "collective" if op in COLLECTIVE_OPS else "p2p"
        size = int(self._real.nbytes(value)) if self._real is not None and value is not None else 0
        self._flops += flops
        masks = self._world.masks
        mask = masks.get(samples)
        if mask is None:
            mask = 0
            for i in samples:
                if isinstance(i, int) and i >= 0:
                    mask |= 1 << i
            if len(masks) > 4096:
                masks.clear()
            masks[samples] = mask
        self._records.append((self.rank, CORE_OP.get(op, op), stream, start, start + length,
                              layer if isinstance(layer, int) else -1, mask, size, flops, peers, op_id, ""))


def problems(models: Sequence[Any]) -> list[str]:
    """What `Model.check` would complain about (empty when the step is correct), in the original's
    order: the first problem is the one `check` raises."""
    out: list[str] = []
    layers = getattr(models[0], "LAYERS", None) or getattr(models[0], "num_layers")
    for layer in range(layers):
        weight = None
        for m in models:
            w = m.final_weights.get(layer)
            if w is None:
                continue
            if w.step != 1:
                out.append(f"layer {layer}: rank {m.rank}'s final weight is at step {w.step}, not 1")
            weight = w if weight is None else weight.combine(w)
        if weight is None:
            out.append(f"Missing weight {layer}")
        elif not weight.is_complete():
            out.append(f"Weight not complete {weight}")
    return out



@dataclass(repr=False)
class ToyResult(Result):
    """A `Result` of a puzzles or lab run, with the figures the notebooks print.

    notebook_time: the step as the originals report it (the latest start of any rank's last event:
    `drawing.draw`'s time axis, the lab's `get_training_stats`); `time_s` is when the last op ends.
    time_unit / memory_unit: 'steps' and 'units' (puzzles), 's' and 'elements' (lab) in original
    timing; 's' and 'bytes' in real timing. original_mfu: the lab's MFU (theoretical best time over
    notebook_time) in original timing, which `mfu` then reports."""

    notebook_time: float = 0.0
    notebook_memory: float = 0.0
    time_unit: str = "s"
    memory_unit: str = "bytes"
    original_mfu: float | None = None

    @property
    def _peak_figure(self) -> float:
        """The peak as the notebook prints it: in the toy units a third of a sharded weight is a fraction,
        which `peak_memory_bytes` (whole numbers) drops."""
        return self.notebook_memory if self.memory_unit != "bytes" and self.notebook_memory else self.peak_memory_bytes

    @property
    def mfu(self) -> float:
        if self.original_mfu is not None:
            return self.original_mfu
        return super().mfu

    def format_time(self, value: float) -> str:
        return f"{value * 1e3:.2f} ms" if self.time_unit == "s" else f"{value:g} {self.time_unit}"

    def format_memory(self, value: float) -> str:
        return format_bytes(value) if self.memory_unit == "bytes" else memory_text(value, self.memory_unit)

    def __repr__(self) -> str:
        return (f"Result({self.strategy or '?'}, {self.options.get('api')} {self.options.get('timing')} timing: "
                f"{self.format_time(self.notebook_time)} (last op ends at {self.format_time(self.time_s)}), "
                f"peak {self.format_memory(self._peak_figure)} on rank {self.peak_memory_rank}, "
                f"MFU {self.mfu * 100:.1f}%, {'correct' if self.correct else 'INCORRECT'})")

    def summary(self) -> str:
        lines = [f"strategy      {self.strategy or '?'}  " + " ".join(f"{k}={v}" for k, v in self.options.items()),
                 f"ranks         {self.cluster.world_size}"
                 + (f" ({self.cluster.name})" if self.options.get("timing") == "real" else ""),
                 f"step          {self.format_time(self.notebook_time)} (the notebook's figure); "
                 f"last op ends at {self.format_time(self.time_s)}",
                 f"peak memory   {self.format_memory(self._peak_figure)} on rank {self.peak_memory_rank}",
                 f"MFU           {self.mfu * 100:.1f} %",
                 f"correct       {'yes' if self.correct else 'NO: ' + '; '.join(self.problems[:3])}"]
        return "\n".join(lines)


def build_result(world: World, strategy: str, problems: list[str], options: dict | None = None) -> ToyResult:
    """A `ToyResult` (time, memory, events, trace) for the models of one toy `Dist`."""
    models: dict[int, ToyModel] = {}
    strays: list[ToyModel] = []
    for m in world.models:  # the last model created for each rank
        if isinstance(m.rank, int) and 0 <= m.rank < world.n:
            models[m.rank] = m
        else:
            strays.append(m)
    # a model whose rank is not one of its Dist's (the originals' defaults: rank 1 on Dist(1)) takes a free
    # slot in creation order, as the originals' draw() shows it: by its place in the list, not its rank
    for r, m in zip([r for r in range(world.n) if r not in models], strays):
        models[r] = m
    n = world.n
    any_model = next(iter(models.values()), None)
    layers = any_model._layers if any_model else 1
    events: list[tuple] = []
    rank_times = [0.0] * n
    peaks = [0] * n
    by_kind: list[dict[str, int]] = [{} for _ in range(n)]
    timelines = []
    flops = 0.0
    batches = 1
    for r in range(n):
        m = models.get(r)
        if m is None:
            timelines.append((array("d"), array("d")))
            continue
        events.extend(m._records if m.rank == r else [(r, *e[1:]) for e in m._records])
        rank_times[r] = max([float(m.time)] + [e[4] for e in m._records])
        peaks[r] = int(m._peak)
        by_kind[r] = {k: int(v) for k, v in m._peak_by_kind.items()}
        timelines.append((array("d", m._mem_times), array("d", m._mem_values)))
        flops += m._flops
        batches = max(batches, m._batches)
    events.sort(key=itemgetter(3, 0))
    # the latest start of a rank's last event, read from the records the ops made rather than from
    # `model.log`, which a file may empty or edit (the originals' draw() then fails on an empty log)
    notebook_time = max((float(m._records[-1][3]) for m in models.values() if m._records), default=0.0)
    real = world.costs
    extra: dict[str, Any] = {}
    if real is not None:
        cluster, workload = real.cluster, real.workload
        model_flops = workload.model_flops_per_sample() * batches
        units = ("s", "bytes")
    else:
        cluster = default_cluster(n, "H100-80GB")  # nominal: the original cost model is not a cluster's
        workload = replace(default_workload(world.api), name=f"{world.api}-original", num_layers=max(layers, 1))
        model_flops = 0.0
        units = ("steps", "units") if world.api == "puzzles" else ("s", "elements")
        if world.api == "lab":
            from dist_lib.compat.lab_costs import theoretical_best_time
            best = theoretical_best_time(layers, batches, n)
            extra["original_mfu"] = best / notebook_time if notebook_time > 0 else 0.0
    notebook_memory = max((float(m._peak) for m in models.values()), default=0.0)
    figures = {"time": notebook_time, "memory": notebook_memory, "time_unit": units[0], "memory_unit": units[1]}
    if "original_mfu" in extra:
        figures["mfu"] = extra["original_mfu"]
    # the run's options, then what the run itself was (its API, its timing, its figures), which no option
    # may say otherwise (a replayed program's options are the sandboxed file's data)
    opts = {**(options or {}), "api": world.api, "timing": world.settings.timing, "notebook": figures}
    return ToyResult(cluster=cluster, workload=workload, global_batch_size=batches, options=opts,
                     time_s=max(rank_times), rank_times=rank_times, memory_bytes=peaks, memory_by_kind=by_kind,
                     model_flops=model_flops, hardware_flops=flops, correct=not problems, problems=list(problems),
                     raw_events=events, timelines=timelines, strategy=strategy, notebook_time=notebook_time,
                     notebook_memory=notebook_memory,
                     time_unit=units[0], memory_unit=units[1], **extra)

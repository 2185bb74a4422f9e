"""The machinery under both toy `Model` classes: storage dicts, the event log, and a dist_lib `Result`.

Memory follows the toy APIs: a rank holds what its five storage dicts hold, sampled at each event
(before the op's output is stored, as the originals do). In 'real' timing the same dicts are also
counted in bytes (see `RealCosts.nbytes`), and that is what the `Result` reports.
"""

from __future__ import annotations

from array import array
from typing import Any

from ..result import Result
from ._runtime import KIND, World, samples_mask, samples_of

COMPUTE_OPS = {"forward", "backward", "loss", "update", "load_weights"}
COLLECTIVE_OPS = {"allreduce", "allgather", "scatterreduce", "all_reduce", "all_gather", "reduce_scatter"}
CORE_OP = {"allreduce": "all_reduce", "allgather": "all_gather", "scatterreduce": "reduce_scatter"}


class ToyModel:
    """Shared state of a puzzles or lab `Model`; subclasses name the public API."""

    _api = "puzzles"

    def _setup(self, rank: int, dist: Any, layers: int, batches: int) -> None:
        self.rank = rank
        self.dist = dist
        self.log: list = []
        self.time = 0
        self.final_weights: dict[int, Any] = {}
        self.weights: dict[Any, Any] = {}
        self.opt_states: dict[Any, Any] = {}
        self.activations: dict[Any, Any] = {}
        self.grad_activations: dict[Any, Any] = {}
        self.grad_weights: dict[Any, Any] = {}
        self._world: World = dist._world
        self._world.models.append(self)
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

    def memory(self) -> float:
        """What the storage dicts hold, in the API's own units."""
        mem = 0
        for d in self.storage():
            for v in d.values():
                mem += v.memory()
        return mem

    def status(self) -> None:
        for d in self.storage():
            for k, v in d.items():
                print(k, type(v), end=",")
        print()

    @property
    def _costs(self):
        return self._world.cost_model(self._layers, _units)

    def _record(self, typ: str, layer: Any, samples: frozenset, length: float, *, peers: Any = None,
                op_id: int = 0, value: Any = None, flops: float = 0.0) -> float:
        """Log one event starting at `self.time`, lasting `length`; returns the toy memory figure."""
        costs = self._costs
        units = self.memory()
        if costs.timing == "unit":
            nbytes, by_kind = units, None
        else:
            by_kind = {}
            for d in self.storage():
                for v in d.values():
                    kind = KIND.get(type(v).__name__, "activation")
                    by_kind[kind] = by_kind.get(kind, 0.0) + costs.nbytes(v)
            nbytes = sum(by_kind.values())
        start = self.time
        self._mem_times.append(start)
        self._mem_values.append(nbytes)
        if nbytes > self._peak or not self._records:
            self._peak = nbytes
            self._peak_by_kind = by_kind if by_kind is not None else {"toy units": units}
        if typ in COMPUTE_OPS:
            stream = "compute"
        elif typ in COLLECTIVE_OPS:
            stream = "collective"
        else:
            stream = "p2p"
        op = CORE_OP.get(typ, typ)
        size = int(costs.nbytes(value)) if value is not None else 0
        self._flops += flops
        self._records.append((self.rank, op, stream, start, start + length, layer if layer is not None else -1,
                              samples_mask(samples), size, flops, peers, op_id, ""))
        return units


def _units(value: Any) -> float:
    return value.memory()


def build_result(world: World, strategy: str, problems: list[str], options: dict | None = None) -> Result:
    """A dist_lib `Result` (time, memory, events, trace) for the models of one toy `Dist`.

    In 'unit' timing, times are the puzzles' steps and memory their units (not seconds or bytes)."""
    models: dict[int, ToyModel] = {}
    for m in world.models:  # the last model created for each rank
        if isinstance(m.rank, int) and 0 <= m.rank < world.n:
            models[m.rank] = m
    any_model = next(iter(models.values()), None)
    costs = world.cost_model(any_model._layers if any_model else 1, _units)
    n = world.n
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
        events.extend(m._records)
        ends = [e[4] for e in m._records]
        rank_times[r] = max([float(m.time)] + ends)
        peaks[r] = int(m._peak)
        by_kind[r] = {k: int(v) for k, v in m._peak_by_kind.items()}
        timelines.append((array("d", m._mem_times), array("d", m._mem_values)))
        flops += m._flops
        batches = max(batches, m._batches)
    events.sort(key=lambda e: (e[3], e[0]))
    workload = costs.workload
    opts = {"api": world.api, "timing": costs.timing, **(options or {})}
    return Result(cluster=costs.cluster, workload=workload, global_batch_size=batches, options=opts,
                  time_s=max(rank_times), rank_times=rank_times, memory_bytes=peaks, memory_by_kind=by_kind,
                  model_flops=workload.model_flops_per_sample() * batches if costs.timing == "real" else 0.0,
                  hardware_flops=flops, correct=not problems, problems=list(problems), raw_events=events,
                  timelines=timelines, strategy=strategy)


def toy_samples(v: Any) -> frozenset:
    return samples_of(v)

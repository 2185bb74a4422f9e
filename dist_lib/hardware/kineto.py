"""Per-layer costs from a PyTorch profiler (Kineto) trace of one training step.

The trace is the Chrome-trace JSON `torch.profiler.profile(...).export_chrome_trace(path)` writes: complete
events (`"ph": "X"`, `ts` and `dur` in microseconds) of categories `user_annotation` (a `record_function`
range), `cpu_op` (an ATen op, with `args["Sequence number"]` when it records an autograd node), and on a GPU
`cuda_runtime` launches and `kernel`/`gpu_memcpy`/`gpu_memset` activity paired by `args["correlation"]`.

The convention the trace must follow (docs/how-to/profile-your-gpu.md): the forward of the input
embedding, of each transformer layer and of the LM head with its loss run under
`record_function("embedding")`, `record_function("layer.<i>")` (i from 0) and `record_function("head")`,
and the optimizer step under `record_function("optimizer")`. Backward needs no annotation: autograd runs
each node as an `autograd::engine::evaluate_function: ...` event carrying the sequence number of the
forward op that created it, so a range's backward is every such event whose sequence number one of its
forward ops holds.

A range's cost is the time of its ops: on a GPU trace (any kernel events) the durations of the kernels and
copies launched from inside it; otherwise the durations of its outermost CPU ops (the range's own Python
time between ops is not counted). A trace of several steps gives, for each range, the median over its
occurrences. Parameters and memory are not in a trace: they come from the workload's shape (the stash by
the formulas of `Workload.stash_bytes`), and the file's `profiler` object says so.
"""

from __future__ import annotations

import re
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dist_lib import specs
from dist_lib.errors import SpecError
from dist_lib.hardware.profile_writer import MeasuredStep, layer_memory_bytes
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload

LAYER = re.compile(r"^layer\.(\d+)$")
BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
RANGES = ("embedding", "head", "optimizer")


def _events(path: Path) -> list[dict[str, Any]]:
    data = specs.read_json(path, "PyTorch profiler trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise SpecError(f"{path}: not a Chrome trace: expected an object with a traceEvents list")
    complete = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ts, dur)) or dur < 0:
            raise SpecError(f"{path}: traceEvents[{i}] ({specs.shown(str(e.get('name')))}): ts and dur must be "
                            f"numbers, dur >= 0")
        complete.append(e)
    return complete


def _args(e: dict[str, Any]) -> dict[str, Any]:
    args = e.get("args")
    return args if isinstance(args, dict) else {}


class _Trace:
    """The events of one trace, indexed for the sums."""

    def __init__(self, path: Path):
        self.path = path
        events = _events(path)
        self.annotations = [e for e in events if e.get("cat") == "user_annotation"]
        ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e["dur"]))
        self.ops_by_thread: dict[tuple, list[dict]] = defaultdict(list)
        for e in ops:
            self.ops_by_thread[e.get("pid"), e.get("tid")].append(e)
        self.starts = {key: [e["ts"] for e in v] for key, v in self.ops_by_thread.items()}
        self.backward: dict[int, list[dict]] = defaultdict(list)
        for e in ops:
            seq = _args(e).get("Sequence number")
            if str(e.get("name", "")).startswith(BACKWARD_PREFIX) and isinstance(seq, int):
                self.backward[seq].append(e)
        device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
        self.on_device = bool(device)
        by_correlation: dict[Any, float] = defaultdict(float)
        for e in device:
            by_correlation[_args(e).get("correlation")] += e["dur"]
        self.launches: dict[tuple, list[tuple[float, float]]] = defaultdict(list)  # (ts, device time) per thread
        for e in events:
            if e.get("cat") in LAUNCH_CATEGORIES:
                self.launches[e.get("pid"), e.get("tid")].append((e["ts"], by_correlation.get(
                    _args(e).get("correlation"), 0.0)))
        for launches in self.launches.values():
            launches.sort()

    def _inside(self, span: dict) -> list[dict]:
        """The CPU ops of `span`'s thread that run inside it."""
        key = span.get("pid"), span.get("tid")
        ops, starts = self.ops_by_thread.get(key, []), self.starts.get(key, [])
        begin, end = span["ts"], span["ts"] + span["dur"]
        found = []
        for e in ops[bisect_left(starts, begin):]:
            if e["ts"] > end:
                break
            if e is not span and e["ts"] >= begin and e["ts"] + e["dur"] <= end:
                found.append(e)
        return found

    def _device_time(self, spans: Iterable[dict]) -> float:
        total = 0.0
        for span in spans:
            launches = self.launches.get((span.get("pid"), span.get("tid")), [])
            lo = bisect_right(launches, (span["ts"], -1.0))
            for ts, device in launches[lo:]:
                if ts > span["ts"] + span["dur"]:
                    break
                total += device
        return total

    @staticmethod
    def _outermost(ops: list[dict]) -> list[dict]:
        outer, end = [], float("-inf")
        for e in ops:  # sorted by start, longest first
            if e["ts"] >= end:
                outer.append(e)
                end = e["ts"] + e["dur"]
        return outer

    def cost(self, span: dict, *, with_backward: bool) -> tuple[float, float]:
        """(forward, backward) microseconds of one range; backward 0 without `with_backward`."""
        inside = self._inside(span)
        outer = self._outermost(inside)
        backward: list[dict] = []
        if with_backward:
            seqs = {_args(e).get("Sequence number") for e in inside} - {None}
            backward = [b for s in sorted(seqs) for b in self.backward.get(s, [])]
        if self.on_device:
            return self._device_time(outer), self._device_time(backward)
        return sum(e["dur"] for e in outer), sum(e["dur"] for e in backward)


def layer_costs(path: str | Path) -> dict[str, tuple[float, float]]:
    """Per annotated range (`embedding`, `layer.<i>`, `head`, `optimizer`): (forward, backward) seconds,
    each the median over the range's occurrences in the trace (the optimizer's backward is 0)."""
    return _layer_costs(_Trace(Path(path)))


def _layer_costs(trace: _Trace) -> dict[str, tuple[float, float]]:
    path = trace.path
    found: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for span in trace.annotations:
        name = span.get("name")
        if name in RANGES or (isinstance(name, str) and LAYER.match(name)):
            forward, backward = trace.cost(span, with_backward=name != "optimizer")
            found[name].append((forward * 1e-6, backward * 1e-6))
    layers = sorted(int(LAYER.match(n).group(1)) for n in found if LAYER.match(n))
    if not layers:
        raise SpecError(f"{path}: no record_function range named layer.0: annotate each transformer layer's forward "
                        f"as record_function('layer.<i>') (docs/how-to/profile-your-gpu.md)")
    if layers != list(range(len(layers))):
        missing = sorted(set(range(max(layers) + 1)) - set(layers))
        raise SpecError(f"{path}: the layer ranges must be layer.0 to layer.{max(layers)}; missing "
                        f"{', '.join(f'layer.{i}' for i in missing)}")
    return {name: (statistics.median(f for f, _ in runs), statistics.median(b for _, b in runs))
            for name, runs in found.items()}


def import_trace(path: str | Path, workload: Workload, *, tp: int = 1, batch: int = 1,
                 device_type: str | None = None) -> MeasuredStep:
    """A profile file's figures from a trace of a step of `workload` at TP `tp` and microbatch `batch`;
    `device_type` names the files (by default CPU for a CPU trace; a GPU trace must name its type)."""
    trace = _Trace(Path(path))
    if device_type is None:
        if trace.on_device:
            raise SpecError(f"{path}: a GPU trace: name its device type (--type A100, as the cluster names the GPU)")
        device_type = "CPU"
    costs = _layer_costs(trace)
    layers = sum(1 for n in costs if LAYER.match(n))
    if layers != workload.num_layers:
        raise SpecError(f"{path}: the trace has {layers} layer ranges but workload {workload.name} has "
                        f"{workload.num_layers} layers; give the traced model's shape with --workload")
    total = {name: sum(pair) for name, pair in costs.items()}
    params = arch.layer_params(workload) / tp
    embedding, head = arch.input_embedding_params(workload) / tp, arch.output_params(workload) / tp
    stash = batch * workload.stash_bytes(1, tp)
    memory = (layer_memory_bytes(embedding, 0, 0),
              *[layer_memory_bytes(params, batch * workload.activation_bytes(), stash)] * layers,
              layer_memory_bytes(head, 0, 0))
    provenance = {"tool": "dist-sandbox profile --from-trace", "trace": str(path),
                  "time": "GPU kernels launched in each range" if trace.on_device
                  else "outermost CPU ops in each range, and the autograd nodes they created",
                  "memory": "the workload's formulas (a trace holds no per-layer memory)", "workload": workload.name,
                  "forward_backward_ms": {n: [round(f * 1e3, 6), round(b * 1e3, 6)] for n, (f, b) in costs.items()}}
    layer_seconds = tuple(total[f"layer.{i}"] for i in range(layers))
    return MeasuredStep(device_type, tp, batch, total.get("embedding", 0.0), layer_seconds, total.get("head", 0.0),
                        total.get("optimizer", 0.0), (embedding * 2, *[params * 2] * layers, head * 2), memory,
                        model_name=workload.name, provenance=provenance)

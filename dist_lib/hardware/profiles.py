"""Measured per-layer profiles in the Metis format (Um et al., USENIX ATC'24, SamsungLabs/Metis).

A profile directory holds one JSON file per (device type, TP degree, batch size), named
`DeviceType.<TYPE>_tp<N>_bs<M>.json`::

    {"model": {"num_layers": 10,
               "parameters": {"parameters_per_layer_bytes": [...one per layer...]}},
     "execution_time": {"layer_compute_total_ms": [...forward+backward per layer...],
                        "optimizer_time_ms": 39.3, "batch_generator_time_ms": 0.9},
     "execution_memory": {"layer_memory_total_mb": [...]}}      # older files: "total_memory"

Metis layers are the embedding, the transformer layers, then the LM head, so a profile of
`num_layers` N describes a workload of N - 2 transformer layers: layer i of the workload takes
profile entry i + 1 (layer 0 also the embedding's), and the loss takes the head's.

A batch size that was not profiled is interpolated linearly between the nearest profiled sizes
(extrapolated from the two nearest beyond them, but below the smallest never under its per-sample
share; proportionally from a single one). A larger batch must not take less time than a smaller one
(else the line would reach zero time). A device type or TP degree with no file raises `SpecError`
naming the file that is missing. Every malformed file raises `SpecError` naming the file and the field. Spec string: `profiles:DIR` or `profiles:DIR,WORKLOAD`,
where WORKLOAD (a preset spec such as `gpt-1.3b:seq=1024`) gives the shape; without it the hidden
size is solved from the transformer layer's parameters (12h^2 + 13h), heads are h/128 and the
sequence is 2048.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from dist_lib import specs
from dist_lib.workload import transformer as _workload
from dist_lib.hardware.devices import Device
from dist_lib.errors import SpecError
from dist_lib.hardware.cluster import MAX_WORLD_SIZE
from dist_lib.workload.transformer import FIELD_RANGES, MAX_GLOBAL_BATCH, Workload

FILE_NAME = re.compile(r"^DeviceType\.(\w+?)_tp(\d+)_bs(\d+)\.json$")


@dataclass(frozen=True)
class Profile:
    """One measured file: per-layer forward+backward seconds and memory bytes, step times."""

    path: Path
    device_type: str
    tp: int
    batch: int
    layer_seconds: tuple[float, ...]
    layer_memory_bytes: tuple[float, ...]
    parameter_bytes: tuple[float, ...]
    optimizer_seconds: float
    batch_generator_seconds: float


def read_profile(path: str | Path) -> Profile:
    """Read and check one profile file."""
    path = Path(path)
    match = FILE_NAME.match(path.name)
    if not match:
        raise SpecError(f"{path}: file name should be DeviceType.<TYPE>_tp<N>_bs<M>.json")
    device_type = match.group(1).upper()
    tp = specs.whole(match.group(2), f"{path}: tp in the file name", 1, MAX_WORLD_SIZE)
    batch = specs.whole(match.group(3), f"{path}: bs in the file name", 1, MAX_GLOBAL_BATCH)
    data = specs.read_json(path, "profile")
    where = str(path)
    model = _object(data, "", where)
    model_info = _object(model.get("model"), "model", where)
    times = _object(model.get("execution_time"), "execution_time", where)
    memory = _object(model.get("execution_memory"), "execution_memory", where)
    num_layers = model_info.get("num_layers")
    specs.whole(num_layers, f"{where}: model.num_layers (embedding, layers, head)", 3, MAX_LAYERS + 2, exact=True)
    params = _object(model_info.get("parameters"), "model.parameters", where)
    layer_ms = _numbers(times.get("layer_compute_total_ms"), "execution_time.layer_compute_total_ms",
                        where, num_layers, MAX_MS)
    mem_key = "layer_memory_total_mb" if "layer_memory_total_mb" in memory else "total_memory"
    layer_mb = _numbers(memory.get(mem_key), f"execution_memory.{mem_key}", where, num_layers, MAX_MB)
    param_bytes = _numbers(params.get("parameters_per_layer_bytes"), "model.parameters.parameters_per_layer_bytes",
                           where, num_layers, MAX_PARAMETER_BYTES)
    if any(t <= 0 for t in layer_ms[1:-1]):
        raise SpecError(f"{where}: execution_time.layer_compute_total_ms: transformer layers must take > 0 ms")
    optimizer = _number(times.get("optimizer_time_ms", 0.0), "execution_time.optimizer_time_ms", where, MAX_MS)
    generator = _number(times.get("batch_generator_time_ms", 0.0), "execution_time.batch_generator_time_ms", where,
                        MAX_MS)
    return Profile(path, device_type, tp, batch, tuple(t * 1e-3 for t in layer_ms),
                   tuple(m * 2**20 for m in layer_mb), tuple(param_bytes), optimizer * 1e-3, generator * 1e-3)


class ProfileSet:
    """All profiles of a directory, looked up by (device type, TP, batch size)."""

    def __init__(self, directory: Path, profiles: list[Profile]):
        self.directory = directory
        self.profiles = {(p.device_type, p.tp, p.batch): p for p in profiles}
        self.num_layers = profiles[0].layer_seconds.__len__()
        for p in profiles:
            if len(p.layer_seconds) != self.num_layers:
                raise SpecError(f"{p.path}: model.num_layers is {len(p.layer_seconds)} but "
                                f"{profiles[0].path.name} has {self.num_layers}")
        self.parameter_bytes = profiles[0].parameter_bytes
        _check_monotonic(self.profiles.values())

    @classmethod
    def load(cls, directory: str | Path) -> ProfileSet:
        directory = Path(directory)
        if not directory.is_dir():
            raise SpecError(f"{directory}: profile directory not found")
        files = sorted(p for p in directory.iterdir() if p.name.startswith("DeviceType.") and p.suffix == ".json")
        if not files:
            raise SpecError(f"{directory}: no DeviceType.<TYPE>_tp<N>_bs<M>.json profile files")
        return cls(directory, [read_profile(f) for f in files])

    @property
    def device_types(self) -> list[str]:
        return sorted({key[0] for key in self.profiles})

    def device_type(self, device: Device) -> str:
        """The profile type of a catalog device: its name (A100-80GB) or its family (A100)."""
        name = device.name.upper()
        types = self.device_types
        if name in types:
            return name
        family = name.split("-")[0]
        if family in types:
            return family
        raise SpecError(f"{self.directory}: no profile for device {device.name}: missing "
                        f"{self.directory / f'DeviceType.{family}_tp1_bs1.json'} (profiled: {', '.join(types)})")

    def tp_degrees(self, device: Device) -> set[int]:
        """The TP degrees profiled for `device`'s type (the only ones whose times are known)."""
        kind = self.device_type(device)
        return {t for (k, t, _) in self.profiles if k == kind}

    def _series(self, device: Device, tp: int) -> list[Profile]:
        kind = self.device_type(device)
        series = sorted((p for (k, t, _), p in self.profiles.items() if k == kind and t == tp), key=lambda p: p.batch)
        if not series:
            raise SpecError(f"{self.directory}: no profile of {kind} at TP {tp}: missing "
                            f"{self.directory / f'DeviceType.{kind}_tp{tp}_bs1.json'}")
        return series

    def _interpolate(self, device: Device, tp: int, samples: int, value) -> float:
        series = self._series(device, tp)
        batches = [p.batch for p in series]
        i = bisect_left(batches, samples)
        if i < len(series) and batches[i] == samples:
            return value(series[i])
        proportional = value(series[0]) * samples / batches[0]
        if len(series) == 1:
            return proportional
        i = min(max(i, 1), len(series) - 1)  # the two nearest profiled sizes
        lo, hi = series[i - 1], series[i]
        slope = (value(hi) - value(lo)) / (hi.batch - lo.batch)
        linear = value(lo) + slope * (samples - lo.batch)
        # Below the smallest profiled size a steep line would reach zero: never less than that size's
        # per-sample share (a kernel's fixed cost only adds to it).
        return max(linear, proportional) if samples < batches[0] else max(0.0, linear)

    def layer_time(self, device: Device, layer: int, samples: int, tp: int) -> float:
        """Forward+backward seconds of workload layer `layer` (0-based transformer layer) for `samples`."""
        index = layer + 1
        if not 1 <= index <= self.num_layers - 2:
            raise SpecError(f"{self.directory}: layer {layer} is outside the profiled {self.num_layers - 2} layers")
        seconds = self._interpolate(device, tp, samples, lambda p: p.layer_seconds[index])
        if layer == 0:
            seconds += self._interpolate(device, tp, samples, lambda p: p.layer_seconds[0])
        return seconds

    def head_time(self, device: Device, samples: int, tp: int) -> float:
        return self._interpolate(device, tp, samples, lambda p: p.layer_seconds[-1])

    def layer_memory_bytes(self, device: Device, layer: int, samples: int, tp: int) -> float:
        """Measured memory of a layer (weights, gradients, optimizer state and activations); layer 0
        carries the embedding's too, as its time and parameters do."""
        nbytes = self._interpolate(device, tp, samples, lambda p: p.layer_memory_bytes[layer + 1])
        if layer == 0:
            nbytes += self._interpolate(device, tp, samples, lambda p: p.layer_memory_bytes[0])
        return nbytes

    def stash_bytes(self, device: Device, layer: int, samples: int, tp: int, state_bytes: float,
                    input_bytes: float) -> int:
        """What `samples` samples of a layer keep for backward, by the measurement: the layer's measured
        memory less what the simulator accounts as tensors of their own (the model state, `state_bytes`,
        and the layer's input activation, `input_bytes`); never below zero."""
        return max(0, round(self.layer_memory_bytes(device, layer, samples, tp) - state_bytes - input_bytes))

    def optimizer_time(self, device: Device, tp: int) -> float:
        return self._series(device, tp)[0].optimizer_seconds

    def batch_generator_time(self, device: Device, samples: int, tp: int) -> float:
        return self._interpolate(device, tp, samples, lambda p: p.batch_generator_seconds)

    def infer_workload(self, name: str) -> Workload:
        """A workload shape from the parameters: 12h^2 + 13h per transformer layer, 16-bit."""
        params = self.parameter_bytes[1] / 2
        if params <= 0:
            raise SpecError(f"{self.directory}: model.parameters.parameters_per_layer_bytes[1] must be > 0 "
                            f"to infer the hidden size; give a shape as profiles:DIR,gpt-1.3b")
        hidden = round((-13 + math.sqrt(169 + 48 * params)) / 24)
        hidden = max(1, hidden)
        heads = max(1, hidden // 128) if hidden % 128 == 0 else 1
        try:
            return Workload(name, self.num_layers - 2, hidden, heads, 2048, 0)
        except SpecError as exc:
            raise SpecError(f"{self.directory}: the shape inferred from model.parameters does not fit ({exc}); "
                            f"give one as profiles:DIR,gpt-1.3b") from None


def load_workload(directory: str | Path, shape: str | None = None) -> Workload:
    """A workload whose layer times come from the profiles in `directory`."""
    profiles = ProfileSet.load(directory)
    name = f"profiles:{directory}"
    if shape:
        base = Workload.parse(shape)
        base = replace(base, name=name, num_layers=profiles.num_layers - 2)
    else:
        base = profiles.infer_workload(name)
    return replace(base, profile=profiles)


def parse_spec(arg: str) -> Workload:
    directory, _, shape = arg.partition(",")
    if not directory.strip():
        raise SpecError(f"profiles:{arg}: expected profiles:DIR or profiles:DIR,WORKLOAD")
    return load_workload(directory.strip(), shape.strip() or None)


def _object(value: object, field: str, where: str) -> dict:
    if not isinstance(value, dict):
        label = f"{field}: " if field else ""
        raise SpecError(f"{where}: {label}expected a JSON object, got {type(value).__name__}")
    return value


def _number(value: object, field: str, where: str, high: float) -> float:
    if isinstance(value, str):  # JSON numbers only: text is a malformed file, not a figure
        raise SpecError(f"{where}: {field}: expected a number, got {specs.shown(value)}")
    return specs.number(value, f"{where}: {field}", 0.0, high)


def _check_monotonic(profiles: Iterable[Profile]) -> None:
    """A larger batch cannot take less time: otherwise interpolation would extrapolate to zero time."""
    series: dict[tuple[str, int], list[Profile]] = {}
    for p in profiles:
        series.setdefault((p.device_type, p.tp), []).append(p)
    for runs in series.values():
        runs.sort(key=lambda p: p.batch)
        for lo, hi in zip(runs, runs[1:]):
            for i, (fast, slow) in enumerate(zip(hi.layer_seconds, lo.layer_seconds)):
                if fast < slow:
                    raise SpecError(f"{hi.path}: execution_time.layer_compute_total_ms[{i}] is {fast * 1e3:g} ms at "
                                    f"batch {hi.batch}, less than {slow * 1e3:g} ms at batch {lo.batch} "
                                    f"({lo.path.name}); a larger batch must not take less time")


def _numbers(value: object, field: str, where: str, count: int, high: float) -> list[float]:
    if not isinstance(value, list):
        raise SpecError(f"{where}: {field}: missing or not a list of numbers")
    if len(value) != count:
        raise SpecError(f"{where}: {field} has {len(value)} entries but model.num_layers is {count}")
    return [_number(v, f"{field}[{i}]", where, high) for i, v in enumerate(value)]


# Upper bounds of measured figures: a day per layer or step part, a TiB of memory or of weights per layer
# (what one simulated tensor may hold).
MAX_MS, MAX_MB, MAX_PARAMETER_BYTES = 86_400_000.0, 2.0**20, 2.0**40
MAX_LAYERS = FIELD_RANGES["num_layers"][1]


_workload.SPEC_SCHEMES["profiles"] = parse_spec
specs.PATH_PARTS["profiles"] = 1  # profiles:DIR[,WORKLOAD]

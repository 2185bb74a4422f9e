"""Write measured per-layer costs as profile files (`hardware.profiles` reads them back).

The files are Metis' profiler's (Um et al., USENIX ATC'24, SamsungLabs/Metis): one JSON file per (device
type, TP degree, microbatch size), `DeviceType.<TYPE>_tp<N>_bs<M>.json`, whose layers are the embedding,
the transformer layers, then the LM head with the loss. Besides the keys this sandbox reads, the file holds
the totals Metis' files carry (`model_name`, `total_parameters_bytes`, `total_time_ms`,
`forward_backward_time_ms`, `total_memory_mb`) and a `profiler` object saying how it was measured; readers
ignore keys they do not know.

Whoever measures (`hardware.profiling` with PyTorch, `hardware.kineto` from a profiler trace) hands the
figures over as plain numbers in a `MeasuredStep`; nothing here needs PyTorch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES

TYPE_NAME = re.compile(r"^\w+$")  # what `profiles.FILE_NAME` accepts as the device type


@dataclass(frozen=True)
class MeasuredStep:
    """One device type's costs at one TP degree and microbatch size, in seconds and bytes.

    `layer_seconds` holds forward + backward of each transformer layer; `embedding_seconds` and
    `head_seconds` the same for the input embedding and for the LM head with the loss. `parameter_bytes`
    and `memory_bytes` have one entry per Metis layer (embedding, each layer, head)."""

    device_type: str
    tp: int
    batch: int
    embedding_seconds: float
    layer_seconds: tuple[float, ...]
    head_seconds: float
    optimizer_seconds: float
    parameter_bytes: tuple[float, ...]
    memory_bytes: tuple[float, ...]
    batch_generator_seconds: float = 0.0
    model_name: str = "GPT"
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"profile of {self.device_type} at TP {self.tp}, microbatch {self.batch}"
        if not TYPE_NAME.match(self.device_type):
            raise SpecError(f"{where}: the device type must be letters, digits and _ (it names the file), "
                            f"got {self.device_type!r}")
        if self.tp < 1 or self.batch < 1:
            raise SpecError(f"{where}: TP and microbatch must be at least 1")
        if not self.layer_seconds:
            raise SpecError(f"{where}: no transformer layer was measured")
        entries = len(self.layer_seconds) + 2
        for name in ("parameter_bytes", "memory_bytes"):
            if len(getattr(self, name)) != entries:
                raise SpecError(f"{where}: {name} has {len(getattr(self, name))} entries, expected {entries} "
                                f"(embedding, {len(self.layer_seconds)} layers, head)")
        figures = (self.embedding_seconds, *self.layer_seconds, self.head_seconds, self.optimizer_seconds,
                   self.batch_generator_seconds, *self.parameter_bytes, *self.memory_bytes)
        if any(not math.isfinite(x) or x < 0 for x in figures):
            raise SpecError(f"{where}: every time and size must be a finite number >= 0")
        if any(t <= 0 for t in self.layer_seconds):
            raise SpecError(f"{where}: a transformer layer must take more than 0 s")

    @property
    def file_name(self) -> str:
        return f"DeviceType.{self.device_type}_tp{self.tp}_bs{self.batch}.json"


def layer_memory_bytes(parameters: float, input_bytes: float, saved_bytes: float) -> float:
    """A layer's memory as `profiles.ProfileSet.stash_bytes` takes it apart again: its model state at the
    simulator's bytes per parameter (16-bit weight and gradient, 12 bytes of fp32 optimizer state), the
    layer's input activation, and what autograd saved for backward besides that input."""
    return parameters * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES) + input_bytes + saved_bytes


def profile_document(step: MeasuredStep) -> dict[str, Any]:
    """The JSON object of one profile file."""
    times_ms = [step.embedding_seconds * 1e3, *(t * 1e3 for t in step.layer_seconds), step.head_seconds * 1e3]
    memory_mb = [m / 2**20 for m in step.memory_bytes]
    forward_backward = sum(times_ms)
    optimizer, generator = step.optimizer_seconds * 1e3, step.batch_generator_seconds * 1e3
    return {
        "model": {"model_name": step.model_name, "num_layers": len(times_ms),
                  "parameters": {"total_parameters_bytes": round(sum(step.parameter_bytes)),
                                 "parameters_per_layer_bytes": [round(p) for p in step.parameter_bytes]}},
        "execution_time": {"total_time_ms": _ms(forward_backward + optimizer + generator),
                           "forward_backward_time_ms": _ms(forward_backward),
                           "batch_generator_time_ms": _ms(generator),
                           "optimizer_time_ms": _ms(optimizer),
                           "layer_compute_total_ms": [_ms(t) for t in times_ms]},
        "execution_memory": {"total_memory_mb": round(sum(memory_mb), 9),
                             "layer_memory_total_mb": [round(m, 9) for m in memory_mb]},  # MiB to the byte
        "profiler": dict(step.provenance),
    }


def _ms(value: float) -> float:
    """Milliseconds to the nanosecond: what a timer resolves, and exact enough to read back."""
    return round(value, 6)


def write_profiles(steps: Iterable[MeasuredStep], directory: str | Path) -> list[Path]:
    """Write one file per measured step into `directory` (created if missing); the paths written.
    Every step must describe the same number of layers, as `profiles.ProfileSet` requires."""
    steps = list(steps)
    if not steps:
        raise SpecError("no measured step to write")
    layers = {len(s.layer_seconds) for s in steps}
    if len(layers) > 1:
        raise SpecError(f"the measured steps disagree on the number of layers ({sorted(layers)}); a profile folder "
                        f"holds one model")
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"{directory}: cannot create the profile folder ({exc.strerror or exc})") from None
    paths = []
    for step in steps:
        path = directory / step.file_name
        try:
            path.write_text(json.dumps(profile_document(step), indent=1) + "\n")
        except OSError as exc:
            raise SpecError(f"{path}: cannot write the profile ({exc.strerror or exc})") from None
        paths.append(path)
    return paths

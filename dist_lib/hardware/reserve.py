"""What a real training process keeps of each GPU besides its tensors: the runtime reserve.

A PyTorch process cannot fill a GPU with tensors. Three things take their share first:

- **The CUDA (or ROCm) context**: the driver's state and the kernels it has loaded. PyTorch's maintainers
  measure about 300 MB with lazy module loading (CUDA >= 11.7; the default on Linux since CUDA 12.2), and
  more than 1000 MB before it (pytorch/pytorch issue 107667, 2023); users measured 200 to 700 MB on older
  stacks (issue 28113) and 721 MB (GTX 1080, CUDA 10.1) against 1687 MB (RTX 3090, CUDA 11.1, eager
  loading) for one tensor (issue 55277). `CONTEXT_BYTES` is 512 MiB: the lazily loaded context with room
  for the kernels a training step loads. No published measurement of a ROCm (HIP) context was found; the
  same figure stands for it.
- **NCCL (RCCL) buffers, per communicator**: each channel keeps a FIFO per connected peer for each
  protocol: Simple's `NCCL_BUFFSIZE` (4 MiB by default), LL128's (about 4.7 MiB) and LL's (0.5 MiB);
  NCCL's allocation log shows them as 10 MiB buffers per channel and peer (NVIDIA/nccl issue 1685, 8 x
  H100). Memory grows linearly with the channels, and a ring has two connections whatever its size
  (NCCL maintainer, NVIDIA/nccl issue 986). `COMMUNICATOR_BYTES` counts 16 channels x 2 connections x
  10 MiB = 320 MiB for each communicator a rank belongs to (PyTorch makes one per process group, and one
  for each pair of ranks that send to each other). NVLink SHARP, CollNet and all-to-all connect more
  peers: users measured about 1 GB a communicator on H100 (issues 864 and 1685); set `communicator=1GiB`
  there.
- **Allocator fragmentation**: PyTorch's caching allocator splits cached blocks, and the pieces left
  between live tensors cannot hold a larger one. GMLake (Guo et al., ASPLOS'24) measured 15 % of an
  A100-80GB wasted on average over eight LLMs (up to 33 %) under recompute, offloading, ZeRO and LoRA,
  whose allocations are irregular. `FRAGMENTATION` is 10 % of what the context and buffers leave: a step
  whose allocations repeat each microbatch fragments less; set `fragmentation=0.15` (or more) for the
  irregular cases.

A rank fits when its peak live bytes are at most `usable(capacity, communicators)`; the figures are
settable (`MemoryReserve`, or the text `context=...,communicator=...,fragmentation=...`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.specs import key_values, number, shown

MiB, GiB = 2**20, 2**30
CONTEXT_BYTES = 512 * MiB
COMMUNICATOR_BYTES = 16 * 2 * 10 * MiB
FRAGMENTATION = 0.10

_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*")
_UNITS = {None: 1, "B": 1, "KiB": 2**10, "MiB": MiB, "GiB": GiB, "KB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass(frozen=True)
class MemoryReserve:
    """Bytes a real run keeps of every GPU besides its tensors: the runtime context, each communicator's
    NCCL buffers, and a fraction of the rest lost to the allocator's fragmentation."""

    context_bytes: int = CONTEXT_BYTES
    communicator_bytes: int = COMMUNICATOR_BYTES
    fragmentation: float = FRAGMENTATION

    def __post_init__(self) -> None:
        for name in ("context_bytes", "communicator_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"memory reserve: {name} must be a whole number of bytes >= 0, got {shown(value)}")
        value = self.fragmentation
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise SpecError(f"memory reserve: fragmentation must be a fraction in [0, 1), got {shown(value)}")

    def usable(self, capacity: int, communicators: int = 0) -> int:
        """Bytes of tensors a GPU of `capacity` bytes holds in a process that belongs to `communicators`
        communicators."""
        rest = capacity - self.context_bytes - communicators * self.communicator_bytes
        return max(0, int(rest * (1 - self.fragmentation)))

    def reserved(self, capacity: int, communicators: int = 0) -> int:
        """Bytes of the GPU the runtime keeps (capacity minus `usable`)."""
        return capacity - self.usable(capacity, communicators)

    def describe(self, capacity: int, communicators: int = 0) -> str:
        """The reserve on one GPU, part by part, in one line."""
        rest = max(0, capacity - self.context_bytes - communicators * self.communicator_bytes)
        return (f"runtime reserve {_gib(self.reserved(capacity, communicators))}: context {_gib(self.context_bytes)}, "
                f"NCCL buffers {communicators} x {_gib(self.communicator_bytes)}, fragmentation "
                f"{self.fragmentation * 100:g} % ({_gib(rest - self.usable(capacity, communicators))})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def memory_reserve(value: Any, where: str = "memory reserve") -> MemoryReserve | None:
    """The reserve a value names: None, False or "off" for none (tensors may fill the whole device); True
    or "default" for the cited figures; a `MemoryReserve`; its dict; or text overriding some figures of
    the default, `context=0.5GiB,communicator=1GiB,fragmentation=0.15` (sizes in B, KiB, MiB, GiB, KB, MB or
    GB; a bare number is bytes)."""
    if value is None or value is False:
        return None
    if value is True:
        return MemoryReserve()
    if isinstance(value, MemoryReserve):
        return value
    if isinstance(value, dict):
        unknown = set(value) - {"context_bytes", "communicator_bytes", "fragmentation"}
        if unknown:
            raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                            f"(known: context_bytes, communicator_bytes, fragmentation)")
        return MemoryReserve(**value)
    if not isinstance(value, str):
        raise SpecError(f"{where}: expected off, default, a MemoryReserve or key=value text, got {shown(value)}")
    text = value.strip()
    if text.lower() in ("off", "none", "0"):
        return None
    if text.lower() in ("default", "on"):
        return MemoryReserve()
    fields: dict[str, Any] = {}
    for key, item in key_values(text, ",", where):
        if key == "fragmentation":
            fields["fragmentation"] = number(item.rstrip("%"), f"{where}: fragmentation", 0, 99.999 if
                                             item.endswith("%") else 0.99999) / (100 if item.endswith("%") else 1)
        elif key in ("context", "communicator"):
            fields[f"{key}_bytes"] = _size(item, f"{where}: {key}")
        else:
            raise SpecError(f"{where}: unknown key {shown(key)} (known: context, communicator, fragmentation; "
                            f"or off, default)")
    return MemoryReserve(**fields)


def _size(text: str, where: str) -> int:
    match = _SIZE.fullmatch(text)
    if not match:
        raise SpecError(f"{where}: expected a size such as 512MiB or 1GiB, got {shown(text)}")
    nbytes = float(match.group(1)) * _UNITS[match.group(2)]
    if not nbytes < 2**50:
        raise SpecError(f"{where}: {shown(text)} is larger than any GPU")
    return int(nbytes)

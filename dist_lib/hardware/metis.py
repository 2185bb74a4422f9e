"""Metis cluster descriptions (Um et al., USENIX ATC'24, SamsungLabs/Metis): a host file plus a JSON file.

Host file, one node per line, in file order (blank lines and `#` comments are skipped)::

    10.0.0.1 slots=8        # MPI/DeepSpeed style
    10.0.0.2 4              # or just the GPU count

Cluster file, a JSON object keyed by the same IPs::

    {"10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80}}

Units: `inter_bandwidth` and `intra_bandwidth` are per-GPU bandwidth each way in decimal GB/s (the
unit the Metis cost estimator actually uses: its repository's clusterfile.json holds values such as
10 and 46). Values above 2000 GB/s or below 0.001 are rejected as implausible, with a hint when they look like bytes/s.
`memory` is GB per GPU, at most 1024. `instance_type` is a Metis device type (A100, V100, P100, T4) or
any device of the catalog; the memory picks the variant (A100 with 40 -> A100-40GB).

Every problem raises `SpecError` naming the file, the line or IP, and the field.
Spec string: `metis:HOSTFILE,CLUSTERFILE`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dist_lib.hardware import cluster as hardware
from dist_lib import specs
from dist_lib.hardware.devices import DEVICES, GB, GiB, Device, Link, get_device
from dist_lib.errors import SpecError
from dist_lib.hardware.cluster import FIGURE_RANGES, MAX_WORLD_SIZE, Cluster, Node
from dist_lib.specs import number, whole

MIN_VALUE, MAX_BANDWIDTH_GBPS = FIGURE_RANGES["bandwidth_GBps"]  # the cluster file's accepted range
MAX_MEMORY_GB = 1024.0


def read_hostfile(path: str | Path) -> list[tuple[str, int]]:
    """(IP, GPUs) per node, in file order."""
    path = Path(path)
    text = specs.read_text(path, "host file")
    hosts: list[tuple[str, int]] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        parts = line.split()
        if len(parts) != 2:
            raise SpecError(f"{where}: expected 'IP slots=N' or 'IP N', got {specs.shown(raw.strip())}")
        ip, count = parts
        if count.startswith("slots="):
            count = count[len("slots="):]
        slots = whole(count, f"{where}: slots", 1, MAX_WORLD_SIZE)
        if ip in seen:
            raise SpecError(f"{where}: host {ip} is listed twice")
        seen.add(ip)
        hosts.append((ip, slots))
    if not hosts:
        raise SpecError(f"{path}: the host file lists no hosts")
    return hosts


def read_clusterfile(path: str | Path) -> dict[str, dict]:
    path = Path(path)
    data = specs.read_json(path, "cluster file")
    if not isinstance(data, dict) or not data:
        raise SpecError(f"{path}: expected a JSON object keyed by host IP")
    return data


def load_cluster(hostfile: str | Path, clusterfile: str | Path) -> Cluster:
    """A `Cluster` with one node per host-file line, described by the cluster file."""
    hosts = read_hostfile(hostfile)
    info = read_clusterfile(clusterfile)
    nodes = []
    for ip, gpus in hosts:
        where = f"{clusterfile}: {ip}"
        if ip not in info:
            raise SpecError(f"{where}: host from {hostfile} has no entry in the cluster file")
        entry = info[ip]
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: expected an object, got {type(entry).__name__}")
        missing = [k for k in ("instance_type", "inter_bandwidth", "intra_bandwidth", "memory") if k not in entry]
        if missing:
            raise SpecError(f"{where}: missing field(s) {', '.join(missing)}")
        kind = entry["instance_type"]
        if not isinstance(kind, str) or not kind.strip():
            raise SpecError(f"{where}.instance_type: expected a device name such as 'A100', got {kind!r}")
        memory = _plausible(entry["memory"], f"{where}.memory", "GB", MAX_MEMORY_GB)
        intra = _plausible(entry["intra_bandwidth"], f"{where}.intra_bandwidth", "GB/s", MAX_BANDWIDTH_GBPS)
        inter = _plausible(entry["inter_bandwidth"], f"{where}.inter_bandwidth", "GB/s", MAX_BANDWIDTH_GBPS)
        device = _device(kind, memory, f"{where}.instance_type")
        nodes.append(Node(device, gpus, Link(f"{ip}-intra", intra * GB, device.intra_link.latency),
                          Link(f"{ip}-inter", inter * GB, device.inter_link.latency)))
    return Cluster(tuple(nodes), name=f"metis:{Path(hostfile).name}")


def parse_spec(arg: str) -> Cluster:
    """`HOSTFILE,CLUSTERFILE` (the part after `metis:`)."""
    parts = [p.strip() for p in arg.split(",")]
    if len(parts) != 2 or not all(parts):
        raise SpecError(f"metis:{arg}: expected metis:HOSTFILE,CLUSTERFILE")
    return load_cluster(*parts)


def _device(kind: str, memory_gb: float, where: str) -> Device:
    """The catalog device of this type whose memory is nearest `memory_gb`; its memory is set to that."""
    key = kind.strip().upper()
    family = [d for name, d in DEVICES.items() if name.upper() == key or name.upper().startswith(key + "-")]
    if not family:
        try:
            family = [get_device(kind)]
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
    best = min(family, key=lambda d: abs(d.memory_bytes / GiB - memory_gb))
    return replace(best, memory_bytes=int(memory_gb * GiB))


def _plausible(value: object, where: str, unit: str, limit: float) -> float:
    """A JSON number of `unit` from MIN_VALUE (below a megabyte, a unit mistake) to `limit`."""
    if isinstance(value, str):
        raise SpecError(f"{where}: expected a number in {unit}, got {specs.shown(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 1e6 <= value < float("inf") \
            and unit == "GB/s":
        raise SpecError(f"{where}: {value!r} {unit} is implausible (at most {limit:g}); this looks like bytes/s, "
                        f"give GB/s")
    return number(value, where, MIN_VALUE, limit, unit=f" {unit}")


hardware.SPEC_SCHEMES["metis"] = parse_spec
specs.PATH_PARTS["metis"] = 2  # metis:HOSTFILE,CLUSTERFILE

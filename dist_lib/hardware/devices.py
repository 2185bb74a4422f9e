"""The device catalog: the one place where GPU and link figures live.

Peak figures are dense 16-bit tensor-core throughput and HBM bandwidth from the vendor data sheets
(NVIDIA H100, A100, V100, A10, L4 and T4 data sheets). Memory is the nominal size in GiB, which is what
`nvidia-smi` reports (an "80GB" A100 shows 81920 MiB). Link bandwidths are per GPU and per direction.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from dist_lib.errors import SpecError
from dist_lib.specs import shown

GB = 1e9  # bandwidths and FLOP rates use decimal units, as the data sheets do
GiB = 2**30


@dataclass(frozen=True, slots=True)
class Link:
    """A link type: per-GPU line rate each way (bytes/s), the latency of one ring step (s), and the share
    of the line rate NCCL's transfers reach on it (`efficiency`; 1.0 for bandwidths a user measured)."""

    name: str
    bandwidth: float
    latency: float
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise SpecError(f"link {self.name!r}: bandwidth must be > 0 bytes/s, got {self.bandwidth}")
        if not self.latency >= 0:
            raise SpecError(f"link {self.name!r}: latency must be >= 0 s, got {self.latency}")
        if not 0 < self.efficiency <= 1:
            raise SpecError(f"link {self.name!r}: efficiency must be in (0, 1], got {self.efficiency}")

    @property
    def achieved_bandwidth(self) -> float:
        """Bytes/s a large NCCL transfer moves per GPU each way: the line rate times `efficiency`."""
        return self.bandwidth * self.efficiency


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU model: what it computes, holds and moves, and the links it usually comes with."""

    name: str
    peak_flops: float  # dense fp16/bf16 tensor FLOP/s
    memory_bytes: int
    hbm_bandwidth: float  # bytes/s
    intra_link: Link  # default link between GPUs of one node
    inter_link: Link  # default per-GPU network link between nodes
    # Fraction of an SM's share of peak that a GEMM tile's K loop sustains; whole GEMMs lose more to
    # wave and tile quantization (costs.gemm_time).
    max_efficiency: float
    sms: int = 0  # streaming multiprocessors (data sheet); 0 if unknown, then GEMMs run in fractional waves
    price_per_hour: float = 0.0  # USD per device-hour, on-demand list price (see PRICES_PER_HOUR)

    def __post_init__(self) -> None:
        for field in ("peak_flops", "memory_bytes", "hbm_bandwidth"):
            if not getattr(self, field) > 0:
                raise SpecError(f"device {self.name!r}: {field} must be > 0, got {getattr(self, field)}")
        if not 0 < self.max_efficiency <= 1:
            raise SpecError(f"device {self.name!r}: max_efficiency must be in (0, 1], got {self.max_efficiency}")


# Per-step ring latencies follow NCCL's tuner (src/graph/tuning.cc, "Simple" protocol hardware
# latencies for the ring algorithm): NVLink 3.4 us, PCIe 5.7 us, network 14 us per step.
# NVLink line rates are the data sheets'; NCCL's protocol overhead costs about a fifth of them, so its
# transfers reach ~80 % (NCCL maintainer in NVIDIA/nccl-tests issue 212: NVLink4's 450 GB/s line rate
# gives an effective 370 GB/s, the bus bandwidth of non-all-reduce collectives). Users' all_reduce_perf
# runs on 8 x A100 SXM4 report bus bandwidths of 200-210 GB/s of NVLink3's 300 (nccl-tests issues 149
# and 178), so 0.8 is not pessimistic. The other links keep efficiency 1.0: PCIe figures are already
# below line rate, and no comparable NCCL figure is at hand for InfiniBand or Ethernet.
NVLINK_NCCL_EFFICIENCY = 0.8
NVLINK_4 = Link("NVLink4", 450 * GB, 3.4e-6, NVLINK_NCCL_EFFICIENCY)
NVLINK_3 = Link("NVLink3", 300 * GB, 3.4e-6, NVLINK_NCCL_EFFICIENCY)
NVLINK_2 = Link("NVLink2", 150 * GB, 3.4e-6, NVLINK_NCCL_EFFICIENCY)
PCIE_4 = Link("PCIe4", 25 * GB, 5.7e-6)
PCIE_3 = Link("PCIe3", 12 * GB, 5.7e-6)
IB_NDR = Link("IB-NDR", 50 * GB, 14e-6)  # 400 Gb/s per GPU
IB_HDR = Link("IB-HDR", 25 * GB, 14e-6)  # 200 Gb/s per GPU
IB_EDR = Link("IB-EDR", 12.5 * GB, 14e-6)  # 100 Gb/s per GPU
ETH_100G = Link("Eth-100G", 12.5 * GB, 14e-6)
ETH_50G = Link("Eth-50G", 6.25 * GB, 14e-6)  # e.g. a g4dn.12xlarge T4 node's 50 Gb/s
ETH_40G = Link("Eth-40G", 5 * GB, 14e-6)

LINKS: dict[str, Link] = {link.name.lower(): link for link in
                          (NVLINK_4, NVLINK_3, NVLINK_2, PCIE_4, PCIE_3, IB_NDR, IB_HDR, IB_EDR,
                           ETH_100G, ETH_50G, ETH_40G)}

# max_efficiency is the share of one SM's peak that a GEMM tile's K loop sustains; costs.gemm_time
# adds wave and tile quantization and the tile stores from the SM count, and the memory-bound kernels
# and communication are timed separately. Each is set once from one published measurement
# (`python benchmarks/fidelity.py --calibrate` recomputes them) and checked against others:
# * A100 0.75: Korthikanti et al. 2022 Table 4, one 22B layer forward, 7.7 ms with its TP all-reduces at
#   NCCL's achieved NVLink bandwidth; Table 4's nine other layer times and the Table 5 and Narayanan et
#   al. 2021 Table 1 iteration times are predictions, not fits (benchmarks/fidelity.py).
# * V100 0.93: cuBLAS fp16 GEMM of 8192^3 on a V100 reaches about 101 TFLOP/s of the 112 its clock
#   gives (NVIDIA developer forum, "Understanding IPC and issue slot utilization when using Tensor Cores",
#   thread 79781); the same share of the SXM2's 125.
# * T4 0.38: a sustained cuBLAS fp16 GEMM of 4096^3 runs at about 24 TFLOP/s of the data sheet's 65,
#   because the 70 W power cap lowers the clock (NVIDIA developer forum, "About GPU peak performance",
#   thread 264462, with NVIDIA's answer).
# SM counts from the data sheets / architecture whitepapers (H100 SXM 132, A100 108, V100 80, A10 72,
# L4 58, T4 40, P100 56). The H100, A10, L4 and P100 efficiencies are placeholders that no published
# measurement has checked yet.
DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("H100-80GB", 989e12, 80 * GiB, 3350 * GB, NVLINK_4, IB_NDR, 0.62, 132),
    Device("A100-80GB", 312e12, 80 * GiB, 2039 * GB, NVLINK_3, IB_HDR, 0.75, 108),
    Device("A100-40GB", 312e12, 40 * GiB, 1555 * GB, NVLINK_3, IB_HDR, 0.75, 108),
    Device("V100-32GB", 125e12, 32 * GiB, 900 * GB, NVLINK_2, IB_EDR, 0.93, 80),
    Device("V100-16GB", 125e12, 16 * GiB, 900 * GB, NVLINK_2, IB_EDR, 0.93, 80),
    Device("A10", 125e12, 24 * GiB, 600 * GB, PCIE_4, ETH_40G, 0.60, 72),
    Device("L4", 121e12, 24 * GiB, 300 * GB, PCIE_4, ETH_40G, 0.60, 58),
    Device("T4", 65e12, 16 * GiB, 320 * GB, PCIE_3, ETH_50G, 0.38, 40),
    # Tesla P100 SXM2 data sheet: 21.2 TFLOP/s fp16 (no tensor cores), 16 GB HBM2 at 732 GB/s,
    # NVLink 1 four links of 20 GB/s each way; a Metis device type (SamsungLabs/Metis utils.DeviceType).
    Device("P100-16GB", 21.2e12, 16 * GiB, 732 * GB, Link("NVLink1", 80 * GB, 3.4e-6, NVLINK_NCCL_EFFICIENCY),
           ETH_100G, 0.55, 56),
)}

# On-demand list prices per GPU-hour: the instance's hourly price over its GPUs, AWS EC2 On-Demand
# pricing, us-east-1 (aws.amazon.com/ec2/pricing/on-demand): p5.48xlarge 8 x H100 $98.32; p4de.24xlarge
# 8 x A100-80GB $40.9657; p4d.24xlarge 8 x A100-40GB $32.7726; p3dn.24xlarge 8 x V100-32GB $31.212;
# p3.16xlarge 8 x V100-16GB $24.48; g5.12xlarge 4 x A10G $5.672; g6.12xlarge 4 x L4 $4.6016;
# g4dn.12xlarge 4 x T4 $3.912. P100: Google Cloud's on-demand GPU price, $1.46 per GPU-hour.
PRICES_PER_HOUR = {"H100-80GB": 98.32 / 8, "A100-80GB": 40.9657 / 8, "A100-40GB": 32.7726 / 8,
                   "V100-32GB": 31.212 / 8, "V100-16GB": 24.48 / 8, "A10": 5.672 / 4, "L4": 4.6016 / 4,
                   "T4": 3.912 / 4, "P100-16GB": 1.46}
DEVICES = {name: replace(d, price_per_hour=PRICES_PER_HOUR[name]) for name, d in DEVICES.items()}

_ALIASES = {"h100": "H100-80GB", "a100": "A100-80GB", "v100": "V100-32GB", "p100": "P100-16GB"}


def get_device(name: str, custom: dict[str, Device] | None = None) -> Device:
    """Look a device up by name, case-insensitively; an unknown name lists the close ones."""
    catalog = {**DEVICES, **(custom or {})}
    by_lower = {key.lower(): dev for key, dev in catalog.items()}
    key = name.strip().lower()
    if key in by_lower:
        return by_lower[key]
    if key in _ALIASES:
        return DEVICES[_ALIASES[key]]
    close = difflib.get_close_matches(name.upper(), list(catalog), n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise SpecError(f"unknown device {shown(name)}{hint} (known: {', '.join(catalog)})")


def get_link(name: str) -> Link:
    try:
        return LINKS[name.strip().lower()]
    except KeyError:
        raise SpecError(f"unknown link {name!r} (known: {', '.join(l.name for l in LINKS.values())})") from None

"""The device catalog: the one place where GPU and link figures live.

Peak figures are dense (no 2:4 sparsity) 16-bit and 8-bit tensor-core throughput and HBM bandwidth from the
vendor data sheets (NVIDIA H100, H200, DGX B200, A100, V100, A10, L4, L40S and T4 data sheets; AMD's MI300X
specifications). Memory is what `nvidia-smi` reports as memory.total: the nominal GiB for the A100 ("80GB"
shows 81920 MiB) and older parts, less than the nominal "GB" for the H100 (81559 MiB), H200 (143771 MiB),
B200 (183359 MiB) and L40S (46068 MiB), as public nvidia-smi logs show. Link bandwidths are per GPU and per
direction. `SOURCES` names where each device's figures come from (docs/reference/devices.md lists them).
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
    fp8_flops: float = 0.0  # dense FP8 tensor FLOP/s; 0 for devices without FP8 tensor cores
    # A board power limit below the one the data-sheet peaks are stated at (W; 0: the data sheet's own) and the
    # share of the data-sheet tensor-core clock the part sustains under it on tensor-core-bound kernels
    # (`hopper_clock_share`); memory-bound kernels keep the HBM bandwidth.
    power_limit_w: float = 0.0
    sustained_clock: float = 1.0

    def __post_init__(self) -> None:
        for field in ("peak_flops", "memory_bytes", "hbm_bandwidth"):
            if not getattr(self, field) > 0:
                raise SpecError(f"device {self.name!r}: {field} must be > 0, got {getattr(self, field)}")
        if not 0 < self.max_efficiency <= 1:
            raise SpecError(f"device {self.name!r}: max_efficiency must be in (0, 1], got {self.max_efficiency}")
        if not 0 < self.sustained_clock <= 1:
            raise SpecError(f"device {self.name!r}: sustained_clock must be in (0, 1], got {self.sustained_clock}")

    @property
    def tensor_flops(self) -> float:
        """Dense 16-bit tensor FLOP/s at the clock the part sustains under its power limit: what the GEMM and
        attention kernels are timed against (`peak_flops`, the data sheet's, stays the MFU denominator)."""
        return self.peak_flops * self.sustained_clock


# The tensor-core clock a Hopper part (132 SMs, 4,096 dense 16-bit FLOPs per SM and clock) sustains under a board
# power limit, from NVIDIA's two data sheets of that die at two limits: the H100 SXM5, up to 700 W, 989.4 TFLOP/s
# dense BF16 (1,830 MHz), and the H100 NVL, 350-400 W, 835.5 TFLOP/s (the data sheet's 1,671 with sparsity,
# halved: 1,545 MHz). Between them the clock is taken linear in the limit. Power grows faster than linearly in
# the clock (the voltage rises with it), so the chord lies below the true clock-power curve: a lower bound on the
# clock, by a few percent at most between two points 300 W apart.
HOPPER_DATA_SHEET_CLOCKS = ((400.0, 835.5e12), (700.0, 989.4e12))  # (board W, dense BF16 FLOP/s), 132 SMs


def hopper_clock_share(power_limit_w: float) -> float:
    """Share of the H100 SXM5's data-sheet tensor clock a 132-SM Hopper part holds at `power_limit_w` (linear
    between the NVL's 400 W and the SXM5's 700 W data-sheet peaks; 1.0 from 700 W up)."""
    (low_w, low), (high_w, high) = HOPPER_DATA_SHEET_CLOCKS
    if power_limit_w >= high_w:
        return 1.0
    if power_limit_w < low_w:
        raise SpecError(f"power limit {power_limit_w} W: below the {low_w:.0f} W of the lowest Hopper data sheet "
                        f"(H100 NVL); no clock is known there")
    return (low + (power_limit_w - low_w) / (high_w - low_w) * (high - low)) / high


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
# NVLink5 (B200): 18 links, 1.8 TB/s both ways per GPU (DGX B200 data sheet); NCCL's share of NVLink4's.
NVLINK_5 = Link("NVLink5", 900 * GB, 3.4e-6, NVLINK_NCCL_EFFICIENCY)
# PCIe 5 x16 (H100 PCIe): 63 GB/s each way at line rate, taken at the share of it that PCIe4's 25 of 31.5 is.
PCIE_5 = Link("PCIe5", 50 * GB, 5.7e-6)
# MI300X: Infinity Fabric (xGMI), one 64 GB/s-each-way link to each of the 7 other GPUs of the OAM platform,
# 448 GB/s per GPU in all (AMD MI300X specifications; S. Bekman, Machine Learning Engineering, network
# chapter). A ring over the 8 GPUs spreads over all links, as RCCL's rings do; a transfer between ONE pair
# of GPUs reaches only 64 GB/s, which a per-GPU port does not model. RCCL's latency taken as NCCL's NVLink.
XGMI_MI300X = Link("xGMI", 448 * GB, 3.4e-6, NVLINK_NCCL_EFFICIENCY)
IB_NDR = Link("IB-NDR", 50 * GB, 14e-6)  # 400 Gb/s per GPU (one ConnectX-7 per GPU on DGX H100/H200/B200)
IB_HDR = Link("IB-HDR", 25 * GB, 14e-6)  # 200 Gb/s per GPU
IB_EDR = Link("IB-EDR", 12.5 * GB, 14e-6)  # 100 Gb/s per GPU
ETH_100G = Link("Eth-100G", 12.5 * GB, 14e-6)
ETH_50G = Link("Eth-50G", 6.25 * GB, 14e-6)  # e.g. a g4dn.12xlarge T4 node's 50 Gb/s
ETH_40G = Link("Eth-40G", 5 * GB, 14e-6)

LINKS: dict[str, Link] = {link.name.lower(): link for link in
                          (NVLINK_5, NVLINK_4, NVLINK_3, NVLINK_2, XGMI_MI300X, PCIE_5, PCIE_4, PCIE_3, IB_NDR,
                           IB_HDR, IB_EDR,
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
# * H100 0.84 (and H200, the same SMs at the same clocks): the best whole-GEMM rate measured on an H100 SXM,
#   794.5 TFLOP/s bf16 at 2048 x 2048 x 13312 (S. Bekman, Machine Learning Engineering, "Maximum Achievable
#   Matmul FLOPS" table, torch 2.7 + CUDA 12.6; the table gives the H200 the same figure); gemm_time at 0.84
#   gives 791. The H100 PCIe has the same SM design (114 SMs, lower clocks in its peak) and takes it too.
# * B200 0.84: the same table, 1745 TFLOP/s bf16 at 1792 x 16128 x 3072 (gemm_time: 1743).
# * MI300X 0.53: the same table, 668.4 TFLOP/s bf16 at 10240 x 15360 x 8192 with PyTorch's TunableOp
#   (gemm_time with 304 compute units: 673).
# The same table measures an A100 SXM at 271.2 TFLOP/s (1024 x 10240 x 5120), which gemm_time reaches at
# 0.90: the A100's 0.75, set on a 2022 Megatron-LM layer, also holds what the kernels of that time lost.
# The table has no L40S, A10G, L4, A10 or P100 row. Those come from one community benchmark, torch.mm on square
# bf16 matrices of 1024 to 10240 (zzc0721/torch-performance-test-data, test.py; CUDA events over 30 runs after
# warm-up), which reports each precision's best size; its submitted results are the issues cited:
# * L40S 0.78: 269.15 TFLOP/s bf16, the best of the five sizes (issue 43, torch 2.8 + CUDA 12.8; the sizes'
#   own rates are not listed); gemm_time's best of them at 0.78: 268 (at 10240^3).
# * A10G 1.00: 69.47 TFLOP/s bf16 at 10240^3 (issue 126, torch 2.7 + CUDA 12.8; 66.6 at 8192^3, 62.5 at 4096^3);
#   gemm_time at 1.00 gives 69.2 (68.0, 62.2): the A10G reaches the whole of the 70 TFLOP/s it is credited with
#   (a figure from no data sheet), so that peak, not this efficiency, carries the uncertainty.
# * L4 0.51: 59.40 TFLOP/s bf16 at 8192^3 (issue 120, torch 2.9 + CUDA 12.8), taken like the T4's as the sustained
#   rate of a 72 W part: its best size, 2048^3, runs at 70.89 for a few milliseconds; gemm_time at 0.51 gives 59.1.
# * P100 0.45: 8.39 TFLOP/s fp16 on a P100 PCIe, the best of the five sizes (database.md, Kaggle P100, torch 2.6 +
#   CUDA 12.4): 45 % of the PCIe's 18.7 TFLOP/s, the share the SXM2's 21.2 takes as for the V100 (gemm_time at
#   0.45 and 18.7: 8.31 at 8192^3). PyTorch's half GEMM accumulates in fp32, which Pascal runs at its fp32 rate.
# * A10 0.60: a placeholder; no published GEMM rate of an A10 was found (the A10G's above is a different part).
# SM counts from the data sheets / architecture whitepapers (H100 SXM 132, PCIe 114, B200 148, MI300X 304
# compute units, A100 108, V100 80, A10 72, L40S 142, L4 58, T4 40, P100 56); the A10G's 80 is what PyTorch reports
# on g5 instances (no NVIDIA or AWS document gives it).
DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("H100-80GB", 989e12, 81559 * 2**20, 3350 * GB, NVLINK_4, IB_NDR, 0.84, 132, fp8_flops=1979e12),
    Device("H100-PCIe-80GB", 756e12, 80 * GiB, 2000 * GB, PCIE_5, IB_NDR, 0.84, 114, fp8_flops=1513e12),
    Device("H200-141GB", 989e12, 143771 * 2**20, 4800 * GB, NVLINK_4, IB_NDR, 0.84, 132, fp8_flops=1979e12),
    # Meta's Grand Teton H100 (torchtitan's published H100 runs): the SXM part with 96 GB of HBM2e at 2.4 TB/s and
    # a 500 W power limit ("between SXM and NVL", the benchmark file says of its peak). The SXM's data-sheet peaks
    # (torchtitan's MFU takes 989 TFLOP/s for it too), SMs and GEMM efficiency, its tensor clock held at what
    # 500 W gives between the SXM5's and the NVL's data sheets (`hopper_clock_share`: 0.896).
    Device("H100-HBM2e-96GB", 989e12, 96 * GiB, 2400 * GB, NVLINK_4, IB_NDR, 0.84, 132, fp8_flops=1979e12,
           power_limit_w=500.0, sustained_clock=hopper_clock_share(500.0)),
    Device("B200-180GB", 2250e12, 183359 * 2**20, 8000 * GB, NVLINK_5, IB_NDR, 0.84, 148, fp8_flops=4500e12),
    Device("MI300X-192GB", 1307.4e12, 192 * GiB, 5300 * GB, XGMI_MI300X, IB_NDR, 0.53, 304, fp8_flops=2614.9e12),
    Device("L40S-48GB", 362.05e12, 46068 * 2**20, 864 * GB, PCIE_4, ETH_100G, 0.78, 142, fp8_flops=733e12),
    Device("A10G-24GB", 70e12, 23028 * 2**20, 600 * GB, PCIE_4, ETH_40G, 1.00, 80),
    Device("A100-80GB", 312e12, 80 * GiB, 2039 * GB, NVLINK_3, IB_HDR, 0.75, 108),
    Device("A100-40GB", 312e12, 40 * GiB, 1555 * GB, NVLINK_3, IB_HDR, 0.75, 108),
    Device("V100-32GB", 125e12, 32 * GiB, 900 * GB, NVLINK_2, IB_EDR, 0.93, 80),
    Device("V100-16GB", 125e12, 16 * GiB, 900 * GB, NVLINK_2, IB_EDR, 0.93, 80),
    Device("A10", 125e12, 24 * GiB, 600 * GB, PCIE_4, ETH_40G, 0.60, 72),
    Device("L4", 121e12, 24 * GiB, 300 * GB, PCIE_4, ETH_40G, 0.51, 58),
    Device("T4", 65e12, 16 * GiB, 320 * GB, PCIE_3, ETH_50G, 0.38, 40),
    # Tesla P100 SXM2 data sheet: 21.2 TFLOP/s fp16 (no tensor cores), 16 GB HBM2 at 732 GB/s,
    # NVLink 1 four links of 20 GB/s each way; a Metis device type (SamsungLabs/Metis utils.DeviceType).
    Device("P100-16GB", 21.2e12, 16 * GiB, 732 * GB, Link("NVLink1", 80 * GB, 3.4e-6, NVLINK_NCCL_EFFICIENCY),
           ETH_100G, 0.45, 56),
)}

# On-demand list prices per GPU-hour: the instance's hourly price over its GPUs, AWS EC2 On-Demand
# pricing, us-east-1 (aws.amazon.com/ec2/pricing/on-demand): p5.48xlarge 8 x H100 $98.32; p4de.24xlarge
# 8 x A100-80GB $40.9657; p4d.24xlarge 8 x A100-40GB $32.7726; p3dn.24xlarge 8 x V100-32GB $31.212;
# p3.16xlarge 8 x V100-16GB $24.48; g5.12xlarge 4 x A10G $5.672; g6.12xlarge 4 x L4 $4.6016;
# g4dn.12xlarge 4 x T4 $3.912. P100: Google Cloud's on-demand GPU price, $1.46 per GPU-hour. The g5's GPU is the
# A10G, which is priced from it; the A10 (not offered on AWS) takes the same price as its nearest sibling.
# From SkyPilot's price catalog, the same era as the p5's $98.32 (skypilot-org/skypilot-catalog
# catalogs/v7/aws/vms.csv at 001367d, us-east-1; catalogs/v7/lambda/vms.csv at 1158013):
# p5en.48xlarge 8 x H200 $84.80 (the p5e has no on-demand price, only capacity blocks);
# g6e.48xlarge 8 x L40S $30.13118; Lambda gpu_1x_h100_pcie 1 x H100 PCIe $2.49.
# Unpriced (0): the B200 and MI300X, whose on-demand prices (AWS p6-b200, Azure ND MI300X v5) were not in any
# stored catalog we could check, and the H100 HBM2e, Meta's Grand Teton part, which no cloud rents.
PRICES_PER_HOUR = {"H100-80GB": 98.32 / 8, "A100-80GB": 40.9657 / 8, "A100-40GB": 32.7726 / 8,
                   "V100-32GB": 31.212 / 8, "V100-16GB": 24.48 / 8, "A10": 5.672 / 4, "A10G-24GB": 5.672 / 4,
                   "L4": 4.6016 / 4, "T4": 3.912 / 4, "P100-16GB": 1.46, "H200-141GB": 84.80 / 8,
                   "L40S-48GB": 30.13118 / 8, "H100-PCIe-80GB": 2.49}
# The devices without a price are unpriced (0): the planner's cost objective asks for one.
DEVICES = {name: replace(d, price_per_hour=PRICES_PER_HOUR.get(name, 0.0)) for name, d in DEVICES.items()}

_ALIASES = {"h100": "H100-80GB", "a100": "A100-80GB", "v100": "V100-32GB", "p100": "P100-16GB", "h200": "H200-141GB",
            "b200": "B200-180GB", "mi300x": "MI300X-192GB", "l40s": "L40S-48GB", "a10g": "A10G-24GB"}

# Where each device's figures come from (peak per precision, memory, HBM, links, SMs, GEMM efficiency).
_MAMF = "GEMM efficiency: Bekman, ML Engineering, MAMF table (commit 744d01e)"
SOURCES: dict[str, str] = {
    "H100-80GB": "NVIDIA H100 data sheet (SXM5: 989 / 1979 TFLOP/s dense, as torchtitan's get_peak_flops, 3.35 TB/s, NVLink4 900 GB/s both ways); "
                 "nvidia-smi 81559 MiB; DGX H100 SuperPOD reference (ConnectX-7 NDR 400 Gb/s per GPU); " + _MAMF,
    "H100-PCIe-80GB": "NVIDIA H100 data sheet (PCIe: 756 / 1513 TFLOP/s, 2 TB/s HBM2e, PCIe 5 x16; NVLink bridge "
                      "pairs not modelled); memory nominal (nvidia-smi not confirmed); GEMM efficiency: H100 SXM's; "
                      "price: Lambda gpu_1x_h100_pcie $2.49/h (SkyPilot catalog)",
    "H200-141GB": "NVIDIA H200 product page (989 / 1979 TFLOP/s, 4.8 TB/s, NVLink4); nvidia-smi 143771 MiB; "
                  "DGX H200 ConnectX-7 400 Gb/s per GPU; " + _MAMF + " (same as H100); price: AWS p5en.48xlarge "
                  "$84.80/h for 8 (SkyPilot catalog)",
    "H100-HBM2e-96GB": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Grand Teton: H100 96 GB HBM2e "
                       "2.4 TB/s, 500 W limit, RDMA 400 Gb/s per GPU); memory nominal; peaks, SMs, NVLink4 and GEMM "
                       "efficiency the H100 SXM's; tensor clock at 500 W interpolated between the H100 SXM5 (700 W, "
                       "989.4 TFLOP/s) and H100 NVL (400 W, 835.5 TFLOP/s dense) data sheets: 0.896 of the SXM5's; "
                       "unpriced: no cloud rents it",
    "B200-180GB": "NVIDIA DGX B200 data sheet (72 PFLOP/s FP8 sparse for 8 GPUs: 2250 / 4500 dense, 64 TB/s HBM, "
                  "NVLink5 14.4 TB/s for 8); nvidia-smi 183359 MiB; 148 SMs (not on the data sheet); " + _MAMF
                  + "; unpriced: no on-demand price found",
    "MI300X-192GB": "AMD Instinct MI300X specifications (1307.4 / 2614.9 TFLOP/s, 192 GB HBM3 at 5.3 TB/s, 304 CUs, "
                    "7 x 64 GB/s Infinity Fabric links); 400 Gb/s NIC per GPU typical; memory nominal; " + _MAMF
                    + "; unpriced: no on-demand price found",
    "L40S-48GB": "NVIDIA L40S data sheet (362.05 / 733 TFLOP/s, 864 GB/s GDDR6, PCIe 4, 142 SMs); nvidia-smi "
                 "46068 MiB; GEMM efficiency: torch.mm bf16 best of five squares 269.15 TFLOP/s "
                 "(zzc0721/torch-performance-test-data issue 43); price: AWS g6e.48xlarge $30.13118/h for 8",
    "A10G-24GB": "AWS g5 (A10G, no NVIDIA or AWS data sheet): ~70 TFLOP/s bf16 per Baseten's A10 vs A10G "
                 "article, 24 GB GDDR6 at 600 GB/s; nvidia-smi 23028 MiB and 300 W (public g5.xlarge log); 80 SMs "
                 "as PyTorch reports on g5; GEMM efficiency: torch.mm bf16 10240^3 69.47 TFLOP/s "
                 "(zzc0721/torch-performance-test-data issue 126); price: AWS g5.12xlarge",
    "A100-80GB": "NVIDIA A100 data sheet (SXM4: 312 TFLOP/s, 2039 GB/s, NVLink3 600 GB/s both ways); "
                 "GEMM efficiency: Korthikanti et al. 2022 Table 4",
    "A100-40GB": "NVIDIA A100 data sheet (SXM4 40GB: 1555 GB/s); GEMM efficiency: Korthikanti et al. 2022 Table 4",
    "V100-32GB": "NVIDIA V100 data sheet (SXM2: 125 TFLOP/s, 900 GB/s, NVLink2); GEMM efficiency: cuBLAS 8192^3",
    "V100-16GB": "NVIDIA V100 data sheet (SXM2 16GB); GEMM efficiency: cuBLAS 8192^3",
    "A10": "NVIDIA A10 data sheet (125 TFLOP/s, 600 GB/s, PCIe 4); GEMM efficiency: placeholder, no published "
           "measurement found; price: the A10G's",
    "L4": "NVIDIA L4 data sheet (121 TFLOP/s, 300 GB/s, PCIe 4); GEMM efficiency: torch.mm bf16 8192^3 59.40 "
          "TFLOP/s (zzc0721/torch-performance-test-data issue 120)",
    "T4": "NVIDIA T4 data sheet (65 TFLOP/s, 320 GB/s); GEMM efficiency: sustained cuBLAS 4096^3 at 70 W",
    "P100-16GB": "NVIDIA P100 SXM2 data sheet (21.2 TFLOP/s fp16, 732 GB/s, NVLink1); GEMM efficiency: torch.mm "
                 "fp16 best of five squares 8.39 TFLOP/s on a P100 PCIe (zzc0721/torch-performance-test-data)",
}


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

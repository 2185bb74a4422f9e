"""The catalog's GEMM efficiencies, each set from one published GEMM rate (dist_lib/hardware/devices.py cites
them): the `max_efficiency`, in two decimals, at which costs.gemm_time reproduces the measured rate.

    python benchmarks/fidelity.py --calibrate   # prints these with the other calibrated constants
"""

from __future__ import annotations

from dataclasses import replace

from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES, Device

# zzc0721/torch-performance-test-data's test.py times torch.mm on these square sizes and reports the best rate
SQUARES = (1024, 2048, 4096, 8192, 10240)
_CANDIDATES = [round(0.2 + i / 100, 2) for i in range(81)]


def calibrate_gemm(device: Device, size: int | tuple[int, int, int], achieved_flops: float,
                   clock_peak: float | None = None) -> float:
    """The `max_efficiency` (two decimals) at which a size^3 (or M x N x K) GEMM runs at `achieved_flops`, on a
    device whose peak at the measured clock is `clock_peak` (the catalog's if None)."""
    device = replace(device, peak_flops=clock_peak or device.peak_flops)
    m, n, k = (size, size, size) if isinstance(size, int) else size
    target = 2 * m * n * k / achieved_flops
    return min(_CANDIDATES, key=lambda e: abs(costs.gemm_time(replace(device, max_efficiency=e), m, n, k) - target))


def calibrate_gemm_best(device: Device, sizes: tuple[int, ...], achieved_flops: float,
                        clock_peak: float | None = None) -> float:
    """The `max_efficiency` (two decimals) at which the fastest of the square GEMMs `sizes`^3 runs at
    `achieved_flops`: for a benchmark that reports only its best rate over a list of square sizes."""
    device = replace(device, peak_flops=clock_peak or device.peak_flops)

    def best(e: float) -> float:
        return max(2 * s**3 / costs.gemm_time(replace(device, max_efficiency=e), s, s, s) for s in sizes)
    return min(_CANDIDATES, key=lambda e: abs(best(e) - achieved_flops))


def gemm_efficiencies() -> dict[str, float]:
    """Every GEMM efficiency set from a published GEMM rate (the A100's comes from a whole layer instead:
    fidelity.calibrate_a100)."""
    return {"V100 max_efficiency": calibrate_gemm(DEVICES["V100-16GB"], 8192, 101e12, clock_peak=112e12),
            "T4 max_efficiency": calibrate_gemm(DEVICES["T4"], 4096, 24e12),
            # best whole-GEMM bf16 rates (S. Bekman, Machine Learning Engineering, MAMF table)
            "H100 (and H200) max_efficiency": calibrate_gemm(DEVICES["H100-80GB"], (2048, 2048, 13312), 794.5e12),
            "B200 max_efficiency": calibrate_gemm(DEVICES["B200-180GB"], (1792, 16128, 3072), 1745e12),
            "MI300X max_efficiency": calibrate_gemm(DEVICES["MI300X-192GB"], (10240, 15360, 8192), 668.4e12),
            # torch.mm bf16 (fp16 for the P100) rates from zzc0721/torch-performance-test-data (issues 43, 120,
            # 126; database.md's P100 row): the best of SQUARES, or one size where the issue lists each
            "L40S max_efficiency": calibrate_gemm_best(DEVICES["L40S-48GB"], SQUARES, 269.15e12),
            "A10G max_efficiency": calibrate_gemm(DEVICES["A10G-24GB"], 10240, 69.47e12),
            "L4 max_efficiency": calibrate_gemm(DEVICES["L4"], 8192, 59.40e12),
            "P100 max_efficiency": calibrate_gemm_best(DEVICES["P100-16GB"], SQUARES, 8.39e12, clock_peak=18.7e12)}

"""The catalog's figures are the cited sources' numbers (dist_lib/hardware/devices.py, SOURCES), and each GEMM
efficiency reproduces the measurement it was set from."""

from __future__ import annotations

import pytest

from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES, GB, SOURCES, get_device

MiB = 2**20

# name: (bf16 TFLOP/s, fp8 TFLOP/s, memory MiB as nvidia-smi reports it, HBM GB/s, intra-node GB/s each way)
CITED = {
    "H100-80GB": (989, 1979, 81559, 3350, 450),  # H100 SXM5 data sheet; nvidia-smi "81559MiB"
    "H200-141GB": (989, 1979, 143771, 4800, 450),  # H200 product page; nvidia-smi "143771MiB"
    "B200-180GB": (2250, 4500, 183359, 8000, 900),  # DGX B200 data sheet / 8; nvidia-smi "183359MiB"
    "MI300X-192GB": (1307.4, 2614.9, 192 * 1024, 5300, 448),  # AMD MI300X specifications: 7 x 64 GB/s
    "L40S-48GB": (362.05, 733, 46068, 864, 25),  # L40S data sheet; nvidia-smi "46068MiB"; PCIe4 as the A10's
    "H100-PCIe-80GB": (756, 1513, 80 * 1024, 2000, 50),  # H100 PCIe data sheet
    "H100-HBM2e-96GB": (989, 1979, 96 * 1024, 2400, 450),  # torchtitan's Grand Teton H100 (SXM peaks kept)
}


@pytest.mark.parametrize("name", CITED)
def test_device_figures_are_their_sources(name):
    bf16, fp8, mib, hbm, intra = CITED[name]
    d = DEVICES[name]
    assert (d.peak_flops, d.fp8_flops) == (bf16 * 1e12, fp8 * 1e12)
    assert d.memory_bytes == mib * MiB
    assert (d.hbm_bandwidth, d.intra_link.bandwidth) == (hbm * GB, intra * GB)
    assert name in SOURCES


# Bekman, Machine Learning Engineering, "Maximum Achievable Matmul FLOPS" table: best bf16 TFLOP/s and its shape
MAMF = {"H100-80GB": (794.5, (2048, 2048, 13312)), "H200-141GB": (794.5, (2048, 2048, 13312)),
        "B200-180GB": (1745.0, (1792, 16128, 3072)), "MI300X-192GB": (668.4, (10240, 15360, 8192))}


@pytest.mark.parametrize("name", MAMF)
def test_gemm_efficiency_reproduces_the_measured_gemm(name):
    measured, (m, n, k) = MAMF[name]
    modelled = 2 * m * n * k / costs.gemm_time(DEVICES[name], m, n, k) / 1e12
    assert modelled == pytest.approx(measured, rel=0.01)


def test_short_names_of_the_new_devices():
    assert get_device("b200").name == "B200-180GB" and get_device("MI300X").name == "MI300X-192GB"

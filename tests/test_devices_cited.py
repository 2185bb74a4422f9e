"""The catalog's figures are the cited sources' numbers (dist_lib/hardware/devices.py, SOURCES), and each GEMM
efficiency reproduces the measurement it was set from."""

from __future__ import annotations

from dataclasses import replace

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


# zzc0721/torch-performance-test-data (torch.mm on squares of 1024 to 10240, best size reported): device, the
# measured TFLOP/s, the sizes whose best it is, and the peak of the part measured when it is not the catalog's
SQUARES = (1024, 2048, 4096, 8192, 10240)
TORCH_MM = {"L40S-48GB": (269.15, SQUARES, None),  # issue 43, bf16, best of the five
            "A10G-24GB": (69.47, (10240,), None),  # issue 126, bf16
            "L4": (59.40, (8192,), None),  # issue 120, bf16, the sustained size of a 72 W part
            "P100-16GB": (8.39, SQUARES, 18.7)}  # database.md, fp16 on a P100 PCIe (18.7 TFLOP/s)


@pytest.mark.parametrize("name", TORCH_MM)
def test_gemm_efficiency_reproduces_the_community_torch_mm_rate(name):
    measured, sizes, peak = TORCH_MM[name]
    device = DEVICES[name] if peak is None else replace(DEVICES[name], peak_flops=peak * 1e12)
    modelled = max(2 * s**3 / costs.gemm_time(device, s, s, s) / 1e12 for s in sizes)
    # the efficiency has two decimals: the rate is reproduced within half a step of it
    assert modelled == pytest.approx(measured, rel=0.005 / device.max_efficiency)


def test_the_a10g_figures_are_what_g5_instances_report():
    a10g = DEVICES["A10G-24GB"]
    assert (a10g.memory_bytes, a10g.sms) == (23028 * MiB, 80)  # nvidia-smi "23028MiB"; PyTorch's 80 SMs


# per-GPU on-demand prices: the instance's hourly price over its GPUs (devices.py, PRICES_PER_HOUR)
PRICES = {"H200-141GB": 84.80 / 8,  # AWS p5en.48xlarge, 8 x H200
          "L40S-48GB": 30.13118 / 8,  # AWS g6e.48xlarge, 8 x L40S
          "H100-PCIe-80GB": 2.49}  # Lambda gpu_1x_h100_pcie


@pytest.mark.parametrize("name", PRICES)
def test_the_new_prices_are_the_cited_instances(name):
    assert DEVICES[name].price_per_hour == pytest.approx(PRICES[name])


def test_short_names_of_the_new_devices():
    assert get_device("b200").name == "B200-180GB" and get_device("MI300X").name == "MI300X-192GB"


def test_hopper_clock_share_lies_between_the_two_data_sheets():
    """The SXM5 at 700 W and the NVL at 400 W give their own data-sheet peaks (989.4 and 835.5 TFLOP/s, the same
    132 SMs); 500 W is a third of the way up: (835.5 + 153.9 / 3) / 989.4 = 0.8963."""
    from dist_lib.hardware.devices import hopper_clock_share
    assert hopper_clock_share(700) == 1.0 and hopper_clock_share(1000) == 1.0
    assert hopper_clock_share(400) * 989.4 == pytest.approx(835.5)
    assert hopper_clock_share(500) == pytest.approx((835.5 + (989.4 - 835.5) / 3) / 989.4)
    assert hopper_clock_share(500) == pytest.approx(0.8963, abs=1e-4)
    with pytest.raises(Exception, match="below the 400 W"):
        hopper_clock_share(300)


def test_the_500_w_grand_teton_h100_runs_tensor_core_work_at_its_capped_clock():
    """Its power limit scales what the tensor cores do, not what HBM moves, and not the MFU denominator."""
    capped, sxm = DEVICES["H100-HBM2e-96GB"], DEVICES["H100-80GB"]
    assert capped.power_limit_w == 500 and capped.peak_flops == sxm.peak_flops
    flops = 1e15
    assert costs.compute_time(capped, flops, 0.0) == pytest.approx(flops / (989e12 * 0.8963 * 0.84), rel=1e-4)
    assert costs.compute_time(capped, 0.0, 2.4e12) == pytest.approx(1.0)  # 2.4 TB at 2.4 TB/s: untouched
    # a compute-bound GEMM's tile math slows by the clock share; the same part at full clock is the SXM's
    full = replace(capped, sustained_clock=1.0)
    m = n = k = 8192
    ratio = costs.gemm_time(capped, m, n, k) / costs.gemm_time(full, m, n, k)
    assert 1 < ratio < 1 / 0.8963 + 1e-9
    with pytest.raises(Exception, match="sustained_clock"):
        replace(sxm, sustained_clock=0.0)

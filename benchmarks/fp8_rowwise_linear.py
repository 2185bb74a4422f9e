"""torchao's rowwise Float8 linear layer against torchao's own microbenchmark of it: a check of `costs.fp8`'s
rowwise recipe on shapes alone, with nothing set from it.

    python benchmarks/fp8_rowwise_linear.py

The published figures: torchao/float8/README.md, "Performance", "Rowwise scaling": the speedup over bf16 of a
compiled LayerNorm -> Linear -> Sigmoid, forward and backward, by the forward's M, K, N, on an H100 (the image
docs/static/fp8-rowwise-perf.png, pytorch/ao 6243040, PyTorch 2.8.0a0), read from the image for the cells below.
The variant of H100 is not stated: the catalog's H100-80GB (SXM) is taken.

Predicted, from the same kernels `dist_lib.costs` charges a layer: the three GEMMs (forward M x N x K, input
gradient M x K x N, weight gradient K x N x M) at the bf16 or the FP8 peak (`costs.compute.gemm_time`), the rowwise
casts (`costs.fp8.shapes_cast_bytes`) at HBM bandwidth, and, the same in both, the fused LayerNorm (4 bytes an
element of x forward, 6 backward) and sigmoid (4 and 6 of the output), as `architecture.elementwise_bytes_per_token`
counts a norm and an activation. `ratio` is predicted over published: above 1, the model makes the rowwise linear
faster than torchao measured it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dist_lib.costs import compute as costs  # noqa: E402
from dist_lib.costs import fp8 as fp8_costs  # noqa: E402
from dist_lib.hardware.devices import DEVICES, Device  # noqa: E402

DEVICE = "H100-80GB"
# (M, K, N): the published speedup of the rowwise linear over bf16 (torchao's image, read by eye)
PUBLISHED = {
    (4096, 4096, 1024): 0.44, (4096, 4096, 4096): 0.84, (4096, 4096, 16384): 1.01,
    (8192, 8192, 8192): 1.20, (8192, 8192, 32768): 1.41,
    (16384, 4096, 1024): 0.57, (16384, 4096, 4096): 1.02, (16384, 4096, 16384): 1.26,
    (16384, 8192, 8192): 1.33, (16384, 16384, 16384): 1.42,
    (32768, 16384, 16384): 1.49, (32768, 32768, 32768): 1.52,
}


def linear_times(device: Device, m: int, k: int, n: int, recipe: str) -> tuple[float, float]:
    """(bf16, FP8) seconds of the benchmark's forward and backward: LayerNorm, the linear's three GEMMs (and in
    FP8 its casts), sigmoid."""
    shapes = {"forward": (m, n, k), "input": (m, k, n), "weight": (k, n, m)}
    fast = fp8_costs.fp8_device(device)
    bf16 = sum(costs.gemm_time(device, *s) for s in shapes.values())
    fp8 = sum(costs.gemm_time(fast, *s) for s in shapes.values()) + sum(
        fp8_costs.shapes_cast_bytes([(m, n, k)], pass_, recipe) for pass_ in shapes) / device.hbm_bandwidth
    elementwise = ((4 + 6) * m * k + (4 + 6) * m * n) / device.hbm_bandwidth
    return bf16 + elementwise, fp8 + elementwise


def main() -> None:
    device = DEVICES[DEVICE]
    print(f"torchao's rowwise Float8 linear (LayerNorm -> Linear -> Sigmoid, fwd + bwd) on {DEVICE}: speedup over bf16")
    print(f"{'M':>6} {'K':>6} {'N':>6} {'published':>9} {'predicted':>9} {'ratio':>6}")
    ratios = []
    for (m, k, n), published in PUBLISHED.items():
        bf16, fp8 = linear_times(device, m, k, n, "rowwise")
        ratios.append(bf16 / fp8 / published)
        print(f"{m:>6} {k:>6} {n:>6} {published:>9.2f} {bf16 / fp8:>9.2f} {ratios[-1]:>6.2f}")
    print(f"predicted / published: {min(ratios):.2f} to {max(ratios):.2f} over {len(ratios)} shapes")


if __name__ == "__main__":
    main()

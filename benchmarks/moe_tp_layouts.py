"""Mixtral 8x7B (all 32 layers) on H100 nodes under hybrid with tensor parallelism beside the experts: step
time, MFU, the fullest GPU's peak memory and whether it fits the GPU (the catalog's 85.5 GB, before the
runtime reserve of the CUDA context and NCCL buffers), for a few layouts. Megatron-Core's way: TP with
sequence parallelism, expert TP `etp`, the distributed optimizer sharding the experts' state over the
expert-data-parallel group, FP8 and recompute. Run: `python benchmarks/moe_tp_layouts.py`."""

from __future__ import annotations

import sys

from dist_lib import simulate
from dist_lib.hardware.devices import get_device

SP = dict(sequence_parallel=True)
DO = dict(distributed_optimizer=True)
LAYOUTS = [  # (cluster, global batch, options)
    ("2x8xH100-80GB", 16, dict(tp=1, ep=8, pp=2)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO, fp8="delayed")),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO, selective_recompute=True)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO, selective_recompute=True, fp8="delayed")),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO, recompute=True)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=4, pp=2, **SP, **DO, selective_recompute=True)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=4, etp=1, **SP, **DO)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=4, etp=1, **SP, **DO, fp8="delayed")),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=4, etp=1, **SP, **DO, selective_recompute=True)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=4, etp=1, **SP, **DO, selective_recompute=True, fp8="delayed")),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO, selective_recompute=True)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=4, pp=4, **SP, **DO, selective_recompute=True)),
]


def main() -> None:
    capacity = get_device("H100-80GB").memory_bytes
    print(f"{'cluster':14} {'batch':>5}  {'options':96} {'step':>9} {'MFU':>6} {'peak':>9}  fits  correct")
    for cluster, batch, options in LAYOUTS:
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        r = simulate("strategies/hybrid.py", cluster, "mixtral-8x7b", batch, enforce_memory=False, **options)
        peak = max(r.memory_bytes)
        print(f"{cluster:14} {batch:>5}  {shown:96} {r.time_s * 1e3:7.1f}ms {r.mfu * 100:5.1f}% "
              f"{peak / 2**30:6.1f}GiB  {'yes' if peak <= capacity else 'no ':4}  {r.correct}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

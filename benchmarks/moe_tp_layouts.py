"""Mixtral 8x7B (all 32 layers) on H100 nodes under hybrid with tensor parallelism beside the experts: step
time, the fullest GPU's peak memory and whether it fits 80 GB, for a few layouts (tp, ep, pp; expert TP 1,
sequence parallelism on, as Megatron-Core runs MoE with TP). Run: `python benchmarks/moe_tp_layouts.py`."""

from __future__ import annotations

import sys

from dist_lib import simulate

SP = dict(sequence_parallel=True)
DO = dict(distributed_optimizer=True)
LAYOUTS = [  # (cluster, global batch, options)
    ("2x8xH100-80GB", 16, dict(tp=1, ep=8, pp=2)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO, fp8="delayed")),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO, recompute=True)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=4, pp=2, etp=2, **SP, **DO)),
    ("2x8xH100-80GB", 16, dict(tp=2, ep=4, pp=4, etp=1, **SP, **DO)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=4, etp=1, **SP)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=4, etp=1, **SP, **DO)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=4, etp=1, **SP, **DO, fp8="delayed")),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=8, pp=2, etp=1, **SP, **DO)),
    ("4x8xH100-80GB", 32, dict(tp=2, ep=4, pp=4, etp=2, **SP, **DO)),
    ("4x8xH100-80GB", 32, dict(tp=1, ep=8, pp=4, **DO)),
]


def main() -> None:
    print(f"{'cluster':15} {'batch':>5}  {'options':100} {'step':>10} {'peak GiB':>9}  fits  correct")
    for cluster, batch, options in LAYOUTS:
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        r = simulate("strategies/hybrid.py", cluster, "mixtral-8x7b", batch, enforce_memory=False, **options)
        peak = max(r.memory_bytes) / 2**30
        print(f"{cluster:15} {batch:>5}  {shown:100} {r.time_s * 1e3:8.1f}ms {peak:9.1f}  {'yes' if peak <= 80 * 1e9 / 2**30 else 'no ':4}"
              f"  {r.correct}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

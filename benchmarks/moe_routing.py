"""The two routing tables of docs/explanation/moe.md: Mixtral 8x7B's first 2 layers under `strategies/moe.py`
on two 8-GPU A100 nodes (uniform, Zipf-skewed and padded-to-capacity routing), and its first 8 layers under
`strategies/hybrid.py` with two pipeline stages on two 8-GPU H100 nodes: step time, the fullest GPU's peak
memory (and MFU for hybrid). Run: `python benchmarks/moe_routing.py`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dist_lib import simulate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MOE = [("uniform", ""), ("zipf:1.2", ",routing=zipf:1.2"), ("uniform, capacity_factor=2", ",capacity_factor=2")]
HYBRID = [("uniform", ""), ("zipf:1.2", ",routing=zipf:1.2")]


def main() -> None:
    print("strategies/moe.py, 2x8xA100-80GB, mixtral-8x7b:layers=2, global batch 16, ep=8")
    for label, extra in MOE:
        r = simulate(str(ROOT / "strategies" / "moe.py"), "2x8xA100-80GB", "mixtral-8x7b:layers=2" + extra, 16, ep=8)
        print(f"  {label:28} {r.time_s * 1e3:7.1f} ms {max(r.memory_bytes) / 2**30:6.2f} GiB  correct {r.correct}")
    print("strategies/hybrid.py, 2x8xH100-80GB, mixtral-8x7b:layers=8, global batch 16, pp=2, ep=8")
    for label, extra in HYBRID:
        r = simulate(str(ROOT / "strategies" / "hybrid.py"), "2x8xH100-80GB", "mixtral-8x7b:layers=8" + extra, 16,
                     pp=2, ep=8)
        print(f"  {label:28} {r.time_s * 1e3:7.1f} ms {max(r.memory_bytes) / 2**30:6.2f} GiB "
              f"{r.mfu * 100:5.1f} % MFU  correct {r.correct}")


if __name__ == "__main__":
    main()

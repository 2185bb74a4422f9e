"""The MoE token dispatchers of hybrid's `moe_dispatcher` side by side: Megatron-Core's flat `alltoall` and the
hierarchical dispatch of its flex dispatcher (DeepEP / HybridEP: each token sent once to each other node holding
its experts, forwarded there over NVLink; DeepSeek-AI 2024, arXiv 2412.19437 sec. 3.2.2), on EP groups that
span two nodes. Prints each configuration's step, its MFU and one exchange's time (rank 0's first dispatch).

    python benchmarks/moe_dispatchers.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dist_lib import simulate  # noqa: E402

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
# (cluster, workload, global batch, hybrid's options)
CASES = (
    ("2x4xH100-80GB", "mixtral-8x7b:layers=2", 8, dict(pp=1, ep=8)),
    ("2x8xH100-80GB", "deepseek-v3:layers=4", 16, dict(pp=1, ep=16)),
)


def main() -> None:
    print(f"{'cluster':>14} {'workload':>22} {'EP':>3} {'dispatcher':>10} {'step':>10} {'MFU':>6} {'dispatch':>10}")
    for cluster, workload, batch, options in CASES:
        for dispatcher in ("alltoall", "deepep"):
            r = simulate(HYBRID, cluster, workload, batch, moe_dispatcher=dispatcher, enforce_memory=False,
                         **options)
            assert r.correct, r.problems
            first = next(e for e in r.events if e.op == "all_to_all" and e.rank == 0)
            print(f"{cluster:>14} {workload:>22} {options['ep']:>3} {dispatcher:>10} {r.time_s * 1e3:>7.1f} ms "
                  f"{r.mfu * 100:>5.1f}% {(first.end - first.start) * 1e3:>7.3f} ms")


if __name__ == "__main__":
    main()

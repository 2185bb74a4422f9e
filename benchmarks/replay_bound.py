"""What a forged program costs the grader: tests/cheats/replay_amplifier.py graded with a forged program of
MIB MiB under an address-space limit of GIB GiB; prints the row's status and the max RSS of the grading
process and of its children (the sandboxed run and the bounded replay).

    python benchmarks/replay_bound.py MIB GIB
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grader.grade import grade_one  # noqa: E402
from grader.scenario import Scenario  # noqa: E402


def main(mib: int, gib: float) -> None:
    scenario = Scenario(cluster="2xA100-80GB", workload="toy:layers=4", global_batch=8,
                        strategy_options={"replay_amplifier": {"mib": mib}})
    row = grade_one(str(ROOT / "tests" / "cheats" / "replay_amplifier.py"), scenario.to_dict(),
                    {"timeout_s": 120, "address_space_bytes": int(gib * 2**30)}, None, plots=False)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"program {mib} MiB, limit {gib:g} GiB: {row['status']}; grading process {own:.0f} MiB max RSS, "
          f"largest child {children:.0f} MiB")


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))

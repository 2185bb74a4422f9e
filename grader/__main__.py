"""`python -m grader`: for now, the reference DDP strategy on the default scenario."""

from __future__ import annotations

import sys
from pathlib import Path

from dist_lib import SimulationError, simulate
from dist_lib.simulator import DEFAULT_CLUSTER, DEFAULT_GLOBAL_BATCH, DEFAULT_WORKLOAD


def main() -> int:
    try:
        result = simulate("strategies.ddp", DEFAULT_CLUSTER, DEFAULT_WORKLOAD, DEFAULT_GLOBAL_BATCH,
                          microbatch_size=2)
    except SimulationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(result.summary())
    trace = result.write_chrome_trace(Path("traces") / "ddp.json")
    print(f"trace         {trace} (open in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

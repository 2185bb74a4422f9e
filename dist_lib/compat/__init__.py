"""Run strategy files written for the LLM-Training-Puzzles and course-lab APIs on this simulator.

* `dist_lib.compat.puzzles`: the puzzles' `lib.py` API (unit costs by default, or real costs);
* `dist_lib.compat.lab`: the course lab's `lib.py` + `utils.py` API (real costs on a cluster);
* `run_file(path, api=None, function=None, ...)`: load such a file unchanged (its `from lib import ...`
  resolves to the compatible module), run it and return a dist_lib `Result`;
* `configure(api, timing=..., cluster=..., workload=...)`: settings for `Dist` objects created inside.
"""

from __future__ import annotations

from ._runtime import CompatAssertionError, CompatDeadlockError, Settings
from ._runtime import configure as _configure


def configure(api: str, **settings):
    """Context manager: `Dist` objects of `api` ('puzzles' or 'lab') created inside use these settings
    (timing='unit'|'real', cluster=spec or Cluster, workload=spec or Workload, default_device=name)."""
    return _configure(api, **settings)


from .loader import api_modules, detect_api, run_file  # noqa: E402

__all__ = ["CompatAssertionError", "CompatDeadlockError", "Settings", "api_modules", "configure", "detect_api",
           "run_file"]

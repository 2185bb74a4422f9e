"""Run strategy files written for the LLM-Training-Puzzles and course-lab APIs on this simulator.

* `dist_lib.compat.puzzles`: the puzzles' `lib.py` API; `dist_lib.compat.drawing` their `drawing.py`;
* `dist_lib.compat.lab` and `dist_lib.compat.lab_utils`: the course lab's `lib.py` and `utils.py`;
* `run_file(path, api=None, function=None, ...)`: load such a file unchanged (its `from lib import ...`
  resolves to the compatible module), run it (or its own `main()`) and return a `ToyResult`;
* `configure(api, timing=..., cluster=..., workload=..., strict=...)`: settings for `Dist` objects
  created inside. Timing is the original library's cost model by default ('original'), or this
  simulator's device costs on any cluster ('real').
"""

from __future__ import annotations

from dist_lib.compat._runtime import CompatAssertionError, CompatDeadlockError, Settings
from dist_lib.compat._runtime import configure as _configure


def configure(api: str, **settings):
    """Context manager: `Dist` objects of `api` ('puzzles' or 'lab') created inside use these settings
    (timing='original'|'real', cluster=spec or Cluster, workload=spec or Workload, default_device=name,
    strict=bool)."""
    return _configure(api, **settings)


from dist_lib.compat._base import ToyResult  # noqa: E402
from dist_lib.compat._tensor_rules import CompatStrictWarning  # noqa: E402
from dist_lib.compat.loader import api_modules, detect_api, run_file  # noqa: E402

__all__ = ["CompatAssertionError", "CompatDeadlockError", "CompatStrictWarning", "Settings", "ToyResult",
           "api_modules", "configure", "detect_api", "run_file"]

"""A reduced run of benchmarks/fidelity.py: the 22B rows of Korthikanti et al. 2022, Table 5."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "fidelity.py"
_spec = importlib.util.spec_from_file_location("fidelity", _PATH)
fidelity = importlib.util.module_from_spec(_spec)
sys.modules["fidelity"] = fidelity  # dataclasses look their module up by name
_spec.loader.exec_module(fidelity)


def test_22b_iteration_times_within_eleven_percent_of_table_5():
    row = next(r for r in fidelity.TABLE5 if r.name == "22B")
    for selective, measured in ((False, row.full_recompute_s), (True, row.selective_sp_s)):
        predicted = fidelity.simulate_row(row, selective)["time"]
        assert abs(predicted / measured - 1) < 0.11

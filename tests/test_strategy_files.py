"""A strategy file imports as `python FILE` would: the `_*.py` helpers beside it import by name, each
file's own, and nothing of its folder stays importable afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dist_lib import simulate
from dist_lib.errors import StrategyError

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ("4xA100-80GB", "toy:layers=4", 16)


def _submission(folder: Path, helper: str) -> Path:
    """A file whose whole strategy is in `_helpers.py` beside it, which re-exports `helper`'s train."""
    folder.mkdir()
    (folder / "_helpers.py").write_text(f"from {helper} import train  # noqa: F401\n")
    (folder / "mine.py").write_text("from _helpers import train  # noqa: F401\n")
    return folder / "mine.py"


def test_each_file_imports_its_own_helpers_by_name(tmp_path):
    ddp = _submission(tmp_path / "a", "strategies.ddp")
    zero = _submission(tmp_path / "b", "strategies.zero")  # the same helper name, another strategy
    for mine, bundled in ((ddp, "strategies/ddp.py"), (zero, "strategies/zero.py"), (ddp, "strategies/ddp.py")):
        got, want = simulate(mine, *SCENARIO), simulate(ROOT / bundled, *SCENARIO)
        assert (got.time_s, got.peak_memory_bytes) == (want.time_s, want.peak_memory_bytes)
    assert simulate(ddp, *SCENARIO).time_s != simulate(zero, *SCENARIO).time_s
    assert str(tmp_path / "a") not in sys.path and "_helpers" not in sys.modules


def test_a_relative_import_in_a_file_on_its_own_says_what_to_write(tmp_path):
    """The bundled strategies are a package and import their helpers relatively; a copy of one cannot."""
    copy = tmp_path / "ddp.py"
    copy.write_text((ROOT / "strategies" / "ddp.py").read_text())
    with pytest.raises(StrategyError) as caught:
        simulate(copy, *SCENARIO)
    assert str(caught.value) == (
        f"strategy file {copy}: importing it raised ImportError: attempted relative import with no known "
        f"parent package (at ddp.py:17 in <module>) (a strategy file on its own is not in a package: import a "
        f"helper beside it by name, `from _layout import ...`, or a bundled one from its package, "
        f"`from strategies._layout import ...`)")
    (tmp_path / "_layout.py").write_text((ROOT / "strategies" / "_layout.py").read_text())
    copy.write_text(copy.read_text().replace("from ._layout import", "from _layout import"))
    assert simulate(copy, *SCENARIO).time_s == simulate(ROOT / "strategies" / "ddp.py", *SCENARIO).time_s


def test_the_grader_runs_a_submission_with_its_helpers_imported_by_name(tmp_path):
    """In a run (sandboxed where the sandbox works) the copy's folder holds the file and its helpers."""
    from grader.runner import run_isolated, sandbox_problem
    from grader.scenario import Scenario
    mine = _submission(tmp_path / "a", "strategies.ddp")
    outcome = run_isolated(mine, Scenario(cluster=SCENARIO[0], workload=SCENARIO[1], global_batch=SCENARIO[2]),
                           confine=sandbox_problem() is None)
    assert outcome.status == "ok", outcome.message
    assert len(outcome.programs) == 4

"""The `--api` cheats in tests/cheats (compat_*.py), graded as a course grades them (`grade_run`, the path
of `python -m grader run FILE --api puzzles`): each gets the figures of the honest step it did, which
are the original library's for the same work (tests/compat_oracle/), never smaller."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_lib.compat import run_file
from grader.grade import grade_run
from grader.runner import sandbox_problem
from grader.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = Scenario(name="run", cluster="2xA100-80GB", workload="toy", global_batch=8, options={}, given=())
# puzzle 0 on its own set-up (1 rank, 2 layers, 4 batches), by hand: forward and backward take 4 steps
# each per layer, the loss 0 and an update 0.5, so the last update starts at 16.5 (the notebook's step);
# the peak is at the loss: three activations of four batches (3 x 4 x 512 x 256) beside two layers'
# weights and optimizer states (4 x 512 x 512), 2,621,440 units
HONEST = (16.5, 2621440.0)


@pytest.mark.parametrize("cheat", ["compat_grown_tensor", "compat_dict_setitem", "compat_empty_log"])
def test_a_compat_cheat_is_graded_on_the_work_it_did(tmp_path, cheat):
    row, result = grade_run(str(ROOT / "tests" / "cheats" / f"{cheat}.py"), SCENARIO.to_dict(), {"timeout_s": 60},
                            str(tmp_path / "t.json"), plots=False, api="puzzles", function="basic",
                            confine=sandbox_problem() is None)
    assert row["status"] == "ok", row["error"]
    figures = result.options["notebook"]
    assert (figures["time"], figures["memory"], result.correct) == (*HONEST, True)


def test_the_honest_twin_has_those_figures():
    result = run_file(ROOT / "tests" / "compat_solutions" / "puzzles_solutions.py", api="puzzles", function="basic")
    assert (result.notebook_time, result.notebook_memory) == HONEST


@pytest.mark.parametrize("exact", [False, True])
def test_a_value_stored_past_the_dicts_methods_is_summed_from_then_on(exact):
    """A value put with `dict.__setitem__` and then replaced or deleted through the dict's methods is one
    the running total never counted: the model then sums its storage at each event, as the originals."""
    from dist_lib.compat import api_modules, configure
    with api_modules("puzzles") as lib, configure("puzzles", exact_memory=exact or None):
        model = lib.Model(rank=0, dist=lib.Dist(1), layers=2, batches=4)
        weights = model.weights
        dict.__setitem__(weights, 0, model.load_weights(0)[0])
        weights[0] = model.load_weights(0)[0]  # replaces a value the total never counted
        weights[1] = model.load_weights(1)[0]
        assert model.memory() == 2 * 512 * 512
        del weights[0]
        assert model.memory() == 512 * 512

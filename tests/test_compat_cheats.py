"""The `--api` cheats in tests/cheats (compat_*.py), graded as a course grades them (`grade_run`, the path
of `python -m grader run FILE --api puzzles`): the grader re-executes the calls each made, so each gets
the figures of the step it did, which are the original library's for the same work (tests/compat_oracle/),
never smaller, whatever it patched; a forged program is refused."""

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
    assert result.options["verified"] is True


def _graded(tmp_path, cheat):
    return grade_run(str(ROOT / "tests" / "cheats" / f"{cheat}.py"), SCENARIO.to_dict(), {"timeout_s": 60},
                     str(tmp_path / "t.json"), plots=False, api="puzzles", function="basic",
                     confine=sandbox_problem() is None)


def test_a_cheat_that_patches_the_check_and_the_memory_sum_is_graded_on_its_calls(tmp_path):
    """compat_patched_check never updates layer 1 and patches, in its own process, the loader's check and
    the models' memory sum. Run directly (as the worker once reported it) it passes with 0 units; graded,
    its calls replayed on an unpatched runtime are an incorrect step with the honest peak. By hand: the
    forward and backward passes take 4 + 4 + 0 + 4 + 4 = 16 steps, so the one update starts at 16."""
    from dist_lib.compat import _base, loader, puzzles
    patched = [(loader, "problems"), (_base.ToyModel, "memory"), (_base.ToyModel, "_summed"), (puzzles.Model, "check")]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in patched]
    try:  # (in this process, which the grader's replay below shares: its patches are undone after)
        fooled = run_file(ROOT / "tests" / "cheats" / "compat_patched_check.py", api="puzzles", function="basic",
                          check=False, exact_memory=True)
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
    assert (fooled.correct, fooled.notebook_memory) == (True, 0)
    row, result = _graded(tmp_path, "compat_patched_check")
    assert row["status"] == "incorrect" and result.options["verified"] is True
    assert row["problems"] == ["layer 1: rank 0's final weight is at step 0, not 1"]
    figures = result.options["notebook"]
    assert (figures["time"], figures["memory"]) == (16.0, HONEST[1])


def test_a_forged_program_with_a_handle_used_before_it_is_defined_is_refused(tmp_path):
    row, result = _graded(tmp_path, "compat_forged_program")
    assert (row["status"], result) == ("invalid", None)
    assert row["error"] == ("the recorded program is malformed: rank 0, entry 0 (forward): handle 0 is used before "
                            "it is defined")


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

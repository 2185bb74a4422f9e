"""Every solution file in tests/compat_solutions/, run on a reimplementation of the ORIGINAL puzzles and
lab libraries (tests/compat_oracle/) and through dist_lib.compat, must give the same verdict (correct,
incorrect, assertion, hang), the same event logs (op, layer, start, duration, memory, samples on every
rank), the same notebook figures (steps / execution time, peak memory) and the same lab MFU."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from dist_lib import DeadlockError, StrategyError
from dist_lib.compat import api_modules, run_file
from dist_lib.compat.loader import modules_as
from tests.compat_oracle import _common as _hang, lab_lib, lab_utils, puzzles_lib

SOLUTIONS = Path(__file__).parent / "compat_solutions"

# (file, function, ranks, layers, batches, options)
CASES = [
    ("puzzles_solutions.py", "basic", 1, 2, 4, {}),
    ("puzzles_solutions.py", "grad_accum", 1, 2, 4, {}),
    ("puzzles_solutions.py", "ddp", 4, 2, 4, {}),
    ("puzzles_solutions.py", "wsdp", 4, 6, 4, {}),
    ("puzzles_solutions.py", "fsdp", 4, 6, 4, {}),
    ("puzzles_solutions.py", "pipeline", 4, 8, 4, {}),
    ("puzzles_solutions.py", "gpipe", 4, 8, 4, {}),
    ("puzzles_solutions.py", "pipeline_fsdp", 16, 4, 4, {}),
    ("puzzles_styles.py", "ddp_plus_equals", 4, 2, 4, {}),
    ("puzzles_styles.py", "fsdp_drop_late", 4, 6, 4, {}),
    ("puzzles_styles.py", "fsdp_drop_late", 3, 3, 3, {}),
    ("puzzles_styles.py", "ring_sends_first", 3, 1, 3, {}),
    ("puzzles_styles.py", "pipeline_waiting_sends", 4, 8, 4, {}),
    ("puzzles_styles.py", "pipeline_waiting_sends", 2, 4, 6, {}),
    ("lab_solutions.py", "train_ddp", 4, 4, 16, {"batch_size": 2}),
    ("lab_solutions.py", "part1_training_loop", 4, 4, 16, {"batch_size": 2}),
    ("lab_solutions.py", "part2_training_loop", 4, 4, 16, {}),
    ("lab_solutions.py", "part3_training_loop", 4, 4, 16, {"batch_size": 2}),
    ("lab_course_styles.py", "train_ddp", 8, 6, 32, {"batch_size": 4}),
    ("lab_course_styles.py", "train_ddp", 4, 4, 16, {"batch_size": 2}),  # += over 2 microbatches: fails
    ("lab_course_styles.py", "train_ddp", 16, 2, 16, {"batch_size": 1}),  # past one NVLink domain
    ("lab_course_styles.py", "part1_training_loop", 4, 4, 16, {"batch_size": 2}),
    ("lab_course_styles.py", "part1_training_loop", 3, 3, 12, {"batch_size": 4}),
    ("lab_course_styles.py", "part2_training_loop", 4, 8, 8, {}),
    ("lab_course_styles.py", "part3_training_loop", 4, 8, 32, {"batch_size": 4}),
    ("lab_course_styles.py", "part3_training_loop", 2, 4, 8, {"batch_size": 2}),
]


def _api(file: str) -> str:
    return "lab" if file.startswith("lab") else "puzzles"


def _oracle_modules(api: str):
    return modules_as({"lib": puzzles_lib} if api == "puzzles" else {"lib": lab_lib, "utils": lab_utils})


def _load(file: str):
    spec = importlib.util.spec_from_file_location(f"_oracle_{file[:-3]}", SOLUTIONS / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verdict(error: BaseException) -> str:
    if isinstance(error, (_hang.Hang, DeadlockError)):
        return "hang"
    if isinstance(error, StrategyError) and error.__cause__ is not None:
        error = error.__cause__
    return "assertion" if isinstance(error, AssertionError) else type(error).__name__


def _log(models) -> list:
    out = []
    for m in models:
        for e in m.log:
            out.append((m.rank, e.typ, e.layer, e.time, getattr(e, "length", getattr(e, "duration", None)),
                        e.memory, frozenset(getattr(e, "batches", getattr(e, "samples", ())))))
    return out


def _figures(api: str, models, utils) -> dict:
    steps = max(m.log[-1].time for m in models)
    memory = max(e.memory for m in models for e in m.log)
    figures = {"steps": steps, "memory": memory}
    if api == "lab":
        figures["mfu"] = utils.get_model_theoretical_best_time(models[0]) / steps
    return figures


def run_driver(api: str, file: str, function: str, n: int, layers: int, batches: int, options: dict,
               oracle: bool) -> tuple[str, list, dict]:
    """Run `function` on every rank with the oracle's or the compat layer's modules as `lib`/`utils`."""
    modules = _oracle_modules(api) if oracle else api_modules(api)
    with modules:
        lib = sys.modules["lib"]
        module = _load(file)
        utils = sys.modules.get("utils")
        fn = getattr(module, function)
        dist = lib.Dist(n)
        models = [lib.Model(r, dist, layers, batches) for r in range(n)]
        try:
            if inspect.iscoroutinefunction(fn):
                coroutines = [fn(m, **options) for m in models]
                if oracle:
                    asyncio.run(_hang.run_ranks(coroutines))
                else:
                    async def all_ranks():
                        await asyncio.gather(*coroutines)
                    asyncio.run(all_ranks())
            else:
                fn(models[0], **options)
        except BaseException as error:  # noqa: BLE001  (the verdict is what is compared)
            return _verdict(error), _log(models), {}
        try:
            check = lib.Model.check if api == "puzzles" else utils.check
            with contextlib.redirect_stdout(None):
                check(models)
        except AssertionError:
            return "incorrect", _log(models), _figures(api, models, utils)
        return "correct", _log(models), _figures(api, models, utils)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0][:-3]}.{c[1]}-{c[2]}r" for c in CASES])
def test_same_verdict_logs_and_figures_as_the_original(case):
    file, function, n, layers, batches, options = case
    api = _api(file)
    want = run_driver(api, file, function, n, layers, batches, options, oracle=True)
    got = run_driver(api, file, function, n, layers, batches, options, oracle=False)
    assert got[0] == want[0]
    if want[0] in ("correct", "incorrect"):  # after an error, how far the other ranks got depends on
        assert got[1] == want[1]             # when the event loop stopped them
    assert got[2] == want[2]


@pytest.mark.parametrize("case", [c for c in CASES if c[0] != "puzzles_styles.py" or "ring" not in c[1]],
                         ids=lambda c: f"{c[0][:-3]}.{c[1]}-{c[2]}r")
def test_run_file_reports_the_originals_figures(case):
    file, function, n, layers, batches, options = case
    api = _api(file)
    verdict, _, figures = run_driver(api, file, function, n, layers, batches, options, oracle=True)
    try:
        result = run_file(SOLUTIONS / file, function=function, ranks=n, layers=layers, batches=batches,
                          check=False, **options)
    except Exception as error:  # noqa: BLE001
        assert _verdict(error) == verdict
        return
    assert ("correct" if result.correct else "incorrect") == verdict
    assert result.notebook_time == figures["steps"] and result.peak_memory_bytes == int(figures["memory"])
    if api == "lab":
        assert result.mfu == figures["mfu"]

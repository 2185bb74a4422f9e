"""The C block/wake path (`_drive.c`: `Engine._drive`, `Engine.wake`, `Work.__await__` on a rank's own
coroutine) against its Python twins in `engine/core.py` and `comm/collectives.py`: the same events, memory books and times on
steps of every schedule, and the same exception and message where a strategy deadlocks, raises, awaits
through asyncio, awaits another rank's work or awaits a work twice; and the same step under a trace
function (as coverage and debuggers set one), which makes `await` take the iterator protocol."""

from __future__ import annotations

import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest

from dist_lib import simulate

from dist_lib.comm import collectives as comm

from dist_lib.engine import core as engine
from dist_lib.errors import SimulationError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.fingerprint import CONFIGS, fingerprint  # noqa: E402

pytestmark = pytest.mark.skipif(not engine.PYTHON_TWINS, reason="the C accelerator was not built")


@contextmanager
def python_block_wake_path():
    """Engine.wake, Engine._drive, Engine.schedule and Work.__await__ as their Python twins."""
    places = {"Engine.wake": (engine.Engine, "wake"), "Engine._drive": (engine.Engine, "_drive"),
              "Engine.schedule": (engine.Engine, "schedule"), "Work.__await__": (comm.Work, "__await__")}
    saved = {name: getattr(owner, attr) for name, (owner, attr) in places.items()}
    for name, (owner, attr) in places.items():
        setattr(owner, attr, engine.PYTHON_TWINS[name])
    try:
        yield
    finally:
        for name, (owner, attr) in places.items():
            setattr(owner, attr, saved[name])


def test_the_twins_are_installed_and_swapped():
    assert type(engine.Engine.__dict__["wake"]).__name__ == "method_descriptor"
    with python_block_wake_path():
        assert engine.Engine.__dict__["wake"] is engine.PYTHON_TWINS["Engine.wake"]
    assert type(comm.Work.__dict__["__await__"]).__name__ == "method_descriptor"


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_every_schedule_gives_the_same_step(config):
    _name, strategy, cluster, workload, batch, options = config
    fast = fingerprint(str(ROOT / strategy), cluster, workload, batch, options)
    with python_block_wake_path():
        assert fingerprint(str(ROOT / strategy), cluster, workload, batch, options) == fast


FAULTY = {
    "deadlock": """
        async def train(model):
            if model.rank == 1:
                await model.recv(0)  # rank 0 never sends
            x = model.get_input_activation([model.rank])
            await model.all_reduce(model.forward(0, x, model.load_weights(0, tp_rank=model.rank, tp_size=2)[0]),
                                   [0, 1])
    """,
    "raises after a collective": """
        async def train(model):
            w, _ = model.load_weights(0, tp_rank=model.rank, tp_size=2)
            x = model.get_input_activation([0])
            await model.all_reduce(model.forward(0, x, w), [0, 1])
            if model.rank == 1:
                raise ValueError("rank one gives up")
    """,
    "gather of works": """
        import asyncio
        async def train(model):
            w, _ = model.load_weights(0, tp_rank=model.rank, tp_size=2)
            x = model.get_input_activation([0])
            y = model.forward(0, x, w)
            (z,) = await asyncio.gather(model.all_reduce(y, [0, 1]))
            await asyncio.sleep(0)
            await model.all_reduce(model.forward(1, z, model.load_weights(1, tp_rank=model.rank, tp_size=2)[0]),
                                   [0, 1])
            raise RuntimeError(f"stop {model.time:.9f}")
    """,
    "another rank's work": """
        WORKS = {}
        async def train(model):
            w, _ = model.load_weights(0, tp_rank=model.rank, tp_size=2)
            x = model.get_input_activation([0])
            WORKS[model.rank] = model.all_reduce(model.forward(0, x, w), [0, 1])
            if model.rank == 1:
                await WORKS[0]
    """,
    "a work awaited twice": """
        async def train(model):
            w, _ = model.load_weights(0, tp_rank=model.rank, tp_size=2)
            x = model.get_input_activation([0])
            work = model.all_reduce(model.forward(0, x, w), [0, 1])
            first = await work
            second = await work
            raise RuntimeError(f"{first is second} {model.time:.9f}")
    """,
}


def outcome(path: Path) -> str:
    try:
        result = simulate(str(path), "1x2xA100-80GB", "toy:layers=2", 1, check=False)
    except SimulationError as error:
        return f"{type(error).__name__}: {error}"
    return f"{result.time_s!r} {len(result.raw_events)}"


@pytest.mark.parametrize("case", FAULTY, ids=list(FAULTY))
def test_every_fault_gives_the_same_error(case, tmp_path):
    path = tmp_path / "faulty.py"
    path.write_text(textwrap.dedent(FAULTY[case]))
    fast = outcome(path)
    with python_block_wake_path():
        assert outcome(path) == fast
    assert "Error" in fast  # each case fails, and names what failed
    if case == "another rank's work":
        assert "rank 1 awaits Work(all_reduce on rank 0" in fast


def test_a_trace_function_gives_the_same_step():
    _name, strategy, cluster, workload, batch, options = CONFIGS[5]  # the interleaved pipeline
    fast = fingerprint(str(ROOT / strategy), cluster, workload, batch, options)
    calls = []

    def tracer(frame, event, arg):
        calls.append(event)
        return None

    sys.settrace(tracer)
    try:
        traced = fingerprint(str(ROOT / strategy), cluster, workload, batch, options)
    finally:
        sys.settrace(None)
    assert calls and traced == fast

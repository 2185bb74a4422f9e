"""`python -m grader check FILE`: property-based search for a configuration that breaks a strategy.

Configurations come from `dist_lib.testing.setups` when FILE is (a copy of) a bundled strategy, named as
it is and taking every option it takes, else from a generic generator here (cluster from
`testing.CLUSTERS`, toy workloads, batches that split evenly over ranks and microbatches). Each
configuration must give a correct step whose event log passes `testing.schedule_problems`, whose recorded
program replays to the same result (what the grader relies on), with a valid trace and the same result
whatever order the ranks start in. Hypothesis shrinks a failure to the smallest one. The search runs in
this process: it is for checking your own file, not for grading others'.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from dist_lib import Cluster, SimulationError, SpecError, StrategyError, simulate, testing
from dist_lib.run.simulator import accepted_options, load_strategy
from dist_lib.output.trace import validate_trace

from .errors import InputError
from .paths import BUILTIN_STRATEGIES
from .report_terminal import literal

BUNDLED = {p.stem for p in BUILTIN_STRATEGIES.glob("*.py") if not p.name.startswith("_")}


class Rejected(Exception):
    """The strategy refused this configuration with a ValueError (e.g. a batch it cannot split)."""


def generic_setups(path: str, accepted: set[str]) -> Any:
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> testing.Setup:
        cluster = draw(st.sampled_from(testing.CLUSTERS))
        world = Cluster.parse(cluster).world_size
        mb = draw(st.integers(1, 2))
        options = {"microbatch_size": mb} if "microbatch_size" in accepted else {}
        layers = world * draw(st.integers(1, 2)) if draw(st.booleans()) else draw(st.integers(1, 8))
        batch = world * mb * draw(st.integers(1, 3))
        return testing.Setup(path, cluster, f"toy:layers={layers}", batch, options)

    return build()


def _takes_bundled_options(stem: str, train: Any) -> bool:
    """Is a file of this name a copy of the bundled strategy, which the bundled configurations fit? A file of
    one's own named like one (`ddp.py`) need not take the bundled options (`bucket_mb`)."""
    if stem not in BUNDLED:
        return False
    takes = accepted_options(train)
    return takes is None or set(accepted_options(load_strategy(BUILTIN_STRATEGIES / f"{stem}.py")[0]) or ()) <= set(takes)


def invariants(setup: testing.Setup) -> list[str]:
    from dist_lib.run.recording import record
    from dist_lib.run.replay import replay
    try:
        result, programs = record(setup.strategy, setup.cluster, setup.workload, setup.batch, **setup.options)
    except StrategyError as exc:
        if isinstance(exc.__cause__, ValueError):
            raise Rejected(str(exc)) from None
        return [f"the strategy raised: {exc}"]
    except SimulationError as exc:
        return [f"{type(exc).__name__}: {str(exc).splitlines()[0]}"]
    problems = [f"incorrect step: {p}" for p in result.problems]
    problems += testing.schedule_problems(result)
    replayed = replay(programs, setup.cluster, setup.workload, setup.batch)
    if (replayed.time_s, replayed.memory_bytes, replayed.correct) != (result.time_s, result.memory_bytes,
                                                                      result.correct):
        problems.append("the recorded program does not replay to the same step time, memory and verdict")
    with tempfile.TemporaryDirectory() as tmp:
        problems += [f"trace: {p}" for p in validate_trace(result.write_chrome_trace(Path(tmp) / "t.json"))[:3]]
    again = simulate(setup.strategy, setup.cluster, setup.workload, setup.batch, check=False, start_order_seed=7,
                     **setup.options)
    if again.time_s != result.time_s or again.memory_bytes != result.memory_bytes:
        problems.append("not deterministic: starting the ranks in another order changed the step time or memory")
    return problems


def cmd_check(file: str, examples: int, seed: int, console: Console) -> int:
    from hypothesis import HealthCheck, given, seed as hseed, settings
    path = Path(file)
    if not path.is_file():
        raise InputError(f"strategy file {file}: not found")
    try:
        train, name = load_strategy(str(path))
    except (SpecError, StrategyError) as exc:  # StrategyError: importing the file raised (a syntax error...)
        raise InputError(str(exc).splitlines()[0]) from None
    accepted = set(accepted_options(train) or ())
    if _takes_bundled_options(path.stem, train):
        source = testing.setups(path.stem).map(
            lambda s: testing.Setup(str(path.resolve()), s.cluster, s.workload, s.batch, s.options))
        origin = f"dist_lib.testing.setups({path.stem!r})"
    else:
        source = generic_setups(str(path.resolve()), accepted)
        origin = "generic configurations (toy workloads on testing.CLUSTERS)"
    console.print(f"checking {literal(name)} on up to {examples} random configurations from {literal(origin)}")
    passed, rejected, failures = 0, 0, []

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(source)
    def search(setup: testing.Setup) -> None:
        nonlocal passed, rejected
        try:
            problems = invariants(setup)
        except Rejected:
            rejected += 1
            from hypothesis import reject
            reject()
        if problems:
            failures.append((setup, problems))
            raise AssertionError(problems[0])
        passed += 1

    try:
        search()
    except AssertionError:
        setup, problems = failures[-1]  # hypothesis replays the shrunk example last
        console.print("[red]FAILED[/]: smallest failing configuration found:")
        console.print(literal(f"  cluster {setup.cluster}, workload {setup.workload}, global batch {setup.batch}, "
                              f"options {setup.options}"))
        for problem in problems[:5]:
            console.print(f"  violated: {literal(problem)}", highlight=False)
        console.print(literal(f"  reproduce: python -m grader run {file} --cluster {setup.cluster} --workload "
                              f"{setup.workload} --batch {setup.batch}"
                              + "".join(f" --set {k}={_toml(v)}" for k, v in setup.options.items())))
        return 1
    except Exception as exc:  # noqa: BLE001 - hypothesis gave up (e.g. every configuration rejected)
        console.print(f"[red]could not check[/]: {literal(type(exc).__name__)}: "
                      f"{literal((str(exc).splitlines() or [''])[0])}")
        return 1
    console.print(f"[green]passed[/]: {passed} configurations satisfied every invariant"
                  + (f" ({rejected} rejected by the strategy as invalid)" if rejected else ""))
    return 0


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)

"""`simulate`: run a strategy on every rank of a cluster for one training step and return a `Result`."""

from __future__ import annotations

import ast
import asyncio
import contextvars
import importlib.util
import inspect
import random
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from dist_lib.model.correctness import HandedIn, check_final_weights, check_kept
from dist_lib.comm.collectives import unfinished
from dist_lib.engine.core import Engine
from dist_lib.run.file_import import beside, import_hint
from dist_lib.run.folding import check_kept_folded, expand_books, plan_fold, spread_shards
from dist_lib.comm.groups import FoldBroken
from dist_lib.hardware.replicas import Fold
from dist_lib.errors import (DeadlockError, IncorrectStepError, OutOfMemoryError, ResourceError, SpecError,
                             StrategyError)
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.reserve import memory_reserve as read_reserve
from dist_lib.memory.tracker import RankLog, cycle_collector_paused, format_bytes, slot_records
from dist_lib.model.handle import Model
from dist_lib.model.expert_books import ExpertBooks
from dist_lib.model.experts import MoEModel
from dist_lib.output.result import PerRank, Result
from dist_lib.specs import shown
from dist_lib.run.split import Coordinator
from dist_lib.run.split_worker import Worker
from dist_lib.run.worker_process import fork_worker, send_error, stop_worker, worker_ranks as choose_worker_ranks
from dist_lib.tensors import Weight
from dist_lib.engine.waits import interrupt_at_once, user_frame
from dist_lib.workload.transformer import Workload, check_global_batch

DEFAULT_CLUSTER = "1x8xA100-80GB"
DEFAULT_WORKLOAD = "gpt-1.3b"
DEFAULT_GLOBAL_BATCH = 32

Strategy = Callable[..., Any]
# True in the task `simulate` runs: there only the strategy can cancel the step's task (a caller of
# `simulate_async` may cancel it for reasons of its own)
_OWN_LOOP: contextvars.ContextVar[bool] = contextvars.ContextVar("own_loop", default=False)
_FILE_MODULE = "_strategy_"  # the prefix of the module name a strategy file outside a package is imported as


def simulate(strategy: Strategy | str | Path, cluster: Cluster | str | Path = DEFAULT_CLUSTER,
             workload: Workload | str | Path = DEFAULT_WORKLOAD, global_batch_size: int = DEFAULT_GLOBAL_BATCH,
             *, check: bool = True, enforce_memory: bool = True, start_order_seed: int | None = None,
             workers: int = 1, worker_ranks: Any = None, fold: bool = True, memory_reserve: Any = None,
             **options: Any) -> Result:
    """Run `strategy` (an `async def train(model, **options)`, or a path to a file defining one) on
    every rank. Extra keywords go to the strategy. With `check=True` an incorrect step raises
    `IncorrectStepError`; with `check=False` it is reported in `result.correct` / `result.problems`.
    `start_order_seed` shuffles the order in which ranks start (results must not change). `workers=2`
    runs the ranks in two processes with the results of one (`split.py`): `worker_ranks` (whole nodes; by
    default the second half of the nodes) in the second. Choose replicas: the two processes run side by
    side when their ranks meet only in collectives. `memory_reserve` (off by default: tensors may fill
    each device, as the step's figures have always been counted) keeps back what a real run's runtime
    holds of every GPU (`hardware.reserve`: True or "default" for the cited figures, a `MemoryReserve`, or
    text such as "fragmentation=0.15"): a rank whose peak exceeds what is left is out of memory, and the
    result names the fullest GPU by the share of its capacity it uses, reserve included."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("simulate() was called inside a running event loop; use `await simulate_async(...)`")
    own = _OWN_LOOP.set(True)  # (asyncio.run copies this context into the step's task)
    try:
        with interrupt_at_once():
            return asyncio.run(simulate_async(strategy, cluster, workload, global_batch_size, check=check,
                                              enforce_memory=enforce_memory, start_order_seed=start_order_seed,
                                              workers=workers, worker_ranks=worker_ranks, fold=fold,
                                              memory_reserve=memory_reserve, **options))
    finally:
        _OWN_LOOP.reset(own)


async def simulate_async(strategy: Strategy | str | Path, cluster: Cluster | str | Path = DEFAULT_CLUSTER,
                         workload: Workload | str | Path = DEFAULT_WORKLOAD,
                         global_batch_size: int = DEFAULT_GLOBAL_BATCH, *, check: bool = True,
                         enforce_memory: bool = True, start_order_seed: int | None = None,
                         workers: int = 1, worker_ranks: Any = None, fold: bool = True, memory_reserve: Any = None,
                         **options: Any) -> Result:
    """`simulate` for callers that already run an event loop."""
    train, name = load_strategy(strategy)
    check_options(train, options, name)
    cluster = Cluster.load(cluster)
    workload = Workload.load(workload)
    check_global_batch(global_batch_size)
    for flag, value in (("check", check), ("enforce_memory", enforce_memory), ("fold", fold)):
        if not isinstance(value, bool):
            raise SpecError(f"{flag} must be True or False, got {shown(value)}")
    if start_order_seed is not None and (isinstance(start_order_seed, bool) or not isinstance(start_order_seed, int)):
        raise SpecError(f"start_order_seed must be a whole number or None, got {start_order_seed!r}")
    if workers not in (1, 2) or isinstance(workers, bool):
        raise SpecError(f"workers must be 1 or 2 (processes to run the ranks in), got {shown(workers)}")
    if worker_ranks is not None and workers != 2:
        raise SpecError("worker_ranks names the ranks of the second process: give it with workers=2")
    theirs = choose_worker_ranks(cluster, worker_ranks) if workers == 2 else []
    reserve = read_reserve(memory_reserve, "memory_reserve")
    folded = plan_fold(train, cluster, global_batch_size, options, workload.moe) if fold else None
    if folded is not None:
        try:
            return await _run_folded(train, name, folded, workload, global_batch_size, check, enforce_memory,
                                     start_order_seed, options, reserve)
        except (ResourceError, IncorrectStepError):
            raise
        except Exception:  # a broken fold, or an error: the unfolded step says what it is, in its own words
            pass
    engine = Engine(cluster, workload, global_batch_size, enforce_memory, memory_reserve=reserve)
    engine.cancel_is_strategys = _OWN_LOOP.get()
    if workload.moe is not None and workers != 1:
        raise SpecError(f"workers=2: a step of the mixture-of-experts workload {workload.name} runs in one process")
    books = ExpertBooks(engine) if workload.moe is not None else None
    models = [Model(engine, r) if books is None else MoEModel(engine, r, books) for r in range(cluster.world_size)]
    order = list(range(cluster.world_size))
    if start_order_seed is not None:
        random.Random(start_order_seed).shuffle(order)
    # Frees rely on reference counting, not on the cycle collector, whose full passes over a growing
    # event log would make long steps quadratic: pause it for the step and for building its result.
    try:
        with cycle_collector_paused():
            make = lambda rank: train(models[rank], **options)  # noqa: E731
            if workers == 1:
                await engine.run(make, order)
                if engine.instant_transfers:  # (else the engine numbered the op ids in that order already)
                    engine.events.renumber()
                return _finish(engine, options, name, check, _books(engine, range(cluster.world_size)),
                               books.problems() if books is not None else [], enforce_memory=enforce_memory)
            return _finish(engine, options, name, check, await _run_split(engine, make, order, theirs),
                           enforce_memory=enforce_memory)
    except MemoryError:  # between ranks (a rank's own is reported by the engine, with the rank)
        raise ResourceError(f"MemoryError: the simulation of {cluster.world_size} ranks ran out of real memory "
                            f"while checking the step and building its result") from None
    finally:
        engine.release()


async def _run_folded(train: Strategy, name: str, fold: Fold, workload: Workload, global_batch_size: int,
                      check: bool, enforce_memory: bool, start_order_seed: int | None, options: dict[str, Any],
                      reserve: Any = None) -> Result:
    """The step with only replica 0 running (`run/folding.py`); raises `FoldBroken` when a representative
    did what its replicas would not do alike."""
    cluster = fold.cluster
    engine = Engine(cluster, workload, global_batch_size, enforce_memory, fold=fold, memory_reserve=reserve)
    engine.cancel_is_strategys = _OWN_LOOP.get()
    experts = ExpertBooks(engine) if workload.moe is not None else None
    models = {rank: Model(engine, rank) if experts is None else MoEModel(engine, rank, experts) for rank in fold.reps}
    order = list(fold.reps)
    if start_order_seed is not None:
        random.Random(start_order_seed).shuffle(order)
    engine.finished = cluster.world_size - len(order)  # the other replicas: never blocked, never to wait for
    try:
        with cycle_collector_paused():
            await engine.run(lambda rank: train(models[rank], **options), order)
            if fold.broken:
                raise FoldBroken(fold.broken)
            # (the full step names them, rank by rank)
            if experts is not None and experts.problems(lambda shards, num: spread_shards(shards, num, fold)):
                raise FoldBroken("the representatives' experts were not all trained exactly once")
            if engine.instant_transfers:
                engine.events.renumber()
            books = expand_books(_books(engine, fold.reps), fold, global_batch_size)
            return _finish(engine, options, name, check, books, fold=fold, enforce_memory=enforce_memory)
    except MemoryError:
        raise ResourceError(f"MemoryError: the simulation of {cluster.world_size} ranks ran out of real memory "
                            f"while checking the step and building its result") from None
    finally:
        engine.release()


class Books(NamedTuple):
    """What a step leaves of its ranks once every rank returned, rank by rank (of one process's ranks, in
    a split step, until the two are joined)."""

    leftovers: list[str]  # ops still pending
    logs: list[RankLog]  # each rank's allocation log
    loaded: list[list]  # what each rank loaded (`check.Loaded`)
    finals: list[tuple]  # the handed-in weights (`check.HandedIn`)
    times: list[float]  # when each rank's last op ended, awaited or not
    peaks: list[int]
    flops: list[float]
    communicators: list[int]  # groups of two or more ranks, and peers it sends to or receives from

    def join(self, ours: list[int], other: Books, theirs: list[int]) -> Books:
        """The books of a split step's two halves, rank by rank."""
        order = sorted(range(len(ours) + len(theirs)), key=(ours + theirs).__getitem__)

        def merged(field: str) -> list:
            both = getattr(self, field) + getattr(other, field)
            return [both[i] for i in order]

        finals = sorted(self.finals + other.finals, key=lambda record: record[0])
        return Books(self.leftovers + other.leftovers, merged("logs"), merged("loaded"), finals, merged("times"),
                     merged("peaks"), merged("flops"), merged("communicators"))


def _books(engine: Engine, ranks: Any) -> Books:
    states = [engine.ranks[r] for r in ranks]
    return Books(
        leftovers=unfinished(engine),
        logs=[s.memory.detach_log() for s in states],  # the step's books: later frees are not in them
        loaded=[s.loaded for s in states], finals=_take_final_weights(states),
        # a rank's step ends with its last op, awaited or not: compute, collective or point-to-point
        times=[max(s.clock, s.comm_end, s.p2p_end) for s in states],
        peaks=[s.memory.peak for s in states], flops=[s.flops for s in states],
        communicators=communicator_counts(engine, ranks))


def communicator_counts(engine: Engine, ranks: Any) -> list[int]:
    """The NCCL communicators each of `ranks` belongs to in a real run: one per group of two or more ranks it
    is a member of (a PyTorch process group), and one per rank it sends to or receives from (PyTorch's
    ProcessGroupNCCL makes a communicator of two ranks for each such pair)."""
    counts = [0] * engine.world_size
    for key in engine.groups:
        if len(key) > 1:
            for r in key:
                counts[r] += 1
    peers: set[tuple[int, int]] = {(min(src, dst), max(src, dst)) for src, dst in engine.channels if src != dst}
    for pair in peers:
        for r in pair:
            counts[r] += 1
    return [counts[r] for r in ranks]


async def _run_split(engine: Engine, make: Callable, order: list[int], theirs: list[int]) -> Books:
    """Run the step in two processes (`split.py`): `theirs` in a fork, the other ranks here; the worker's
    books and events join this process's."""
    taken = set(theirs)
    ours = [r for r in range(engine.world_size) if r not in taken]

    def run_worker(conn: Any) -> None:
        asyncio.events._set_running_loop(None)  # the fork runs its half on a loop of its own
        try:
            engine.partition = Worker(engine, conn, theirs)
            asyncio.run(engine.run(make, [r for r in order if r in taken]))
            conn.send(("books", _books(engine, theirs), engine.events.export()), arrays=True)
        except BaseException as error:
            send_error(conn, error)
            raise

    pid, conn = fork_worker(run_worker)
    try:
        engine.partition = Coordinator(engine, conn, ours)
        await engine.run(make, [r for r in order if r not in taken])
        books = _books(engine, ours)
        _, their_books, events = engine.partition.receive()
        engine.partition.join_events(events)
    finally:
        stop_worker(pid)
    return books.join(ours, their_books, theirs)


def _finish(engine: Engine, options: dict[str, Any], name: str, check: bool, books: Books,
            expert_problems: list[str] = (), fold: Fold | None = None, enforce_memory: bool = True) -> Result:
    """After every rank returned: the leftovers check, the runtime reserve's check, the end-of-step check and
    the result."""
    if books.leftovers:
        raise DeadlockError("the step ended with communication that never completed (it would hang on a GPU):\n  "
                            + "\n  ".join(books.leftovers))
    reserve = engine.memory_reserve
    if reserve is not None and enforce_memory:
        check_reserve(engine.cluster, reserve, books.peaks, books.communicators)
    finals, logs = books.finals, books.logs
    problems = check_final_weights(finals, engine.workload.num_layers, engine.global_batch_size)
    if not problems:  # (else what is missing is already named, layer by layer)
        problems = check_kept(books.loaded, finals) if fold is None else check_kept_folded(books.loaded, finals, fold)
    problems = problems + list(expert_problems)  # a mixture of experts' routed experts (`model.experts`)
    engine.events.pack()
    workload = engine.workload
    result = Result(
        cluster=engine.cluster, workload=workload, global_batch_size=engine.global_batch_size,
        options=dict(options), time_s=max(books.times), rank_times=books.times, memory_bytes=books.peaks,
        memory_by_kind=PerRank(logs, RankLog.peak_by_kind),
        model_flops=workload.model_flops_per_sample() * engine.global_batch_size,
        hardware_flops=sum(books.flops), correct=not problems, problems=problems, raw_events=engine.events,
        timelines=PerRank(logs, RankLog.timeline), memory_log=PerRank(logs, RankLog.entries), strategy=name,
        representatives=None if fold is None else fold.rep_of, memory_reserve=reserve,
        communicators=books.communicators)
    result.final_weights = finals
    if problems and check:
        raise IncorrectStepError(f"{name}: the step is not a correct training step:\n  " + "\n  ".join(problems))
    return result


def check_reserve(cluster: Cluster, reserve: Any, peaks: list[int], communicators: list[int]) -> None:
    """Raise `OutOfMemoryError` for the fullest rank whose peak does not fit beside the runtime reserve of
    its communicators (the step ran within the reserve of none: its communicators are known only now)."""
    over = [(peaks[r] / max(1, reserve.usable(cluster.device_of(r).memory_bytes, communicators[r])), r)
            for r in range(len(peaks))
            if peaks[r] > reserve.usable(cluster.device_of(r).memory_bytes, communicators[r])]
    if over:
        _, r = max(over, key=lambda item: (item[0], -item[1]))  # the fullest, the first on a tie
        device = cluster.device_of(r)
        raise OutOfMemoryError(
            f"rank {r} ({device.name}, {format_bytes(device.memory_bytes)}): out of memory in a real run: peak "
            f"{format_bytes(peaks[r])} of tensors, but {reserve.describe(device.memory_bytes, communicators[r])} "
            f"leave {format_bytes(reserve.usable(device.memory_bytes, communicators[r]))} "
            f"({peaks[r] - reserve.usable(device.memory_bytes, communicators[r]):,} bytes short)"
            + (f" ({len(over) - 1} more rank(s) over)" if len(over) > 1 else ""))


def _take_final_weights(states: list) -> list[tuple]:
    """The handed-in weights as `check.HandedIn` records. Each rank's weights are released as soon as
    they are recorded, so that the records take the memory the weights held."""
    finals: list[tuple] = []
    for state in states:
        finals += slot_records(state.final_weights, Weight, HandedIn._fields)
        state.final_weights = []
    return finals


def load_strategy(strategy: Strategy | str | Path) -> tuple[Strategy, str]:
    """A `train` coroutine function from a callable, a file path, or a module name (`strategies.ddp`)."""
    if callable(strategy):
        train, name = strategy, getattr(strategy, "__module__", "") or getattr(strategy, "__name__", "train")
        name = name.rsplit(".", 1)[-1] if name != "__main__" else getattr(strategy, "__name__", "train")
        if name.startswith(_FILE_MODULE):  # a `train` of a file `_load_file` imported: named after its file
            name = Path(getattr(sys.modules.get(strategy.__module__), "__file__", None) or name).stem
    else:
        if not isinstance(strategy, (str, Path)):
            raise SpecError(f"strategy must be an async train function, a file path or a module name, "
                            f"got {type(strategy).__name__} {shown(strategy)}")
        text = str(strategy)
        path = Path(text)
        if path.suffix == ".py" or path.exists():
            module = _load_file(path)
            name = path.stem
        else:
            try:
                module = importlib.import_module(text)
            except ImportError as exc:
                raise SpecError(f"strategy {text!r}: no such file or module ({exc})") from None
            name = text.rsplit(".", 1)[-1]
        train = getattr(module, "train", None)
        if train is None:
            raise SpecError(f"strategy {text}: defines no `train` function (expected `async def train(model, **options)`)")
    if inspect.isasyncgenfunction(train):
        raise SpecError(f"strategy {name}: `train` must be `async def train(model, **options)`, got an async "
                        f"generator function: a `yield` in train{_yield_line(train)} makes it one; a strategy "
                        f"awaits works and returns, it does not yield")
    if not inspect.iscoroutinefunction(train):
        raise SpecError(f"strategy {name}: `train` must be `async def train(model, **options)`, "
                        f"got a plain {type(train).__name__}")
    return train, name


def _yield_line(function: Callable) -> str:
    """' (at strategy.py:42)': the first `yield` of a generator function's own body, else its `def` line."""
    code = getattr(function, "__code__", None)
    if code is None:
        return ""
    line = code.co_firstlineno
    try:
        lines, first = inspect.getsourcelines(function)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        body = tree.body[0]
        nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
        todo = list(ast.iter_child_nodes(body))
        found = []
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                found.append(node.lineno)
            elif not isinstance(node, nested):
                todo.extend(ast.iter_child_nodes(node))
        if found:
            line = first + min(found) - 1
    except (OSError, TypeError, SyntaxError, IndexError):
        pass
    return f" (at {Path(code.co_filename).name}:{line})"


def _load_file(path: Path) -> Any:
    """Import a strategy file; a file inside a package (e.g. strategies/ddp.py) is imported as part of
    it, so that its relative imports work."""
    if not path.is_file():
        raise SpecError(f"strategy file {path}: " + ("not a file" if path.exists() else "not found"))
    path = path.resolve()
    parts = [path.stem]
    root = path.parent
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    try:
        if len(parts) > 1:
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            module = importlib.import_module(".".join(parts))
            if Path(module.__file__ or "").resolve() == path:
                return module
        module_name = f"{_FILE_MODULE}{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"strategy file {path}: cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        with beside(path):
            spec.loader.exec_module(module)
        return module
    except SpecError:
        raise
    except (Exception, SystemExit) as exc:  # a file that calls exit() on import must not end the caller
        raise StrategyError(f"strategy file {path}: importing it raised {type(exc).__name__}: {exc}"
                            f"{user_frame(exc)}{import_hint(exc)}") from exc


def accepted_options(train: Strategy) -> list[str] | None:
    """The option names `train` takes after `model`, or None when it takes any (`**options`)."""
    params = inspect.signature(train).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return list(params)[1:]


def _check_required(train: Strategy, params: Any, options: dict[str, Any], name: str) -> None:
    """Every parameter of `train` after `model` without a default must come as an option (a keyword of
    `simulate`), which also rules out positional-only ones: the engine calls `train(model, **options)`."""
    after_model = list(params.values())[1:]
    positional = [p.name for p in after_model if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    missing = [p.name for p in after_model if p.default is inspect.Parameter.empty and p.name not in options
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if not positional and not missing:
        return
    code = getattr(inspect.unwrap(train), "__code__", None)
    where = f" ({Path(code.co_filename).name}:{code.co_firstlineno})" if code is not None else ""
    if positional:
        raise SpecError(f"strategy {name}: `train`{where} takes {', '.join(positional)} before `/`, as positional "
                        f"only; options reach it as keywords (train(model, **options)): drop the `/`")
    s = "s" if len(missing) > 1 else ""
    given = ", ".join(f"{m}=..." for m in missing)
    raise SpecError(f"strategy {name}: `train`{where} requires the option{s} {', '.join(missing)}, which "
                    f"{'have' if s else 'has'} no default; pass {'them' if s else 'it'} to simulate() as "
                    f"{'keywords' if s else 'a keyword'}: simulate(strategy, cluster, workload, global_batch_size, {given}), or give "
                    f"{'them defaults' if s else 'it a default'} in train's signature")


def check_options(train: Strategy, options: dict[str, Any], name: str) -> None:
    """Reject option names the strategy does not take (listing those it does), and values whose type
    differs from a plain default's (an int, float, bool or str default says what the option expects)."""
    accepted = accepted_options(train)
    if accepted is not None:
        unknown = [k for k in options if k not in accepted]
        if unknown:
            raise SpecError(f"strategy {name}: unknown option(s) {', '.join(unknown)}; it accepts "
                            f"{', '.join(accepted) or 'no options'}")
    params = inspect.signature(train).parameters
    _check_required(train, params, options, name)
    for key, value in options.items():
        param = params.get(key)
        if param is None or param.default is inspect.Parameter.empty or param.default is None:
            continue
        want = type(param.default)
        if want not in (int, float, bool, str):
            continue
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        ok = ok or (want is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise SpecError(f"strategy {name}: option {key} expects {want.__name__} "
                            f"(default {param.default!r}), got {type(value).__name__} {value!r}")

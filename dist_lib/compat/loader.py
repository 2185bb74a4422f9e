"""Load a puzzles or course-lab strategy file unchanged and run it: `run_file(...) -> Result`.

Both APIs are imported as `from lib import ...` (the lab also `from utils import ...`, the puzzles
`from drawing import ...`); `api_modules` points those names at the compatible modules while the file
loads and runs, and restores whatever they were before.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import inspect
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dist_lib.engine.waits import HangWatch, interrupt_at_once, user_frame
from dist_lib.run.file_import import beside, import_hint
from dist_lib.errors import IncorrectStepError, SimulationError, SpecError, StrategyError
from dist_lib.output.result import Result
from dist_lib.hardware.cluster import MAX_WORLD_SIZE
from dist_lib.specs import whole
from dist_lib.workload.transformer import FIELD_RANGES, MAX_GLOBAL_BATCH
from dist_lib.compat import _runtime
from dist_lib.compat._program import FILE_MODULE
from dist_lib.compat._base import build_result
from dist_lib.compat._base import problems
from dist_lib.compat.notebook import Notebook, definitions, is_notebook, read_notebook, unimported, where_in

# The puzzles' set-ups by the notebook's function names: (ranks, layers, batches).
PUZZLE_SETUPS = {"basic": (1, 2, 4), "grad_accum": (1, 2, 4), "ddp": (4, 2, 4), "wsdp": (4, 6, 4),
                 "fsdp": (4, 6, 4), "pipeline": (4, 8, 4), "gpipe": (4, 8, 4), "pipeline_fsdp": (16, 4, 4)}
LAB_FUNCTIONS = ("train_ddp", "part1_training_loop", "part2_training_loop", "part3_training_loop",
                 "part4_training_loop")
LAB_DEFAULT = (4, 4, 16)  # the lab's example harness: world size, layers, global batch size

_LAB_MARKS = (r"\bfrom\s+utils\s+import", r"\bimport\s+utils\b", r"get_input_activation", r"\.all_reduce\(",
              r"\.all_gather\(", r"\.reduce_scatter\(", r"\.num_layers\b", r"\.global_batch_size\b",
              r"\bget_training_stats\b", r"\.send\(")
_PUZZLE_MARKS = (r"\bfrom\s+drawing\s+import", r"\.get_activation\(", r"\.allreduce\(", r"\.allgather\(",
                 r"\.scatterreduce\(", r"\.pass_to\(", r"\.LAYERS\b", r"\.BATCHES\b", r"\.RANKS\b",
                 r"fake_grad")


def detect_api(source: str) -> str | None:
    """'puzzles' or 'lab' from what a file's text uses, or None when it uses neither."""
    lab = sum(bool(re.search(p, source)) for p in _LAB_MARKS)
    puzzles = sum(bool(re.search(p, source)) for p in _PUZZLE_MARKS)
    if lab == puzzles == 0:
        return "puzzles" if re.search(r"^\s*(from\s+lib\s+import|import\s+lib\b)", source, re.M) else None
    return "lab" if lab > puzzles else "puzzles"


@contextlib.contextmanager
def api_modules(api: str) -> Iterator[types.ModuleType]:
    """Make `import lib` (and `utils` / `drawing`, and `chalk` if it is not installed) resolve to the
    compatible modules of `api` inside the block."""
    from dist_lib.compat import drawing
    from dist_lib.compat import lab
    from dist_lib.compat import lab_utils
    from dist_lib.compat import puzzles
    module = {"puzzles": puzzles, "lab": lab}.get(api)
    if module is None:
        raise SpecError(f"api must be 'puzzles' or 'lab', got {api!r}")
    names = {"lib": module, "drawing": drawing}
    if api == "lab":
        names["utils"] = lab_utils
    if importlib.util.find_spec("chalk") is None:
        stub = types.ModuleType("chalk")
        stub.__getattr__ = lambda name: (lambda *a, **k: None)  # type: ignore[attr-defined]
        names["chalk"] = stub
    with modules_as(names):
        yield module


# the compatible modules by the names a file imports them as, for the texts of its errors
_IMPORTED_AS = {"dist_lib.compat.puzzles": "lib", "dist_lib.compat.lab": "lib", "dist_lib.compat.lab_utils": "utils",
                "dist_lib.compat.drawing": "drawing"}


def _said(error: BaseException) -> str:
    """`Type: text` of an error a user's file raised, a compatible module named as the file imports it
    (`cannot import name 'X' from 'lib'`, as with the original, not from this project's module)."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, ImportError):
        text = re.sub(r"from '(dist_lib\.compat\.\w+)' \([^()]*\)",
                      lambda found: f"from {_IMPORTED_AS.get(found[1], found[1])!r}", text)
    return text


@contextlib.contextmanager
def modules_as(names: dict[str, types.ModuleType]) -> Iterator[None]:
    """Inside the block, `import NAME` gives `names[NAME]`; whatever was there before comes back after."""
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update(names)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def run_file(path: str | Path, api: str | None = None, function: str | None = None, *,
             timing: str | None = None, cluster: Any = None, workload: Any = None, ranks: int | None = None,
             layers: int | None = None, batches: int | None = None, options: dict[str, Any] | None = None,
             check: bool = True, global_batch_size: int | None = None, enforce_memory: bool = True,
             main: bool | None = None, strict: bool = False, exact_memory: bool = False,
             on_world: Any = None, **more_options: Any) -> Result:
    """Run a puzzles or lab strategy file unchanged and return its `ToyResult` (a dist_lib `Result`).

    api: 'puzzles', 'lab', or None to detect it from the file's text.
    function: the training function to run on every rank (`async def f(model, **options)`, or a plain
    function for the one-rank puzzles 0 and 1), with the set-up `ranks`, `layers`, `batches`.
    main: True runs the file's own `main()` (its world size, layers and batch) and reports the models
    of the last `Dist` it created; False never does; None (default) runs `main()` when the file has
    one and no function or set-up is named, else a lone known function (the puzzles' names, the lab's
    `partN_training_loop` / `train_ddp`).
    A notebook (an `.ipynb`, or a `.py` exported or saved by jupytext as one; `notebook.py`) runs its
    cells in order where a file would run `main()` (their top-level `await`s awaited; a lone known
    function if they make no models), and a named function on its cells' definitions alone.
    timing: 'original' (default: the original library's cost model, the puzzles' unit steps or the
    lab's calculon-style seconds; 'unit' is the same) or 'real' (this simulator's costs on `cluster`).
    cluster, workload: dist_lib specs or objects for real timing (default: H100s, the API's shape).
    ranks, layers, batches: the set-up (defaults: the puzzle's own set-up by function name; lab 4, 4, 16).
    options: extra keyword arguments for the training function (lab: `batch_size`, default 2 when needed).
    check: raise `IncorrectStepError` when the final weights are not one correct step; otherwise it is
    reported in `result.correct` / `result.problems`.
    strict: warn where the original accepts something suspicious (a sample counted twice in a sum).
    exact_memory: sum every stored tensor at every event, as the originals (`Settings.exact_memory`):
    slower on files that store many tensors per rank, and exact whatever a file does to its storage.
    global_batch_size: the lab's global batch (same as `batches`); ignored for the puzzles, whose
    set-ups fix their batches. enforce_memory: accepted for symmetry with `simulate` (the toy APIs
    have no capacity limit). on_world: called with the `World` whose models the result reports, the
    function's name and the options, before the result is built (`recording.py` reads its models there). Other
    keywords join `options`.
    With timing=None, a file given a cluster or workload runs in 'real' timing.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_file() runs its own event loop; call it outside a running loop")
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"strategy file {path}: not found")
    source = None if path.suffix == ".ipynb" else path.read_text()
    notebook = read_notebook(path, source) if is_notebook(path, source) else None
    if notebook is not None:
        source = notebook.source
    api = api or detect_api(source)
    if api not in ("puzzles", "lab"):
        raise SpecError(f"{path}: cannot tell which API it uses; pass api='puzzles' or api='lab'")
    options = {**(options or {}), **more_options}
    if main and function is not None:
        raise SpecError(f"{path}: main=True runs the file's main(), which ignores function={function!r}; give one")
    batches, timing = run_settings(api, batches, global_batch_size, timing, cluster, workload)
    for name, value, most in (("ranks", ranks, MAX_WORLD_SIZE), ("layers", layers, FIELD_RANGES["num_layers"][1]),
                              ("batches", batches, MAX_GLOBAL_BATCH)):
        if value is not None:  # not a default in disguise: 0 is an error, not "the puzzle's own set-up"
            whole(value, f"{path}: {name}", 1, most, exact=True)
    with api_modules(api) as lib, _runtime.configure(api, timing=timing, cluster=cluster, workload=workload,
                                                     strict=strict, exact_memory=exact_memory or None):
        module = _load(path) if notebook is None else _notebook_module(path)
        use_main = main if main is not None else (
            function is None and ranks is None and layers is None and batches is None
            and (notebook is not None or callable(getattr(module, "main", None))))
        if notebook is not None and not use_main:
            _run_definitions(notebook, module)
        fn_name = None if use_main else function or _pick_function(module, api)
        before = _runtime.World.created
        try:
            if fn_name is None and notebook is not None:
                world = _run_cells(notebook, module, before)
                fn_name = "notebook"
                if world is None and main is None and _pick_function(module, api) is not None:
                    fn_name = _pick_function(module, api)  # cells that only define: their lone known function
                    world = _run_function(lib, api, getattr(module, fn_name), fn_name, ranks, layers, batches,
                                          options)
                elif world is None:
                    raise SpecError(f"{path}: its cells created no models; name the function to grade (--function)")
            elif fn_name is None:
                world = _run_main(module, path, before)
                fn_name = "main"
            else:
                fn = getattr(module, fn_name, None)
                if not callable(fn):
                    raise SpecError(f"{path}: no function {fn_name!r}")
                world = _run_function(lib, api, fn, fn_name, ranks, layers, batches, options)
        except SpecError:
            raise
        except SimulationError as error:
            raise _in_cells(_with_cause(_located(error, path), error), notebook) from error
        except Exception as error:
            raise _in_cells(_with_cause(StrategyError(f"{path.name}: {_said(error)}"
                                                      f"{user_frame(error)}"), error), notebook) from error
        if on_world is not None:
            on_world(world, fn_name, options)
        models = sorted({m.rank: m for m in world.models}.values(), key=lambda m: m.rank)
        found = problems(models)
    result = build_result(world, f"{path.stem}.{fn_name}", found, options)
    if found and check:
        raise IncorrectStepError(f"{path.stem}.{fn_name}: not a correct training step:\n  " + "\n  ".join(found))
    return result


def _run_main(module: types.ModuleType, path: Path, before: int) -> Any:
    main = getattr(module, "main", None)
    if not callable(main):
        raise SpecError(f"{path}: name the training function to run (no known one and no main())")
    out = main()
    if inspect.isawaitable(out):
        with interrupt_at_once():
            asyncio.run(_unless_hung(out, lambda: next((w for w in reversed(_runtime.WORLDS) if w.serial > before), None)))
    worlds = [w for w in _runtime.WORLDS if w.serial > before and w.models]
    if not worlds:
        raise SpecError(f"{path}: main() created no models")
    return worlds[-1]


def _located(error: SimulationError, path: Path) -> SimulationError:
    """The same error with the file and the line in it where it arose."""
    first, _, rest = str(error).partition("\n")
    return type(error)(f"{path.name}: {first}{user_frame(error)}" + (f"\n{rest}" if rest else ""))


async def _unless_hung(awaitable: Any, world: Any) -> Any:
    """Await the ranks' work; if they wait on something of asyncio's that nothing will ever complete (an
    `asyncio.Event` no rank sets), stop it and raise `CompatDeadlockError` naming each rank's wait, where
    the original API would hang. `world()` is the ranks' `World`, or None if none was made."""
    task = asyncio.ensure_future(awaitable)
    report: list[str] = []

    def hung() -> None:
        report.append(_describe_hang(world()))
        task.cancel()

    watch = HangWatch(hung)
    try:
        return await task
    except asyncio.CancelledError:
        if report:
            raise _runtime.CompatDeadlockError(report[0]) from None
        raise
    finally:
        watch.cancel()


def _describe_hang(world: Any) -> str:
    headline = ("deadlock: the ranks wait on something of asyncio's that nothing will ever complete (an "
                "asyncio.Event no rank sets, a queue no rank fills...); the original API would hang here")
    return world.describe_waits(headline) if world is not None else headline


def _with_cause(error: SimulationError, cause: BaseException) -> SimulationError:
    error.__cause__ = cause
    return error


def _notebook_module(path: Path) -> types.ModuleType:
    """The namespace a notebook's cells run in, as IPython's: named `__main__`."""
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    return module


def _in_cells(error: SimulationError, notebook: Notebook | None) -> SimulationError:
    """A notebook's error with its locations as "NAME, cell N, line L"."""
    if notebook is None:
        return error
    text = notebook.locate(str(error))
    cell = getattr(error.__cause__, "_compat_cell", None)
    if cell:  # (cell 0, a script's code outside cells, is named by its file line)
        first, _, rest = text.partition("\n")
        text = f"{first}; cell {cell} was running" + (f"\n{rest}" if rest else "")
    return error if text == str(error) else type(error)(text)


def _run_definitions(notebook: Notebook, module: types.ModuleType) -> None:
    """Each cell's imports, definitions and plain assignments (`notebook.definitions`), in cell order: what
    a named function needs, without the cells' own tests.
    An import that fails here (Colab's `google.colab`, a package not installed) binds placeholders that
    raise when used (`notebook.unimported`), so a function that does not need it runs as in the student's
    environment; an import of the API's own modules (`lib`, `utils`, `drawing`) must work."""
    for cell in notebook.cells:
        for stmt in definitions(cell.tree).body:  # one at a time, so a failed import can be told apart
            code = compile(ast.Module(body=[stmt], type_ignores=[]), cell.filename, "exec")
            try:
                exec(code, module.__dict__)
            except SimulationError as error:
                raise _in_cells(error, notebook) from error
            except ImportError as exc:
                where = where_in(notebook.path.name, cell.number, cell.first_line, stmt.lineno)
                names = unimported(stmt, where, exc)
                if names is None:
                    raise StrategyError(notebook.locate(f"{notebook.path.name}: running its definitions raised "
                                                        f"{_said(exc)}{user_frame(exc)}")) from exc
                module.__dict__.update(names)
            except Exception as exc:
                raise StrategyError(notebook.locate(f"{notebook.path.name}: running its definitions raised "
                                                    f"{_said(exc)}{user_frame(exc)}")) from exc


def _run_cells(notebook: Notebook, module: types.ModuleType, before: int) -> Any:
    """Every code cell in order in one event loop, as the notebook runs them (a cell's top-level `await`
    awaited); the `World` of the last `Dist` that made models, or None."""
    async def cells() -> None:
        for cell in notebook.cells:
            code = compile(cell.tree, cell.filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            try:
                if code.co_flags & inspect.CO_COROUTINE:
                    await eval(code, module.__dict__)
                else:
                    exec(code, module.__dict__)
            except Exception as exc:  # the cell that was running (the error may arise in an earlier cell's code)
                exc._compat_cell = cell.number  # type: ignore[attr-defined]
                raise

    with interrupt_at_once():
        asyncio.run(_unless_hung(cells(), lambda: next((w for w in reversed(_runtime.WORLDS) if w.serial > before),
                                                       None)))
    worlds = [w for w in _runtime.WORLDS if w.serial > before and w.models]
    return worlds[-1] if worlds else None


def _load(path: Path) -> types.ModuleType:
    name = f"{FILE_MODULE}{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"strategy file {path}: cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    try:
        with beside(path.resolve()):
            spec.loader.exec_module(module)
    except SimulationError:
        raise
    except Exception as exc:
        raise StrategyError(f"strategy file {path}: importing it raised {_said(exc)}"
                            f"{user_frame(exc)}{import_hint(exc)}") from exc
    return module


def _pick_function(module: types.ModuleType, api: str) -> str | None:
    known = PUZZLE_SETUPS if api == "puzzles" else LAB_FUNCTIONS
    present = [name for name in known if callable(getattr(module, name, None))]
    return present[0] if len(present) == 1 else None


def run_settings(api: str, batches: int | None, global_batch_size: int | None, timing: str | None,
                 cluster: Any, workload: Any) -> tuple[int | None, str | None]:
    """(batches, timing) of a run: a lab run's batches default to the global batch, and a run given a
    cluster or a workload is priced by them ("real") unless told otherwise."""
    if api == "lab" and batches is None:
        batches = global_batch_size
    if timing is None and (cluster is not None or workload is not None):
        timing = "real"
    return batches, timing


def function_setup(api: str, name: str, ranks: int | None, layers: int | None,
                   batches: int | None) -> tuple[int, int, int]:
    """(ranks, layers, batches) a named function runs on: the puzzle's own set-up (or the lab's), each
    unless given."""
    default = PUZZLE_SETUPS.get(name, (4, 4, 4)) if api == "puzzles" else LAB_DEFAULT
    return tuple(default[i] if given is None else given for i, given in enumerate((ranks, layers, batches)))


def _run_function(lib: types.ModuleType, api: str, fn: Any, name: str, ranks: int | None, layers: int | None,
                  batches: int | None, options: dict[str, Any]) -> Any:
    n, num_layers, batch = function_setup(api, name, ranks, layers, batches)
    params = inspect.signature(fn).parameters
    if api == "lab" and "batch_size" in params and "batch_size" not in options \
            and params["batch_size"].default is inspect.Parameter.empty:
        options["batch_size"] = 2 if batch % 2 == 0 else 1
    dist = lib.Dist(n)
    if api == "puzzles":
        models = [lib.Model(rank=r, dist=dist, layers=num_layers, batches=batch) for r in range(n)]
    else:
        models = [lib.Model(r, dist, num_layers, batch) for r in range(n)]
    if inspect.iscoroutinefunction(fn):
        async def all_ranks() -> None:
            try:
                await asyncio.gather(*[fn(m, **options) for m in models])
            except KeyboardInterrupt:
                # Ctrl-C in a rank's task: asyncio raised it out of the loop from that task already; this
                # is asyncio.run's shutdown running the gather once more, and raising it again would stop
                # that shutdown and leave tasks pending ("Task was destroyed but it is pending!")
                return
        with interrupt_at_once():
            asyncio.run(_unless_hung(all_ranks(), lambda: dist._world))
    else:
        if n != 1:
            raise SpecError(f"{name} is a plain function: it can only run on one rank, not {n}")
        fn(models[0], **options)
    return dist._world

"""Re-execute a recorded `--api puzzles|lab` program (`_program.py`, written by `recording.py`) on a fresh,
unpatched compat runtime: the trusted half of grading such a file.

The grader builds the program's `Dist` and models with their recorded set-up and runs one coroutine per
model that issues the model's entries in order: literals and in-place writes rebuild the tensors the
file met, storage changes rebuild its five dicts before each event reads them, and each op calls the
API's own method, so rendezvous, mailboxes, clocks, memory and the final check are the runtime's own.
A send waits for its recorded turn at its mailbox, so a mailbox that several ranks send to hands out
its messages in the recorded order. Nothing else the file did (patches, its clocks, its log) exists here.

The program is untrusted data: it is checked whole before anything runs (shape, opcodes, operand
counts, handles defined before use, bounded numbers), its tensor operands are checked to be of the kind
the op takes as they are bound, and a malformed one raises `ProgramError` naming the rank and entry. A
function the grader named (or one the loader would pick) must have run on that function's set-up. A
well-formed program the API rejects fails with the API's error. A deadline bounds the wall time.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

from dist_lib.errors import SimulationError, StrategyError
from dist_lib.run.replay import ProgramError, ReplayTimeout
from dist_lib.specs import shown
from dist_lib.workload.transformer import FIELD_RANGES, MAX_GLOBAL_BATCH
from dist_lib.compat._program import COLLECTIONS, DERIVED, FUNCTION_MODES, KIND, MAX_DEPTH, MAX_INT, MAX_ITEMS, MAX_MODELS, MAX_OUTPUTS, MAX_TEXT, OPS, SENDS, STORAGE, TENSORS, tensor_classes, tensors_in

MAX_RANKS = 128  # the Dist a program may claim (the lab's mailboxes grow as its square: 16,256 of them here)


def replay(program: Any, path: str | Path, api: str, function: str | None = None, *, timing: str | None = None,
           cluster: Any = None, workload: Any = None, global_batch_size: int | None = None,
           ranks: int | None = None, layers: int | None = None, batches: int | None = None, main: bool | None = None,
           deadline_s: float | None = None) -> Any:
    """The `ToyResult` of re-executing `program` for the file at `path`, priced as `loader.run_file` with
    the same arguments would (options['verified'] True); those arguments also say which function and set-up
    the program must have run. Raises `ProgramError` for a malformed program, `ReplayTimeout` past the
    deadline, `SimulationError` for one the API rejects."""
    from dist_lib.compat import _runtime
    from dist_lib.compat._base import build_result, problems
    from dist_lib.compat.loader import api_modules, run_settings
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    batches, timing = run_settings(api, batches, global_batch_size, timing, cluster, workload)
    n, models_spec = _checked(program, api, function, main, (ranks, layers, batches))
    with api_modules(api) as lib, _runtime.configure(api, timing=timing, cluster=cluster, workload=workload,
                                                     exact_memory=True):
        dist = lib.Dist(n)
        models = [lib.Model(rank, dist, count, size) for rank, count, size, _, _ in models_spec]
        repeated = Counter(spec[0] for spec in models_spec)
        names = [f"rank {spec[0]}" if repeated[spec[0]] == 1 else f"model {i} (rank {spec[0]})"
                 for i, spec in enumerate(models_spec)]
        runner = _Runner(api, dist, deadline)
        tables: list[list] = [[] for _ in models]

        async def everyone() -> None:
            await asyncio.gather(*[runner.run(m, spec[3], tables[i], names[i])
                                   for i, (m, spec) in enumerate(zip(models, models_spec))])
        try:
            asyncio.run(_within(everyone(), deadline))
        except (ProgramError, ReplayTimeout):
            raise
        except SimulationError:
            _check_deadline(deadline)
            raise
        for model, spec, table, name in zip(models, models_spec, tables, names):
            model.final_weights = {layer: runner.value(value, table, f"{name}, its final weights")
                                   for layer, value in spec[4]}
        found = problems(sorted({m.rank: m for m in dist._world.models}.values(), key=lambda m: m.rank))
        result = build_result(dist._world, f"{Path(path).stem}.{program['function']}", found, program["options"])
    _check_deadline(deadline)
    result.options.pop("unverified", None)
    result.options["verified"] = True
    return result


async def _within(work: Any, deadline: float | None) -> None:
    if deadline is None:
        return await work
    try:
        return await asyncio.wait_for(work, max(deadline - time.monotonic(), 0.0))
    except asyncio.TimeoutError:
        raise ReplayTimeout("the replay of the recorded program ran past its deadline") from None


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise ReplayTimeout("the replay of the recorded program ran past its deadline")


class _Runner:
    """Runs each model's entries; holds the mailboxes' turns."""

    def __init__(self, api: str, dist: Any, deadline: float | None):
        self.api, self.world, self.deadline = api, dist._world, deadline
        self.classes = tensor_classes(api)
        self.ops = OPS[api]
        self.puts: dict[Any, int] = {}
        self.waiting: dict[Any, list] = {}

    async def run(self, model: Any, entries: list, table: list, who: str) -> None:
        if isinstance(model.rank, int) and 0 <= model.rank < self.world.n:
            self.world.enter(model.rank)  # (so the runtime counts this model's rank finished when it is)
        for j, entry in enumerate(entries):
            _check_deadline(self.deadline)  # (every entry: one op can be slow, an update over 2**20 batches)
            where = f"{who}, entry {j}"
            kind = entry[0]
            if kind == "lit":
                table.append(self.classes[entry[1]](*[self.value(v, table, where) for v in entry[2]]))
            elif kind == "set":
                tensor = table[entry[1]]
                if len(entry[2]) != len(fields(tensor)):
                    raise ProgramError(f"{where}: {len(entry[2])} field values for a {type(tensor).__name__}, which "
                                       f"has {len(fields(tensor))}")
                for f, v in zip(fields(tensor), entry[2]):
                    setattr(tensor, f.name, self.value(v, table, where))
            elif kind == "call":
                table.append(self.derived(entry, table, where))
            elif kind == "mem":
                self.storage(model, entry[1], table, where)
            else:
                await self.op(model, entry, table, where)

    def derived(self, entry: list, table: list, where: str) -> Any:
        """The tensor a file made with `+`, `combine` or `shard` of another."""
        _, method, handle, encoded = entry
        tensor, where = table[handle], f"{where} ({method})"
        if type(tensor) not in self.classes or not callable(getattr(tensor, method, None)):
            raise ProgramError(f"{where}: handle {handle} is a {type(tensor).__name__}, which has no {method}")
        try:
            out = getattr(tensor, method)(*[self.value(v, table, where) for v in encoded])
        except (ProgramError, ReplayTimeout):
            raise
        except SimulationError as exc:
            raise type(exc)(f"{where}: {exc}") from exc
        except Exception as exc:
            raise StrategyError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if type(out) not in self.classes:
            raise ProgramError(f"{where}: made a {type(out).__name__}, not a tensor")
        return out

    def value(self, encoded: Any, table: list, where: str) -> Any:
        if not isinstance(encoded, list):
            return encoded
        tag = encoded[0]
        if tag == "h":
            return table[encoded[1]]
        if tag in ("f", "s"):
            return encoded[1]
        if tag == "r":
            return range(*[self.value(v, table, where) for v in encoded[1:]])
        items = [self.value(v, table, where) for v in encoded[1]]
        try:
            return COLLECTIONS[tag](items)
        except TypeError as exc:
            raise ProgramError(f"{where}: a {COLLECTIONS[tag].__name__} of unhashable values ({exc})") from None

    def storage(self, model: Any, changes: list, table: list, where: str) -> None:
        for i, deleted, replaced, appended in changes:
            store = getattr(model, STORAGE[i])
            for key in deleted:
                if key not in store:
                    raise ProgramError(f"{where}: deletes key {key} from {STORAGE[i]}, which does not hold it")
                del store[key]
            for key, value in replaced:
                if key not in store:
                    raise ProgramError(f"{where}: replaces key {key} of {STORAGE[i]}, which does not hold it")
                store[key] = self.value(value, table, where)
            for key, value in appended:
                if key in store:
                    raise ProgramError(f"{where}: appends key {key} to {STORAGE[i]}, which holds it already")
                store[key] = self.value(value, table, where)

    async def op(self, model: Any, entry: list, table: list, where: str) -> None:
        _, name, encoded, outputs, turn = entry
        where = f"{where} ({name})"
        params, _, coroutine = self.ops[name]
        args = [self.value(v, table, where) for v in encoded]
        for k, (kind, arg) in enumerate(zip(params, args)):
            if kind in KIND and type(arg) is not self.classes[TENSORS.index(KIND[kind])]:
                raise ProgramError(f"{where}: argument {k + 1} is a {type(arg).__name__}, not the "
                                   f"{KIND[kind]} the op takes")
        mailbox = None
        if name in SENDS and turn is not None and type(args[0]) is int:
            mailbox = (args[0],) if self.api == "puzzles" else (model.rank, args[0])
            await self.turn(model, mailbox, turn, where)
        try:
            out = getattr(model, name)(*args)
            if coroutine:
                out = await out
        except Exception as exc:
            if outputs == -1:  # it raised in the recorded run too, where the file caught it
                return
            if isinstance(exc, (ProgramError, ReplayTimeout)):
                raise
            if isinstance(exc, SimulationError):
                raise type(exc)(f"{where}: {exc}") from exc
            raise StrategyError(f"{where}: {type(exc).__name__}: {exc}") from exc
        finally:
            if mailbox is not None:
                self.passed(mailbox)
        if outputs == -1:
            return
        made = tensors_in(out, self.classes)
        if len(made) != outputs:
            raise ProgramError(f"{where}: the program says its result holds {outputs} tensors; it holds {len(made)}")
        table.extend(made)

    async def turn(self, model: Any, mailbox: tuple, turn: int, where: str) -> None:
        """Wait until `turn` puts into `mailbox` are done (as a runtime wait, so a deadlock is reported)."""
        while self.puts.get(mailbox, 0) < turn:
            future = asyncio.get_running_loop().create_future()
            self.waiting.setdefault(mailbox, []).append((model.rank, future))
            await self.world.block(model.rank, future, lambda: f"{where}: its turn #{turn} at its mailbox "
                                                               f"(after {self.puts.get(mailbox, 0)} puts)")

    def passed(self, mailbox: tuple) -> None:
        self.puts[mailbox] = self.puts.get(mailbox, 0) + 1
        for rank, future in self.waiting.pop(mailbox, []):
            self.world.wake(rank, future)


# ---- checking the program whole, before anything runs --------------------------------------------------

def _checked(program: Any, api: str, function: str | None, main: bool | None, setup: tuple) -> tuple[int, list]:
    """(ranks, models) of a well-formed program that ran what `loader.run_file` runs with `function`, `main`
    and `setup` (ranks, layers, batches, each None for the default); `ProgramError` names the first thing
    out of shape."""
    from dist_lib.compat.loader import LAB_FUNCTIONS, PUZZLE_SETUPS, function_setup
    if not isinstance(program, dict):
        raise ProgramError(f"the program: expected an object, got {type(program).__name__}")
    for key in ("api", "function", "options", "ranks", "models"):
        if key not in program:
            raise ProgramError(f"the program: {key} missing")
    if program["api"] != api:
        raise ProgramError(f"the program is of the {shown(program['api'])} API, not {api}")
    fn = program["function"]
    known = PUZZLE_SETUPS if api == "puzzles" else LAB_FUNCTIONS
    if main:
        allowed: tuple = FUNCTION_MODES
    elif function is not None:
        allowed = (function,)
    else:
        allowed = FUNCTION_MODES + tuple(known) if main is None else tuple(known)
    if fn not in allowed:
        raise ProgramError(f"the program ran {shown(fn)}, not {' or '.join(allowed)}")
    options = program["options"]
    if not isinstance(options, dict) or len(options) > 64 or not all(
            isinstance(k, str) and len(k) <= MAX_TEXT and k.isprintable() and _plain(v) for k, v in options.items()):
        raise ProgramError("options: expected up to 64 names of numbers, true/false or printable text")
    n = _int(program["ranks"], "ranks", 1, MAX_RANKS)
    specs = program["models"]
    if not isinstance(specs, list) or not 1 <= len(specs) <= MAX_MODELS:
        raise ProgramError(f"models: expected a list of 1 to {MAX_MODELS} models")
    if fn not in FUNCTION_MODES:  # a named function runs on its set-up (loader._run_function)
        ranks, layers, batches = function_setup(api, fn, *setup)
        expected = [[r, layers, batches] for r in range(ranks)]
        got = [spec[:3] if isinstance(spec, list) else spec for spec in specs]
        if n != ranks or got != expected:
            raise ProgramError(f"{fn} runs on {ranks} ranks of {layers} layers and {batches} batches, one model "
                               f"each; the program's set-up differs")
    classes = tensor_classes(api)
    repeated = Counter(spec[0] for spec in specs if isinstance(spec, list) and spec and type(spec[0]) is int)
    checked = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, list) or len(spec) != 5:
            raise ProgramError(f"models[{i}]: expected [rank, layers, batches, entries, final]")
        rank = _int(spec[0], f"models[{i}] rank", -MAX_INT, MAX_INT)
        layers = _int(spec[1], f"models[{i}] layers", 0, FIELD_RANGES["num_layers"][1])
        batches = _int(spec[2], f"models[{i}] batches", 0, MAX_GLOBAL_BATCH)
        who = f"rank {rank}" if repeated[rank] == 1 else f"model {i} (rank {rank})"
        defined = _entries(spec[3], who, api, classes)
        final = spec[4]
        if not isinstance(final, list) or not all(
                isinstance(p, list) and len(p) == 2 and type(p[0]) is int and 0 <= p[0] < layers for p in final):
            raise ProgramError(f"{who}, final weights: expected [layer, value] pairs of layers 0 to {layers - 1}")
        for layer, value in final:
            _value(value, defined, f"{who}, final weight of layer {layer}")
        checked.append((rank, layers, batches, spec[3], final))
    return n, checked


def _entries(entries: Any, who: str, api: str, classes: tuple) -> int:
    """Check a model's entries; the number of handles they define."""
    if not isinstance(entries, list):
        raise ProgramError(f"{who}: expected a list of entries")
    defined = 0
    for j, entry in enumerate(entries):
        where = f"{who}, entry {j}"
        if not isinstance(entry, list) or not entry:
            raise ProgramError(f"{where}: expected a non-empty list")
        kind = entry[0]
        if kind in ("lit", "set") and len(entry) == 3:
            if kind == "lit":
                _int(entry[1], f"{where} (class)", 0, len(classes) - 1)
                count = len(fields(classes[entry[1]]))
            else:
                _int(entry[1], f"{where} (handle)", 0, defined - 1) if defined else _undefined(where, entry[1])
                count = None
            if not isinstance(entry[2], list) or (count is not None and len(entry[2]) != count):
                raise ProgramError(f"{where}: expected a list of {count or 'the'} field values")
            for v in entry[2]:
                _value(v, defined, where)
            defined += kind == "lit"
        elif kind == "call" and len(entry) == 4:
            if entry[1] not in DERIVED:
                raise ProgramError(f"{where}: {shown(entry[1])} is not one of {', '.join(DERIVED)}")
            _value(["h", entry[2]], defined, f"{where} ({entry[1]})")
            if not isinstance(entry[3], list) or len(entry[3]) > 2:
                raise ProgramError(f"{where} ({entry[1]}): expected a list of up to 2 arguments")
            for v in entry[3]:
                _value(v, defined, f"{where} ({entry[1]})")
            defined += 1
        elif kind == "mem" and len(entry) == 2 and isinstance(entry[1], list):
            for change in entry[1]:
                if not (isinstance(change, list) and len(change) == 4 and all(isinstance(c, list) for c in change[1:])):
                    raise ProgramError(f"{where}: expected [storage, deleted, replaced, appended] changes")
                _int(change[0], f"{where} (storage)", 0, len(STORAGE) - 1)
                for key in change[1]:
                    _int(key, f"{where} (key)", 0, MAX_INT)
                for pair in change[2] + change[3]:
                    if not isinstance(pair, list) or len(pair) != 2:
                        raise ProgramError(f"{where}: expected [key, value] pairs")
                    _int(pair[0], f"{where} (key)", 0, MAX_INT)
                    _value(pair[1], defined, where)
        elif kind == "op" and len(entry) == 5:
            _, name, args, outputs, turn = entry
            if not isinstance(name, str) or name not in OPS[api]:
                raise ProgramError(f"{where}: {shown(name)} is not an op of the {api} API's Model")
            params, optional, _ = OPS[api][name]
            if not isinstance(args, list) or not len(params) - optional <= len(args) <= len(params):
                count = f"{len(params) - optional} to {len(params)}" if optional else str(len(params))
                raise ProgramError(f"{where} ({name}): expected {count} argument{'s' * (len(params) != 1)}")
            for k, (param, arg) in enumerate(zip(params, args)):
                if param in KIND and not (isinstance(arg, list) and arg[:1] == ["h"]):
                    raise ProgramError(f"{where} ({name}): argument {k + 1} must be a handle (of a {KIND[param]})")
                _value(arg, defined, f"{where} ({name})")
            _int(outputs, f"{where} ({name}) outputs", -1, MAX_OUTPUTS)
            if turn is not None:
                _int(turn, f"{where} ({name}) turn", 0, MAX_INT)
            defined += max(outputs, 0)
        else:
            raise ProgramError(f"{where}: {shown(kind)} is not an entry of a program (lit, call, set, mem, op) "
                               f"of its shape")
    return defined


def _value(encoded: Any, defined: int, where: str, depth: int = 0) -> None:
    if encoded is None or isinstance(encoded, bool):
        return
    if type(encoded) is int:
        if abs(encoded) >= MAX_INT:
            raise ProgramError(f"{where}: the number {encoded} is out of range")
        return
    if not isinstance(encoded, list) or not encoded or depth > MAX_DEPTH:
        raise ProgramError(f"{where}: {shown(encoded)} is not a program value")
    tag, rest = encoded[0], encoded[1:]
    if tag == "h" and len(rest) == 1 and type(rest[0]) is int:
        if not 0 <= rest[0] < defined:
            _undefined(where, rest[0])
    elif len(rest) == 1 and ((tag == "f" and type(rest[0]) is float and abs(rest[0]) < float("inf"))
                             or (tag == "s" and isinstance(rest[0], str) and len(rest[0]) <= MAX_TEXT)):
        pass
    elif tag == "r" and len(rest) == 3 and all(type(v) is int and abs(v) < MAX_INT for v in rest) and rest[2] != 0 \
            and len(range(*rest)) <= MAX_ITEMS:
        pass
    elif tag in COLLECTIONS and len(rest) == 1 and isinstance(rest[0], list) and len(rest[0]) <= MAX_ITEMS:
        for item in rest[0]:
            _value(item, defined, where, depth + 1)
    else:
        raise ProgramError(f"{where}: {shown(encoded)} is not a program value")


def _undefined(where: str, handle: Any) -> None:
    raise ProgramError(f"{where}: handle {shown(handle)} is used before it is defined")


def _int(value: Any, where: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ProgramError(f"{where}: expected a whole number from {low} to {high}, got {shown(value)}")
    return value


def _plain(value: Any) -> bool:
    return value is None or type(value) in (bool, int) or (type(value) is float and abs(value) < float("inf")) or (
        isinstance(value, str) and len(value) <= MAX_TEXT and value.isprintable())



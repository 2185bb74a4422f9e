"""Record what a `--api puzzles|lab` file asks of the toy API, as a program (`_program.py`) the grader
re-executes (`replay.py`): the untrusted half of grading such a file, run in the sandboxed worker.

`record_file` runs the file as `loader.run_file` does, with the API's `Model` ops wrapped: each call of
a model of the graded `Dist` is written to that model's entries, its toy tensors as handles; each event
adds how the model's storage dicts changed since its previous event, read with `dict`'s own methods at
the moment the event reads its memory (`ToyModel._event_hook`), so whatever the file did to them
(`dict.__setitem__` included) is what the program holds; a toy tensor whose fields were written in place
is written again (`set`) before the model next uses it. Nothing the file does to the API's classes or to
a model's attributes (`time`, `log`, `check`) reaches the program: the replay runs the unpatched API.

What a program cannot say, the run reports as today (`record_file` returns the reason): a value that is
not plain data or one of the API's own tensor classes (a file's own class stored or sent), a model that
starts an op while another of its ops is pending (concurrent ops of one model share its clock in an
order only that run's interleaving fixes), or a collective or mailbox used through the `Dist` itself.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from . import _runtime
from ._base import ToyModel
from ._program import (MAX_DEPTH, MAX_INT, MAX_ITEMS, MAX_OUTPUTS, MAX_TEXT, OPS, SENDS, STORAGE,
                       TAG_OF, tensor_classes, tensors_in)

_INSIDE = contextvars.ContextVar("compat_recording_inside", default=False)  # in a recorded op (per task)


class Unreplayable(Exception):
    """Something the program cannot say; the message says what."""


class _ModelRecord:
    """One model's entries, its handle table (id -> [handle, version, object]) and last storage snapshot."""

    def __init__(self, model: Any, rank: Any, layers: Any, batches: Any):
        self.model, self.setup = model, (rank, layers, batches)
        self.entries: list[list] = []
        self.table: dict[int, list] = {}
        self.handles = 0
        self.keys: list[dict] = [{} for _ in STORAGE]  # the file's keys -> numbers, per storage dict
        self.key_objects: list[list] = [[] for _ in STORAGE]  # (kept alive, so their ids stay theirs)
        self.snapshot: list[list] = [[] for _ in STORAGE]  # [(key number, value object)] in dict order
        self.epoch = 0  # the recorder's mutation count when this model last synced its tensors
        self.busy: str | None = None  # the pending op's name


class Recorder:
    """Wraps the API while active; `program()` is the result."""

    def __init__(self, api: str):
        self.api = api
        self.classes = tensor_classes(api)
        self.models: dict[int, _ModelRecord] = {}
        self.reason: str | None = None
        self.known: set[int] = set()  # ids of tensors some table holds (a write to one bumps its version)
        self.versions: dict[int, int] = {}
        self.epoch = 0
        self.puts: dict[int, int] = {}  # id(mailbox) -> puts completed
        self.last_put = -1
        self.world: Any = None
        self.function = ""
        self.options: dict[str, Any] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    # ---- what cannot be recorded
    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def active(self) -> bool:
        return self.reason is None and not _INSIDE.get()

    # ---- values
    def encode(self, record: _ModelRecord, value: Any, depth: int = 0) -> Any:
        """`value` as a program value for `record`'s model; its toy tensors become handles (defined here
        as literals when the model has not met them, written again when changed since it last did)."""
        kind = type(value)
        if value is None or kind is bool:
            return value
        if kind is int:
            if abs(value) >= MAX_INT:
                raise Unreplayable(f"the whole number {value} is too large for a program")
            return value
        if kind in self.classes:
            return ["h", self.handle(record, value)]
        if kind is float:
            if not math.isfinite(value):
                raise Unreplayable(f"the value {value} is not a finite number")
            return ["f", value]
        if kind is str:
            if len(value) > MAX_TEXT:
                raise Unreplayable(f"a string of {len(value)} characters (a program holds up to {MAX_TEXT})")
            return ["s", value]
        if kind is range:
            return ["r", self.encode(record, value.start), self.encode(record, value.stop),
                    self.encode(record, value.step)]
        tag = TAG_OF.get(kind)
        if tag is None:
            raise Unreplayable(f"a {kind.__module__}.{kind.__qualname__} is neither plain data nor a tensor of "
                               f"the {self.api} API")
        if depth >= MAX_DEPTH or len(value) > MAX_ITEMS:
            raise Unreplayable(f"a {kind.__name__} nested {MAX_DEPTH} deep or of over {MAX_ITEMS} items")
        items = sorted(value) if kind in (frozenset, set) and all(type(v) is int for v in value) else value
        return [tag, [self.encode(record, item, depth + 1) for item in items]]

    def handle(self, record: _ModelRecord, tensor: Any) -> int:
        entry = record.table.get(id(tensor))
        if entry is None or entry[2] is not tensor:
            entry = self.define(record, tensor)
            record.entries.append(["lit", self.classes.index(type(tensor)), self.fields(record, tensor)])
        elif self.versions.get(id(tensor), 0) != entry[1]:
            entry[1] = self.versions.get(id(tensor), 0)
            record.entries.append(["set", entry[0], self.fields(record, tensor)])
        return entry[0]

    def fields(self, record: _ModelRecord, tensor: Any) -> list:
        return [self.encode(record, getattr(tensor, f.name), 1) for f in fields(tensor)]

    def define(self, record: _ModelRecord, tensor: Any) -> list:
        entry = record.table[id(tensor)] = [record.handles, self.versions.get(id(tensor), 0), tensor]
        record.handles += 1
        self.known.add(id(tensor))
        return entry

    def touched(self, tensor: Any) -> None:
        """A field of `tensor` was written: a model that meets it again writes it again."""
        if id(tensor) in self.known:
            self.versions[id(tensor)] = self.versions.get(id(tensor), 0) + 1
            self.epoch += 1

    # ---- storage, at each event
    def on_event(self, model: Any) -> None:
        record = self.models.get(id(model))
        if record is None or record.model is not model or self.reason is not None:
            return
        try:
            changes = [change for i, name in enumerate(STORAGE) if (change := self._changed(record, i, name))]
            if changes:
                record.entries.append(["mem", changes])
        except Unreplayable as exc:
            self.stop(f"rank {record.setup[0]}'s storage: {exc}")

    def _changed(self, record: _ModelRecord, i: int, name: str) -> list | None:
        store = getattr(record.model, name)
        if not isinstance(store, dict):
            raise Unreplayable(f"model.{name} is a {type(store).__name__}, not a dict")
        before = record.snapshot[i]
        now = list(dict.items(store))
        synced = record.epoch == self.epoch
        if synced and len(now) == len(before) and all(k is b[2] and v is b[1] for (k, v), b in zip(now, before)):
            return None
        keys, objects = record.keys[i], record.key_objects[i]
        current = []
        for key, value in now:
            number = keys.get(key)
            if number is None:
                number = keys[key] = len(objects)
                objects.append(key)
            current.append((number, value, key))
        # the new order is the survivors of the old in their order, then what was inserted since
        old_at = {number: at for at, (number, _, _) in enumerate(before)}
        survivors, last = 0, -1
        while survivors < len(current) and old_at.get(current[survivors][0], -1) > last:
            last = old_at[current[survivors][0]]
            survivors += 1
        kept = {number for number, _, _ in current[:survivors]}
        old_values = {number: value for number, value, _ in before}
        deleted = [number for number, _, _ in before if number not in kept]
        replaced = []
        for number, value, _ in current[:survivors]:
            was = old_values[number]
            if value is not was or (type(value) in self.classes and self._stale(record, value)):
                replaced.append([number, self.encode(record, value)])
        appended = [[number, self.encode(record, value)] for number, value, _ in current[survivors:]]
        record.snapshot[i] = current
        record.epoch = self.epoch if i == len(STORAGE) - 1 else record.epoch
        return [i, deleted, replaced, appended] if deleted or replaced or appended else None

    def _stale(self, record: _ModelRecord, tensor: Any) -> bool:
        entry = record.table.get(id(tensor))
        return entry is not None and self.versions.get(id(tensor), 0) != entry[1]

    # ---- ops
    def call(self, name: str, model: Any, args: tuple) -> tuple[_ModelRecord, list] | None:
        """The model's record and the op's encoded arguments, or None when the call is not recorded."""
        record = self.models.get(id(model))
        if record is None or record.model is not model:
            return None
        if record.busy is not None:
            self.stop(f"rank {record.setup[0]} called {name} while its {record.busy} was pending (a model's ops "
                      f"share its clock; the program runs them one at a time)")
            return None
        try:
            return record, [self.encode(record, a) for a in args]
        except Unreplayable as exc:
            self.stop(f"rank {record.setup[0]}, {name}: {exc}")
            return None

    def done(self, record: _ModelRecord, name: str, args: list, out: Any, raised: bool) -> None:
        outputs = [] if raised else tensors_in(out, self.classes)
        if len(outputs) > MAX_OUTPUTS:
            self.stop(f"rank {record.setup[0]}, {name}: a result of {len(outputs)} tensors")
            return
        for tensor in outputs:
            self.define(record, tensor)
        turn = self.last_put if name in SENDS and not raised else None
        record.entries.append(["op", name, args, -1 if raised else len(outputs), turn])

    # ---- set-up
    def setup(self, model: Any, rank: Any, layers: Any, batches: Any) -> None:
        self.models[id(model)] = _ModelRecord(model, rank, layers, batches)

    def graded(self, world: Any, function: str, options: dict[str, Any]) -> None:
        self.world, self.function, self.options = world, function, dict(options)

    def program(self) -> dict[str, Any]:
        """The program of the graded `Dist`'s models (call after the run)."""
        models = []
        for model in self.world.models:
            record = self.models.get(id(model))
            if record is None or record.model is not model:
                raise Unreplayable("a model of the graded Dist was made past Model()")
            rank, layers, batches = record.setup
            if not all(type(v) is int and abs(v) < MAX_INT for v in record.setup):
                raise Unreplayable(f"a model made with rank {rank!r}, layers {layers!r}, batches {batches!r}")
            final = model.final_weights
            if not isinstance(final, dict):
                raise Unreplayable(f"rank {rank}'s final_weights is a {type(final).__name__}, not a dict")
            pairs = [[layer, self.encode(record, final[layer])]
                     for layer in sorted(k for k in final if type(k) is int and 0 <= k < layers)]
            models.append([rank, layers, batches, record.entries, pairs])
        options = {k: v for k, v in self.options.items() if type(v) in (int, float, str, bool) or v is None}
        return {"api": self.api, "function": self.function, "options": options, "ranks": self.world.n,
                "models": models}

    # ---- the wrappers
    def install(self) -> None:
        from . import lab, puzzles
        module = puzzles if self.api == "puzzles" else lab
        for name, (params, optional, coroutine) in OPS[self.api].items():
            self._patch(module.Model, name, (_async_op if coroutine else _sync_op)(self, name, getattr(module.Model, name)))
        self._patch(ToyModel, "_event_hook", staticmethod(self.on_event))
        self._patch(ToyModel, "_setup", _setup(self, ToyModel._setup))
        self._patch(_runtime.World, "collective", _outside(self, _runtime.World.collective, "a collective"))
        self._patch(_runtime.Mailbox, "get", _outside(self, _runtime.Mailbox.get, "a mailbox's get"))
        self._patch(_runtime.Mailbox, "put", _put(self, _runtime.Mailbox.put))
        recorder = self

        def __setattr__(tensor: Any, field: str, value: Any) -> None:
            object.__setattr__(tensor, field, value)
            recorder.touched(tensor)
        for cls in self.classes:
            self._patch(cls, "__setattr__", __setattr__)

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        for owner, name, old in reversed(self._saved):
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._saved.clear()


_ABSENT = object()


def _bound(original: Any, model: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The call's arguments by position, defaults filled in (None if they do not fit: the op then raises)."""
    import inspect
    try:
        bound = inspect.signature(original).bind(model, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return tuple(bound.args[1:])


def _sync_op(recorder: Recorder, name: str, original: Any) -> Any:
    def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        positional = _bound(original, self, args, kwargs) if recorder.active() else None
        call = recorder.call(name, self, positional) if positional is not None else None
        if call is None:
            return original(self, *args, **kwargs)
        token = _INSIDE.set(True)
        try:
            out = original(self, *positional)
        except BaseException:
            recorder.done(call[0], name, call[1], None, True)
            raise
        finally:
            _INSIDE.reset(token)
        recorder.done(call[0], name, call[1], out, False)
        return out
    op.__name__ = op.__qualname__ = name
    op.__doc__ = original.__doc__
    return op


def _async_op(recorder: Recorder, name: str, original: Any) -> Any:
    async def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        positional = _bound(original, self, args, kwargs) if recorder.active() else None
        call = recorder.call(name, self, positional) if positional is not None else None
        if call is None:
            return await original(self, *args, **kwargs)
        record = call[0]
        record.busy = name
        token = _INSIDE.set(True)
        try:
            out = await original(self, *positional)
        except BaseException:
            recorder.done(record, name, call[1], None, True)
            raise
        finally:
            _INSIDE.reset(token)
            record.busy = None
        recorder.done(record, name, call[1], out, False)
        return out
    op.__name__ = op.__qualname__ = name
    op.__doc__ = original.__doc__
    return op


def _setup(recorder: Recorder, original: Any) -> Any:
    def _setup(self: Any, rank: Any, dist: Any, layers: Any, batches: Any) -> None:
        original(self, rank, dist, layers, batches)
        recorder.setup(self, rank, layers, batches)
    return _setup


def _outside(recorder: Recorder, original: Any, what: str) -> Any:
    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if recorder.active():
            recorder.stop(f"{what} was used through the Dist, not a Model op")
        return await original(self, *args, **kwargs)
    return method


def _put(recorder: Recorder, original: Any) -> Any:
    async def put(self: Any, item: Any) -> None:
        if recorder.active():
            recorder.stop("a mailbox's put was used through the Dist, not a Model op")
        await original(self, item)
        count = recorder.puts.get(id(self), 0)
        recorder.puts[id(self)] = count + 1
        recorder.last_put = count  # read by the send that made this put, before anything else runs
    return put


def record_file(path: str | Path, api: str, **run_options: Any) -> tuple[Any, dict[str, Any] | None, str | None]:
    """Run a puzzles or lab file as `loader.run_file(path, api, **run_options)` does, recording it:
    (its `ToyResult`, the program of its graded `Dist`, None), or (result, None, why no program)."""
    from .loader import run_file
    recorder = Recorder(api)
    recorder.install()
    try:
        result = run_file(path, api=api, on_world=recorder.graded, **run_options)
    finally:
        recorder.uninstall()
    program = None
    if recorder.reason is None:
        try:
            program = recorder.program()
        except Unreplayable as exc:
            recorder.stop(str(exc))
    return result, (program if recorder.reason is None else None), recorder.reason

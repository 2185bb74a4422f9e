"""Record what a `--api puzzles|lab` file asks of the toy API, as a program (`_program.py`) the grader
re-executes (`replay.py`): the untrusted half of grading such a file, run in the sandboxed worker.

`record_file` runs the file as `loader.run_file` does, with the API wrapped (`_recording_hooks.py`): each
call of a model of the graded `Dist` is written to that model's entries, its toy tensors as handles; each
tensor the file made with `+`, `combine` or `shard` is written as that call, others whole; each event
adds how the model's storage dicts changed since its previous event, read with `dict`'s own methods at
the moment the event reads its memory (`ToyModel._event_hook`), so whatever the file did to them
(`dict.__setitem__` included) is what the program holds; a toy tensor whose fields were written in place
is written again (`set`) before the model next uses it. Nothing the file does to the API's classes or to
a model's attributes (`time`, `log`, `check`) reaches the program: the replay runs the unpatched API.

What a program cannot say, the run reports its own figures for (`record_file` returns the reason): a value
that is not plain data or one of the API's own tensor classes (a file's own class stored or sent), a model that
starts an op while another of its ops is pending (concurrent ops of one model share its clock in an
order only that run's interleaving fixes), or a collective or mailbox used through the `Dist` itself.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import fields
from pathlib import Path
from typing import Any

from dist_lib.compat._program import FILE_MODULE, MAX_DEPTH, MAX_INT, MAX_ITEMS, MAX_OUTPUTS, MAX_TEXT, SENDS, STORAGE, TAG_OF, tensor_classes, tensors_in
from dist_lib.compat._recording_hooks import INSIDE, install, uninstall

MAX_CHAIN = 200  # calls followed back to define one tensor (a longer chain of sums is written as a literal)


class Unreplayable(Exception):
    """Something the program cannot say; the message says what."""


class _Snapshot:
    """A storage dict as the model's last event saw it: its keys and values in order (kept alive, so their
    ids stay theirs), their ids, and the numbers standing for its keys, in the same order."""

    __slots__ = ("keys", "values", "key_ids", "value_ids", "numbers")

    def __init__(self, keys: list, values: list, key_ids: list, value_ids: list, numbers: list):
        self.keys, self.values, self.key_ids, self.value_ids, self.numbers = keys, values, key_ids, value_ids, numbers


def _first_change(a: list, b: list) -> int:
    """The first position where lists `a` and `b` differ (the length of the shorter if none)."""
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _without(items: list, j: int) -> list:
    return items[:j] + items[j + 1:]


class _ModelRecord:
    """One model's entries, its handle table (id -> [handle, version, object]) and last storage snapshot."""

    def __init__(self, model: Any, rank: Any, layers: Any, batches: Any):
        self.model, self.setup = model, (rank, layers, batches)
        self.entries: list[list] = []
        self.table: dict[int, list] = {}
        self.handles = 0
        self.keys: list[dict] = [{} for _ in STORAGE]  # the file's keys -> numbers, per storage dict
        self.key_objects: list[list] = [[] for _ in STORAGE]  # (kept alive, so their ids stay theirs)
        self.snapshot = [_Snapshot([], [], [], [], []) for _ in STORAGE]
        self.epoch = 0  # the recorder's mutation count when this model last synced its tensors
        self.busy: str | None = None  # the pending op's name


class Recorder:
    """Wraps the API while active; `program()` is the result."""

    def __init__(self, api: str, file: str = "the file"):
        self.api, self.file = api, file  # (the graded file's name, for its own classes in messages)
        self.classes = tensor_classes(api)
        self.models: dict[int, _ModelRecord] = {}
        self.reason: str | None = None
        self.known: set[int] = set()  # ids of tensors some table or recipe holds (a write bumps its version)
        self.recipes: dict[int, tuple] = {}  # id(tensor) -> how the file made it (`made`)
        self._watched: dict[int, weakref.ref] = {}
        self._chain = 0
        self.versions: dict[int, int] = {}
        self.epoch = 0
        self.puts: dict[int, int] = {}  # id(mailbox) -> puts completed
        self.last_put = -1
        self.world: Any = None
        self.function = ""
        self.options: dict[str, Any] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    # ---- what cannot be recorded
    def install(self) -> None:
        self._saved = install(self)

    def uninstall(self) -> None:
        uninstall(self._saved)

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def active(self) -> bool:
        return self.reason is None and not INSIDE.get()

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
            encoded = ["r", self.encode(record, value.start), self.encode(record, value.stop),
                       self.encode(record, value.step)]  # (bounded, so the length below is an int)
            if len(value) > MAX_ITEMS:
                raise Unreplayable(f"a range of {len(value)} numbers (a program holds up to {MAX_ITEMS})")
            return encoded
        tag = TAG_OF.get(kind)
        if tag is None:
            raise Unreplayable(f"a {self._class_name(kind)} is neither plain data nor a tensor of the {self.api} API")
        if depth >= MAX_DEPTH or len(value) > MAX_ITEMS:
            raise Unreplayable(f"a {kind.__name__} nested {MAX_DEPTH} deep or of over {MAX_ITEMS} items")
        if kind in (frozenset, set) and all(type(v) is int for v in value):  # a sample or shard set
            items = sorted(value)
            if items and max(-items[0], items[-1]) >= MAX_INT:
                raise Unreplayable(f"the whole number {max(-items[0], items[-1])} is too large for a program")
            return [tag, items]
        return [tag, [self.encode(record, item, depth + 1) for item in value]]

    def handle(self, record: _ModelRecord, tensor: Any) -> int:
        entry = record.table.get(id(tensor))
        if entry is None or entry[2] is not tensor:
            entry = self.derived(record, tensor)
            if entry is None:
                values = self.fields(record, tensor)
                entry = self.define(record, tensor)
                record.entries.append(["lit", self.classes.index(type(tensor)), values])
        elif self.versions.get(id(tensor), 0) != entry[1]:
            entry[1] = self.versions.get(id(tensor), 0)
            record.entries.append(["set", entry[0], self.fields(record, tensor)])
        return entry[0]

    def made(self, out: Any, method: str, tensor: Any, args: tuple) -> None:
        """`out` is `tensor.method(*args)` (a sum, a combination or a shard the file made): a model that meets
        it can make it so too, while neither it nor its operands have been written since."""
        operands = [out, tensor, *[a for a in args if type(a) in self.classes]]
        for t in operands:
            self.watch(t)
        ref = self._watched.get(id(out))
        if ref is not None and ref() is out:  # (else a table holds it already, as an op's output)
            self.recipes[id(out)] = (ref, method, tensor, args, [self.versions.get(id(t), 0) for t in operands])

    def watch(self, tensor: Any) -> None:
        """Count writes to `tensor` until it is freed (then its id, which a new tensor may take, is forgotten)."""
        key = id(tensor)
        if key not in self.known:
            self.known.add(key)
            self._watched[key] = weakref.ref(tensor, lambda _: self.forget(key))

    def forget(self, key: int) -> None:
        for books in (self.versions, self.recipes, self._watched):
            books.pop(key, None)
        self.known.discard(key)

    def derived(self, record: _ModelRecord, tensor: Any) -> list | None:
        """Define `tensor` in the model's table by the call that made it (`made`), or None when there is none
        still valid, or the chain of such calls is too long to follow."""
        recipe = self.recipes.get(id(tensor))
        if recipe is None or recipe[0]() is not tensor or self._chain >= MAX_CHAIN:
            return None
        _, method, receiver, args, versions = recipe
        if [self.versions.get(id(t), 0) for t in [tensor, receiver, *[a for a in args if type(a) in self.classes]]] \
                != versions:
            return None
        self._chain += 1
        try:
            call = ["call", method, self.handle(record, receiver), [self.encode(record, a) for a in args]]
        finally:
            self._chain -= 1
        record.entries.append(call)
        return self.define(record, tensor)

    def fields(self, record: _ModelRecord, tensor: Any) -> list:
        return [self.encode(record, getattr(tensor, f.name), 1) for f in fields(tensor)]

    def define(self, record: _ModelRecord, tensor: Any) -> list:
        entry = record.table[id(tensor)] = [record.handles, self.versions.get(id(tensor), 0), tensor]
        record.handles += 1
        self.known.add(id(tensor))  # (held by the table: never freed while recording)
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
            record.epoch = self.epoch
            if changes:
                record.entries.append(["mem", changes])
        except Unreplayable as exc:
            self.stop(f"rank {record.setup[0]}'s storage: {exc}")

    def _changed(self, record: _ModelRecord, i: int, name: str) -> list | None:
        """[storage, deleted, replaced, appended] since the last snapshot of storage dict `i`, or None. Entries
        are compared by the identity of their key and value objects (the snapshot keeps both alive)."""
        store = getattr(record.model, name)
        if not isinstance(store, dict):
            raise Unreplayable(f"model.{name} is a {type(store).__name__}, not a dict")
        key_ids, value_ids = list(map(id, dict.keys(store))), list(map(id, dict.values(store)))
        old = record.snapshot[i]
        stale = record.epoch != self.epoch
        if key_ids == old.key_ids and value_ids == old.value_ids and not stale:
            return None  # (the snapshot holds the objects these ids are of: no id was reused)
        keys, values = list(dict.keys(store)), list(dict.values(store))
        size, before = len(key_ids), len(old.key_ids)
        deleted: list = []
        if key_ids == old.key_ids or (size == before + 1 and key_ids[:-1] == old.key_ids):
            m, numbers, was = before, old.numbers[:], old.value_ids  # values replaced, or one key stored
        elif not stale and size == before - 1 and value_ids == _without(old.value_ids, j := _first_change(
                key_ids, old.key_ids)) and key_ids == _without(old.key_ids, j):  # one key deleted
            record.snapshot[i] = _Snapshot(keys, values, key_ids, value_ids, _without(old.numbers, j))
            return [i, [old.numbers[j]], [], []]
        else:  # the survivors of the old keys in their order, then what was stored since
            at = dict(zip(old.key_ids, range(before)))
            m, last = 0, -1
            while m < size and at.get(key_ids[m], -1) > last:
                last = at[key_ids[m]]
                m += 1
            kept = set(key_ids[:m])
            deleted = [n for k, n in zip(old.key_ids, old.numbers) if k not in kept]
            numbers = [old.numbers[at[k]] for k in key_ids[:m]]
            was = [old.value_ids[at[k]] for k in key_ids[:m]]
        replaced = [[numbers[j], self.encode(record, values[j])] for j in range(m)
                    if value_ids[j] != was[j] or (stale and self._stale(record, values[j]))]
        appended = []
        for j in range(m, size):
            number = record.keys[i].get(keys[j])
            if number is None:
                number = record.keys[i][keys[j]] = len(record.key_objects[i])
                record.key_objects[i].append(keys[j])
            numbers.append(number)
            appended.append([number, self.encode(record, values[j])])
        record.snapshot[i] = _Snapshot(keys, values, key_ids, value_ids, numbers)
        return [i, deleted, replaced, appended] if deleted or replaced or appended else None

    def _stale(self, record: _ModelRecord, tensor: Any) -> bool:
        if type(tensor) not in self.classes:
            return False
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

    def _class_name(self, kind: type) -> str:
        """`module.Class`; a class of the graded file itself named after the file (`mine.Box`), not after
        the module name the loader imported it under."""
        module = self.file if kind.__module__.startswith(FILE_MODULE) else kind.__module__
        return f"{module}.{kind.__qualname__}"

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

def record_file(path: str | Path, api: str, **run_options: Any) -> tuple[Any, dict[str, Any] | None, str | None]:
    """Run a puzzles or lab file as `loader.run_file(path, api, **run_options)` does, recording it:
    (its `ToyResult`, the program of its graded `Dist`, None), or (result, None, why no program)."""
    from dist_lib.compat.loader import run_file
    recorder = Recorder(api, Path(path).stem)
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

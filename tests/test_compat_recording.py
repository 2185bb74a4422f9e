"""The storage diff `dist_lib.compat.recording` writes at each event, applied as `dist_lib.compat.replay`
applies it, rebuilds each storage dict exactly: same keys in the same order (which fixes the order of
the originals' float sum), same values, whatever the file did between two events."""

from __future__ import annotations

import random

from dist_lib.compat._program import STORAGE
from dist_lib.compat.recording import Recorder, _ModelRecord, record_file
from dist_lib.compat.replay import _Runner


class _Model:
    def __init__(self):
        for name in STORAGE:
            setattr(self, name, {})


def _mirror_after(changes, mirror):
    """Apply one event's changes as the replay does (`_Runner.storage`), on plain dicts keyed by number."""
    runner = _Runner.__new__(_Runner)
    holder = type("Holder", (), {})()
    for i, name in enumerate(STORAGE):
        setattr(holder, name, mirror[i])
    runner.storage(holder, changes, [], "test")


def test_random_edits_between_events_are_rebuilt_exactly():
    rng = random.Random(7)
    recorder, model = Recorder("puzzles"), _Model()
    record = _ModelRecord(model, 0, 2, 4)
    recorder.models[id(model)] = record
    mirror = [{} for _ in STORAGE]
    for event in range(400):
        for _ in range(rng.randint(0, 4)):  # what a file may do between two events
            store = getattr(model, STORAGE[rng.randrange(len(STORAGE))])
            key = rng.choice(["a", "b", ("c", 1), ("c", 2), 5, 6, 7])
            action = rng.random()
            if action < 0.4:
                store[key] = rng.randint(0, 10**6)  # stored, or replaced in place
            elif action < 0.6 and key in store:
                del store[key]
            elif action < 0.8 and key in store:
                store[key] = store.pop(key)  # stored again: now last
            else:
                dict.__setitem__(store, key, rng.randint(0, 10**6))  # past the dict's methods
        before = len(record.entries)
        recorder.on_event(model)
        for entry in record.entries[before:]:
            _mirror_after(entry[1], mirror)
        for i, name in enumerate(STORAGE):
            keys = [record.key_objects[i][number] for number in mirror[i]]
            assert keys == list(getattr(model, name)), (event, name)
            assert list(mirror[i].values()) == list(getattr(model, name).values()), (event, name)
    assert recorder.reason is None


def test_a_value_of_the_files_own_class_is_named_after_the_file(tmp_path):
    """A run that stores a class of its own cannot be replayed (the storage is read at each event: here
    the forward's); the reason names the class as the file defines it, not by the module name the loader
    imported the file under."""
    path = tmp_path / "mine.py"
    path.write_text("from lib import Model\n\n\nclass Box:\n    def memory(self):\n        return 0\n\n\n"
                    "def basic(model):\n"
                    "    weights, opt_states, activations, grad_activations, grad_weights = model.storage()\n"
                    "    activations[0] = Box()\n"
                    "    weights[0], opt_states[0] = model.load_weights(0)\n"
                    "    activations[1] = model.forward(0, model.get_activation([0]), weights[0])\n")
    _, program, reason = record_file(path, "puzzles", function="basic", check=False, exact_memory=True)
    assert program is None
    assert reason == "rank 0's storage: a mine.Box is neither plain data nor a tensor of the puzzles API"

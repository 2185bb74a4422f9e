"""The storage dicts keep what they hold as a running total that always equals the originals' sum of
every stored tensor's size, whatever the sequence of stores, deletions and replacements."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_lib.compat import configure, lab, puzzles

SHARDS = st.sampled_from([1, 2, 3, 4, 8])
OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "pop", "popitem", "clear", "update", "setdefault", "ior"]),
                         st.integers(0, 5), st.integers(0, 3), SHARDS), max_size=40)


def _tensor(api, kind: int, shards: int):
    lib = puzzles if api == "puzzles" else lab
    if kind == 0:
        return lib.Weight(0, 2, 0, frozenset({0}), shards)
    if kind == 1:
        return lib.OptState(0, 2, 0, frozenset(range(shards)), shards)
    if kind == 2:
        return lib.WeightGrad(0, 2, frozenset({0, 1}), 4, frozenset({0}), shards)
    return lib.Activation(0, 2, frozenset(range(shards)), 8)


@settings(max_examples=60, deadline=None)
@given(api=st.sampled_from(["puzzles", "lab"]), timing=st.sampled_from(["original", "real"]), ops=OPS)
def test_running_total_equals_the_full_sum(api, timing, ops):
    lib = puzzles if api == "puzzles" else lab
    with configure(api, timing=timing):
        model = lib.Model(0, lib.Dist(1), 2, 8)
    shared = _tensor(api, 0, 2)  # one object stored under several keys
    for op, key, kind, shards in ops:
        store = model.storage()[key % 5]
        value = shared if kind == 0 and shards == 2 else _tensor(api, kind, shards)
        if op == "set":
            store[key] = value
        elif op == "del" and key in store:
            del store[key]
        elif op == "pop":
            store.pop(key, None)
        elif op == "popitem" and store:
            store.popitem()
        elif op == "clear":
            store.clear()
        elif op == "update":
            store.update({key: value, key + 1: shared})
        elif op == "setdefault":
            store.setdefault(key, value)
        elif op == "ior":
            store |= {key: value}
        full = model._summed()
        assert model.memory() == full and type(model.memory()) is type(full)
        if timing == "real":
            # bytes are this simulator's figures, kept to float precision (not an original's sum)
            assert sum(model._bytes_by_kind().values()) == pytest.approx(
                sum(model._real.nbytes(v) for d in model.storage() for v in d.values()), rel=1e-12, abs=1e-6)


def test_a_storage_attribute_replaced_by_a_plain_dict_is_still_counted():
    model = puzzles.Model(0, puzzles.Dist(1), 2, 4)
    mine: dict = {}
    model.activations = mine
    mine[0] = model.get_activation([0, 1])
    assert model.memory() == 2 * 512 * 256


def test_a_value_without_memory_fails_at_the_next_event_as_in_the_original():
    model = puzzles.Model(0, puzzles.Dist(1), 2, 4)
    model.weights["note"] = "not a tensor"
    try:
        model.event("forward", 0, frozenset({0}))
    except AttributeError as error:
        assert "memory" in str(error)
    else:
        raise AssertionError("the event should fail on the stored string, as the original's sum does")
    del model.weights["note"]
    model.event("forward", 0, frozenset({0}))

"""The C accelerator is used only when it was built from the sources beside it (`native.load_extension`)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from dist_lib import native
from dist_lib.native.source_hash import source_hash


def _fake_extension(monkeypatch, name: str, hash_value: str | None) -> str:
    module = types.ModuleType(name)
    module.__file__ = f"/somewhere/{name}.so"
    if hash_value is not None:
        module.SOURCE_HASH = hash_value
    monkeypatch.setitem(sys.modules, name, module)
    return name


def test_an_extension_built_from_other_sources_is_not_used_and_the_fix_is_said(monkeypatch):
    monkeypatch.delenv("DIST_SANDBOX_PURE_PYTHON", raising=False)
    name = _fake_extension(monkeypatch, "stale_ext", "0" * 64)
    with pytest.warns(RuntimeWarning, match=r"stale_ext\.so was built from other sources .*python3 dev\.py test"):
        assert native.load_extension(name, sources="f" * 64) is None
    name = _fake_extension(monkeypatch, "old_ext", None)  # built before extensions carried their hash
    with pytest.warns(RuntimeWarning, match="built from other sources"):
        assert native.load_extension(name, sources="f" * 64) is None


def test_an_extension_of_these_sources_is_used_unless_python_is_forced(monkeypatch):
    monkeypatch.delenv("DIST_SANDBOX_PURE_PYTHON", raising=False)
    name = _fake_extension(monkeypatch, "fresh_ext", "f" * 64)
    assert native.load_extension(name, sources="f" * 64) is sys.modules[name]
    monkeypatch.setenv("DIST_SANDBOX_PURE_PYTHON", "1")
    assert native.load_extension(name, sources="f" * 64) is None
    monkeypatch.delenv("DIST_SANDBOX_PURE_PYTHON")
    assert native.load_extension("no_such_extension_here", sources="f" * 64) is None


def test_the_built_extension_carries_the_hash_of_the_sources_beside_it():
    try:
        from dist_lib import _buffers
    except ImportError:
        pytest.skip("the C accelerator was not built")
    assert _buffers.SOURCE_HASH == source_hash() and len(source_hash()) == 64
    assert native.ACCELERATED == (native.EXTENSION is _buffers)


def test_the_developer_switch_names_twins_and_buffers_takes_the_ops_on_it_along():
    assert native.twins_off(None) == frozenset() == native.twins_off(" , ")
    assert native.twins_off("drive, p2p") == {"drive", "p2p"}
    assert native.twins_off("buffers") == {"buffers", "ops", "weight_ops", "comm", "p2p"}
    with pytest.raises(ValueError, match="unknown twin drives, ops2; the twins are buffers, events"):
        native.twins_off("drives,ops2,events")


def test_a_twin_switched_off_runs_in_python_and_the_others_in_c():
    """Each switch, in a fresh process: its twin's classes or methods are the Python ones, another's C."""
    if native.EXTENSION is None:
        pytest.skip("the C accelerator was not built")
    probe = ("from dist_lib.model.handle import Model; from dist_lib.engine import core, eventlog, transfers;"
             "from dist_lib.memory import tracker;"
             "print(tracker.Buffer.__module__, eventlog.pack_events is None, transfers.Scheduler.__module__,"
             "type(Model.forward).__name__, type(Model.update).__name__, type(Model.all_reduce).__name__,"
             "type(Model.send).__name__, type(core.Engine.wake).__name__)")
    c = ["dist_lib._buffers", "False", "dist_lib._buffers"] + ["method_descriptor"] * 5
    python = ["dist_lib.memory.buffers", "True", "dist_lib.engine.transfers"] + ["function"] * 5
    env = {k: v for k, v in os.environ.items() if k != "DIST_SANDBOX_PURE_PYTHON"}
    for i, twin in enumerate(native.TWINS):
        out = subprocess.run([sys.executable, "-c", probe], env={**env, "DIST_SANDBOX_C_OFF": twin},
                             capture_output=True, text=True, check=True).stdout.split()
        off = {i} | ({native.TWINS.index(t) for t in native.NEED_C_BUFFERS} if twin == "buffers" else set())
        assert out == [python[j] if j in off else c[j] for j in range(len(c))], twin

"""The C accelerator is used only when it was built from the sources beside it (`native.load_extension`)."""

from __future__ import annotations

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

"""The sandbox runs as nobody when the grader is root: a Python it cannot read is named in the error."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from grader.runner import sandbox

@pytest.fixture
def open_folder():
    """A folder every user may enter, under /tmp (pytest's own temporary folders are closed to others)."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-view-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox drops to nobody only when the grader is root")


@as_root
def test_the_first_closed_folder_above_a_file_is_named(open_folder):
    home = open_folder / "home"
    python = home / "versions" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("")
    python.chmod(0o755)
    home.chmod(0o700)  # as root's home folder, where pyenv installs Pythons
    assert sandbox.hidden_part(python) == home
    assert not sandbox.readable_by_sandbox(python)
    home.chmod(0o755)
    assert sandbox.hidden_part(python) is None
    python.chmod(0o700)  # the file itself closed
    assert sandbox.hidden_part(python) == python


@as_root
def test_an_unreadable_interpreter_is_explained(open_folder, monkeypatch):
    home = open_folder / "root"
    python = home / ".pyenv" / "bin" / "python3.11"
    python.parent.mkdir(parents=True)
    python.write_text("")
    home.chmod(0o700)
    monkeypatch.setattr(sys, "executable", str(python))
    why = sandbox._unreadable_python()
    assert f"who cannot read {python} ({home} is closed to other users)" in why
    home.chmod(0o755)
    python.chmod(0o755)
    monkeypatch.setattr(sys, "base_prefix", str(python.parent))
    assert sandbox._unreadable_python() == ""

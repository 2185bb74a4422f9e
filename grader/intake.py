"""Which files of a submissions folder are submissions, and which helpers each run is given.

Two layouts are read the same way. A flat folder holds many students' files side by side
(`submissions/alice.py`, `submissions/bob.py`); a folder of folders holds one folder per student
(`submissions/alice/solution.py`), each folder its own unit. A submission is a regular `.py` file not
named with a leading underscore; a helper is a regular `_*.py` file beside it. Anything else is skipped
with a one-line note and the board goes on: a symbolic link (it could name a classmate's file or any file
the grader may read), a folder named like a file, a link that leads nowhere or around in a loop, a file
that cannot be read.

A run is given its own file and only the helpers it names (`named_helpers`): those whose module name its
source imports, or names in a string (`importlib.import_module("_layout")`), and in turn those the named
helpers name. Never `__init__.py`, and never a helper nobody named: in a flat folder a classmate's
`_uuid.py` or `__init__.py` placed beside everyone's files reaches no other run. A helper in a flat folder
is shared by every submission that names it (the folder grants no ownership); a student who wants a helper
of their own keeps it in their own folder.
"""

from __future__ import annotations

import ast
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError

MAX_SCANNED_BYTES = 4 * 2**20  # source read for the names it imports (a larger file names no helper)


@dataclass
class Intake:
    """The submissions found, and one line per entry skipped (its path and why)."""

    submissions: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def regular_file(path: Path) -> str | None:
    """None when `path` is a regular file (not a link to one); else why it is not, in a few words."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(mode):
        try:
            path.stat()
        except OSError as exc:  # (a loop says ELOOP, a dangling link ENOENT)
            return f"is a symbolic link that leads nowhere ({exc.strerror})"
        return "is a symbolic link (a run is given regular files only)"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def gather(paths: list[str]) -> Intake:
    """The submissions under `paths` (files, flat folders, folders of per-student folders), each once,
    and what was skipped. Raises `InputError` only for a path that does not exist or holds nothing."""
    intake = Intake()
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = _folder(path, intake, depth=1)
            if not found and not intake.skipped:
                raise InputError(f"submission folder {path}: holds no .py files")
        elif path.suffix == ".ipynb" and path.is_file():
            raise InputError(f"submission {path}: a notebook is graded on its own, with `python -m grader run "
                             f"{path.name} --api puzzles|lab`; the leaderboard grades .py strategies (async def train)")
        elif os.path.lexists(path):
            why = regular_file(path)
            if why is None:
                intake.submissions.append(_absolute(path))
            else:
                intake.skipped.append(f"{path}: {why}; skipped")
        else:
            raise InputError(f"submission {path}: no such file or folder")
    intake.submissions = list(dict.fromkeys(intake.submissions))
    if not intake.submissions:
        raise InputError("no submission to grade: " + ("; ".join(intake.skipped[:3]) or "the folders hold none"))
    return intake


def _folder(folder: Path, intake: Intake, depth: int) -> int:
    """Add the submissions of `folder` (and, `depth` levels down, of its per-student folders); how many."""
    found = 0
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        intake.skipped.append(f"{folder}: cannot be listed ({exc.strerror}); skipped")
        return 0
    for entry in entries:
        path = Path(folder) / entry.name
        if entry.name.startswith("_"):
            continue  # helpers (and __init__.py, __pycache__), which are no submissions
        if entry.is_dir(follow_symlinks=False) and not entry.name.endswith(".py"):
            if depth > 0 and not entry.name.startswith("."):  # (not .git and the like)
                found += _folder(path, intake, depth - 1)  # a student's own folder
            continue
        if not entry.name.endswith(".py"):
            continue
        why = regular_file(path)
        if why is None:
            intake.submissions.append(_absolute(path))
            found += 1
        else:
            intake.skipped.append(f"{path}: {why}; skipped")
    return found


def _absolute(path: Path) -> Path:
    """`path` made absolute through its folder only: the file itself is never followed as a link."""
    return Path(os.path.realpath(path.parent)) / path.name


def helper_candidates(folder: Path) -> dict[str, Path]:
    """The regular `_*.py` files in `folder`, by module name (never `__init__`)."""
    found = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    for name in names:
        if name.startswith("_") and name.endswith(".py") and name != "__init__.py" \
                and regular_file(folder / name) is None:
            found[name[:-3]] = folder / name
    return found


def named_helpers(path: Path) -> list[Path]:
    """The helpers beside `path` that it names, directly or through other named helpers, sorted by name."""
    candidates = helper_candidates(path.parent)
    named: dict[str, Path] = {}
    todo = [path]
    while todo:
        for name in sorted(names_in(todo.pop()) & set(candidates) - set(named)):
            named[name] = candidates[name]
            todo.append(candidates[name])
    return [named[name] for name in sorted(named)]


def names_in(path: Path) -> set[str]:
    """The module names a Python file names: the first part of each absolute import, each module or name
    of a relative one, and each string that is a module name or a file name `NAME.py`. A file that cannot
    be read or parsed (or is over `MAX_SCANNED_BYTES`) names none: its run fails on its own."""
    try:
        with open(path, "rb") as fh:
            source = fh.read(MAX_SCANNED_BYTES + 1)
        if len(source) > MAX_SCANNED_BYTES:
            return set()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names: set[str] = set()
    try:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.module:
                    names.add(node.module.split(".")[0])
                if node.level:
                    names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 256:
                names.add(node.value.removesuffix(".py").split(".")[0])
    except RecursionError:
        return names
    return names

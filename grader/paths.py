"""Output paths the grader writes (`--trace`, `--out`, `--plot`), checked before a run rather than after it."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError

# the built-in strategies, beside this package wherever it is installed (a checkout, or site-packages after
# `pip install`)
BUILTIN_STRATEGIES = Path(__file__).resolve().parents[1] / "strategies"


def output_path(text: str, flag: str, *, folder: bool, example: str = "trace.json") -> Path:
    """An output path the grader can write: a file (`--trace`) or a folder (`--out`), checked (and its
    folder made) before the run rather than found out after it."""
    path = Path(text)
    if folder and path.exists() and not path.is_dir():
        raise InputError(f"{flag} {text}: is a file; give a folder")
    if not folder and path.is_dir():
        raise InputError(f"{flag} {text}: is a folder; give a file path such as {path / example}")
    if not folder and path.exists() and not path.is_file():
        raise InputError(f"{flag} {text}: not a regular file")
    where = path if folder else path.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{flag} {text}: {where} is a file, not a folder") from None
    except OSError as exc:
        raise InputError(f"{flag} {text}: cannot create folder {where} ({exc.strerror})") from None
    if not os.access(where, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {text}: folder {where} is not writable")
    if not folder:  # the access bits do not tell everything (root, a read-only or special file system)
        existed = path.exists()
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            raise InputError(f"{flag} {text}: cannot be written ({exc.strerror})") from None
        if not existed:
            path.unlink(missing_ok=True)
    return path


def builtin_names() -> list[str]:
    """The built-in strategies' names (strategies/*.py but the helpers led by `_`)."""
    return sorted(p.stem for p in BUILTIN_STRATEGIES.glob("*.py") if not p.name.startswith("_"))


def trains_dense(path: Path) -> bool:
    """Whether a built-in strategy trains dense models (all but those that declare `TRAINS = "..."`, read
    from the file without importing it)."""
    import ast
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TRAINS" for t in node.targets):
            return False
    return True

"""Importing a user's strategy file much as `python FILE` would: with its folder on `sys.path` while it
imports (after the standard library), so that the helper modules beside it (`_helpers.py`) import by name."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def beside(path: Path) -> Iterator[None]:
    """While the file `path` imports, its folder is on `sys.path`, after the standard library's folders (a
    `_uuid.py` or `json.py` beside it never shadows the standard module that `import uuid` loads), before
    the installed packages. Afterwards the folder leaves
    `sys.path` again (a `numpy.py` beside one file must not shadow numpy for the rest of the process),
    and so do the modules imported from it from `sys.modules`: the file keeps what it imported, and the
    next file's `_helpers` is its own, not the first one's."""
    folder = path.parent
    before = set(sys.modules)
    sys.path.insert(after_standard_library(), str(folder))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(folder))
        for name in set(sys.modules) - before:
            found = getattr(sys.modules.get(name), "__file__", None)
            if found and Path(found).parent == folder and Path(found) != path:
                del sys.modules[name]


def after_standard_library() -> int:
    """The index in `sys.path` just past its last standard-library folder (`sysconfig`'s stdlib and
    platstdlib, its lib-dynload, the zipped library), or 0 when none is listed."""
    import sysconfig
    paths = sysconfig.get_paths()
    standard = {os.path.realpath(p) for p in (paths["stdlib"], paths["platstdlib"])}
    standard |= {os.path.join(p, "lib-dynload") for p in standard}
    last = -1
    for index, entry in enumerate(sys.path):
        real = os.path.realpath(entry) if entry else ""
        if real in standard or (entry.endswith(".zip") and os.path.basename(entry).startswith("python")):
            last = index
    return last + 1


def import_hint(error: BaseException) -> str:
    """What to write instead, for the import errors a file on its own runs into: a relative import (as
    the bundled strategies, which are a package, make) has no package to be relative to."""
    if isinstance(error, ImportError) and "no known parent package" in str(error):
        return (" (a strategy file on its own is not in a package: import a helper beside it by name, "
                "`from _layout import ...`, or a bundled one from its package, `from strategies._layout "
                "import ...`)")
    return ""

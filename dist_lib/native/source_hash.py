"""The fingerprint of the C accelerator's sources, computed the same way when it is built (setup.py
compiles it into the extension as `SOURCE_HASH`) and when it is loaded (`memory/tracker.py`): an extension built
from other sources than those beside it is stale, and is not used."""

from __future__ import annotations

import hashlib
from pathlib import Path

HERE = Path(__file__).resolve().parent


def source_hash(folder: Path = HERE) -> str | None:
    """sha256 over the names and contents of the C files (`_*.c`, `_*.h`) in `folder`, in name order; None
    when there are none (an installed copy that ships only the built extension)."""
    files = sorted(folder.glob("_*.[ch]"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()

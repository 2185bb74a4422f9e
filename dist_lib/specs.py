"""What cluster and workload descriptions share: reading TOML files and accepting a spec in any form."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import SpecError

T = TypeVar("T")


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The table in a TOML file; unreadable or malformed files raise `SpecError` naming the file."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read {what} file ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML ({exc})") from None


def load_spec(value: Any, cls: type[T], what: str, from_toml: Callable[[Any], T],
              schemes: dict[str, Callable[[str], T]], parse: Callable[[str], T]) -> T:
    """Accept an instance of `cls`, a `.toml` path, a registered `scheme:argument` spec, or a spec string."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Path) or (isinstance(value, str) and value.endswith(".toml")):
        return from_toml(value)
    if not isinstance(value, str):
        raise SpecError(f"{what} must be a spec string, a .toml path or a {cls.__name__}, got {type(value).__name__}")
    scheme, _, arg = value.partition(":")
    if scheme in schemes and arg:
        return schemes[scheme](arg)
    return parse(value)

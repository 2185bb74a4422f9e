"""What cluster and workload descriptions share: reading TOML files and accepting a spec in any form."""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dist_lib.errors import SpecError

T = TypeVar("T")


MAX_FILE_BYTES = 2**24  # a description file larger than 16 MiB is not one


def read_text(path: str | Path, what: str) -> str:
    """A description file's text: a regular UTF-8 file of at most `MAX_FILE_BYTES` (a folder, a device
    such as /dev/zero or a FIFO would otherwise fail late, hang or fill memory)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise SpecError(f"{path}: cannot read {what} (not a regular file)")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"{path}: {what} is larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{path}: {what} is not UTF-8 text") from None


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The table in a TOML file; unreadable or malformed files raise `SpecError` naming the file."""
    return _decode(tomllib.loads, "TOML", path, read_text(path, f"{what} file"))


def read_json(path: str | Path, what: str) -> Any:
    """The value in a JSON file; unreadable or malformed files raise `SpecError` naming the file."""
    return _decode(json.loads, "JSON", path, read_text(path, what))


def _decode(parse: Callable[[str], Any], language: str, path: str | Path, text: str) -> Any:
    try:
        return parse(text)
    except ValueError as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise SpecError(f"{path}: not valid {language} ({exc})") from None
    except RecursionError:
        raise SpecError(f"{path}: not valid {language} (nested too deeply)") from None


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
    if scheme in schemes:
        if not arg.strip():
            raise SpecError(f"{what} spec {shown(value)}: {scheme}: needs what to read, e.g. {scheme}:PATH")
        return schemes[scheme](arg)
    return parse(value)


# ---- shared validation: every parser reads numbers through these, so each bad value gets one line
# naming the field and the range it accepts --------------------------------------------------------

_DIGITS = re.compile(r"[+-]?[0-9]{1,30}")


def shown(value: Any, limit: int = 40) -> str:
    """`repr(value)`, cut short: a message stays one readable line whatever the input."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def number(value: Any, where: str, low: float, high: float, *, unit: str = "", above: bool = False) -> float:
    """A finite number from a TOML/JSON value or spec text, within [low, high] (`above`: more than `low`)."""
    accepted = f"{'more than' if above else 'at least'} {low:g} and at most {high:g}{unit}"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SpecError(f"{where}: expected a number {accepted}, got {shown(value)}")
    try:
        result = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        raise SpecError(f"{where}: expected a number {accepted}, got {shown(value)}") from None
    if not (low < result if above else low <= result) or not result <= high:  # NaN fails both
        raise SpecError(f"{where}: must be {accepted}, got {shown(value)}")
    return result


def whole(value: Any, where: str, low: int, high: int, *, exact: bool = False) -> int:
    """A whole number within [low, high] from an int, an integral float or spec text (`12`, `1e3`);
    `exact`: an int only (a value built in code, where 2.0 or "2" is a type mistake)."""
    accepted = f"a whole number from {low} to {high}"
    if exact and (isinstance(value, bool) or not isinstance(value, int)):
        raise SpecError(f"{where}: must be {accepted}, got {shown(value)}")
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        value = int(value.strip())  # at most 30 digits: never the slow path of int() on huge text
    elif isinstance(value, (float, str)) and not isinstance(value, bool):
        try:
            as_float = float(value)
        except ValueError:
            raise SpecError(f"{where}: expected {accepted}, got {shown(value)}") from None
        if not as_float.is_integer():
            raise SpecError(f"{where}: expected {accepted}, got {shown(value)}")
        value = int(as_float)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}: expected {accepted}, got {shown(value)}")
    if not low <= value <= high:
        raise SpecError(f"{where}: must be {accepted}, got {shown(value)}")
    return value


def table(value: Any, where: str, allowed: set[str] | None = None) -> dict:
    """`value` as a table, with no keys outside `allowed` (when given)."""
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a table, got {type(value).__name__}")
    unknown = set(value) - allowed if allowed is not None else set()
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                        f"(known: {', '.join(sorted(allowed or ()))})")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{where}: expected a string, got {shown(value)}")
    return value


def key_values(items: str, separator: str, where: str) -> list[tuple[str, str]]:
    """`key=value` pairs split by `separator`; a key given twice is an error rather than a silent override."""
    pairs: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in items.split(separator))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"{where}: {shown(item)} should be key=value")
        if any(key == seen for seen, _ in pairs):
            raise SpecError(f"{where}: {key} is given twice")
        pairs.append((key, value.strip()))
    return pairs


# How many leading comma-separated parts of a `scheme:argument` spec are file paths (registered by
# the modules that read them, e.g. metis: 2, profiles: 1).
PATH_PARTS: dict[str, int] = {}


def absolute_spec(spec: str) -> str:
    """`spec` with the files it names made absolute against the working directory, so that it means
    the same in a process that runs elsewhere (the grader's workers)."""
    return map_spec_paths(spec, lambda path: os.path.abspath(os.path.expanduser(path)))


def map_spec_paths(spec: str, change: Callable[[str], str]) -> str:
    """`spec` with `change` applied to each file path it names (a `.toml` spec, or the leading parts of
    a registered `scheme:argument` spec)."""
    if spec.endswith(".toml"):
        return change(spec)
    scheme, _, arg = spec.partition(":")
    count = PATH_PARTS.get(scheme, 0)
    if not count or not arg:
        return spec
    parts = arg.split(",")
    paths = [change(p.strip()) if p.strip() else p for p in parts[:count]]
    return f"{scheme}:{','.join(paths + parts[count:])}"

"""A puzzles or lab notebook as a student has it: an `.ipynb` file, or a `.py` exported from one.

`read_notebook` gives its code cells in order, parsed with top-level `await` allowed and IPython's own
syntax taken out; `definitions` keeps what a graded function needs of a cell (its imports, definitions
and plain assignments), leaving the cell's own tests (top-level calls and awaits) out.

* `.ipynb`: nbformat 4 JSON, read with the standard library; its code cells' `source` (a string or a
  list of strings), markdown and raw cells skipped.
* `.py` with `# In[ ]:` lines (`jupyter nbconvert --to script`): each marker starts a cell, whose first
  line is the first after the (up to two) blank lines nbconvert writes under the marker, so a line of a
  cell has the same number as in the notebook; text before the first marker is a cell too when it
  holds code.
* `.py` in jupytext's percent format (also VS Code's and Spyder's cells): each `# %%` line starts a cell,
  `# %% [markdown]`, `[md]` and `[raw]` ones are skipped; text before the first marker is a cell when it
  holds code. Jupytext writes magics commented (`# %time ...`, `# !pip ...`): in code cells they are
  read as the magics they are.
* `.py` in jupytext's light format (a `# ---` header naming `format_name: light`): read as one cell whose
  lines are the file's, as it runs top to bottom; its commented magics are read as magics in code
  paragraphs (a paragraph with a line of code, or led by a magic), and comment paragraphs stay text.

Cells are numbered from 1 among code cells (markdown cells are not counted), so cell N of a notebook
is cell N of its export. IPython's syntax, line by line at the start of a statement (the line count
of a cell is kept, so lines keep their numbers): `%time CODE` runs CODE; any other `%magic`, `!shell`,
`x = %magic`, `x = !shell` and `name?` help line is taken out; a cell led by `%%capture`, `%%time` or
`%%timeit` runs its body once, any other cell magic (`%%bash`, `%%writefile`...) skips the cell. In an
export, `get_ipython().run_line_magic('time', 'CODE')` runs CODE, `run_cell_magic` with capture,
time or timeit runs its body, and any other `get_ipython()...` statement is taken out.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import linecache
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from dist_lib.errors import SpecError, StrategyError

MARKER = re.compile(r"# In\[[ \d]*\]:[ \t]*$")
PERCENT = re.compile(r"#\s*%%(?:[ \t].*)?$")  # jupytext's percent cell marker (not `# %%capture`)
_TEXT_CELL = re.compile(r"\[(markdown|md|raw)\]")
_ESCAPED_MAGIC = re.compile(r"([ \t]*)# ?((?:%%?[A-Za-z]|!).*)$", re.S)  # `# %time x`, `# !pip ...`
_LIGHT_HEADER = re.compile(r"^# ---[ \t]*\n(#.*\n)*?#\s+format_name:\s*light\b", re.M)
BODY_MAGICS = ("capture", "time", "timeit")  # cell magics whose body is the cell's own Python, run once
_ASSIGNED_MAGIC = re.compile(r"[A-Za-z_][\w.]*(\s*,\s*[A-Za-z_][\w.]*)*\s*=\s*[%!]")
_HELP = re.compile(r"\?\??[\w.]*\s*$|[A-Za-z_][\w.]*\?\??\s*$")
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class Cell:
    number: int  # 1-based among the code cells (0: code before an export's first marker)
    first_line: int  # its first line in the file (exports; 0 for an .ipynb)
    filename: str  # what its code objects are compiled under: "<notebook path>, cell N"
    tree: ast.Module


@dataclass(frozen=True)
class Notebook:
    path: Path
    cells: tuple[Cell, ...]
    source: str  # the cells' code, for telling which API it uses

    def locate(self, text: str) -> str:
        """`text` with every "NAME, cell N:L" (a traceback location) as "NAME, cell N, line L"."""
        firsts = {c.number: c.first_line for c in self.cells}

        def where(match: re.Match) -> str:
            number, line = int(match.group(1)), int(match.group(2))
            return where_in(self.path.name, number, firsts.get(number, 0), line)
        return re.sub(re.escape(self.path.name) + r", cell (\d+):(\d+)", where, text)


def where_in(name: str, number: int, first: int, line: int) -> str:
    """Line `line` of cell `number` (0: the code of a script before its first cell, or a light script),
    which begins at line `first` of the file (0: an .ipynb)."""
    if number == 0:
        return f"{name}, line {first + line - 1}"
    return f"{name}, cell {number}, line {line}" + (f" (line {first + line - 1} of the file)" if first and line else "")


def is_notebook(path: Path, text: str | None = None) -> bool:
    """An .ipynb file, or a .py holding `# In[ ]:` or `# %%` cell markers or a jupytext light header."""
    if path.suffix == ".ipynb":
        return True
    return text is not None and _script_format(text) is not None


def _script_format(text: str) -> str | None:
    """'export', 'percent' or 'light' for a notebook saved as a script, else None."""
    lines = text.splitlines()
    if any(MARKER.match(line) for line in lines):
        return "export"
    if any(PERCENT.match(line) for line in lines):
        return "percent"
    if _LIGHT_HEADER.match(text):
        return "light"
    return None


def read_notebook(path: Path, text: str | None = None) -> Notebook:
    """The notebook's code cells, parsed. A file that is not a notebook raises `SpecError`; a cell that is
    not Python, `StrategyError` naming the cell and line."""
    if path.suffix == ".ipynb":
        sources = [(n, 0, s) for n, s in enumerate(_ipynb_cells(path), 1)]
    else:
        text = path.read_text() if text is None else text
        sources = {"export": _export_cells, "percent": _percent_cells, "light": _light_cells}[
            _script_format(text) or "export"](text)
    cells = []
    for number, first, raw in sources:
        source = strip_magics(raw)
        if source is None:
            continue
        filename = f"{path.resolve()}, cell {number}"
        try:
            tree = ast.parse(source, filename, "exec", type_comments=False)
        except SyntaxError as exc:
            raise StrategyError(f"{where_in(path.name, number, first, exc.lineno or 0)}: SyntaxError: {exc.msg}") from None
        tree = _IPythonCalls().visit(tree)
        ast.fix_missing_locations(tree)
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        cells.append(Cell(number, first, filename, tree))
    return Notebook(path, tuple(cells), "\n".join(ast.unparse(c.tree) for c in cells))


def _ipynb_cells(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SpecError(f"{path.name}: not a notebook (not UTF-8 text)") from None
    except ValueError as exc:
        raise SpecError(f"{path.name}: not a notebook (not JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        version = data.get("nbformat") if isinstance(data, dict) else None
        raise SpecError(f"{path.name}: not an nbformat 4 notebook (no list of cells"
                        + (f"; nbformat {version}: save it as nbformat 4" if version is not None else "") + ")")
    if data.get("nbformat") != 4:
        raise SpecError(f"{path.name}: nbformat {data.get('nbformat')!r}, not 4; save it as nbformat 4")
    sources = []
    for index, cell in enumerate(data["cells"], 1):
        if not isinstance(cell, dict):
            raise SpecError(f"{path.name}: cell {index} of the file is not a JSON object")
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(part, str) for part in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise SpecError(f"{path.name}: code cell {len(sources) + 1}: source is neither a string nor a list of "
                            f"strings")
        sources.append(source)
    if not sources:
        raise SpecError(f"{path.name}: the notebook holds no code cells")
    return sources


def _export_cells(text: str) -> list[tuple[int, int, str]]:
    """(number, first line in the file, source) of each cell of an nbconvert export."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if MARKER.match(line)]
    cells = []
    preamble = "".join(lines[:starts[0]])
    if any(line.strip() and not line.lstrip().startswith("#") for line in lines[:starts[0]]):
        cells.append((0, 1, preamble))
    for number, (marker, end) in enumerate(zip(starts, starts[1:] + [len(lines)]), 1):
        start = marker + 1
        while start < min(marker + 3, end) and not lines[start].strip():  # the two blank lines nbconvert writes
            start += 1
        cells.append((number, start + 1, "".join(lines[start:end])))
    return cells


def _percent_cells(text: str) -> list[tuple[int, int, str]]:
    """(number, first line in the file, source) of each code cell of a percent-format script."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if PERCENT.match(line)]
    cells = []
    if any(line.strip() and not line.lstrip().startswith("#") for line in lines[:starts[0]]):
        cells.append((0, 1, "".join(lines[:starts[0]])))
    number = 0
    for marker, end in zip(starts, starts[1:] + [len(lines)]):
        if _TEXT_CELL.search(lines[marker]):
            continue
        number += 1
        cells.append((number, marker + 2, _unescape_magics(lines[marker + 1:end])))
    return cells


def _light_cells(text: str) -> list[tuple[int, int, str]]:
    """A light-format script as one cell of the file's lines, its code paragraphs' magics unescaped."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    start = 0
    for end in [i for i, line in enumerate(lines) if not line.strip()] + [len(lines)]:
        paragraph = lines[start:end]
        code = any(line.strip() and not line.lstrip().startswith("#") for line in paragraph) or \
            bool(paragraph) and _ESCAPED_MAGIC.match(paragraph[0]) is not None
        out.extend(_unescape_magics(paragraph) if code else paragraph)
        out.extend(lines[end:end + 1])
        start = end + 1
    return [(0, 1, "".join(out))]


def _unescape_magics(lines: list[str]) -> str:
    """A code cell's lines with jupytext's commented magics (`# %time x`) as typed (`%time x`)."""
    return "".join(m.group(1) + m.group(2) if (m := _ESCAPED_MAGIC.match(line)) else line for line in lines)


def strip_magics(source: str) -> str | None:
    """The cell's Python, with IPython's line syntax taken out (see the module's notes) and the line count
    kept; None for a cell magic whose body is not Python."""
    lines = source.splitlines(keepends=True)
    if lines and lines[0].lstrip().startswith("%%"):
        words = lines[0].lstrip()[2:].split()
        if not words or words[0] not in BODY_MAGICS:
            return None
        lines[0] = "\n"
    out: list[str] = []
    pending = ""  # the statement begun on earlier lines, while it is open
    for line in lines:
        stripped = line.lstrip()
        indent = line[:len(line) - len(stripped)]
        if not pending and stripped[:1] in ("%", "!", "?") or not pending and (
                _ASSIGNED_MAGIC.match(stripped) or _HELP.match(stripped.split("#", 1)[0].rstrip() or "#")):
            timed = re.match(r"%time\s+(\S.*)", stripped, re.S)
            if not timed:
                out.append(indent + "pass\n")
                continue
            line = indent + timed.group(1)
        out.append(line)
        pending += line
        if _complete(pending):
            pending = ""
    return "".join(out)


def _complete(text: str) -> bool:
    """Does `text` end a statement (no bracket, string or backslash continuation left open)?"""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except tokenize.TokenError:
        return False
    except SyntaxError:  # (an indentation error: the parser reports it)
        return True
    return True


class _IPythonCalls(ast.NodeTransformer):
    """An export's `get_ipython().…(...)` statements: `%time` code and capture/time/timeit bodies run, the
    rest becomes `pass`."""

    def _replace(self, node: ast.stmt, value: ast.expr | None) -> ast.AST | list[ast.stmt]:
        call = value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
                and call.func.value.func.id == "get_ipython"):
            return self.generic_visit(node)
        args = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in call.args]
        code = None
        if isinstance(node, ast.Expr) and call.func.attr == "run_line_magic" and len(args) == 2 \
                and args[0] == "time":
            code = args[1]
        elif isinstance(node, ast.Expr) and call.func.attr == "run_cell_magic" and len(args) == 3 \
                and args[0] in BODY_MAGICS:
            code = strip_magics(args[2] or "")
        if code:
            try:
                body = ast.parse(code).body
            except SyntaxError:
                body = []
            for stmt in body:
                ast.increment_lineno(stmt, node.lineno - 1)
            if body:
                return [self.visit(stmt) for stmt in body]
        return ast.copy_location(ast.Pass(), node)

    def visit_Expr(self, node: ast.Expr) -> ast.AST | list[ast.stmt]:
        return self._replace(node, node.value)

    def visit_Assign(self, node: ast.Assign) -> ast.AST | list[ast.stmt]:
        return self._replace(node, node.value)


def definitions(tree: ast.Module) -> ast.Module:
    """The statements of a cell a graded function needs: imports, function and class definitions,
    assignments to plain names of values that await nothing and call nothing but Python's builtins (a
    lambda's body is not called), and `try` statements made only of those."""
    return ast.Module(body=[s for s in tree.body if _kept(s)], type_ignores=[])


def _kept(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass)):
        return True
    if isinstance(stmt, ast.Try):
        return all(_kept(s) for s in [*stmt.body, *stmt.orelse, *stmt.finalbody]) and \
            all(_kept(s) for h in stmt.handlers for s in h.body)
    if isinstance(stmt, ast.Assign):
        return all(_plain_target(t) for t in stmt.targets) and _inert(stmt.value)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and (stmt.value is None or _inert(stmt.value))
    return False


def _plain_target(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, ast.Starred):
        return _plain_target(target.value)
    return isinstance(target, (ast.Tuple, ast.List)) and all(_plain_target(t) for t in target.elts)


def _inert(value: ast.expr) -> bool:
    """Awaits nothing and calls nothing but builtins (outside lambdas, whose bodies do not run here)."""
    stack: list[ast.AST] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            stack.extend(node.args.defaults + [d for d in node.args.kw_defaults if d is not None])
            continue
        if isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom)):
            return False
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _BUILTINS):
            return False
        stack.extend(ast.iter_child_nodes(node))
    return True


API_MODULES = frozenset({"lib", "utils", "drawing"})  # what run_file provides; an import of them must work


class Unimported:
    """A name an import in a notebook's definitions would bind, where that import failed here (Colab's
    `from google.colab import drive`, a plotting package not installed). The graded function runs as
    in the student's own environment when it does not use the name; using it raises ImportError saying
    which import, in which cell, failed."""

    def __init__(self, name: str, statement: str, where: str, reason: str) -> None:
        self._message = (f"{name!r} comes from `{statement}` in {where}, which could not be imported here: "
                         f"{reason}")

    def _fail(self, *_args: object, **_kwargs: object) -> None:
        raise ImportError(self._message)

    def __getattr__(self, attr: str) -> None:
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    __call__ = __getitem__ = __iter__ = _fail

    def __repr__(self) -> str:
        return f"<not imported: {self._message}>"


def unimported(stmt: ast.stmt, where: str, error: ImportError) -> dict[str, Unimported] | None:
    """The placeholders an import statement that raised `error` would have bound, or None when the
    statement is not an import, or imports one of the APIs' own modules (a wrong name there is an error
    as it is in the original)."""
    if isinstance(stmt, ast.Import):
        modules = [a.name for a in stmt.names]
        bound = [a.asname or a.name.partition(".")[0] for a in stmt.names]
    elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
        modules = [stmt.module]
        bound = [a.asname or a.name for a in stmt.names]
    else:
        return None
    if any(m.partition(".")[0] in API_MODULES for m in modules) or "*" in bound:
        return None
    statement = ast.unparse(stmt)
    return {name: Unimported(name, statement, where, f"{type(error).__name__}: {error}") for name in bound}

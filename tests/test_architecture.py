"""The house's layout holds: imports flow one way, from the grader down to the errors (docs/architecture.md).

Every `import` of the project's own modules counts, wherever it stands (at the top, inside a function, under
`if TYPE_CHECKING:`): a cycle that only a type checker follows is still two modules that need each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dist_lib", "strategies", "grader")

# Bottom to top. A module may import modules of its own layer and of the layers below, never above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("dist_lib.errors", "dist_lib.specs"),
    ("dist_lib.native",),
    ("dist_lib.memory",),
    ("dist_lib.tensors",),
    ("dist_lib.workload",),
    ("dist_lib.hardware",),
    ("dist_lib.costs",),
    ("dist_lib.engine",),
    ("dist_lib.comm",),
    ("dist_lib.model",),
    ("dist_lib.output",),
    ("dist_lib.run",),
    ("dist_lib.schedules",),
    ("dist_lib.planner",),
    ("dist_lib",),  # the public face: dist_lib/__init__.py
    ("strategies",),
    ("dist_lib.compat", "dist_lib.testing"),
    ("grader",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules that `name` imports (a `from package import submodule` counts the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in modules else module)
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int:
    """The layer of the longest prefix that names one (`dist_lib` itself is the public face only)."""
    best, depth = -1, -1
    for index, names in enumerate(LAYERS):
        for prefix in names:
            matches = module == prefix or (module.startswith(prefix + ".") and prefix != "dist_lib")
            if matches and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    return best


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_the_project_has_no_import_cycle():
    assert cycles(graph()) == []


def test_every_module_belongs_to_a_layer():
    assert [m for m in graph() if layer_of(m) < 0] == []


@pytest.mark.parametrize("importer, imported, allowed", [
    ("dist_lib.engine.core", "dist_lib.costs.compute", True),
    ("dist_lib.costs.compute", "dist_lib.engine.core", False),
    ("dist_lib.planner.search", "dist_lib", False),
    ("strategies.ddp", "dist_lib", True),
])
def test_the_layer_rule_reads_as_the_architecture_says(importer, imported, allowed):
    assert (layer_of(imported) <= layer_of(importer)) is allowed


def test_imports_flow_downward():
    upward = sorted(f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
                    for m, deps in graph().items() for d in deps if layer_of(d) > layer_of(m))
    assert upward == []


def test_the_top_level_holds_the_public_face_and_a_handful_of_modules():
    top = sorted(p.name for p in (ROOT / "dist_lib").glob("*.py"))
    assert top == ["__init__.py", "errors.py", "specs.py", "tensors.py", "testing.py"]


def test_no_python_file_is_over_500_lines():
    long = sorted(f"{p.relative_to(ROOT)}: {n}" for package in (*PACKAGES, "benchmarks")
                  for p in (ROOT / package).rglob("*.py") if (n := len(p.read_text().splitlines())) > 500)
    assert long == []

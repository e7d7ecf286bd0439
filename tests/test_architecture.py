"""The project's rooms, read from its own imports (docs/architecture.md, "Rooms of
core/").

Every ``import`` of every module counts, at any depth (inside functions too): a
function-level import is a dependency all the same, and so is ``import_module`` of a
name written out. A package's ``__init__``, which runs before any of its modules, is
counted only where a module imports it by name (``from package import name``): else
every package whose ``__init__`` gathers its modules' names would be a circle. The
direction checks count imports under ``if TYPE_CHECKING:`` (a room that names another's
types knows it); so does one of the two circle checks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"sparkeos": ROOT / "sparkeos", "sparkeos.core": ROOT / "core",
            "sparkeos.connectors": ROOT / "connectors"}
"""Where each package's files are (pyproject.toml's package-dir)."""

CORE = "sparkeos.core"
ROOMS = ("snapshot", "storage", "text", "streaming")
FORBIDDEN: Mapping[str, tuple[str, ...]] = {
    # the protocol knows nothing of Spark or of any store
    f"{CORE}.snapshot": (f"{CORE}.streaming", f"{CORE}.storage", f"{CORE}.text", "pyspark"),
    f"{CORE}.storage": (f"{CORE}.streaming", f"{CORE}.text"),
    f"{CORE}.text": (f"{CORE}.streaming", f"{CORE}.storage", f"{CORE}.snapshot"),
    CORE: ("sparkeos.connectors", "sparkeos.testing", "sparkeos.cli", "sparkeos.formats",
           "sparkeos.demo"),
}
"""Package -> what no module in it may import (a prefix, at a dot)."""


@dataclass
class ImportGraph:
    modules: dict[str, Path] = field(default_factory=dict)
    runtime: dict[str, set[str]] = field(default_factory=dict)
    """Module -> the project's modules it imports when it runs."""
    named: dict[str, set[str]] = field(default_factory=dict)
    """Module -> everything it imports (any module, TYPE_CHECKING included)."""


def read_graph(packages: Mapping[str, Path]) -> ImportGraph:
    graph = ImportGraph()
    for package, directory in packages.items():
        for path in sorted(directory.rglob("*.py")):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            graph.modules[".".join([package, *parts])] = path
    known = set(graph.modules)
    for name, path in graph.modules.items():
        runtime, named = _imports(name, path, known)
        graph.named[name] = named
        graph.runtime[name] = {m for m in runtime if m in known and m != name}
    return graph


def _imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text(), str(path))
    type_only = {id(node) for block in ast.walk(tree) if _type_checking(block)
                 for statement in block.body for node in ast.walk(statement)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    runtime: set[str] = set()
    named: set[str] = set()
    for node in ast.walk(tree):
        targets = _targets(node, package, known)
        named.update(targets)
        if id(node) not in type_only:
            runtime.update(targets)
    return runtime, named


def _type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _targets(node: ast.AST, package: str, known: set[str]) -> set[str]:
    """The modules an import statement imports: ``from a import b`` is ``a.b`` where
    that is a module of the project (the package ``a`` is loaded as its parent, as for
    ``from a.b import c``), else ``a``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.Call):
        return _imported_by_name(node)
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return {f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
            for alias in node.names}


def _imported_by_name(call: ast.Call) -> set[str]:
    """``importlib.import_module("a.b")`` and ``__import__("a.b")`` with the name
    written out (a name computed at run time, as the lazy exports' tables, is not seen)."""
    function = call.func
    name = (function.attr if isinstance(function, ast.Attribute)
            else function.id if isinstance(function, ast.Name) else "")
    if name not in ("import_module", "__import__") or not call.args:
        return set()
    first = call.args[0]
    if (isinstance(first, ast.Constant) and isinstance(first.value, str)
            and not first.value.startswith(".")):
        return {first.value}
    return set()


def circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without
    recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def trespasses(graph: ImportGraph,
               forbidden: Mapping[str, tuple[str, ...]]) -> list[str]:
    """``module -> import`` for each import a room may not make."""
    found = []
    for module, imported in sorted(graph.named.items()):
        for room, banned in forbidden.items():
            if not _within(module, room):
                continue
            hits = {target for target in imported if any(_within(target, b) for b in banned)}
            # ``from a import b`` names ``a`` and ``a.b``: say ``a``
            found += sorted(f"{module} -> {target}" for target in hits
                            if not any(_within(target, other) for other in hits - {target}))
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def connector_crossings(graph: ImportGraph) -> list[str]:
    """A connector importing another connector (each depends on ``core`` only)."""
    prefix = "sparkeos.connectors."
    found = []
    for module, imported in sorted(graph.named.items()):
        if not module.startswith(prefix):
            continue
        own = module[len(prefix):].split(".")[0]
        found += [f"{module} -> {target}" for target in sorted(imported)
                  if target.startswith(prefix) and target[len(prefix):].split(".")[0] != own]
    return found


@pytest.fixture(scope="module")
def project() -> ImportGraph:
    return read_graph(PACKAGES)


def test_the_rooms_exist(project: ImportGraph) -> None:
    for room in ROOMS:
        assert f"{CORE}.{room}" in project.modules, room
    assert f"{CORE}.snapshot.coordinator" in project.modules  # the graph reads core/


def test_no_module_imports_itself_through_others(project: ImportGraph) -> None:
    assert circles(project.runtime) == []


def test_no_circle_even_through_type_annotations(project: ImportGraph) -> None:
    """Types named under ``TYPE_CHECKING`` never run, but two modules naming each other's
    are one room in two files."""
    known = set(project.modules)
    assert circles({m: {t for t in named if t in known and t != m}
                    for m, named in project.named.items()}) == []


def test_each_room_imports_only_what_it_may(project: ImportGraph) -> None:
    assert trespasses(project, FORBIDDEN) == []


def test_the_top_of_core_imports_no_room_but_the_protocol(project: ImportGraph) -> None:
    """What a connector author imports from the top stays light: the contract may use
    the protocol's types, never Spark's entry points, storage or Spark's text (the
    package's ``__init__`` only names them for its lazy exports)."""
    top = {module: (f"{CORE}.streaming", f"{CORE}.storage", f"{CORE}.text")
           for module in project.modules
           if module.rpartition(".")[0] == CORE and module.rpartition(".")[2] not in ROOMS}
    assert len(top) >= 8, sorted(top)
    assert trespasses(project, top) == []


def test_connectors_depend_on_core_only(project: ImportGraph) -> None:
    assert connector_crossings(project) == []


def unresolved(graph: ImportGraph, roots: Iterable[str]) -> list[str]:
    """Imports of the project's packages that name no module of it (a relative import
    left behind by a move fails only when its function runs)."""
    found = []
    for module, path in sorted(graph.modules.items()):
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [_from_module(node, package)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{module}:{node.lineno} -> {name}" for name in names
                      if any(_within(name, root) for root in roots)
                      and name not in graph.modules]
    return found


def _from_module(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def test_every_import_of_the_project_names_a_module_of_it(project: ImportGraph) -> None:
    assert unresolved(project, PACKAGES) == []


def test_the_checks_find_a_circle_and_a_trespass(tmp_path: Path) -> None:
    """The checks above can fail: a planted circle and a planted trespass are found."""
    (tmp_path / "snapshot").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "snapshot" / "__init__.py").write_text("")
    (tmp_path / "snapshot" / "a.py").write_text("from . import b\n")
    (tmp_path / "snapshot" / "b.py").write_text(
        "def later():\n    from .a import x\n    from pyspark import TaskContext\n")
    (tmp_path / "snapshot" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n")
    (tmp_path / "snapshot" / "d.py").write_text(
        "from .c import C\nimport importlib\nimportlib.import_module('pkg.streaming.x')\n")
    graph = read_graph({"pkg": tmp_path})
    assert circles(graph.runtime) == [["pkg.snapshot.a", "pkg.snapshot.b"]]
    assert trespasses(graph, {"pkg.snapshot": ("pyspark", "pkg.streaming")}) == [
        "pkg.snapshot.b -> pyspark", "pkg.snapshot.d -> pkg.streaming.x"]
    (tmp_path / "snapshot" / "e.py").write_text("def later():\n    from .gone import x\n")
    assert unresolved(read_graph({"pkg": tmp_path}), ["pkg"]) == [
        "pkg.snapshot.e:2 -> pkg.snapshot.gone"]


CLASS_LINES, FUNCTION_LINES = 250, 60
LONGER_TODAY = {
    "class sparkeos.core.storage.stores.writeonce.ObjectStoreFiles": 286,
    "class sparkeos.testing.conformance.cases.ConnectorConformance": 588,
    "function sparkeos.cli._status": 69,
    "function sparkeos.demo.main": 154,
    "function sparkeos.testing.wireproxy._handler_for": 91,
}
"""What was longer than the limits when they were written down (issue 49), at most as
long as then: each is a room to split when it is next changed."""


def oversized(graph: ImportGraph) -> dict[str, int]:
    found = {}
    for module, path in graph.modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                kind, limit = "class", CLASS_LINES
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                kind, limit = "function", FUNCTION_LINES
            else:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found[f"{kind} {module}.{node.name}"] = lines
    return found


def test_no_class_or_function_grows_past_its_limit(project: ImportGraph) -> None:
    grown = {name: lines for name, lines in oversized(project).items()
             if lines > LONGER_TODAY.get(name, 0)}
    assert grown == {}, f"over {CLASS_LINES} lines a class, {FUNCTION_LINES} a function"

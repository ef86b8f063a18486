"""Data flows one way: no package imports a package further down the chain, no module imports itself back
through others, and no module of ours is imported by a name the checks here cannot see."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "anchorlens"

# Upstream first. A module may import only from its own layer or layers above it.
LAYERS = [
    {"errors", "atomic", "progress", "rundir", "tensorfile", "devices", "arguments", "heap"},
    {"roles"},
    {"tasks"},
    {"models"},
    {"engine"},
    {"methods"},
    {"capture"},
    {"analyses"},
    {"evaluation"},
    {"training", "runtime"},
    {"workflows"},
    {"figures", "views"},
    {"reports"},
    {"notebook"},
    {"cli", "__main__", "__init__"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# The one import by a computed name: anchorlens/__init__.py's PEP 562 ``__getattr__``, which imports a public
# name's module on first use so that ``import anchorlens`` stays fast (its table, ``_EXPORTS``, names them).
LAZY_LOADER = ("__init__.py", "__getattr__")


def _imports(path: Path) -> set[str]:
    """Top-level anchorlens subpackages that ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "anchorlens" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_package_has_a_layer():
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.rglob("*.py")}
    assert tops <= set(RANK), f"place these in LAYERS: {sorted(tops - set(RANK))}"


def test_no_module_imports_downstream():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for dep in _imports(path):
            if RANK[dep] > RANK[own]:
                bad.append(f"{path.relative_to(PACKAGE)} imports anchorlens.{dep}")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------- the module graph
def _module_name(path: Path) -> str:
    """``anchorlens/capture/run.py`` -> ``anchorlens.capture.run``; a package's ``__init__.py`` -> the package."""
    parts = ("anchorlens", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _package_of(name: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _targets(node: ast.AST, name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The modules of ours that one import statement loads (at module level, in a function, anywhere).

    ``import anchorlens.a.b`` -> ``anchorlens.a.b``; ``from anchorlens.a import b`` -> ``anchorlens.a.b`` where b is
    a submodule, else ``anchorlens.a`` (its ``__init__``); relative imports resolved from the module's package;
    ``importlib.import_module("anchorlens.a")`` with a literal name -> ``anchorlens.a`` (refused anyway, below)."""
    if isinstance(node, ast.Call) and _called(node) in ("import_module", "__import__") and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and arg.value in modules:
            yield arg.value
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                yield alias.name
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = _package_of(name, path).split(".")
            anchor = ".".join(package[: len(package) - (node.level - 1)])
            base = f"{anchor}.{base}" if base else anchor
        if base.split(".")[0] != "anchorlens":
            return
        for alias in node.names:
            if f"{base}.{alias.name}" in modules:
                yield f"{base}.{alias.name}"
            elif base in modules:
                yield base


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (function-level and ``TYPE_CHECKING`` imports included)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            graph[name].update(t for t in _targets(node, name, path, modules) if t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f", "e"}, "g": {"h"}, "h": {"g"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["g", "h"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_every_kind_of_import(tmp_path):
    names = ("anchorlens.capture", "anchorlens.capture.run", "anchorlens.capture.event", "anchorlens.capture.maps")
    modules = {n: PACKAGE for n in names}
    here = PACKAGE / "capture" / "session.py"
    text = (
        "import anchorlens.capture.run\n"
        "def f():\n    from anchorlens.capture import event, Selection\n"
        "from . import run\nfrom .event import AttentionEvent\nimport torch\n"
        "def g():\n    importlib.import_module('anchorlens.capture.maps')\n    import_module(name)\n"
    )
    got = set()
    for node in ast.walk(ast.parse(text)):
        got.update(_targets(node, "anchorlens.capture.session", here, modules))
    assert got == {
        "anchorlens.capture.run",
        "anchorlens.capture.event",
        "anchorlens.capture",
        "anchorlens.capture.maps",
    }


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (break each by moving the shared code up a layer):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def _called(call: ast.Call) -> str:
    """The name a call calls (``importlib.import_module(...)`` -> ``import_module``), or ``""``."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _import_calls(tree: ast.AST) -> Iterator[tuple[ast.Call, str | None]]:
    """Every call of ``importlib.import_module`` / ``import_module`` / ``__import__`` with the function it is in."""
    owners: dict[ast.AST, str | None] = {}
    for node in ast.walk(tree):  # parents before children
        owner = node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else owners.get(node)
        for child in ast.iter_child_nodes(node):
            owners[child] = owner
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if _called(node) in ("import_module", "__import__"):
            yield node, owners.get(node)


def _ours(call: ast.Call) -> bool:
    """Whether the call may import a module of ours: a literal naming anchorlens (or a relative name), or a
    computed name (which the checks here cannot read)."""
    if not call.args:
        return True
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value.split(".")[0] == "anchorlens" or arg.value.startswith(".")
    return True


def test_no_module_of_ours_is_imported_by_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for call, owner in _import_calls(ast.parse(path.read_text())):
            if _ours(call):
                found.append((str(path.relative_to(PACKAGE)), owner))
    assert LAZY_LOADER in found, "the lazy public-API loader moved: update LAZY_LOADER"
    rest = [f"{file} ({owner or 'module level'})" for file, owner in found if (file, owner) != LAZY_LOADER]
    assert not rest, "import modules of ours with an import statement, not by name:\n" + "\n".join(rest)


def test_the_name_import_check_reads_calls():
    text = (
        "import importlib\nfrom importlib import import_module\n"
        "def f():\n    importlib.import_module('anchorlens.capture.run')\n"
        "x = import_module('json')\ny = __import__(name)\n"
    )
    calls = [(_ours(call), owner) for call, owner in _import_calls(ast.parse(text))]
    assert sorted(calls, key=str) == sorted([(True, "f"), (False, None), (True, None)], key=str)

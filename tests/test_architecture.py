"""Data flows one way: no package imports a package further down the chain."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "anchorlens"

# Upstream first. A module may import only from its own layer or layers above it.
LAYERS = [
    {"errors", "atomic", "progress", "rundir", "tensorfile", "devices", "arguments", "heap"},
    {"roles"},
    {"tasks"},
    {"models"},
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

"""The import graph of the package, read with ``ast`` (nothing imported): observability reads
the manager's events through the schema and never imports the manager; the schema is standard
library only; the pure layers reach neither zmq nor MindSpore (docs/design.md)."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

import ms_recover

PACKAGE = pathlib.Path(ms_recover.__file__).parent
#: The pure layers, and what they must never reach through module-level imports.
PURE = (
    "ms_recover.config",
    "ms_recover.strategy",
    "ms_recover.protocol.messages",
    "ms_recover.manager.decide",
    "ms_recover.manager.planner",
    "ms_recover.observability.schema",
)
IMPURE = ("zmq", "mindspore")


def _module(path: pathlib.Path) -> str:
    parts = ["ms_recover", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, top_level: bool) -> set[str]:
    """The modules ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``), relative
    imports resolved; ``top_level``: only the statements run when it is imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level else list(ast.walk(tree))
    here = _module(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _reaches(start: str) -> set[str]:
    """Every module ``start`` imports when it is imported, transitively (a package's
    ``__init__`` included)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        parents = [".".join(parts[:i]) for i in range(1, len(parts))]
        todo.extend(p for p in parents if p in MODULES)
        if name in MODULES:
            todo.extend(_imports(MODULES[name], top_level=True))
    return seen


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "observability").glob("*.py")), ids=lambda p: p.name
)
def test_observability_never_imports_the_manager(path: pathlib.Path) -> None:
    found = sorted(n for n in _imports(path, top_level=False) if _under(n, "ms_recover.manager"))
    assert not found, f"{path.name} imports {found}"


def test_the_schema_imports_only_the_standard_library() -> None:
    imported = _imports(PACKAGE / "observability" / "schema.py", top_level=False)
    outside = sorted(n for n in imported if n.split(".")[0] not in sys.stdlib_module_names)
    assert outside == [] and "__future__" in imported


@pytest.mark.parametrize("module", PURE)
def test_a_pure_layer_reaches_neither_zmq_nor_mindspore(module: str) -> None:
    reached = _reaches(module)
    assert module in MODULES
    assert sorted(n for n in reached if any(_under(n, bad) for bad in IMPURE)) == []


def test_the_checks_see_an_import_where_there_is_one() -> None:
    assert "ms_recover.manager.model" in _reaches("ms_recover.manager.decide")
    assert "ms_recover.observability.schema" in _reaches("ms_recover.manager.decide")
    assert any(_under(n, "zmq") for n in _reaches("ms_recover.manager.server"))

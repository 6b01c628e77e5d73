"""The session core and its two drivers import one way, imports inside functions (and under
TYPE_CHECKING) included: session/ only from the sans-I/O layers below it, aio/ and anyio/
nothing above them (the CLI, the apps, the bridge, tracing, the pipeline), and no import
that runs makes a cycle through any of their modules. (tests/test_structure.py checks the
whole tree's import-time graph.)"""

from __future__ import annotations

import ast
from pathlib import Path

import polymux


SRC = Path(polymux.__file__).parent
PACKAGES = ("session", "aio", "anyio")

BELOW_SESSION = (
    "polymux._types",
    "polymux.config",
    "polymux.exceptions",
    "polymux.engine",
    "polymux.formats",
    "polymux.wire",
    "polymux.sniff",
)
"""What the sans-I/O session layer may import besides itself (the format registry: its
detector tells a session's errors what a peer of another format speaks)."""

ABOVE_DRIVERS = (
    "polymux.cli",
    "polymux.apps",
    "polymux.bridging",
    "polymux.tracing",
    "polymux.pipeline",
    "polymux.web",
)
"""What the drivers must not import."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _nodes(tree: ast.AST, typing: bool) -> list[ast.AST]:
    """Every node of ``tree``; without those under ``if TYPE_CHECKING:`` unless ``typing``."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def _imports(name: str, source: str | None = None, *, typing: bool = True) -> set[str]:
    """Every polymux module ``name`` (or ``source`` standing for it) imports, anywhere in it
    (``typing=False``: not counting imports for type checkers only)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text() if source is None else source), typing):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("polymux"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                base = ".".join(parent[: len(parent) - node.level + 1] + ([base] if base else []))
            if base.startswith("polymux"):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def _ours(name: str) -> bool:
    return any(name == f"polymux.{p}" or name.startswith(f"polymux.{p}.") for p in PACKAGES)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_session_layer_imports_only_what_is_below_it() -> None:
    bad = {
        name: sorted(m for m in _imports(name) if not _within(m, (*BELOW_SESSION, "polymux.session")))
        for name in MODULES
        if _within(name, ("polymux.session",))
    }
    assert not {k: v for k, v in bad.items() if v}
    assert "polymux.session.core" in bad  # the walk saw the package


def test_the_drivers_import_nothing_above_them() -> None:
    checked = []
    for name in MODULES:
        if not _within(name, ("polymux.aio", "polymux.anyio")):
            continue
        checked.append(name)
        above = sorted(m for m in _imports(name) if _within(m, ABOVE_DRIVERS))
        assert not above, f"{name} imports {above}"
        if _within(name, ("polymux.aio",)):
            assert not any(_within(m, ("polymux.anyio",)) for m in _imports(name)), name
        else:  # the anyio driver shares only the socket helper of the asyncio one
            assert {m for m in _imports(name) if _within(m, ("polymux.aio",))} <= {"polymux.aio._sockinfo"}
    assert "polymux.anyio" in checked and "polymux.aio.session" in checked


def test_no_import_cycle_goes_through_the_session_or_a_driver() -> None:
    """(Imports for type checkers only do not run: the core's modules that name the core in
    annotations are not a cycle.)"""
    graph = {name: _imports(name, typing=False) for name in MODULES}
    for start in sorted(n for n in MODULES if _ours(n)):
        # Every module reachable from start: is start among them?
        seen: set[str] = set()
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for dep in sorted(graph[node]):
                if dep == start:
                    raise AssertionError("import cycle: " + " -> ".join([*path, dep]))
                if dep not in seen:
                    seen.add(dep)
                    stack.append((dep, [*path, dep]))


def test_the_walk_sees_imports_inside_functions() -> None:
    """The checks above are not blind to a function-level import (the way a cycle hides),
    nor to one under TYPE_CHECKING, nor to a relative one."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from polymux.tracing import records\n"
        "def f() -> None:\n    from polymux.cli import main\n"
        "class C:\n    def g(self) -> None:\n        from ..aio import session\n"
    )
    assert _imports("polymux.session.core", source) == {
        "polymux.tracing.records",
        "polymux.cli",
        "polymux.aio.session",
    }
    assert _imports("polymux.session.core", source, typing=False) == {"polymux.cli", "polymux.aio.session"}

"""The structure the issues promise, checked on the source: imports go one way (no
cycle; wire/ and engine/ import no I/O), and nothing outside a format's own modules tests
a format's name or probes an engine with getattr (everything asks the registry,
:mod:`polymux.formats`, or the engine's own interface)."""

from __future__ import annotations

import ast
from pathlib import Path

import polymux
from polymux import formats


SRC = Path(polymux.__file__).parent
NAMES = set(formats.PROTOCOLS)


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The polymux modules ``name`` imports at import time (not inside functions, not under
    TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("polymux"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")
                    base = ".".join(parent[: len(parent) - node.level + 1] + ([base] if base else []))
                if not base.startswith("polymux"):
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in modules else base)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(node.orelse)

    visit(tree.body)
    return {m for m in found if m in modules and m != name}


def test_the_import_graph_of_src_has_no_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # A package's __init__ importing its own submodules is how packages re-export: a
    # submodule importing its package's __init__ back would be the cycle to catch, and is
    # kept; the edge parent -> child alone is not a cycle.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_sans_io_layers_import_no_io() -> None:
    for layer in ("wire", "engine", "session"):
        for path in (SRC / layer).glob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                bad = [
                    n
                    for n in names
                    if n.split(".")[0] in ("asyncio", "socket", "anyio", "trio", "pyspark", "uvloop")
                ]
                assert not bad, f"{path}: imports {bad}"


def _own(path: Path) -> bool:
    """A format's own modules: its codec, its engine and its definition (polymux.formats)."""
    rel = path.relative_to(SRC).as_posix()
    return rel.startswith(("wire/", "engine/", "formats/"))


def test_no_format_name_tests_and_no_engine_probes_outside_a_formats_own_modules() -> None:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        if _own(path):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                consts = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                for c in consts:
                    values = c.value if isinstance(c.value, tuple) else (c.value,)
                    if any(isinstance(v, str) and v in NAMES for v in values):
                        problems.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
                problems.extend(
                    f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}"
                    for comp in [node.left, *node.comparators]
                    if isinstance(comp, (ast.Tuple, ast.List, ast.Set))
                    and any(isinstance(e, ast.Constant) and e.value in NAMES for e in comp.elts)
                )
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "startswith" and node.args and isinstance(node.args[0], ast.Constant):
                    prefix = node.args[0].value
                    if isinstance(prefix, str) and any(
                        n.startswith(prefix) and len(prefix) > 3 for n in NAMES
                    ):
                        problems.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                target = ast.unparse(node.args[0]) if node.args else ""
                if "engine" in target:
                    problems.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert not problems, "\n".join(problems)


def test_the_registry_is_what_everything_lists() -> None:
    from polymux.formats import make_engine

    assert polymux.PROTOCOLS == formats.PROTOCOLS
    for fmt in formats.FORMATS:
        engine = make_engine(fmt.name)
        assert engine.format == fmt.name
        assert engine.one_way == fmt.caps.one_way
        assert engine.has_ping == fmt.caps.ping
        assert bool(engine.has_flow_control) == (fmt.caps.credit is not None)


def test_no_asyncio_wait_for_in_src() -> None:
    """Python 3.11's asyncio.wait_for returns the result and swallows a cancellation that
    arrives as the awaited thing completes (Ctrl-C lost); src uses asyncio.timeout."""
    found = [
        f"{path.relative_to(SRC)}:{n}"
        for path in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "wait_for(" in line and not line.lstrip().startswith("#")
    ]
    assert found == []

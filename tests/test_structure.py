"""The structure the issues promise, checked on the source: imports go one way (no
cycle, counting the imports inside functions; each layer imports only the layers below
it: wire/ and engine/ nothing above them), and nothing outside a format's own modules tests
a format's name or probes an engine with getattr (everything asks the registry,
:mod:`polymux.formats`, or the engine's own interface)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import polymux
from polymux import formats


SRC = Path(polymux.__file__).parent
NAMES = set(formats.PROTOCOLS)

LAYERS = (
    ("polymux._types", "polymux.exceptions", "polymux.config", "polymux.sniff"),
    ("polymux.wire",),
    ("polymux.engine",),
    ("polymux.formats",),
    ("polymux.session",),
)
"""The sans-I/O layers, bottom up: a module of one imports only modules of its own layer and
of those below (the shared base: types, errors, the configuration, the sniffer). Everything
else (the drivers, tracing, the apps ...) sits above them all."""


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return len(LAYERS)


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(
    name: str, path: Path, modules: dict[str, Path], *, type_checking: bool = False, source: str | None = None
) -> dict[str, int]:
    """The polymux modules ``name`` imports, anywhere in it: at import time, inside
    functions and methods (an import there runs later, but a cycle it closes is a cycle
    all the same), and with ``type_checking`` under ``if TYPE_CHECKING:`` too. Each with
    the line of its first import."""
    tree = ast.parse(source if source is not None else path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(module: str, line: int) -> None:
        if module in modules and module != name:
            found.setdefault(module, line)

    def visit(node: ast.AST) -> None:
        if _type_checking(node) and not type_checking:
            for child in getattr(node, "orelse", []):
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("polymux"):
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                base = ".".join(parent[: len(parent) - node.level + 1] + ([base] if base else []))
            if base.startswith("polymux"):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    add(full if full in modules else base, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph(*, type_checking: bool = False) -> dict[str, dict[str, int]]:
    modules = _modules()
    return {
        name: _imports(name, path, modules, type_checking=type_checking) for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]] | dict[str, dict[str, int]]) -> list[str] | None:
    """An import cycle of ``graph``, or None. A package's __init__ importing its own
    submodules is how packages re-export: a submodule importing its package's __init__
    back would be the cycle to catch, and is kept; the edge parent -> child alone is not a
    cycle."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_of_src_has_no_cycle() -> None:
    """Counting the imports inside functions: a cycle closed by one is a cycle."""
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_imports_inside_functions() -> None:
    """The check itself: a cycle whose closing import is inside a function (as
    formats -> engine -> wire -> formats once was) is found."""
    modules = {"polymux.a": SRC / "a.py", "polymux.b": SRC / "b.py"}
    a = _imports("polymux.a", modules["polymux.a"], modules, source="from polymux import b\n")
    b = _imports(
        "polymux.b",
        modules["polymux.b"],
        modules,
        source="def f():\n    if True:\n        from polymux.a import x\n",
    )
    assert a == {"polymux.b": 1} and b == {"polymux.a": 3}
    assert _cycle({"polymux.a": set(a), "polymux.b": set(b)}) == ["polymux.a", "polymux.b", "polymux.a"]
    hidden = _imports(
        "polymux.b", modules["polymux.b"], modules, source="if TYPE_CHECKING:\n    import polymux.a\n"
    )
    assert hidden == {}
    assert _imports(
        "polymux.b",
        modules["polymux.b"],
        modules,
        type_checking=True,
        source="if TYPE_CHECKING:\n    import polymux.a\n",
    ) == {"polymux.a": 2}


def test_each_sans_io_layer_imports_only_the_layers_below_it() -> None:
    """wire/ imports nothing above the shared base, engine/ nothing above wire/, formats/
    nothing above engine/, session/ nothing above formats/: not at import time, not inside
    a function, not even for the type checker."""
    problems = [
        f"{SRC.parent / name.replace('.', '/')}:{line}: {name} (layer {_layer(name)}) imports {dep} "
        f"(layer {_layer(dep)})"
        for name, deps in sorted(_graph(type_checking=True).items())
        if _layer(name) < len(LAYERS)
        for dep, line in sorted(deps.items())
        if _layer(dep) > _layer(name)
    ]
    assert problems == []


@pytest.mark.parametrize("layer", ["wire", "engine"])
def test_wire_and_engine_import_nothing_above_them(layer: str) -> None:
    """The promise in its plainest form: every polymux module that wire/ (engine/) imports
    is the shared base, wire/ (or engine/)."""
    allowed = ("polymux._types", "polymux.exceptions", "polymux.config", "polymux.wire") + (
        ("polymux.engine",) if layer == "engine" else ()
    )
    graph = _graph(type_checking=True)
    imported = {dep for name, deps in graph.items() if name.startswith(f"polymux.{layer}") for dep in deps}
    assert imported, layer
    assert {dep for dep in imported if not dep.startswith(allowed)} == set()


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
    """One list of formats, and one declaration of each format's capabilities: the one its
    engine reads."""
    assert polymux.PROTOCOLS is formats.PROTOCOLS
    assert tuple(formats.PROTOCOLS) == tuple(fmt.name for fmt in formats.FORMATS)
    for fmt in formats.FORMATS:
        engine = fmt.make_engine()
        assert engine.format == fmt.name
        assert engine.caps is fmt.caps
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

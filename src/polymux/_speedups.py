"""Which path polymux's data plane runs on: compiled, or its pure-Python twin.

The modules of :data:`COMPILED_MODULES` are the ones every frame's bytes pass through.
``setup.py`` compiles each of them with Cython from its own source, unchanged, into a C
extension next to it, which Python imports instead of the ``.py`` file; the ``.py`` file
is the pure-Python twin. One source, so both paths behave the same by construction, and
the test suite checks it (``tests/test_speedups.py`` feeds the same bytes to both).

:func:`install` (run by ``import polymux``, before any of these modules) puts a finder
in front of Python's own that imports the twin instead when

* ``POLYMUX_NO_EXTENSIONS=1`` (any non-empty value) is set, as aiohttp's
  ``AIOHTTP_NO_EXTENSIONS`` and yarl's ``YARL_NO_EXTENSIONS`` do; or
* in a checkout, the ``.py`` file is newer than its extension (a stale build: it says
  so once on standard error; ``scripts/setup`` rebuilds).

:func:`path` names the path in use (``polymux --version`` prints it).

This module is plain standard library: ``setup.py`` reads :data:`COMPILED_MODULES` from it
without importing polymux.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType


__all__ = ["COMPILED_MODULES", "NO_EXTENSIONS", "compiled", "install", "path"]

COMPILED_MODULES = (
    # the codecs
    "polymux.wire._buffer",
    "polymux.wire._varint",
    "polymux.wire.mplex",
    "polymux.wire.mstream",
    "polymux.wire.omnistreams",
    "polymux.wire.smux",
    "polymux.wire.streamux",
    "polymux.wire.yamux",
    # the engines and their data plane
    "polymux.engine.plane",
    "polymux.engine.flow",
    "polymux.engine.channel",
    "polymux.engine.base",
    "polymux.engine.mplex",
    "polymux.engine.mstream",
    "polymux.engine.omnistreams",
    "polymux.engine.smux",
    "polymux.engine.streamux",
    "polymux.engine.yamux",
    # the session core's data path
    "polymux.session.core",
    "polymux.session.budget",
    "polymux.session.peer",
    "polymux.session.scheduler",
    "polymux.session.channels",
    "polymux.session.dispatch",
    # the asyncio driver
    "polymux.aio.reader",
    "polymux.aio.channel",
    "polymux.aio.session",
)
"""The modules compiled into C extensions, by name (``setup.py`` builds them)."""

NO_EXTENSIONS = bool(os.environ.get("POLYMUX_NO_EXTENSIONS"))
"""``POLYMUX_NO_EXTENSIONS`` was set: the pure-Python twin, whatever is built."""

_COMPILED = frozenset(COMPILED_MODULES)
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.isfile(os.path.join(_PACKAGE, os.pardir, os.pardir, "pyproject.toml"))
"""polymux runs from a checkout (``src/polymux``): file times tell a stale build."""


class _Chooser(MetaPathFinder):
    """Imports the ``.py`` twin of a compiled module when it must (module docstring)."""

    def __init__(self) -> None:
        self.stale: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in _COMPILED or path is None:
            return None
        name = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, name + ".py")
            if not os.path.isfile(source):
                continue
            if not NO_EXTENSIONS and not self._stale(entry, name, source, fullname):
                return None  # Python's own finder takes the extension (or the source, unbuilt)
            loader = importlib.machinery.SourceFileLoader(fullname, source)
            return importlib.util.spec_from_file_location(fullname, source, loader=loader)
        return None

    def _stale(self, entry: str, name: str, source: str, fullname: str) -> bool:
        if not _CHECKOUT:
            return False
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            built = os.path.join(entry, name + suffix)
            if os.path.isfile(built):
                if os.path.getmtime(source) <= os.path.getmtime(built):
                    return False
                if not self.stale:
                    print(
                        f"polymux: {fullname} changed since it was compiled: using its pure-Python "
                        "twin (scripts/setup rebuilds the extension)",
                        file=sys.stderr,
                    )
                self.stale.append(fullname)
                return True
        return False


_chooser = _Chooser()


def install() -> None:
    """Put the chooser in front of Python's finders (once)."""
    if _chooser not in sys.meta_path:
        sys.meta_path.insert(0, _chooser)


def compiled() -> bool:
    """Whether the data plane runs compiled (every module of :data:`COMPILED_MODULES`
    that is imported so far is an extension, and the data plane's own is)."""
    import polymux.engine.plane

    modules = [sys.modules[name] for name in COMPILED_MODULES if name in sys.modules]
    return all(not (module.__file__ or "").endswith(".py") for module in modules) and not (
        polymux.engine.plane.__file__ or ""
    ).endswith(".py")


def path() -> str:
    """The data plane's path, in words: ``compiled (Cython)`` or ``pure Python (...why)``."""
    if compiled():
        return "compiled (Cython)"
    if NO_EXTENSIONS:
        return "pure Python (POLYMUX_NO_EXTENSIONS is set)"
    if _chooser.stale:
        return "pure Python (the extension is older than its sources: scripts/setup rebuilds it)"
    return "pure Python (the extension is not built)"

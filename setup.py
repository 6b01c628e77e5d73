"""Build polymux's compiled data plane, when it can be built.

The metadata is in ``pyproject.toml``; this file only adds the extension modules: the
modules the bytes of every frame pass through (the codecs, the engines and their data
plane, the session core, the asyncio driver), each compiled by Cython from its own
``.py`` source, unchanged, as a C extension that Python imports in its place (``mypyc``
and aiohttp's websocket reader do the same). The ``.py`` files stay: they are the
pure-Python twin, used where the extension is not built and wherever
``POLYMUX_NO_EXTENSIONS=1`` is set (``polymux._speedups`` chooses at import).

The build is optional, as aiohttp's, yarl's and msgpack's are: without Cython or a C
compiler, or with ``POLYMUX_NO_EXTENSIONS=1`` set at build time, polymux installs on the
pure-Python path and says so once.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


def _compiled_modules() -> tuple[str, ...]:
    """``polymux._speedups.COMPILED_MODULES``, read without importing polymux (whose
    dependencies the build environment lacks)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "_polymux_speedups", os.path.join(here, "src", "polymux", "_speedups.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.COMPILED_MODULES)


COMPILED_MODULES = _compiled_modules()


def _warn(message: str) -> None:
    print(f"polymux: {message}; polymux installs on its pure-Python path", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """``build_ext`` that falls back to the pure-Python path instead of failing."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 (no compiler, no headers ...: any reason)
            _warn(f"the compiled data plane could not be built ({exc})")

    def build_extension(self, ext: object) -> None:
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001
            _warn(f"{getattr(ext, 'name', ext)} could not be compiled ({exc})")


def extensions() -> list[object]:
    if os.environ.get("POLYMUX_NO_EXTENSIONS"):
        _warn("POLYMUX_NO_EXTENSIONS is set")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    sources = [os.path.join("src", *name.split(".")) + ".py" for name in COMPILED_MODULES]
    return list(
        cythonize(
            sources,
            compiler_directives={
                "language_level": 3,
                "binding": True,  # functions keep their signatures and docstrings (inspect, docs)
                "annotation_typing": False,  # annotations are for mypy: same semantics as the twin
                "embedsignature": True,
            },
            nthreads=os.cpu_count() or 1,
            quiet=True,
        )
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})

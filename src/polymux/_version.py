"""The version of polymux: the one place it is written. ``pyproject.toml`` reads it
(``[tool.setuptools.dynamic]``), so the package's metadata, ``polymux.__version__`` and
``polymux --version`` cannot disagree."""

from __future__ import annotations


__all__ = ["__version__"]

__version__ = "0.1.0"

"""Fixtures of the CLI tests: ``procs`` (subprocesses) and ``short_tmp``."""

from __future__ import annotations

from .procs import procs, short_tmp


__all__ = ["procs", "short_tmp"]

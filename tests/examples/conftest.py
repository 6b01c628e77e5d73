"""Fixtures of the example tests: ``procs`` (subprocesses) and ``short_tmp``."""

from __future__ import annotations

from cli.procs import procs, short_tmp


__all__ = ["procs", "short_tmp"]

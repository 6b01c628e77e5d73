"""Fixtures of the CLI tests: ``procs`` (subprocesses) and ``short_tmp``; and the logging
state a command run in-process (``main([...])``) changes, restored after each test."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from .procs import procs, short_tmp


__all__ = ["procs", "restore_logging", "short_tmp"]


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """``polymux connect`` quiets the "polymux" logger for its process (it reports failures
    itself); in-process runs must not quiet it for the tests that follow."""
    loggers = [logging.getLogger(name) for name in ("polymux", "polymux.serve", "polymux.bridge")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)

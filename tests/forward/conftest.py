"""Fixtures of the forward tests: subprocesses (``procs``, ``short_tmp``: the CLI tests'),
a self-signed certificate, and the logging state a command run in-process changes."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.procs import procs, short_tmp


__all__ = ["cert", "procs", "restore_logging", "short_tmp"]


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh self-signed certificate for localhost / 127.0.0.1, and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS tests need the openssl command line tool (they are never skipped)")
    folder = tmp_path_factory.mktemp("tls")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(keyfile), "-out", str(certfile)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return certfile, keyfile


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """A command run in-process (``main([...])``) sets the forward logger's level."""
    logger = logging.getLogger("polymux.forward")
    level = logger.level
    yield
    logger.setLevel(level)

"""Fixtures for the interop tests: the Node.js reference peers, installed by the tests, and
the Go reference peers, built by the tests (``gobuild.py``).

A missing ``node``, ``npm`` or Go toolchain fails these tests (it never skips them): interop
with the reference implementations is part of what polymux promises.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .gobuild import GoUnavailable, build


NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="session")
def node_peers() -> Path:
    """The folder of the Node peers, with its npm packages installed (``npm ci``)."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("interop tests need Node.js and npm on PATH (they are never skipped)")
    lock = NODE_DIR / "package-lock.json"
    stamp = NODE_DIR / "node_modules" / ".package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            check=False,
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            pytest.fail(f"npm ci failed in {NODE_DIR}:\n{result.stdout}\n{result.stderr}")
    return NODE_DIR


@pytest.fixture(scope="session")
def go_yamux_peer() -> Path:
    """The Go peer over hashicorp/yamux (``go/yamux_peer``), built if its sources changed."""
    try:
        return build("yamux_peer")
    except GoUnavailable as exc:
        pytest.fail(f"interop tests against hashicorp/yamux (they are never skipped): {exc}")

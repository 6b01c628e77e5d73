"""Fixtures for the interop tests: the Node.js reference peers, installed by the tests, and
the Go reference peers, built by the tests (``gobuild.py``).

A missing ``node``, ``npm`` or Go toolchain fails these tests (it never skips them): interop
with the reference implementations is part of what polymux promises.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .gobuild import GoUnavailable, build
from .peers import install_node_peers


@pytest.fixture(scope="session")
def node_peers() -> Path:
    """The folder of the Node peers, with its npm packages installed (``npm ci``)."""
    return install_node_peers("interop tests")


@pytest.fixture(scope="session")
def go_yamux_peer() -> Path:
    """The Go peer over hashicorp/yamux (``go/yamux_peer``), built if its sources changed."""
    try:
        return build("yamux_peer")
    except GoUnavailable as exc:
        pytest.fail(f"interop tests against hashicorp/yamux (they are never skipped): {exc}")

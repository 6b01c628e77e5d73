"""Fixtures for the interop tests: the Node.js reference peers, installed by the tests.

A missing ``node`` or ``npm`` fails these tests (it never skips them): interop with the
reference implementation is part of what polymux promises.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .peers import install_node_peers


@pytest.fixture(scope="session")
def node_peers() -> Path:
    """The folder of the Node peers, with its npm packages installed (``npm ci``)."""
    return install_node_peers("interop tests")

"""Fixtures of the pipeline tests: one SparkSession for the whole run (local[2], quiet, UI
off, fast JVM start), the captures (made once, with polymux itself and the Node reference
peer), and one ``analyze`` of all of them that most tests read.

Nothing here skips: a missing Java, Node.js or npm fails the tests.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import polymux
from interop.peers import install_node_peers

from .scenarios import (
    Expected,
    format_session,
    node_session,
    slow_reader_session,
    violation_capture,
    write_pcap,
)


if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from polymux.pipeline import Summary


def ensure_java() -> str:
    """JAVA_HOME for Spark: the one set, else the ``java`` on PATH (resolved); fail if none."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return home
    java = shutil.which("java")
    if java is None:
        pytest.fail("the Spark tests need Java 17+ (java on PATH or JAVA_HOME); they are never skipped")
    home = str(Path(os.path.realpath(java)).parent.parent)
    os.environ["JAVA_HOME"] = home
    return home


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test run."""
    ensure_java()
    from polymux.pipeline import build_session

    session = build_session(
        "local[2]", fast_start=True, driver_memory="2g", conf={"spark.sql.shuffle.partitions": "4"}
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def node_dir() -> Path:
    """tests/interop/node with its npm packages installed (``npm ci`` when needed)."""
    return install_node_peers("pipeline's Node peer sessions")


@dataclass
class Captures:
    """The capture folder and what its report must show."""

    root: Path
    expected: Expected
    """Every session with exact per-channel bytes (formats, Node peer, slow reader, pcap)."""
    format_sessions: dict[str, list[str]]
    """format -> the two recorded sessions (client and server side)."""
    node_session: str
    slow_session: str
    slow_size: int
    violation_session: str
    violation_offset: int
    pcap_session: str
    pcap_source: str
    """The recorded session the pcap was written from."""


def _merge(into: Expected, more: Expected) -> None:
    into.pairs.update(more.pairs)
    into.formats.update(more.formats)
    into.roles.update(more.roles)


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory, node_dir: Path) -> Captures:
    """Make every capture once: a session of each format in ``polymux.PROTOCOLS`` (both
    sides recorded, rotating files), a Node reference peer session, a slow reader, an
    injected violation, and a pcap written with dpkt from the recorded yamux client."""
    from polymux.tracing import read_capture, read_session

    root = tmp_path_factory.mktemp("captures")
    expected = Expected()
    by_format: dict[str, list[str]] = {}

    async def sessions() -> tuple[str, str, int]:
        for fmt in polymux.PROTOCOLS:
            got = await asyncio.wait_for(format_session(fmt, root / "formats" / fmt), 30)
            by_format[fmt] = sorted(got.pairs)
            _merge(expected, got)
        node = await asyncio.wait_for(node_session(root / "node", node_dir), 100)
        _merge(expected, node)
        slow, slow_size = await asyncio.wait_for(slow_reader_session(root / "slow"), 30)
        _merge(expected, slow)
        return next(iter(node.pairs)), next(iter(slow.pairs)), slow_size

    node_id, slow_id, slow_size = asyncio.run(sessions())
    violation_id, offset = violation_capture(root / "violation")

    source = next(s for s in by_format["yamux"] if expected.roles[s] == "client")
    files = sorted(
        p for p in (root / "formats" / "yamux").glob("*.pmcap.parquet") if read_capture(p).session == source
    )
    (root / "pcap").mkdir()
    pcap_id = write_pcap(read_session(files).chunks, root / "pcap" / "loopback.pcap")
    expected.pairs[pcap_id] = expected.pairs[source]
    expected.formats[pcap_id] = "yamux"
    expected.roles[pcap_id] = "client"
    return Captures(
        root=root,
        expected=expected,
        format_sessions=by_format,
        node_session=node_id,
        slow_session=slow_id,
        slow_size=slow_size,
        violation_session=violation_id,
        violation_offset=offset,
        pcap_session=pcap_id,
        pcap_source=source,
    )


@pytest.fixture(scope="session")
def analyzed(spark: SparkSession, captures: Captures, tmp_path_factory: pytest.TempPathFactory) -> Summary:
    """``analyze`` of every capture (pcap flows as yamux) on the shared session."""
    from polymux.pipeline import analyze

    out = tmp_path_factory.mktemp("report")
    return analyze([str(captures.root)], out, protocol="yamux", spark=spark, progress=False)

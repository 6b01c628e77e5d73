"""Frames files (``CaptureRecorder(mode="records")``) as pipeline inputs: found beside
captures (a session with both is decoded from its bytes), ingested without decoding into
the same frames table a decode of the bytes gives, and analysed to the same reports."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import polymux
from polymux.pipeline import FRAME_TABLE_COLUMNS, analyze, decode_units, find_inputs
from polymux.tracing import CaptureRecorder
from tracing.tee import Tee


if TYPE_CHECKING:
    from pyspark.sql import SparkSession


pytestmark = pytest.mark.spark


async def _sessions(fmt: str, capture: Any) -> None:
    """Three channels each way's worth of traffic, both ends recorded."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    async def one(session: polymux.Session, n: int) -> None:
        reader, writer = await session.open_pair(f"ch{n}")
        writer.write(bytes(range(256)) * (n // 256))
        writer.write_eof()
        got = 0
        while data := await reader.read(65536):
            got += len(data)
        assert got == n // 256 * 256
        writer.close()

    async with asyncio.timeout(30):
        server = await polymux.start_server(echo, "127.0.0.1", 0, protocol=fmt, capture=capture)
        async with server:
            session = await polymux.connect("127.0.0.1", server.port, protocol=fmt, capture=capture)
            await asyncio.gather(*(one(session, n) for n in (512, 100_096, 400_128)))
            await session.aclose()


def _record(folder: Path, fmt: str) -> tuple[Path, Path]:
    """The same sessions recorded in full (folder/full) and as frame records, rotated
    (folder/records)."""
    full = CaptureRecorder(folder / "full")
    records = CaptureRecorder(folder / "records", mode="records", rotate_bytes=2048)
    try:
        asyncio.run(_sessions(fmt, Tee(full, records)))
    finally:
        full.close()
        records.close()
    assert full.errors == [] and records.errors == []
    return folder / "full", folder / "records"


def _table(folder: Path) -> pa.Table:
    rows = [(f.unit, f.path, Path(f.path).read_bytes()) for f in find_inputs([str(folder)])]
    return pa.Table.from_batches(list(decode_units(rows)))


def _comparable(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows without the session id and the time (two recorders: two ids, two clocks),
    by role and order."""
    role = {s: s.rsplit("-", 1)[1] for s in set(table.column("session").to_pylist())}
    return sorted(
        (role[r["session"]], *(v for k, v in r.items() if k not in ("session", "time_ns")))
        for r in table.to_pylist()
    )


@pytest.mark.parametrize("fmt", ["yamux", "mstream-v3", "mplex", "omnistreams"])
def test_frames_files_ingest_like_the_decoded_bytes(tmp_path: Path, fmt: str) -> None:
    full, records = _record(tmp_path, fmt)
    found = find_inputs([str(records)])
    assert {f.kind for f in found} == {"frames"}
    assert len(found) > 2 and len({f.unit for f in found}) == 2  # rotated: two sessions
    frames = _table(records)
    assert frames.column_names == FRAME_TABLE_COLUMNS
    decoded = _table(full)
    assert _comparable(frames) == _comparable(decoded)
    assert frames.num_rows == decoded.num_rows > 20
    for session in set(frames.column("session").to_pylist()):
        seq = [r["seq"] for r in frames.to_pylist() if r["session"] == session]
        assert seq == list(range(len(seq)))  # across the rotated files


def test_a_session_with_both_is_decoded_from_its_bytes(tmp_path: Path) -> None:
    with CaptureRecorder(tmp_path / "both", frames=True) as recorder:
        asyncio.run(_sessions("yamux", recorder))
    with CaptureRecorder(tmp_path / "both", mode="records") as recorder:
        asyncio.run(_sessions("mplex", recorder))
    found = find_inputs([str(tmp_path / "both")])
    kinds = sorted((f.kind, Path(f.path).name.split(".")[-2]) for f in found)
    # yamux: two captures (their frames files left out); mplex: two frames files
    assert kinds == [("capture", "pmcap")] * 2 + [("frames", "pmframes")] * 2
    named = next((tmp_path / "both").glob("*-client.0000.pmframes.parquet"))
    assert [f.kind for f in find_inputs([str(named)])] == ["frames"]  # named: taken


def test_analyze_frames_files(tmp_path: Path, spark: SparkSession) -> None:
    full, records = _record(tmp_path, "yamux")
    a = analyze([str(full)], tmp_path / "out-full", spark=spark, progress=False)
    b = analyze([str(records)], tmp_path / "out-records", spark=spark, progress=False)
    assert a.frames == b.frames > 20
    traffic = [
        sorted((r.channel, r.direction, r.data_bytes) for r in s.tables["traffic"].itertuples())
        for s in (a, b)
    ]
    assert traffic[0] == traffic[1]
    assert sum(r[2] for r in traffic[1]) == 2 * 2 * (512 + 100_096 + 400_128)  # both ends, both ways

"""``CaptureRecorder(mode="records")`` (frame records only, walked on the event loop) and
the full mode's raw files (one ``writev`` per batch, an index beside them, Parquet once the
session ends): what they write equals what a decode of the bytes gives, for every format;
rotation, conversion, crash leftovers, reading back, and ``polymux decode``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import polymux
from polymux.tracing import CaptureRecorder, decode_chunks, read_capture, read_session
from polymux.tracing.capture import (
    FRAMES_SUFFIX,
    INDEX_SUFFIX,
    RAW_SUFFIX,
    convert_capture,
    frames_file_schema,
    read_frames,
    read_frames_bytes,
)

from .conftest import _pattern, reply_size, without_time
from .tee import Tee


async def _traffic(fmt: str, capture: Any, sizes: Sequence[int], **options: Any) -> None:
    """The client opens a channel per size, sends that many bytes; the server answers."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        writer.write(_pattern(reply_size(len(data)))[: reply_size(len(data))])
        await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def one(session: polymux.Session, n: int) -> int:
        reader, writer = await session.open_pair(f"ch{n}")
        writer.write(_pattern(n)[:n])
        writer.write_eof()
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return len(answer)

    async with asyncio.timeout(30):
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol=fmt, capture=capture, **options)
        try:
            port = server.sockets[0].getsockname()[1]
            session = await polymux.connect("127.0.0.1", port, protocol=fmt, capture=capture, **options)
            answers = await asyncio.gather(*(one(session, n) for n in sizes))
            await session.aclose()
        finally:
            server.close()
            await server.wait_closed()
    assert sorted(answers) == sorted(reply_size(n) for n in sizes)


async def _read_n(reader: asyncio.StreamReader, n: int) -> None:
    """Read ``n`` bytes in reads of at most 64 KiB."""
    while n:
        got = await reader.read(min(n, 65536))
        assert got
        n -= len(got)


def _by_role(paths: list[Path], suffix: str) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {"client": [], "server": []}
    for p in paths:
        if p.name.endswith(suffix):
            out["client" if "-client." in p.name else "server"].append(p)
    return out


def _options(fmt: str) -> dict[str, Any]:
    return {"streamux_length_bits": (6, 30, 12)} if fmt == "streamux" else {}


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_records_mode_equals_a_decode_of_the_full_capture(fmt: str, tmp_path: Path) -> None:
    full = CaptureRecorder(tmp_path / "full")
    records = CaptureRecorder(tmp_path / "records", mode="records", payload_prefix=8)
    try:
        await _traffic(fmt, Tee(full, records), (1, 5_000, 70_001, 300_003), **_options(fmt))
    finally:
        full.close()
        records.close()
    assert full.errors == [] and records.errors == []
    assert not list((tmp_path / "records").glob("*.pmcap.*"))  # records only: no bytes kept
    captures = _by_role(full.paths, ".pmcap.parquet")
    frames = _by_role(records.paths, FRAMES_SUFFIX)
    for role in ("client", "server"):
        capture = read_session(captures[role])
        (path,) = frames[role]
        got = read_frames(path)
        assert (got.format, got.role, got.seq) == (fmt, role, 0)
        assert got.metadata["polymux.frames.mode"] == "records"
        assert got.metadata["polymux.frames.payload_prefix"] == "8"
        expected = list(decode_chunks(fmt, capture.chunks, session=got.session))
        assert without_time(got.records) == without_time(expected)
        assert all(r.session == got.session for r in got.records)
        # payload prefixes: the first bytes the application sent on the channel
        data = [(r, p) for r, p in zip(got.records, got.payloads, strict=True) if r.frame_type == "data"]
        assert data
        assert all(p is not None and len(p) == min(8, r.length) for r, p in data)
        if role == "client":
            firsts = {p for r, p in data if r.direction == "c2s" and r.length >= 8}
            assert _pattern(8)[:8] in firsts
        # and from bytes, the same
        assert read_frames_bytes(path.read_bytes()).records == got.records


async def test_records_mode_rotates_and_decode_lists_it(tmp_path: Path) -> None:
    with CaptureRecorder(tmp_path, mode="records", rotate_bytes=4096, payload_prefix=0) as recorder:
        await _traffic("yamux", recorder, (300_000,) * 4)
    _check_rotated_records(tmp_path)


def _check_rotated_records(tmp_path: Path) -> None:
    client = sorted(tmp_path.glob("*-client.*" + FRAMES_SUFFIX))
    assert len(client) >= 2
    parts = [read_frames(p) for p in client]
    assert [p.seq for p in parts] == list(range(len(parts)))
    records = [r for p in parts for r in p.records]
    sent = sum(r.length for r in records if r.frame_type == "data" and r.direction == "c2s")
    assert sent == 4 * 300_000
    assert all(p is None or p == b"" for part in parts for p in part.payloads)
    assert pq.read_schema(client[0]).remove_metadata() == frames_file_schema()
    # polymux decode prints the records of a frames file as they are
    out = subprocess.run(
        [sys.executable, "-m", "polymux", "decode", "--json", str(client[0])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows == [r._asdict() for r in parts[0].records]
    table = subprocess.run(
        [sys.executable, "-m", "polymux", "decode", str(client[0])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "== format: recorded as frame records" in table
    assert " data " in table


async def test_full_mode_raw_files_until_the_session_ends(tmp_path: Path) -> None:
    recorder = CaptureRecorder(tmp_path, rotate_bytes=64 * 1024, batch_bytes=16 * 1024)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_n(reader, 200_000)
        writer.write(b"got")  # so the client knows it has sent (and recorded) it all
        await reader.read()
        writer.write(b"ok")
        writer.close()

    try:
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol="mplex")
        async with server:
            session = await polymux.connect("127.0.0.1", server.port, protocol="mplex", capture=recorder)
            reader, writer = await session.open_channel("x")
            writer.write(_pattern(200_000)[:200_000])
            assert await reader.readexactly(3) == b"got"
            recorder.flush()  # written, not converted: the session goes on
            _check_unconverted(tmp_path, recorder)
            writer.write_eof()
            assert await reader.read() == b"ok"
            await session.aclose()
    finally:
        recorder.close()
    _check_converted(tmp_path, recorder)


def _check_unconverted(tmp_path: Path, recorder: CaptureRecorder) -> None:
    raws = sorted(tmp_path.glob("*" + RAW_SUFFIX))
    assert len(raws) >= 2
    assert all(p.with_name(p.name[: -len(RAW_SUFFIX)] + INDEX_SUFFIX).exists() for p in raws)
    assert not list(tmp_path.glob("*.pmcap.parquet"))
    assert set(recorder.paths) == set(raws)
    # a raw pair reads as a capture already
    first = read_capture(raws[0])
    assert first.chunks and first.format == "mplex" and first.seq == 0


def _check_converted(tmp_path: Path, recorder: CaptureRecorder) -> None:
    assert not list(tmp_path.glob("*" + RAW_SUFFIX)) and not list(tmp_path.glob("*" + INDEX_SUFFIX))
    parquet = sorted(tmp_path.glob("*.pmcap.parquet"))
    assert sorted(recorder.paths) == parquet
    whole = read_session(parquet)
    sent = [r for r in decode_chunks("mplex", whole.chunks, session="s") if r.frame_type == "data"]
    assert sum(r.length for r in sent if r.direction == "c2s") == 200_000


async def test_convert_on_rotation(tmp_path: Path) -> None:
    recorder = CaptureRecorder(tmp_path, rotate_bytes=64 * 1024, batch_bytes=16 * 1024, convert="rotate")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_n(reader, 300_000)
        writer.write(b"got")
        await reader.read()
        writer.close()

    try:
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol="yamux")
        async with server:
            session = await polymux.connect("127.0.0.1", server.port, protocol="yamux", capture=recorder)
            reader, writer = await session.open_channel("x")
            writer.write(bytes(300_000))
            assert await reader.readexactly(3) == b"got"
            recorder.flush()
            counts = _count(tmp_path)
            writer.write_eof()
            await session.aclose()
    finally:
        recorder.close()
    # every file but the one being written was Parquet already; none is left raw
    assert counts[0] >= 1 and counts[1] == 1
    assert _count(tmp_path)[1] == 0


def _count(folder: Path) -> tuple[int, int]:
    """(Parquet captures, raw captures) in ``folder``."""
    return len(list(folder.glob("*.pmcap.parquet"))), len(list(folder.glob("*" + RAW_SUFFIX)))


def test_a_raw_pair_left_behind_converts(tmp_path: Path) -> None:
    """What a killed process leaves: a raw file whose last chunk is cut short and an
    index whose last row is cut short. convert_capture keeps every whole chunk."""
    recorder = CaptureRecorder(tmp_path, batch_bytes=10)
    sink = recorder({"format": "yamux", "role": "client", "local": "a", "peer": "b"})
    sink.sent([b"0123456789"])
    sink.received(b"abcdefghij")
    sink.sent([memoryview(b"klmnopqrst")])
    recorder.flush()
    (raw,) = tmp_path.glob("*" + RAW_SUFFIX)
    index = raw.with_name(raw.name[: -len(RAW_SUFFIX)] + INDEX_SUFFIX)
    raw.write_bytes(raw.read_bytes()[:25])  # the third chunk cut short
    index.write_bytes(index.read_bytes() + b"\x01\x02")  # a partial row
    converted = convert_capture(raw)
    assert converted.name.endswith(".pmcap.parquet") and not raw.exists() and not index.exists()
    cap = read_capture(converted)
    assert [(d, data) for _t, d, data in cap.chunks] == [("c2s", b"0123456789"), ("s2c", b"abcdefghij")]
    assert (cap.format, cap.role, cap.local, cap.peer) == ("yamux", "client", "a", "b")
    with pytest.raises(ValueError, match="not a raw capture file"):
        convert_capture(tmp_path / "x.parquet")
    bad = tmp_path / ("bad" + INDEX_SUFFIX)
    bad.write_bytes(b"nonsense")
    (tmp_path / ("bad" + RAW_SUFFIX)).write_bytes(b"")
    with pytest.raises(ValueError, match="not a polymux capture index"):
        read_capture(bad)
    sink.close()
    recorder.close()


def test_records_mode_by_hand_and_bad_options(tmp_path: Path) -> None:
    from polymux.wire import yamux

    with CaptureRecorder(tmp_path, mode="records", payload_prefix=3) as recorder:
        sink = recorder({"format": "yamux", "role": "client", "local": "", "peer": ""})
        payload = bytearray(b"hello world")
        sink.sent([yamux.encode_header(1, 1, 1, 0)])
        sink.sent([yamux.encode_header(0, 0, 1, len(payload)), memoryview(payload)])
        payload[:] = b"XXXXXXXXXXX"  # walked when handed over: nothing kept refers to it
        sink.received(yamux.encode_header(2, 0, 0, 7))  # a ping from the server
        sink.received(b"\x09")  # a broken header: a violation record, the session unharmed
        sink.close()
    (path,) = recorder.paths
    got = read_frames(path)
    assert [(r.direction, r.frame_type, r.length) for r in got.records] == [
        ("c2s", "open", 0),
        ("c2s", "data", 11),
        ("s2c", "ping", 0),
        ("s2c", "truncated", 1),
    ]
    assert got.payloads == [b"", b"hel", b"", None]  # none on a record that is no frame
    for bad in ({"mode": "bytes"}, {"convert": "never"}, {"payload_prefix": -1}, {"rotate_bytes": 0}):
        with pytest.raises(ValueError, match="CaptureRecorder"):
            CaptureRecorder(tmp_path, **bad)


def test_records_are_written_in_row_groups_and_at_flush(tmp_path: Path) -> None:
    """The writer collects RECORD_BATCH records for a row group (one per handed-over batch
    was 128 records of 64 KiB frames, and its write a fifth of the sender's time);
    :meth:`CaptureRecorder.flush` writes what it holds."""
    from polymux.tracing.capture import RECORD_BATCH
    from polymux.wire import yamux

    frame = yamux.encode_header(0, 0, 1, 4) + b"data"
    frames = RECORD_BATCH + 100
    with CaptureRecorder(tmp_path, mode="records", batch_bytes=64 * len(frame), payload_prefix=0) as recorder:
        sink = recorder({"format": "yamux", "role": "client", "local": "", "peer": ""})
        sink.sent([yamux.encode_header(1, 1, 1, 0)])  # opens stream 1
        for _ in range(frames):
            sink.sent([frame])
        recorder.flush()  # the records held: a row group of their own now
        sink.sent([frame])
        sink.close()
    (path,) = recorder.paths
    got = read_frames(path)
    assert len(got.records) == frames + 2
    groups = pq.ParquetFile(path).metadata
    sizes = [groups.row_group(i).num_rows for i in range(groups.num_row_groups)]
    # Written once RECORD_BATCH are held (a handed-over batch may go past it), the rest at
    # the flush, the last at the end.
    assert len(sizes) == 3 and RECORD_BATCH <= sizes[0] <= RECORD_BATCH + 64 and sizes[2] == 1

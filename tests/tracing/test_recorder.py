"""CaptureRecorder: file names, metadata, rotation, reading back (from a path or from
bytes), and clear errors for files that are not polymux captures."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from polymux.tracing import (
    CAPTURE_VERSION,
    CaptureRecorder,
    decode_chunks,
    read_capture,
    read_capture_bytes,
    read_session,
)
from polymux.tracing.capture import capture_schema

from .conftest import Recorded, data_bytes, record_session, reply_size


async def test_files_names_and_metadata(tmp_path: Path) -> None:
    rec = await record_session("mstream-v3", tmp_path, sizes=(10, 2000))
    check_names_and_metadata(tmp_path, rec)


def check_names_and_metadata(tmp_path: Path, rec: Recorded) -> None:
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2
    pattern = re.compile(rf"^(\d{{13}})-{os.getpid()}-(\d+)-(client|server)\.0000\.pmcap\.parquet$")
    assert all(pattern.match(n) for n in names), names
    meta = pq.read_schema(tmp_path / names[0]).metadata
    assert meta[b"polymux.capture.version"] == CAPTURE_VERSION.encode() == b"1"
    assert {k.decode() for k in meta} >= {
        "polymux.capture.version",
        "session",
        "format",
        "role",
        "local",
        "peer",
    }
    assert pq.read_schema(tmp_path / names[0]).remove_metadata() == capture_schema()
    cap = read_capture(tmp_path / names[0])
    assert cap.session == names[0].split(".")[0]
    assert cap.format == "mstream-v3" and cap.role in ("client", "server")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", cap.local) and re.fullmatch(r"127\.0\.0\.1:\d+", cap.peer)
    # From bytes (what Spark's binaryFile hands over), the same.
    again = read_capture_bytes((tmp_path / names[0]).read_bytes())
    assert (again.session, again.format, again.chunks) == (cap.session, cap.format, cap.chunks)
    # Times never go backwards within a capture.
    times = [t for t, _d, _data in rec.client.chunks]
    assert times == sorted(times)


async def test_rotation(tmp_path: Path) -> None:
    sizes = (150_000, 200_000)
    options = {"rotate_bytes": 64 * 1024, "batch_bytes": 16 * 1024}
    rec = await record_session("yamux", tmp_path, sizes=sizes, frames=True, recorder_options=options)
    check_rotation(tmp_path, rec, sizes)


def check_rotation(tmp_path: Path, rec: Recorded, sizes: tuple[int, ...]) -> None:
    client_files = sorted(tmp_path.glob("*-client.*.pmcap.parquet"))
    assert len(client_files) >= 3
    seqs = [int(p.name.split(".")[1]) for p in client_files]
    assert seqs == list(range(len(client_files)))
    parts = [read_capture(p) for p in client_files]
    assert [p.seq for p in parts] == seqs
    assert len({p.session for p in parts}) == 1
    # Joined in order, the parts decode to exactly what was sent.
    whole = read_session(reversed(client_files))
    assert whole.chunks == rec.client.chunks
    counts = data_bytes(decode_chunks("yamux", whole.chunks, session=whole.session))
    assert counts["c2s"] == Counter(sizes)
    assert counts["s2c"] == Counter(reply_size(n) for n in sizes)
    # Frame records rotate along with the capture; together they are the whole decode.
    frame_files = sorted(tmp_path.glob("*-client.*.pmframes.parquet"))
    assert 1 < len(frame_files) <= len(client_files)
    rows = [tuple(r.values())[:-1] for f in frame_files for r in pq.read_table(f).to_pylist()]
    assert rows == [tuple(r) for r in decode_chunks("yamux", whole.chunks, session=whole.session)]
    with pytest.raises(ValueError, match="different sessions"):
        read_session([client_files[0], next(tmp_path.glob("*-server.0000.pmcap.parquet"))])


def test_not_a_capture(tmp_path: Path) -> None:
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"a": [1]}), other)
    with pytest.raises(
        ValueError, match=r"other\.parquet is not a polymux capture \(no polymux.capture.version"
    ):
        read_capture(other)
    future = tmp_path / "future.pmcap.parquet"
    schema = capture_schema().with_metadata({"polymux.capture.version": "2"})
    pq.write_table(pa.table([[1], ["c2s"], [b"x"]], schema=schema), future)
    with pytest.raises(ValueError, match="format version '2'; this polymux reads version '1'"):
        read_capture(future)
    with pytest.raises(ValueError, match="blob is not a readable Parquet file"):
        read_capture_bytes(b"not parquet at all", name="blob")
    with pytest.raises(OSError):
        read_capture(tmp_path / "missing.pmcap.parquet")


def test_recorder_by_hand(tmp_path: Path) -> None:
    """The sink as the session drives it: received bytes, sent batches of views, close."""
    with CaptureRecorder(tmp_path / "new" / "dir", batch_bytes=10) as recorder:
        sink = recorder({"format": "yamux", "role": "server", "local": "a", "peer": "b"})
        buf = bytearray(b"0123456789")
        sink.received(b"hello")
        sink.sent([memoryview(buf)[:4], b"", bytearray(b"xy")])
        sink.sent([memoryview(b"abc")[1:]])  # a view of bytes: kept, not copied
        buf[:4] = b"XXXX"  # the capture copied the bytes it was handed
        sink.sent([])
        sink.received(memoryview(b"world"))
        sink.close()
        sink.received(b"late")  # after close: ignored
        recorder.flush()
        assert recorder.sessions == [recorder.paths[0].name.split(".")[0]]
    cap = read_capture(recorder.paths[0])
    assert [(d, data) for _t, d, data in cap.chunks] == [
        ("c2s", b"hello"),
        ("s2c", b"0123xy"),  # one row per batch
        ("s2c", b"bc"),
        ("c2s", b"world"),
    ]
    assert (cap.role, cap.local, cap.peer) == ("server", "a", "b")
    assert recorder.errors == []
    with pytest.raises(RuntimeError, match="closed"):
        recorder({"format": "yamux", "role": "client", "local": "", "peer": ""})


def test_write_errors_are_kept_not_raised(tmp_path: Path) -> None:
    """A capture that cannot be written stops recording; the session is not disturbed
    (the sink never raises) and the error is kept on the recorder."""
    directory = tmp_path / "d"
    recorder = CaptureRecorder(directory)
    sink = recorder({"format": "mplex", "role": "client", "local": "", "peer": ""})
    directory.rmdir()
    directory.write_bytes(b"")  # now a file: nothing can be created in it, even by root
    sink.received(b"x" * (2 << 20))  # a full batch: the writer thread tries to open the file
    sink.sent([b"y"])
    sink.close()
    recorder.close()
    assert len(recorder.errors) == 1
    assert isinstance(recorder.errors[0], OSError)


@pytest.mark.parametrize("drop", [True, False])
def test_drop_behind_lets_written_pages_go(
    tmp_path: Path, drop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drop_behind: after each batch, the raw file's last DROP_WINDOW bytes are advised
    out of the page cache (the newest start going to disk, the older leave); the capture
    reads back the same either way."""
    from polymux.tracing import capture

    advised: list[tuple[int, int, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    monkeypatch.setattr(capture, "DROP_WINDOW", 3000)
    block = bytes(range(256)) * 4  # 1 KiB
    with CaptureRecorder(tmp_path, batch_bytes=1024, drop_behind=drop) as recorder:
        sink = recorder({"format": "yamux", "role": "client", "local": "", "peer": ""})
        for _ in range(8):
            sink.sent([block])
        sink.close()
    assert read_capture(recorder.paths[0]).chunks[3][2] == block
    if not drop:
        assert advised == []
        return
    # one call per batch, each over the last 3000 bytes written (or all, at first)
    assert advised == [
        (max(0, n - 3000), min(n, 3000), os.POSIX_FADV_DONTNEED) for n in range(1024, 8193, 1024)
    ]

"""Captures: :class:`CaptureRecorder` writes them, :func:`read_capture` and
:func:`read_frames` read them.

Two modes (``docs/tracing.md`` has the versioned file formats):

* ``mode="full"`` (the default) keeps every byte. On the event loop, a clock read and a
  tuple appended per received chunk and per batch the session writes (parts that are
  ``bytes`` or views of ``bytes`` are kept without a copy, others copied). Full batches go
  to one writer thread per recorder through a bounded queue (so memory is bounded; if the
  disk cannot keep up, the session waits), which appends the parts to
  ``<session>.<seq:04d>.pmcap.raw`` with ``os.writev`` (the one copy: into the page
  cache) and a row per chunk to the index beside it (``.pmcap.idx``). Once the session
  ends (or a file is full, with ``convert="rotate"``) a converter thread turns each file
  into the Parquet capture ``<session>.<seq:04d>.pmcap.parquet`` (Arrow over the mapped
  file, no copy until Parquet's own) and removes the raw pair: off the session's hot path.
* ``mode="records"`` keeps frame records only. The event loop does what it does in full
  mode; the writer thread walks the batches' frames
  (:meth:`~polymux.tracing.FrameDecoder.feed_parts`: headers only, no payload is copied;
  at most ``payload_prefix`` bytes of each payload are kept, the views are then let go)
  and writes the records into ``<session>.<seq:04d>.pmframes.parquet``, the same frames
  file ``frames=True`` writes beside a full capture. Those are already the frames a
  decode gives: ``polymux decode`` lists them and the pipeline ingests them without
  decoding. A walk is per frame, in Python: its cost grows with frames, not bytes.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import itertools
import json
import logging
import mmap
import os
import queue
import struct
import sys
import threading
import time
import weakref
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeAlias

from polymux._extras import require
from polymux._types import BytesLike
from polymux.tracing.records import C2S, S2C, Chunk, FrameRecord, frame_schema


if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from polymux.tracing.decode import FrameDecoder


__all__ = [
    "CAPTURE_SUFFIX",
    "CAPTURE_VERSION",
    "FRAMES_SUFFIX",
    "FRAMES_VERSION",
    "INDEX_SUFFIX",
    "MODES",
    "RAW_SUFFIX",
    "Capture",
    "CaptureRecorder",
    "Frames",
    "capture_schema",
    "convert_capture",
    "frames_file_schema",
    "frames_metadata",
    "read_capture",
    "read_capture_bytes",
    "read_frames",
    "read_frames_bytes",
    "read_session",
]

logger = logging.getLogger("polymux.tracing")

CAPTURE_VERSION = "1"
"""Version of the capture file format (metadata key ``polymux.capture.version``)."""

FRAMES_VERSION = "1"
"""Version of the frames file format (metadata key ``polymux.frames.version``)."""

CAPTURE_SUFFIX = ".pmcap.parquet"
"""File name suffix of raw captures."""

FRAMES_SUFFIX = ".pmframes.parquet"
"""File name suffix of frame records (``mode="records"``, or ``frames=True``)."""

RAW_SUFFIX = ".pmcap.raw"
"""A full capture being written: the bytes, appended (turned into ``.pmcap.parquet``)."""

INDEX_SUFFIX = ".pmcap.idx"
"""Beside a ``.pmcap.raw`` file: its metadata and a row per chunk."""

MODES = ("full", "records")
"""What :class:`CaptureRecorder` keeps: every byte, or frame records."""

_INDEX_MAGIC = b"PMIDX1\n"
_INDEX_ROW = struct.Struct("<qq")  # time_ns, length << 1 | (1 if s2c)
_MAX_CHUNK_BYTES = 1 << 30  # data bytes per Arrow chunk (offsets are 32-bit)


def _write_errors() -> tuple[type[Exception], ...]:
    """What writing a capture may raise (disk full, permissions, Arrow errors)."""
    import pyarrow as pa

    return (OSError, ValueError, pa.ArrowException)


_Row: TypeAlias = tuple[int, str, BytesLike | tuple[BytesLike, ...]]
"""A chunk as recorded: data is ``bytes`` or a view of ``bytes`` (immutable either way),
or a tuple of such parts (a sent batch, written with one ``writev``)."""

_INFO_KEYS = ("session", "format", "role", "local", "peer")
_counter = itertools.count(1)


def capture_schema() -> pa.Schema:
    """The Arrow schema of capture rows (without the file's metadata)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("time_ns", pa.int64(), nullable=False),
            pa.field("direction", pa.string(), nullable=False),
            pa.field("data", pa.binary(), nullable=False),
        ]
    )


@dataclass
class Capture:
    """One capture file's contents (or a whole session's, from :func:`read_session`)."""

    session: str
    """The session id."""
    format: str
    """The wire format (``polymux.PROTOCOLS``)."""
    role: str
    """Which side recorded: ``"client"`` or ``"server"``."""
    local: str
    """The recording side's address (may be empty)."""
    peer: str
    """The other side's address (may be empty)."""
    chunks: list[Chunk] = field(default_factory=list)
    """``(time_ns, direction, data)`` in recording order."""
    seq: int = 0
    """The file's sequence number within its session (rotation)."""
    metadata: dict[str, str] = field(default_factory=dict)
    """All key-value metadata of the file."""


# -- reading -------------------------------------------------------------------------------


def _described(meta: dict[str, str]) -> dict[str, Any]:
    """The session's description from a file's metadata, shared by captures and frames
    files (a bad ``seq`` reads as 0)."""
    try:
        seq = int(meta.get("seq", "0"))
    except ValueError:
        seq = 0
    fields = {key: meta.get(key, "") for key in ("session", "format", "role", "local", "peer")}
    return {**fields, "seq": seq, "metadata": meta}


def _from_table(table: pa.Table, where: str) -> Capture:
    raw = table.schema.metadata or {}
    meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}
    version = meta.get("polymux.capture.version")
    if version is None:
        raise ValueError(f"{where} is not a polymux capture (no polymux.capture.version metadata)")
    if version != CAPTURE_VERSION:
        raise ValueError(
            f"{where} is a polymux capture of format version {version!r}; this polymux reads version "
            f"{CAPTURE_VERSION!r}"
        )
    names = set(table.column_names)
    missing = [name for name in ("time_ns", "direction", "data") if name not in names]
    if missing:
        raise ValueError(f"{where}: capture is missing column(s) {', '.join(missing)}")
    times = table.column("time_ns").to_pylist()
    directions = table.column("direction").to_pylist()
    datas = table.column("data").to_pylist()
    chunks: list[Chunk] = []
    for t, d, data in zip(times, directions, datas, strict=True):
        if d not in (C2S, S2C) or t is None or data is None:
            raise ValueError(f"{where}: capture row has direction {d!r}, time {t!r}; expected c2s/s2c")
        chunks.append((t, d, data))
    return Capture(chunks=chunks, **_described(meta))


def read_capture(path: str | os.PathLike[str]) -> Capture:
    """Read one ``*.pmcap.parquet`` file (or a raw pair not converted yet: ``*.pmcap.raw``
    and its ``*.pmcap.idx``). Raises ``OSError`` if it cannot be read and ``ValueError``
    if it is not a polymux capture (naming the file and what is wrong)."""
    require("pyarrow", "reading a polymux capture")
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = os.fspath(path)
    if where.endswith((RAW_SUFFIX, INDEX_SUFFIX)):  # a full capture not converted yet
        table, mapped = _raw_table(where)
        try:
            return _from_table(table, where)
        finally:
            del table
            if mapped is not None:
                with contextlib.suppress(BufferError):
                    mapped.close()
    try:
        table = pq.read_table(where)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{where} is not a readable Parquet file: {exc}") from None
    return _from_table(table, where)


def read_capture_bytes(data: BytesLike, *, name: str = "capture") -> Capture:
    """Like :func:`read_capture`, from the file's contents (Spark's ``binaryFile`` gives
    bytes). ``name`` is used in error messages."""
    require("pyarrow", "reading a polymux capture")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(bytes(data)))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{name} is not a readable Parquet file: {exc}") from None
    return _from_table(table, name)


def read_session(paths: Iterable[str | os.PathLike[str]]) -> Capture:
    """Read the rotated files of one session and join them in ``seq`` order into one
    :class:`Capture` (``ValueError`` if they belong to different sessions)."""
    parts = sorted((read_capture(p) for p in paths), key=lambda c: c.seq)
    if not parts:
        raise ValueError("read_session needs at least one capture file")
    first = parts[0]
    for part in parts[1:]:
        if part.session != first.session:
            raise ValueError(f"capture files of different sessions: {first.session!r} and {part.session!r}")
    chunks = [chunk for part in parts for chunk in part.chunks]
    return Capture(
        first.session, first.format, first.role, first.local, first.peer, chunks, 0, first.metadata
    )


# -- full captures being written: the raw file and its index --------------------------------


def _pair(path: str | os.PathLike[str]) -> tuple[Path, Path, str]:
    """``(raw, index, base)`` for a path to either file of a raw pair."""
    p = Path(path)
    for suffix in (RAW_SUFFIX, INDEX_SUFFIX):
        if p.name.endswith(suffix):
            base = p.name[: -len(suffix)]
            return p.with_name(base + RAW_SUFFIX), p.with_name(base + INDEX_SUFFIX), base
    raise ValueError(f"{p} is not a raw capture file (*{RAW_SUFFIX} or *{INDEX_SUFFIX})")


def _read_index(path: Path) -> tuple[dict[str, str], array[int]]:
    """The metadata and the rows (``time, code, time, code ...``) of a capture index; a
    row cut short at the end (a crash while writing) is dropped."""
    data = path.read_bytes()
    if not data.startswith(_INDEX_MAGIC):
        raise ValueError(f"{path} is not a polymux capture index (no {_INDEX_MAGIC!r} at its start)")
    end = data.find(b"\n", len(_INDEX_MAGIC))
    if end < 0:
        raise ValueError(f"{path}: capture index header is cut short")
    try:
        meta = json.loads(data[len(_INDEX_MAGIC) : end])
    except ValueError as exc:
        raise ValueError(f"{path}: capture index header is not JSON: {exc}") from None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{path}: capture index header must be a JSON object of strings")
    body = data[end + 1 :]
    rows = array("q")
    rows.frombytes(body[: len(body) - len(body) % _INDEX_ROW.size])
    if sys.byteorder == "big":
        rows.byteswap()  # the index is little-endian
    return meta, rows


def _raw_table(path: str | os.PathLike[str]) -> tuple[pa.Table, mmap.mmap | None]:
    """The capture table of a raw pair, its data column a zero-copy view of the mapped
    file (returned too: close it once the table is gone). Rows whose bytes the file does
    not hold in full (a crash while writing) are dropped."""
    import pyarrow as pa

    raw, index, _base = _pair(path)
    meta, rows = _read_index(index)
    times = rows[0::2]
    codes = rows[1::2]
    offsets = list(itertools.accumulate((c >> 1 for c in codes), initial=0))
    size = raw.stat().st_size
    n = bisect.bisect_right(offsets, size) - 1  # rows wholly in the file
    del times[n:], codes[n:], offsets[n + 1 :]
    mapped = None
    buffer = pa.py_buffer(b"")
    if offsets[-1]:
        with raw.open("rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buffer = pa.py_buffer(mapped)
    binary = pa.binary()
    chunks: list[pa.Array] = []
    start = 0
    while start < n or not chunks:
        # rows up to _MAX_CHUNK_BYTES a chunk (at least one): Arrow's offsets are 32-bit
        stop = max(start + 1, bisect.bisect_right(offsets, offsets[start] + _MAX_CHUNK_BYTES) - 1)
        stop = min(stop, n)
        base = offsets[start]
        local = array("i", (o - base for o in offsets[start : stop + 1]))
        chunks.append(
            pa.BinaryArray.from_buffers(
                binary,
                stop - start,
                [None, pa.py_buffer(local), buffer.slice(base, offsets[stop] - base)],
            )
        )
        start = stop
        if start >= n:
            break
    names = (C2S, S2C)
    table = pa.table(
        [
            pa.array(times, pa.int64()),
            pa.array([names[c & 1] for c in codes], pa.string()),
            pa.chunked_array(chunks, binary),
        ],
        schema=capture_schema().with_metadata(meta),
    )
    return table, mapped


def convert_capture(path: str | os.PathLike[str], *, compression: str = "none") -> Path:
    """Turn a raw capture pair (``*.pmcap.raw`` and its ``*.pmcap.idx``; either path) into
    its Parquet capture ``*.pmcap.parquet``, remove the pair, and return the new path.

    :class:`CaptureRecorder` does this itself, off the session's hot path; call it for
    pairs a process left behind (killed while recording): rows the files do not hold in
    full are dropped. ``compression``: Parquet compression (``"none"``, ``"zstd"`` ...)."""
    import pyarrow.parquet as pq

    raw, index, base = _pair(path)
    out = raw.with_name(base + CAPTURE_SUFFIX)
    tmp = raw.with_name(base + CAPTURE_SUFFIX + ".tmp")
    table, mapped = _raw_table(raw)
    try:
        # No dictionary and no statistics for the data column: hashing and comparing every
        # payload would cost several times the write itself.
        with pq.ParquetWriter(
            tmp,
            table.schema,
            compression=compression,
            use_dictionary=["direction"],
            write_statistics=["time_ns", "direction"],
        ) as writer:
            writer.write_table(table)
    finally:
        del table
        if mapped is not None:
            with contextlib.suppress(BufferError):  # still exported: the GC closes it
                mapped.close()
    os.replace(tmp, out)
    raw.unlink()
    index.unlink()
    return out


def _write_all(fd: int, parts: Sequence[BytesLike]) -> None:
    """Write ``parts`` in order with as few ``writev`` calls as the system allows (each
    call copies straight from the views into the page cache)."""
    writev = getattr(os, "writev", None)
    if writev is None:  # no writev (Windows): one write per part
        for part in parts:
            view = memoryview(part)
            while view:
                view = view[os.write(fd, view) :]
        return
    pending = list(parts)
    while pending:
        batch = pending[:_IOV_MAX]
        done = writev(fd, batch)
        rest = pending[len(batch) :]
        if done == sum(len(p) for p in batch):
            pending = rest
            continue
        for i, part in enumerate(batch):  # a short write: go on from where it stopped
            if done < len(part):
                pending = [memoryview(part)[done:], *batch[i + 1 :], *rest]
                break
            done -= len(part)


_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024


# -- frame record files ---------------------------------------------------------------------


def frames_file_schema() -> pa.Schema:
    """The Arrow schema of frames files: :func:`~polymux.tracing.frame_schema` (the
    :data:`~polymux.tracing.FRAME_FIELDS`), then ``payload`` (binary, null): at most the
    recorder's ``payload_prefix`` first bytes of the frame's payload, on the frame's
    ``data`` record (else on its first)."""
    import pyarrow as pa

    return frame_schema().append(pa.field("payload", pa.binary(), nullable=True))


def _records_table(records: Sequence[FrameRecord], payloads: Sequence[bytes | None]) -> pa.Table:
    """Records (and their payload prefixes) as a table of :func:`frames_file_schema`."""
    import pyarrow as pa

    schema = frames_file_schema()
    if not records:
        return schema.empty_table()
    columns = list(zip(*records, strict=True))
    arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=False)]
    arrays.append(pa.array(payloads, pa.binary()))
    return pa.Table.from_arrays(arrays, schema=schema)


@dataclass
class Frames:
    """One frames file's records (``*.pmframes.parquet``): what a decode of the session's
    bytes gives, as the recorder walked them."""

    session: str
    """The session id."""
    format: str
    """The wire format."""
    role: str
    """Which side recorded."""
    local: str
    """The recording side's address (may be empty)."""
    peer: str
    """The other side's address (may be empty)."""
    records: list[FrameRecord] = field(default_factory=list)
    """The frame records, in decode order."""
    payloads: list[bytes | None] = field(default_factory=list)
    """Per record, the payload prefix it carries (``None`` if none, or if the file has
    no ``payload`` column)."""
    seq: int = 0
    """The file's sequence number within its session (rotation)."""
    metadata: dict[str, str] = field(default_factory=dict)
    """All key-value metadata of the file."""


def frames_metadata(schema: pa.Schema, where: str) -> dict[str, str]:
    """The metadata of a frames file (its schema's), checked: ``ValueError`` naming the
    file when it is not a frames file of a version this polymux reads."""
    raw = schema.metadata or {}
    meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}
    version = meta.get("polymux.frames.version")
    if version is None:
        raise ValueError(f"{where} is not a polymux frames file (no polymux.frames.version metadata)")
    if version != FRAMES_VERSION:
        raise ValueError(
            f"{where} is a polymux frames file of format version {version!r}; this polymux reads "
            f"version {FRAMES_VERSION!r}"
        )
    return meta


def _frames_from_table(table: pa.Table, where: str) -> Frames:
    from polymux.tracing.records import FRAME_FIELDS

    meta = frames_metadata(table.schema, where)
    names = set(table.column_names)
    missing = [name for name, _ in FRAME_FIELDS[:-1] if name not in names]
    if missing:
        raise ValueError(f"{where}: frames file is missing column(s) {', '.join(missing)}")
    n = table.num_rows
    columns = [table.column(name).to_pylist() if name in names else [None] * n for name, _ in FRAME_FIELDS]
    records = [FrameRecord._make(row) for row in zip(*columns, strict=True)]
    payloads = table.column("payload").to_pylist() if "payload" in names else [None] * n
    return Frames(records=records, payloads=payloads, **_described(meta))


def read_frames(path: str | os.PathLike[str]) -> Frames:
    """Read one ``*.pmframes.parquet`` file. Raises ``OSError`` if it cannot be read and
    ``ValueError`` if it is not a polymux frames file (naming the file and what is wrong)."""
    require("pyarrow", "reading a polymux frames file")
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = os.fspath(path)
    try:
        table = pq.read_table(where)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{where} is not a readable Parquet file: {exc}") from None
    return _frames_from_table(table, where)


def read_frames_bytes(data: BytesLike, *, name: str = "frames") -> Frames:
    """Like :func:`read_frames`, from the file's contents. ``name`` is used in errors."""
    require("pyarrow", "reading a polymux frames file")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(bytes(data)))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{name} is not a readable Parquet file: {exc}") from None
    return _frames_from_table(table, name)


# -- recording -----------------------------------------------------------------------------


def _walk_rows(decoder: FrameDecoder, rows: list[_Row]) -> list[FrameRecord]:
    """The frame records of a batch of chunks, walked in the writer thread. The GIL is
    let go every few hundred records: a walk is pure Python, and the event loop's thread,
    waking for I/O meanwhile, would otherwise wait up to ``sys.getswitchinterval()``."""
    records: list[FrameRecord] = []
    feed = decoder.feed_parts
    due = _YIELD_RECORDS
    for t, direction, data in rows:
        records += feed(t, direction, data if type(data) is tuple else (data,))  # type: ignore[arg-type]
        if len(records) >= due:
            time.sleep(0)  # let the event loop's thread have the GIL if it waits for it
            due = len(records) + _YIELD_RECORDS
    return records


_YIELD_RECORDS = 256

DROP_WINDOW = 32 * 2**20
"""``CaptureRecorder(drop_behind=True)``: the bytes at the end of a raw file each batch's
``posix_fadvise(DONTNEED)`` covers (a range is covered by the next few batches: the first
starts its writeback, a later one drops its pages)."""

RECORD_BATCH = 16_384
"""Frame records a session's writer collects before writing them as one Parquet row group
(and at the session's end, a rotation or :meth:`CaptureRecorder.flush`). A row group per
8 MiB of traffic was 128 records of 64 KiB frames, and the writer's ``write_table`` per
batch took a fifth of the sending process's time."""


class _SessionFiles:
    """The writer thread's state for one session: open files, sizes, live decoder."""

    def __init__(self, recorder: CaptureRecorder, info: Mapping[str, str]) -> None:
        self.recorder = recorder
        self.info = dict(info)
        self.session = info["session"]
        self.seq = 0
        self.size = 0  # bytes in the current file (data bytes; frames: Arrow bytes)
        self.raw_fd: int | None = None
        self.index_fd: int | None = None
        self.raw_path: Path | None = None
        self.frames_writer: pq.ParquetWriter | None = None
        self.decoder: FrameDecoder | None = None
        self.pending: list[FrameRecord] = []  # walked, not yet written (RECORD_BATCH)
        self.pending_payloads: list[bytes | None] = []
        self.failed = False
        self.paths: list[Path] = []  # guarded by the recorder's lock
        self.unconverted: list[Path] = []  # whole raw files waiting for the session's end
        if recorder.frames:
            from polymux.tracing.decode import FrameDecoder

            try:
                self.decoder = FrameDecoder(
                    info["format"], session=self.session, payload_prefix=recorder.payload_prefix
                )
            except ValueError as exc:  # a format this polymux cannot decode
                logger.warning("polymux.tracing: no frame records for %s: %s", self.session, exc)

    def _metadata(self, version_key: str, version: str) -> dict[str, str]:
        meta = {version_key: version}
        meta.update({key: self.info.get(key, "") for key in _INFO_KEYS})
        meta["seq"] = str(self.seq)
        return meta

    def _base(self) -> Path:
        return self.recorder.directory / f"{self.session}.{self.seq:04d}"

    def _open_raw(self) -> None:
        base = self._base()
        raw = base.with_name(base.name + RAW_SUFFIX)
        index = base.with_name(base.name + INDEX_SUFFIX)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0)
        header = json.dumps(self._metadata("polymux.capture.version", CAPTURE_VERSION)).encode()
        self.index_fd = os.open(index, flags, 0o644)
        _write_all(self.index_fd, [_INDEX_MAGIC, header, b"\n"])
        self.raw_fd = os.open(raw, flags, 0o644)
        self.raw_path = raw
        with self.recorder._lock:
            self.paths.append(raw)
        self.size = 0

    def _open_frames(self) -> None:
        import pyarrow.parquet as pq

        rec = self.recorder
        base = self._base()
        meta = self._metadata("polymux.frames.version", FRAMES_VERSION)
        meta["polymux.frames.mode"] = rec.mode
        meta["polymux.frames.payload_prefix"] = str(rec.payload_prefix)
        path = base.with_name(base.name + FRAMES_SUFFIX)
        self.frames_writer = pq.ParquetWriter(
            path, frames_file_schema().with_metadata(meta), compression="zstd"
        )
        with rec._lock:
            self.paths.append(path)

    def _close_files(self) -> None:
        """Close the current files; a whole raw file is converted now (``convert="rotate"``)
        or kept for the session's end."""
        self.write_pending()  # the records of this file's bytes go in this file's frames
        if self.frames_writer is not None:
            self.frames_writer.close()
            self.frames_writer = None
        for fd in (self.raw_fd, self.index_fd):
            if fd is not None:
                os.close(fd)
        self.raw_fd = self.index_fd = None
        if self.raw_path is not None:
            if self.recorder.convert == "rotate":
                self.recorder._convert(self, self.raw_path)
            else:
                self.unconverted.append(self.raw_path)
            self.raw_path = None

    def write(self, rows: list[_Row], size: int) -> None:
        """A batch of chunks: full mode appends them to the raw file and its index; with
        frame records (records mode, ``frames=True``) they are walked into records."""
        if self.failed:
            return
        try:
            if self.recorder.mode == "full":
                self._append_raw(rows, size)
            decoder = self.decoder
            if decoder is not None:
                self.pending += _walk_rows(decoder, rows)
                self.pending_payloads += decoder.take_payloads()
                if len(self.pending) >= RECORD_BATCH:
                    self.write_pending()
        except _write_errors() as exc:  # disk full ...: stop recording this session
            self._fail(exc)

    def write_pending(self) -> None:
        """Write the records collected so far (one row group)."""
        records, payloads = self.pending, self.pending_payloads
        if not records:
            return
        self.pending, self.pending_payloads = [], []
        if self.recorder.mode == "records":
            self.write_records(records, payloads)
        else:
            self._write_frames(records, payloads)

    def sync(self) -> None:
        """:meth:`CaptureRecorder.flush`: write the records collected so far."""
        if self.failed:
            return
        try:
            self.write_pending()
        except _write_errors() as exc:
            self._fail(exc)

    def _append_raw(self, rows: list[_Row], size: int) -> None:
        if self.raw_fd is not None and self.size and self.size + size > self.recorder.rotate_bytes:
            self._close_files()
            self.seq += 1
        if self.raw_fd is None:
            self._open_raw()
        assert self.raw_fd is not None and self.index_fd is not None
        parts: list[BytesLike] = []
        index = bytearray()
        pack = _INDEX_ROW.pack
        for t, direction, data in rows:
            if type(data) is tuple:
                parts += data
                n = sum(len(p) for p in data)
            else:
                parts.append(data)  # type: ignore[arg-type]
                n = len(data)
            index += pack(t, n << 1 | (direction == S2C))
        _write_all(self.raw_fd, parts)  # the data first: an index row never runs ahead
        _write_all(self.index_fd, [index])
        self.size += size
        if self.recorder.drop_behind:
            # the newest bytes start going to disk; the older ones, written by now, leave
            # the page cache (the converter reads them back: off the session's path)
            start = max(0, self.size - DROP_WINDOW)
            os.posix_fadvise(self.raw_fd, start, self.size - start, os.POSIX_FADV_DONTNEED)

    def write_records(self, records: list[FrameRecord], payloads: list[bytes | None]) -> None:
        """Records mode: append a batch of frame records, rotating by their size (a batch
        may be split between files)."""
        if self.failed or not records:
            return
        try:
            table = _records_table(records, payloads)
            per_row = max(1, table.nbytes // table.num_rows)
            limit = self.recorder.rotate_bytes
            while table.num_rows:
                if self.frames_writer is not None and self.size + per_row > limit:
                    self._close_files()
                    self.seq += 1
                    self.size = 0
                if self.frames_writer is None:
                    self._open_frames()
                assert self.frames_writer is not None
                fit = max(1, (limit - self.size) // per_row)
                piece = table.slice(0, fit)
                self.frames_writer.write_table(piece)
                self.size += piece.num_rows * per_row
                table = table.slice(piece.num_rows)
        except _write_errors() as exc:
            self._fail(exc)

    def _write_frames(self, records: list[FrameRecord], payloads: list[bytes | None]) -> None:
        if not records:
            return
        if self.frames_writer is None:
            self._open_frames()
        assert self.frames_writer is not None
        self.frames_writer.write_table(_records_table(records, payloads))

    def close(self) -> None:
        """The session ended: write what is left, close the files, convert the raw ones."""
        if self.failed:
            return
        try:
            if self.decoder is not None:  # written by _close_files with the rest
                self.pending += self.decoder.finish()
                self.pending_payloads += self.decoder.take_payloads()
            if self.recorder.mode == "records":
                if self.frames_writer is None:
                    self._open_frames()  # a session without a frame still gets its file
            elif self.raw_fd is None:
                self._open_raw()  # an empty session still gets its capture file
            self._close_files()
        except _write_errors() as exc:
            self._fail(exc, "closing the capture of %s failed: %s")
            return
        for raw in self.unconverted:
            self.recorder._convert(self, raw)
        self.unconverted = []

    def _fail(self, exc: Exception, message: str = "recording of %s stopped: %s") -> None:
        self.failed = True
        self.recorder._errors.append(exc)
        logger.warning("polymux.tracing: " + message, self.session, exc)
        self._close_quietly()

    def _close_quietly(self) -> None:
        if self.frames_writer is not None:
            with contextlib.suppress(*_write_errors()):
                self.frames_writer.close()  # already failing: the first error is the one kept
        for fd in (self.raw_fd, self.index_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.frames_writer = None
        self.raw_fd = self.index_fd = None


class _CaptureSink:
    """On the event loop: buffer chunks (no copy), hand full batches to the writer thread
    (which writes them, or walks them into frame records)."""

    __slots__ = ("_batch_bytes", "_files", "_in", "_last", "_out", "_recorder", "_rows", "_size", "closed")

    def __init__(self, recorder: CaptureRecorder, files: _SessionFiles, role: str) -> None:
        self._recorder = recorder
        self._files = files
        self._out = C2S if role == "client" else S2C
        self._in = S2C if role == "client" else C2S
        self._rows: list[_Row] = []
        self._size = 0
        self._last = 0
        self._batch_bytes = recorder.batch_bytes
        self.closed = False

    @property
    def session(self) -> str:
        """This session's id."""
        return self._files.session

    def _now(self) -> int:
        t = max(time.time_ns(), self._last)  # the wall clock may step back: keep the order
        self._last = t
        return t

    def received(self, data: BytesLike) -> None:
        """Bytes from the peer."""
        if self.closed:
            return
        self._rows.append((self._now(), self._in, data if type(data) is bytes else bytes(data)))
        self._size += len(data)
        if self._size >= self._batch_bytes or len(self._rows) >= 65536:
            self.flush()

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        """Bytes handed to the socket (one batch, one row). Parts that are ``bytes``, or
        views of ``bytes``, are immutable and kept as they are (no copy here; the writer
        thread writes them with one ``writev``, or walks them); anything else is copied
        now, since its owner may reuse it."""
        if self.closed:
            return
        parts = []
        size = 0
        for part in chunks:
            n = len(part)
            if not n:
                continue
            if type(part) is not bytes and not (type(part) is memoryview and type(part.obj) is bytes):
                part = bytes(part)
            parts.append(part)
            size += n
        if not size:
            return
        self._rows.append((self._now(), self._out, parts[0] if len(parts) == 1 else tuple(parts)))
        self._size += size
        if self._size >= self._batch_bytes or len(self._rows) >= 65536:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered chunks to the writer thread."""
        if self._rows:
            rows, size = self._rows, self._size
            self._rows, self._size = [], 0
            self._recorder._submit(("write", self._files, rows, size))

    def close(self) -> None:
        """The connection is gone: write what is left and close the files."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        self._recorder._submit_close(self)


class CaptureRecorder:
    """A capture factory (``SessionConfig(capture=CaptureRecorder(directory))``): records
    every session it is given into ``directory``.

    Each session gets an id ``<unix-ms>-<pid>-<counter>-<role>``. ``mode="full"`` keeps
    every byte: ``<session>.<seq:04d>.pmcap.parquet`` files, a new one (``seq`` + 1) once a
    file holds ``rotate_bytes``; while the session runs they are ``.pmcap.raw`` files
    (the bytes, appended with ``os.writev``) with a ``.pmcap.idx`` index beside them,
    turned into Parquet by a converter thread when the session ends (``convert="close"``)
    or as soon as each is full (``convert="rotate"``). With ``frames=True`` the writer
    thread also walks the bytes into frame records, ``<session>.<seq:04d>.pmframes.parquet``.
    ``mode="records"`` keeps those frame records only (the writer thread walks the frames,
    and no payload is copied), with at most ``payload_prefix`` bytes of each frame's
    payload: the cheap mode, whose cost grows with frames rather than bytes. Frame records
    are written in row groups of :data:`RECORD_BATCH` (16,384) records, and what a session
    holds at its end, at a rotation or at :meth:`flush`.

    Call :meth:`flush` to wait for what was handed over to be written (and the files of
    ended sessions converted), :meth:`close` (or use it as a context manager) when done:
    it writes what the open sessions buffered, converts, and stops the threads. A recorder
    left open is closed at interpreter exit.

    Args:
        directory: where the files go (created if missing).
        mode: ``"full"`` (every byte) or ``"records"`` (frame records only).
        payload_prefix: payload bytes kept per frame record (``payload`` column).
        rotate_bytes: data bytes per capture file before rotating (records mode: Arrow
            bytes of records per frames file).
        frames: full mode: also write frame records.
        batch_bytes: bytes a session buffers before handing a batch to the writer thread. Large batches matter: the writer thread needs the GIL a few
            times per batch, and a busy event loop hands it over only every
            ``sys.getswitchinterval()``.
        max_queued_bytes: bytes handed over and not yet written before the event loop
            waits for the writer (memory stays bounded when the disk is slow).
        compression: Parquet compression of capture files: ``"none"`` (the default: the
            cheapest to write, and payloads are often incompressible), ``"zstd"``,
            ``"lz4"``, ``"snappy"`` ...
        convert: full mode: when raw files become Parquet: ``"close"`` (when their session
            ends) or ``"rotate"`` (each as soon as it is full).
        drop_behind: full mode: the raw file's pages leave the page cache once written
            to disk (``posix_fadvise(DONTNEED)`` over the last :data:`DROP_WINDOW` bytes
            after each batch: the newest start going to disk, the older ones, on disk by
            then, are dropped), so a capture holds that much page cache at most instead
            of all it wrote. Where fresh memory is dear (a VM faulting in each new page
            from its host) this is most of what full capture costs: 2.3 -> 0.7 ms of
            writer CPU per MiB measured here. No effect where ``posix_fadvise`` is missing.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        mode: str = "full",
        payload_prefix: int = 16,
        rotate_bytes: int = 64 * 2**20,
        frames: bool = False,
        batch_bytes: int = 8 * 1024 * 1024,
        max_queued_bytes: int = 64 * 1024 * 1024,
        compression: str = "none",
        convert: str = "close",
        drop_behind: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"CaptureRecorder: mode must be one of {', '.join(MODES)}, got {mode!r}")
        if convert not in ("close", "rotate"):
            raise ValueError(f"CaptureRecorder: convert must be 'close' or 'rotate', got {convert!r}")
        if rotate_bytes <= 0 or batch_bytes <= 0 or max_queued_bytes <= 0:
            raise ValueError(
                "CaptureRecorder: rotate_bytes, batch_bytes and max_queued_bytes must be positive"
            )
        if payload_prefix < 0:
            raise ValueError(f"CaptureRecorder: payload_prefix must be >= 0, got {payload_prefix}")
        _prepare_writer()  # fail here if pyarrow is missing; and nothing is imported at exit
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.mode = mode
        self.payload_prefix = payload_prefix
        self.rotate_bytes = rotate_bytes
        self.frames = frames or mode == "records"
        self.batch_bytes = batch_bytes
        self.compression = compression
        self.convert = convert
        self.drop_behind = drop_behind and hasattr(os, "posix_fadvise")
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue(max(2, max_queued_bytes // batch_bytes))
        self._converts: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._converter: threading.Thread | None = None
        self._lock = threading.Lock()
        self._sinks: set[_CaptureSink] = set()  # open ones
        self._files: list[_SessionFiles] = []
        self._errors: list[Exception] = []
        self._closed = False
        # Closed at interpreter exit if the caller forgets: from now on, not from the first
        # write (a session that never filled a batch would otherwise be lost).
        _open_recorders.add(self)

    def __call__(self, info: Mapping[str, str]) -> _CaptureSink:
        """Start recording one session (the :data:`polymux.CaptureFactory` call)."""
        if self._closed:
            raise RuntimeError("CaptureRecorder is closed")
        role = info.get("role", "client")
        session = f"{time.time_ns() // 1_000_000}-{os.getpid()}-{next(_counter)}-{role}"
        files = _SessionFiles(self, {**info, "session": session, "role": role})
        if self.mode == "records" and files.decoder is None:
            raise ValueError(f"CaptureRecorder: no frame records for format {info.get('format')!r}")
        sink = _CaptureSink(self, files, role)
        self._sinks.add(sink)
        with self._lock:
            self._files.append(files)
        return sink

    @property
    def sessions(self) -> list[str]:
        """Ids of the sessions recorded so far."""
        with self._lock:
            return [f.session for f in self._files]

    @property
    def paths(self) -> list[Path]:
        """Files written so far: capture files (``.pmcap.parquet``, or ``.pmcap.raw`` while
        not yet converted) and frames files."""
        with self._lock:
            return [p for f in self._files for p in f.paths]

    @property
    def errors(self) -> list[Exception]:
        """Errors that stopped the recording of a session (disk full ...)."""
        return list(self._errors)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="polymux-capture", daemon=True)
                self._thread.start()

    def _submit(self, item: tuple[Any, ...]) -> None:
        if self._thread is None:
            self._start()
        self._queue.put(item)

    def _submit_close(self, sink: _CaptureSink) -> None:
        self._sinks.discard(sink)
        self._submit(("close", sink._files))

    def _run(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            try:
                if item[0] == "stop":
                    return
                self._do(item)
            finally:
                q.task_done()

    def _do(self, item: tuple[Any, ...]) -> None:
        """One queued write or close. An unexpected error stops that session's recording
        (kept in :attr:`errors`), never the thread: a dead thread would block the sessions
        that wait for room in the queue."""
        files: _SessionFiles = item[1]
        try:
            if item[0] == "write":
                files.write(item[2], item[3])
            elif item[0] == "records":
                files.write_records(item[2], item[3])
            elif item[0] == "close":
                files.close()
            elif item[0] == "sync":
                files.sync()
        except Exception as exc:  # noqa: BLE001 - reported through errors and the log
            files._fail(exc, "recording of %s stopped: %r")

    def _convert(self, files: _SessionFiles, raw: Path) -> None:
        """Queue a whole raw file for the converter thread (from the writer thread; or
        convert it here when threads can no longer start: interpreter exit)."""
        with self._lock:
            if self._converter is None and not self._closing_at_exit:
                self._converter = threading.Thread(
                    target=self._run_converter, name="polymux-capture-convert", daemon=True
                )
                self._converter.start()
            inline = self._converter is None
        if inline:
            self._do_convert(files, raw)
        else:
            self._converts.put((files, raw))

    _closing_at_exit = False

    def _run_converter(self) -> None:
        q = self._converts
        while True:
            item = q.get()
            try:
                if not item:
                    return
                self._do_convert(*item)
            finally:
                q.task_done()

    def _do_convert(self, files: _SessionFiles, raw: Path) -> None:
        try:
            parquet = convert_capture(raw, compression=self.compression)
        except Exception as exc:  # noqa: BLE001 - the raw pair stays, for convert_capture
            self._errors.append(exc)
            logger.warning("polymux.tracing: converting %s failed (the raw file is kept): %r", raw, exc)
            return
        with self._lock:
            files.paths = [parquet if p == raw else p for p in files.paths]

    def flush(self) -> None:
        """Hand over what open sessions buffered (call this on their event loop's thread)
        and wait until the writer thread has written everything handed over, and the
        files of ended sessions are converted."""
        sinks = list(self._sinks)
        for sink in sinks:
            sink.flush()
        if self._thread is not None:
            for sink in sinks:  # the records the writer collects for a row group: now
                self._submit(("sync", sink._files))
            self._queue.join()
        if self._converter is not None:
            self._converts.join()

    def close(self) -> None:
        """Close open sessions' captures, write and convert everything and stop the
        threads. Sessions still running are not recorded further."""
        if self._closed:
            return
        for sink in list(self._sinks):
            sink.close()
        self._closed = True
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._queue.put(("stop",))
            thread.join()
        else:
            # No writer thread (nothing was handed over before, or interpreter exit, when a
            # new thread may not start): write what is queued here.
            self._closing_at_exit = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item[0] != "stop":
                    self._do(item)
        converter = self._converter
        if converter is not None and converter.is_alive():
            self._converts.put(())
            converter.join()
        _open_recorders.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_open_recorders: weakref.WeakSet[CaptureRecorder] = weakref.WeakSet()


def _prepare_writer() -> None:
    """Import (and initialise) everything the writer thread uses, on the caller's thread.

    A recorder left open is closed at interpreter exit, when imports that register exit
    handlers fail ("can't register atexit after shutdown": pyarrow's first array built from
    Python objects imports its pandas shim, which imports concurrent.futures), so the
    capture would be lost. Building small tables now does all of that while it can."""
    require("pyarrow", "CaptureRecorder (recording polymux captures)")
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _records_table(
        [FrameRecord("s", C2S, 0, "yamux", 0, "1", "data", 1, 0, 1, C2S, None, None, None)], [b"x"]
    )
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
    pa.table(
        [pa.array([0], pa.int64()), pa.array([C2S], pa.string()), pa.array([b"x"], pa.binary())],
        schema=capture_schema(),
    )


@atexit.register
def _close_open_recorders() -> None:
    for recorder in list(_open_recorders):
        recorder._closing_at_exit = True  # no new thread may start now
        with contextlib.suppress(*_write_errors(), RuntimeError):
            recorder.close()  # interpreter exit: nothing left to report to

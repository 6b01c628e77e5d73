"""Raw captures: :class:`CaptureRecorder` writes them, :func:`read_capture` reads them.

A capture file (``<session>.<seq:04d>.pmcap.parquet``) is a Parquet file with one row per
chunk of bytes: ``time_ns int64, direction string ("c2s"|"s2c"), data binary``, and
key-value metadata naming the session (``docs/tracing.md`` has the versioned format).

Cost on the event loop while recording: a clock read and a tuple appended per received
chunk and per part of each batch the session writes; parts are kept without copying when
they are ``bytes`` or views of ``bytes`` (immutable), copied otherwise. Full batches go to
one writer thread per recorder through a bounded queue (so memory is bounded; if the disk
cannot keep up, the session waits); the thread builds the Arrow tables (zero-copy), writes
and rotates the files, and decodes frames when asked to.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeAlias

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
    "Capture",
    "CaptureRecorder",
    "capture_schema",
    "read_capture",
    "read_capture_bytes",
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
"""File name suffix of frame records written by ``CaptureRecorder(frames=True)``."""


def _write_errors() -> tuple[type[Exception], ...]:
    """What writing a capture may raise (disk full, permissions, Arrow errors)."""
    import pyarrow as pa

    return (OSError, ValueError, pa.ArrowException)


_Row: TypeAlias = tuple[int, str, BytesLike | tuple[BytesLike, ...]]
"""A chunk as recorded: data is ``bytes`` or a view of ``bytes`` (immutable either way),
or a tuple of such parts (a sent batch, joined by the writer thread)."""

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
    try:
        seq = int(meta.get("seq", "0"))
    except ValueError:
        seq = 0
    return Capture(
        session=meta.get("session", ""),
        format=meta.get("format", ""),
        role=meta.get("role", ""),
        local=meta.get("local", ""),
        peer=meta.get("peer", ""),
        chunks=chunks,
        seq=seq,
        metadata=meta,
    )


def read_capture(path: str | os.PathLike[str]) -> Capture:
    """Read one ``*.pmcap.parquet`` file. Raises ``OSError`` if it cannot be read and
    ``ValueError`` if it is not a polymux capture (naming the file and what is wrong)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = os.fspath(path)
    try:
        table = pq.read_table(where)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{where} is not a readable Parquet file: {exc}") from None
    return _from_table(table, where)


def read_capture_bytes(data: BytesLike, *, name: str = "capture") -> Capture:
    """Like :func:`read_capture`, from the file's contents (Spark's ``binaryFile`` gives
    bytes). ``name`` is used in error messages."""
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


# -- recording -----------------------------------------------------------------------------


def _joined(rows: list[_Row]) -> list[tuple[int, str, BytesLike]]:
    """Rows with their parts joined (in the writer thread: one copy, in C)."""
    return [(t, d, b"".join(data) if isinstance(data, tuple) else data) for t, d, data in rows]


def _table(rows: list[tuple[int, str, BytesLike]]) -> pa.Table:
    """The Arrow table of capture rows, zero-copy: the data column is one chunk per row,
    so Parquet copies the bytes into its pages with the GIL released."""
    import pyarrow as pa

    times, directions, datas = zip(*rows, strict=True)
    binary = pa.binary()
    from_buffers = pa.BinaryArray.from_buffers
    chunks = [
        from_buffers(binary, 1, [None, pa.py_buffer(array("i", (0, len(data)))), pa.py_buffer(data)])
        for data in datas
    ]
    return pa.table(
        [pa.array(times, pa.int64()), pa.array(directions, pa.string()), pa.chunked_array(chunks, binary)],
        schema=capture_schema(),
    )


class _SessionFiles:
    """The writer thread's state for one session: open files, sizes, live decoder."""

    def __init__(self, recorder: CaptureRecorder, info: Mapping[str, str]) -> None:
        self.recorder = recorder
        self.info = dict(info)
        self.session = info["session"]
        self.seq = 0
        self.size = 0
        self.writer: pq.ParquetWriter | None = None
        self.frames_writer: pq.ParquetWriter | None = None
        self.decoder: FrameDecoder | None = None
        self.failed = False
        self.paths: list[Path] = []
        if recorder.frames:
            from polymux.tracing.decode import FrameDecoder

            try:
                self.decoder = FrameDecoder(info["format"], session=self.session)
            except ValueError as exc:  # a format this polymux cannot decode
                logger.warning("polymux.tracing: no frame records for %s: %s", self.session, exc)

    def _metadata(self, version_key: str, version: str) -> dict[str, str]:
        meta = {version_key: version}
        meta.update({key: self.info.get(key, "") for key in _INFO_KEYS})
        meta["seq"] = str(self.seq)
        return meta

    def _open(self) -> None:
        import pyarrow.parquet as pq

        rec = self.recorder
        base = rec.directory / f"{self.session}.{self.seq:04d}"
        schema = capture_schema().with_metadata(self._metadata("polymux.capture.version", CAPTURE_VERSION))
        path = base.with_name(base.name + CAPTURE_SUFFIX)
        # No dictionary and no statistics for the data column: hashing and comparing every
        # payload would cost several times the write itself.
        self.writer = pq.ParquetWriter(
            path,
            schema,
            compression=rec.compression,
            use_dictionary=["direction"],
            write_statistics=["time_ns", "direction"],
        )
        self.paths.append(path)
        self.size = 0

    def _open_frames(self) -> None:
        import pyarrow.parquet as pq

        base = self.recorder.directory / f"{self.session}.{self.seq:04d}"
        schema = frame_schema().with_metadata(self._metadata("polymux.frames.version", FRAMES_VERSION))
        path = base.with_name(base.name + FRAMES_SUFFIX)
        self.frames_writer = pq.ParquetWriter(path, schema, compression="zstd")
        self.paths.append(path)

    def _close_files(self) -> None:
        for writer in (self.writer, self.frames_writer):
            if writer is not None:
                writer.close()
        self.writer = self.frames_writer = None

    def write(self, rows: list[_Row], size: int) -> None:

        if self.failed:
            return
        try:
            if self.writer is not None and self.size and self.size + size > self.recorder.rotate_bytes:
                self._close_files()
                self.seq += 1
            if self.writer is None:
                self._open()
            assert self.writer is not None
            chunks = _joined(rows)
            self.writer.write_table(_table(chunks))
            self.size += size
            if self.decoder is not None:
                records: list[FrameRecord] = []
                for t, direction, data in chunks:
                    records.extend(self.decoder.feed((t, direction, bytes(data))))
                self._write_frames(records)
        except _write_errors() as exc:  # disk full ...: stop recording this session
            self.failed = True
            self.recorder._errors.append(exc)
            logger.warning("polymux.tracing: recording of %s stopped: %s", self.session, exc)
            self._close_quietly()

    def _write_frames(self, records: list[FrameRecord]) -> None:
        import pyarrow as pa

        if not records:
            return
        if self.frames_writer is None:
            self._open_frames()
        assert self.frames_writer is not None
        self.frames_writer.write_table(pa.Table.from_pylist([r._asdict() for r in records], frame_schema()))

    def close(self) -> None:
        if self.failed:
            return
        try:
            if self.decoder is not None:
                if self.writer is None:
                    self._open()  # an empty session still gets its capture file
                self._write_frames(self.decoder.finish())
            if self.writer is None:
                self._open()
            self._close_files()
        except _write_errors() as exc:
            self.failed = True
            self.recorder._errors.append(exc)
            logger.warning("polymux.tracing: closing the capture of %s failed: %s", self.session, exc)
            self._close_quietly()

    def _close_quietly(self) -> None:
        for writer in (self.writer, self.frames_writer):
            if writer is not None:
                with contextlib.suppress(*_write_errors()):
                    writer.close()  # already failing: the first error is the one kept
        self.writer = self.frames_writer = None


class _CaptureSink:
    """What one session calls (on the event loop): buffer chunks, hand full batches over."""

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
        thread joins them); anything else is copied now, since its owner may reuse it."""
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
            self._recorder._submit(self._files, rows, size)

    def close(self) -> None:
        """The connection is gone: write what is left and close the files."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        self._recorder._submit_close(self)


class CaptureRecorder:
    """A capture factory (``SessionConfig(capture=CaptureRecorder(directory))``): records
    the raw bytes of every session it is given into ``directory``.

    Each session gets an id ``<unix-ms>-<pid>-<counter>-<role>`` and writes
    ``<session>.<seq:04d>.pmcap.parquet`` files, a new one (``seq`` + 1) once a file holds
    ``rotate_bytes``. With ``frames=True`` the writer thread also decodes the bytes as they
    come and writes ``<session>.<seq:04d>.pmframes.parquet`` (frame records, see
    :data:`polymux.tracing.FRAME_FIELDS`).

    Call :meth:`flush` to wait for what was handed over to be written, :meth:`close` (or
    use it as a context manager) when done: it writes what the open sessions buffered and
    stops the thread. A recorder left open is closed at interpreter exit.

    Args:
        directory: where the files go (created if missing).
        rotate_bytes: data bytes per file before rotating.
        frames: also write decoded frame records.
        batch_bytes: bytes a session buffers before handing a batch to the writer thread.
            Large batches matter: the writer thread needs the GIL a few times per batch,
            and a busy event loop hands it over only every ``sys.getswitchinterval()``.
        max_queued_bytes: bytes handed over and not yet written before the event loop
            waits for the writer (memory stays bounded when the disk is slow).
        compression: Parquet compression of capture files: ``"none"`` (the default: the
            cheapest to write, and payloads are often incompressible), ``"zstd"``,
            ``"lz4"``, ``"snappy"`` ...
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rotate_bytes: int = 64 * 2**20,
        frames: bool = False,
        batch_bytes: int = 8 * 1024 * 1024,
        max_queued_bytes: int = 64 * 1024 * 1024,
        compression: str = "none",
    ) -> None:
        _prepare_writer()  # fail here if pyarrow is missing; and nothing is imported at exit

        if rotate_bytes <= 0 or batch_bytes <= 0 or max_queued_bytes <= 0:
            raise ValueError(
                "CaptureRecorder: rotate_bytes, batch_bytes and max_queued_bytes must be positive"
            )
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rotate_bytes = rotate_bytes
        self.frames = frames
        self.batch_bytes = batch_bytes
        self.compression = compression
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue(max(2, max_queued_bytes // batch_bytes))
        self._thread: threading.Thread | None = None
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
        """Files written so far (capture and frames files)."""
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

    def _submit(self, files: _SessionFiles, rows: list[_Row], size: int) -> None:
        if self._thread is None:
            self._start()
        self._queue.put(("write", files, rows, size))

    def _submit_close(self, sink: _CaptureSink) -> None:
        if self._thread is None:
            self._start()
        self._sinks.discard(sink)
        self._queue.put(("close", sink._files))

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
            elif item[0] == "close":
                files.close()
        except Exception as exc:  # noqa: BLE001 - reported through errors and the log
            files.failed = True
            self._errors.append(exc)
            logger.warning("polymux.tracing: recording of %s stopped: %r", files.session, exc)
            files._close_quietly()

    def flush(self) -> None:
        """Hand over what open sessions buffered (call this on their event loop's thread)
        and wait until the writer thread has written everything handed over."""
        for sink in list(self._sinks):
            sink.flush()
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Close open sessions' captures, write everything and stop the writer thread.
        Sessions still running are not recorded further."""
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
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item[0] != "stop":
                    self._do(item)
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
    capture would be lost. Building one small table now does all of that while it can."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _table([(0, C2S, b"x")])
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
    pa.Table.from_pylist([], frame_schema())


@atexit.register
def _close_open_recorders() -> None:
    for recorder in list(_open_recorders):
        with contextlib.suppress(*_write_errors(), RuntimeError):
            recorder.close()  # interpreter exit: nothing left to report to

"""Ingest: capture files -> the frames table, decoded inside Spark.

Inputs are raw polymux captures (``*.pmcap.parquet``, written by
``polymux.tracing.CaptureRecorder``), frame records (``*.pmframes.parquet``, written by
``CaptureRecorder(mode="records")``) and packet captures (``*.pcap``, ``*.pcapng``), given
as files, folders (searched recursively) or glob patterns. Spark reads each file whole
(``binaryFile``); ``mapInArrow`` decodes it with ``polymux.tracing.decode_batches`` (the
``polymux.wire`` codecs' frame-record walks, vectorised where a walk can) on the executors,
one task per file, so the work is partitioned by flow; a frames file is already decoded:
its columns are taken as they are (the ingest only adds ``seq``, ``credit_before`` and
``detection``, vectorised). :func:`write_frames` has each task write its Parquet file
itself; :func:`ingest` gives the same rows as a lazy DataFrame. A session whose capture
rotated into several files is taken in one piece: those files (only those) are brought
together by session and sorted by sequence number first. A frames file whose session's
raw capture is among the inputs too (``frames=True``) is left out: the bytes are decoded.

Which format: a polymux capture records its own; a packet capture's flow is decoded as the
format ``protocol`` forces for it (one format for every flow, or ``{pattern: format}`` by
session id: ``polymux.tracing.forced_format``), else as ``polymux.tracing.decode_flow``
detects it (retrying the other candidates when it fails early; flows it does not recognise
are skipped). The ``detection`` column says which, per session.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

from polymux.pipeline.schema import EXTRA_FIELDS, FRAME_FIELDS, frames_struct
from polymux.pipeline.spark import sql_conf
from polymux.tracing.inputs import CAPTURE_SUFFIX, FRAMES_SUFFIX, PCAP_SUFFIXES, InputFile, find_inputs


__all__ = [
    "CAPTURE_SUFFIX",
    "FRAMES_SUFFIX",
    "PCAP_SUFFIXES",
    "InputFile",
    "ProtocolChoice",
    "decode_units",
    "find_inputs",
    "ingest",
    "write_frames",
]

_BATCH_ROWS = 65536
_CREDIT = 9  # index of ``credit`` in a frame record
_CHANNEL = 5
_CREDIT_DIR = 10


# -- executor side -------------------------------------------------------------------------


ProtocolChoice = str | Mapping[str, str] | None
"""``protocol`` of the ingest: one format for every packet-capture flow, ``{pattern: format}``
by session id (``polymux.tracing.forced_format``), or None (detect)."""


def _sessions(
    rows: Iterable[tuple[str, str, bytes]], protocol: ProtocolChoice
) -> Iterator[tuple[str, Iterator[Any] | _FramesUnit | _Batches]]:
    """``(detection, frame records)`` per session (a pcap file gives one per flow)."""
    from polymux import tracing

    iterator = iter(rows)
    peek = next(iterator, None)
    while peek is not None:
        unit, path, content = peek
        if path.endswith(FRAMES_SUFFIX):
            files = [(path, content)]
            peek = next(iterator, None)
            while peek is not None and peek[0] == unit:
                files.append((peek[1], peek[2]))
                peek = next(iterator, None)
            yield "recorded in the capture", _FramesUnit(files)
            continue
        if path.lower().endswith(PCAP_SUFFIXES):
            peek = next(iterator, None)
            try:
                flows = list(tracing.read_pcap_bytes(content))
            except Exception as exc:
                raise ValueError(f"{path}: cannot read the packet capture: {exc}") from exc
            for flow in flows:
                forced = tracing.forced_format(flow.session, protocol)
                decoded = tracing.decode_flow(
                    flow.chunks, session=flow.session, format=forced, how="forced (--protocol)"
                )
                if decoded.format is None:
                    continue  # not a format we can recognise: skipped (say --protocol)
                yield decoded.how, decoded.records
            continue
        try:
            first = tracing.read_capture_bytes(content)
        except Exception as exc:
            raise ValueError(f"{path}: cannot read the polymux capture: {exc}") from exc
        peek = next(iterator, None)

        def unit_chunks(first: Any = first, unit: str = unit) -> Iterator[Any]:
            nonlocal peek
            yield from first.chunks
            while peek is not None and peek[0] == unit:
                _u, more_path, more = peek
                try:
                    capture = tracing.read_capture_bytes(more)
                except Exception as exc:
                    raise ValueError(f"{more_path}: cannot read the polymux capture: {exc}") from exc
                peek = next(iterator, None)
                yield from capture.chunks

        yield (
            "recorded in the capture",
            _Batches(
                tracing.decode_batches(first.format, unit_chunks(), session=first.session, rows=_BATCH_ROWS)
            ),
        )
        # in case the batches stopped early: skip the rest of the unit
        while peek is not None and peek[0] == unit:
            peek = next(iterator, None)


class _Batches:
    """A raw capture's session, decoded: the frame records as Arrow batches (the
    contract's 14 columns; :func:`polymux.tracing.decode_batches`)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self.batches = batches


class _FramesUnit:
    """The frames files of one session (in sequence order): already its frame records."""

    def __init__(self, files: list[tuple[str, bytes]]) -> None:
        self.files = files

    def batches(self, schema: pa.Schema, detection: str) -> Iterator[pa.RecordBatch]:
        """The frames table's batches: the files' columns as they are, plus ``seq``,
        ``credit_before`` and ``detection``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from polymux.tracing.capture import frames_metadata

        names = [name for name, _ in FRAME_FIELDS]
        types = list(schema)[: len(names)]
        last: dict[str, int] = {}
        seq = 0
        for path, content in self.files:
            try:
                table = pq.read_table(pa.BufferReader(content))
                frames_metadata(table.schema, path)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise ValueError(f"{path}: cannot read the polymux frames file: {exc}") from exc
            missing = [n for n in names[:-1] if n not in table.column_names]
            if missing:
                raise ValueError(f"{path}: frames file is missing column(s) {', '.join(missing)}")
            for batch in table.to_batches(max_chunksize=_BATCH_ROWS):
                n = batch.num_rows
                arrays = [
                    batch.column(name).cast(field.type)
                    if name in batch.schema.names
                    else pa.nulls(n, field.type)  # channel_name: added to version 1 later
                    for name, field in zip(names, types, strict=True)
                ]
                arrays += _extra_columns(
                    arrays[_CHANNEL], arrays[_CREDIT_DIR], arrays[_CREDIT], last, seq, detection
                )
                seq += n
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _credit_before(
    channel: pa.Array, credit_dir: pa.Array, credit: pa.Array, last: dict[str, int]
) -> pa.Array:
    """Per record, the previous credit of its (channel, credit_dir) (null where the record
    has no credit or none came before); ``last`` carries the latest credit per key from
    block to block (and file to file) of a session. Vectorised: the records with a credit
    are sorted by key (stably), each takes its predecessor's credit; only the first and
    last record of each key in the block touch Python."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(credit)
    rows = np.flatnonzero(credit.is_valid().to_numpy(zero_copy_only=False))
    if not len(rows):
        return pa.nulls(n, pa.int64())
    keys = pc.binary_join_element_wise(channel.take(rows), credit_dir.take(rows), "\x00").dictionary_encode()
    names = keys.dictionary.to_pylist()
    codes = keys.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    by_key = codes[order]
    values = credit.take(rows).to_numpy(zero_copy_only=False).astype(np.int64)[order]
    starts = np.ones(len(by_key), dtype=bool)
    starts[1:] = by_key[1:] != by_key[:-1]
    ends = np.ones(len(by_key), dtype=bool)
    ends[:-1] = starts[1:]
    before = np.zeros(len(by_key), dtype=np.int64)
    before[1:] = values[:-1]
    known = ~starts
    for k in np.flatnonzero(starts):
        previous = last.get(names[by_key[k]])
        if previous is not None:
            before[k] = previous
            known[k] = True
    for k in np.flatnonzero(ends):
        last[names[by_key[k]]] = int(values[k])
    out = np.zeros(n, dtype=np.int64)
    mask = np.ones(n, dtype=bool)
    out[rows[order]] = before
    mask[rows[order]] = ~known
    return pa.array(out, mask=mask)


def decode_units(
    rows: Iterable[tuple[str, str, bytes]], protocol: ProtocolChoice = None
) -> Iterator[pa.RecordBatch]:
    """Decode ``(unit, path, content)`` rows into Arrow batches of the frames table (the
    contract's 14 fields, then ``seq``, ``credit_before`` and ``detection``).

    Rows of the same unit (a rotated capture's files) must be consecutive and in sequence
    order; their chunks are decoded as one stream. No Spark here: the executors run it
    inside ``mapInArrow``, and it can run on its own.
    """
    import pyarrow as pa

    schema = _arrow_schema()
    record_type = pa.struct(list(schema)[: len(FRAME_FIELDS)])
    for detection, records in _sessions(rows, protocol):
        if isinstance(records, _FramesUnit):
            yield from records.batches(schema, detection)
            continue
        last: dict[str, int] = {}
        seq = 0
        if isinstance(records, _Batches):
            for batch in records.batches:
                n = batch.num_rows
                arrays = batch.columns
                arrays += _extra_columns(
                    arrays[_CHANNEL], arrays[_CREDIT_DIR], arrays[_CREDIT], last, seq, detection
                )
                seq += n
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)
            continue
        while block := list(itertools.islice(records, _BATCH_ROWS)):
            n = len(block)
            # One pass in C over the records (tuples): a struct array, then its columns.
            arrays = list(pa.array(block, type=record_type).flatten())
            arrays += _extra_columns(
                arrays[_CHANNEL], arrays[_CREDIT_DIR], arrays[_CREDIT], last, seq, detection
            )
            seq += n
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _extra_columns(
    channel: pa.Array, credit_dir: pa.Array, credit: pa.Array, last: dict[str, int], seq: int, detection: str
) -> list[pa.Array]:
    """``seq``, ``credit_before`` and ``detection`` of a block of a session's records
    (``seq``: the block's first record's)."""
    import numpy as np
    import pyarrow as pa

    n = len(credit)
    # The detection on the session's first record only: a long text on every record
    # costs time and memory for nothing (the reports take it per session).
    if seq:
        shown = pa.nulls(n, pa.string())
    else:
        shown = pa.array([detection], pa.string()).take(pa.array([0] + [None] * (n - 1), pa.int32()))
    return [
        pa.array(np.arange(seq, seq + n, dtype=np.int64)),
        _credit_before(channel, credit_dir, credit, last),
        shown,
    ]


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"str": pa.string(), "int64": pa.int64()}
    names = [name for name, _ in FRAME_FIELDS + EXTRA_FIELDS]
    kinds = [kind for _, kind in FRAME_FIELDS + EXTRA_FIELDS]
    return pa.schema(
        [
            pa.field(n, types[k.split("|")[0].strip()], nullable="None" in k)
            for n, k in zip(names, kinds, strict=True)
        ]
    )


def _rows_of(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[str, str, bytes]]:
    """The ``(unit, path, content)`` rows of ``mapInArrow``'s input batches."""
    for batch in batches:
        units = batch.column("unit").to_pylist()
        paths = batch.column("path").to_pylist()
        contents = batch.column("content")
        for i, unit in enumerate(units):
            yield unit, paths[i], contents[i].as_py()


def _decode_batches(batches: Iterator[pa.RecordBatch], protocol: ProtocolChoice) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body of :func:`ingest`: input rows (unit, path, content) -> frame-table
    batches."""
    yield from decode_units(_rows_of(batches), protocol)


def _local_uri(path: str) -> str:
    return "file://" + str(Path(path).resolve())


def _files_of(inputs: Sequence[str | os.PathLike[str]] | Sequence[InputFile]) -> list[InputFile]:
    files = [f for f in inputs if isinstance(f, InputFile)]
    if len(files) != len(inputs):
        files = find_inputs([f for f in inputs if not isinstance(f, InputFile)]) + files
    if not files:
        raise ValueError("no inputs")
    return files


def _unit_tables(spark: SparkSession, files: list[InputFile]) -> list[tuple[str, DataFrame]]:
    """``(tag, rows)``: the input files as ``(unit, path, content)`` rows, one task per
    file; a rotated session's files (tag ``r``) brought together in one task, in sequence
    order (tag ``f``: the others)."""
    from pyspark.sql import functions as F

    counts: dict[str, int] = {}
    for f in files:
        counts[f.unit] = counts.get(f.unit, 0) + 1
    parts: list[tuple[str, DataFrame]] = []
    for rotated in (False, True):
        chosen = [f for f in files if (counts[f.unit] > 1) == rotated]
        if not chosen:
            continue
        raw = spark.read.format("binaryFile").load([_local_uri(f.path) for f in chosen])
        if rotated:
            # the session part of <session>.<seq>.pmcap.parquet, and the sequence number
            table = raw.select(
                F.regexp_extract("path", r"^(.*)\.\d+\.pm(?:cap|frames)\.parquet$", 1).alias("unit"),
                F.regexp_extract("path", r"\.(\d+)\.pm(?:cap|frames)\.parquet$", 1).cast("long").alias("seq"),
                "path",
                "content",
            )
            units = len({f.unit for f in chosen})
            tasks = max(1, min(units, 2 * spark.sparkContext.defaultParallelism))
            table = table.repartition(tasks, "unit").sortWithinPartitions("unit", "seq")
        else:
            table = raw.select(F.col("path").alias("unit"), "path", "content")
        parts.append(("r" if rotated else "f", table.select("unit", "path", "content")))
    return parts


def ingest(
    spark: SparkSession,
    inputs: Sequence[str | os.PathLike[str]] | Sequence[InputFile],
    protocol: ProtocolChoice = None,
) -> DataFrame:
    """Return the frames DataFrame (columns :data:`~polymux.pipeline.schema.FRAME_TABLE_COLUMNS`)
    of the given capture files, folders or patterns. Lazy: the decoding runs when the
    DataFrame is used; write it or cache it before running several reports on it
    (:func:`write_frames` decodes and writes the table in one go, faster).

    Run the action inside :func:`ingest_settings` so that every file is its own task.
    """
    schema = frames_struct()
    body = partial(_decode_batches, protocol=protocol)
    parts = [rows.mapInArrow(body, schema) for _tag, rows in _unit_tables(spark, _files_of(inputs))]
    frames = parts[0]
    for more in parts[1:]:
        frames = frames.unionByName(more)
    return frames


def write_frames(
    spark: SparkSession,
    inputs: Sequence[str | os.PathLike[str]] | Sequence[InputFile],
    folder: str | os.PathLike[str],
    protocol: ProtocolChoice = None,
) -> int:
    """Decode the inputs on the executors and write the frames table into ``folder`` (a
    local or shared path every executor sees): one Parquet file per task, written by the
    task itself with pyarrow, then ``_SUCCESS``. Returns the number of frame records.

    What :func:`ingest` gives, written: the decoded Arrow batches go straight to Parquet in
    the Python worker, without the JVM turning them into rows and writing those (2-3x the
    ingest's cost). Read it back with ``spark.read.schema(frames_struct()).parquet(folder)``.
    A task writes ``part-<tag>-<partition>.parquet`` through a hidden temporary file and
    renames it, so a retried or speculative task replaces its own file, never adds one.
    """
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    total = 0
    with sql_conf(spark, INGEST_SETTINGS):
        for tag, rows in _unit_tables(spark, _files_of(inputs)):
            body = partial(_write_batches, protocol=protocol, folder=str(target), tag=tag)
            total += sum(row[0] for row in rows.mapInArrow(body, "frames long").collect())
    (target / "_SUCCESS").touch()
    return total


_PARQUET_OPTIONS: dict[str, Any] = {
    # Dictionary pages for the text columns only (few values each); trying them on every
    # integer column too cost a third of the write. Statistics where a filter may use
    # them (the reports skip row groups without names or detections by them).
    "use_dictionary": [name for name, kind in FRAME_FIELDS + EXTRA_FIELDS if kind.startswith("str")],
    "write_statistics": ["session", "time_ns", "frame_type", "channel_name", "detection", "seq"],
}


def _write_batches(
    batches: Iterator[pa.RecordBatch], protocol: ProtocolChoice, folder: str, tag: str
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body of :func:`write_frames`: decode the task's rows, write the
    frames into the task's Parquet file; yield one row, the number of frames."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    attempt = context.attemptNumber() if context is not None else 0
    name = f"part-{tag}-{partition:05d}.parquet"
    tmp = os.path.join(folder, f".{name}.{attempt}-{os.getpid()}.tmp")  # hidden from readers
    count = 0
    writer: pq.ParquetWriter | None = None
    try:
        for batch in decode_units(_rows_of(batches), protocol):
            if writer is None:
                writer = pq.ParquetWriter(tmp, batch.schema, **_PARQUET_OPTIONS)
            writer.write_batch(batch)
            count += batch.num_rows
        if writer is not None:
            writer.close()
            writer = None
            os.replace(tmp, os.path.join(folder, name))
    finally:
        if writer is not None:  # failed: the task is retried or the job fails
            writer.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    yield pa.record_batch([pa.array([count], pa.int64())], names=["frames"])


INGEST_SETTINGS = {
    # every file its own task (binaryFile never splits a file; these stop Spark packing
    # several small files into one task)
    "spark.sql.files.maxPartitionBytes": "1",
    "spark.sql.files.openCostInBytes": "1",
    # a few rows per Arrow batch into mapInArrow: each row is a whole file
    "spark.sql.execution.arrow.maxRecordsPerBatch": "4",
}
"""SQL settings for the action that runs the ingest (see :func:`polymux.pipeline.spark.sql_conf`)."""

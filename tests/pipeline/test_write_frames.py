"""``write_frames``: the executors write the frames table themselves (pyarrow, one file per
task): the same rows ``ingest`` gives, ``_SUCCESS`` at the end, and a task run again
replaces its file instead of adding one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from polymux.pipeline import FRAME_TABLE_COLUMNS, INGEST_SETTINGS, find_inputs, ingest, sql_conf, write_frames
from polymux.pipeline.ingest import _write_batches

from .test_frames_inputs import _record


if TYPE_CHECKING:
    from pyspark.sql import SparkSession


pytestmark = pytest.mark.spark


def _input_batch(folder: Path) -> pa.RecordBatch:
    found = find_inputs([str(folder)])
    return pa.record_batch(
        {
            "unit": [f.unit for f in found],
            "path": [f.path for f in found],
            "content": pa.array([Path(f.path).read_bytes() for f in found], pa.binary()),
        }
    )


def _rows(table: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in table)


def test_a_task_writes_its_file_and_a_retry_replaces_it(tmp_path: Path) -> None:
    full, _records = _record(tmp_path, "yamux")
    batch = _input_batch(full)
    out = tmp_path / "frames"
    out.mkdir()
    for _ in range(2):  # the same task again (a retry): the same file, rewritten
        (counted,) = list(_write_batches(iter([batch]), None, str(out), "f"))
        assert counted.column("frames").to_pylist()[0] > 20
    files = sorted(p.name for p in out.iterdir())
    assert files == ["part-f-00000.parquet"]  # no second file, no temporary one left
    table = pq.read_table(out / files[0])
    assert table.column_names == FRAME_TABLE_COLUMNS
    assert table.num_rows == counted.column("frames").to_pylist()[0]


def test_a_failed_task_leaves_no_file(tmp_path: Path) -> None:
    bad = pa.record_batch(
        {"unit": ["x.pmcap.parquet"], "path": ["x.pmcap.parquet"], "content": pa.array([b"not parquet"])}
    )
    out = tmp_path / "frames"
    out.mkdir()
    with pytest.raises(ValueError, match=r"x\.pmcap\.parquet: cannot read the polymux capture"):
        list(_write_batches(iter([bad]), None, str(out), "f"))
    assert list(out.iterdir()) == []


def test_write_frames_equals_ingest(tmp_path: Path, spark: SparkSession) -> None:
    full, records = _record(tmp_path, "mplex")
    inputs = [str(full), str(records / "*-client.*")]  # a rotated session among them
    out = tmp_path / "table"
    count = write_frames(spark, inputs, out)
    assert (out / "_SUCCESS").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    written = pq.read_table(out).select(FRAME_TABLE_COLUMNS)
    with sql_conf(spark, INGEST_SETTINGS):
        lazy = ingest(spark, inputs).collect()
    assert count == written.num_rows == len(lazy) > 20
    assert _rows(zip(*(written.column(c).to_pylist() for c in FRAME_TABLE_COLUMNS), strict=True)) == _rows(
        lazy
    )

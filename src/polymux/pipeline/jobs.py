"""The whole job: ingest -> frames table (Parquet) -> reports (Parquet + CSV) -> index.html."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

from polymux.pipeline.ingest import InputFile, ProtocolChoice, find_inputs, write_frames
from polymux.pipeline.page import write_html
from polymux.pipeline.reports import REPORTS, SORT_KEYS, reports
from polymux.pipeline.schema import frames_struct
from polymux.pipeline.spark import Progress, build_session, sql_conf, stop_quietly, under_spark_submit


__all__ = ["Summary", "analyze", "collect_reports", "report_settings", "write_reports"]


@dataclass
class Summary:
    """What :func:`analyze` did."""

    out: Path
    """The output folder."""
    files: int
    """Capture files ingested."""
    frames: int
    """Frame records in the frames table."""
    sessions: int
    """Sessions (flows) decoded."""
    violations: int
    """Violation and truncation records."""
    stalls: int
    """Stall intervals."""
    master: str
    """The Spark master the job ran on."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per stage."""
    tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    """The report tables, collected on the driver."""


def collect_reports(frames_reports: Mapping[str, DataFrame]) -> dict[str, pd.DataFrame]:
    """Collect every report (not the ``_``-prefixed intermediates) to pandas, sorted by its
    :data:`~polymux.pipeline.reports.SORT_KEYS`."""
    tables: dict[str, pd.DataFrame] = {}
    for name in REPORTS:
        table: pd.DataFrame = frames_reports[name].toPandas()
        tables[name] = table.sort_values(SORT_KEYS[name], kind="stable").reset_index(drop=True)
    return tables


def write_reports(tables: Mapping[str, pd.DataFrame], out: str | os.PathLike[str]) -> None:
    """Write each collected report as ``out/<name>.csv`` and ``out/<name>.parquet``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_csv(folder / f"{name}.csv", index=False)
        table.to_parquet(folder / f"{name}.parquet", index=False)


def report_settings(spark: SparkSession) -> dict[str, str]:
    """SQL settings for the report queries: their shuffles carry small aggregates, so a
    few partitions (not Spark's default 200, each a task per shuffle) are enough."""
    return {
        "spark.sql.shuffle.partitions": str(max(2, min(8, spark.sparkContext.defaultParallelism))),
        "spark.sql.execution.arrow.pyspark.enabled": "true",  # toPandas through Arrow
    }


def analyze(
    inputs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    protocol: ProtocolChoice = None,
    master: str | None = None,
    *,
    spark: SparkSession | None = None,
    progress: bool = True,
    fast_start: bool = False,
) -> Summary:
    """Run the whole pipeline on capture files, folders or patterns.

    Writes into ``out``: ``frames/`` (the frames table, Parquet), every report as CSV and
    Parquet, ``throughput.png``, ``stalls.png`` and ``index.html``. Spark: ``spark`` if
    given, else a quiet session on ``master`` (default ``local[*]``; under ``spark-submit``
    the submitted master). ``protocol``: the format of packet-capture flows, one for all
    or ``{session pattern: format}`` (``polymux.tracing.parse_protocols``); by default
    each flow's format is detected (``polymux.tracing.decode_flow``).
    """
    steps = Progress(progress)
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    files = find_inputs(inputs)
    ours = spark is None
    if spark is None:
        with steps.stage("spark") as info:
            spark = build_session(master, fast_start=fast_start)
            info["detail"] = f"master {spark.sparkContext.master}" + (
                ", from spark-submit" if under_spark_submit() else ""
            )
    try:
        return _run(spark, files, folder, protocol, steps)
    except KeyboardInterrupt:  # Ctrl-C: no Java stacks of killed tasks after "interrupted"
        stop_quietly(spark, stop=ours and not under_spark_submit())
        raise


def _run(
    spark: SparkSession, files: list[InputFile], folder: Path, protocol: ProtocolChoice, steps: Progress
) -> Summary:
    """The stages after the session is there: ingest, reports, html."""
    table_dir = folder / "frames"
    if table_dir.exists():
        shutil.rmtree(table_dir)
    with steps.stage("ingest") as info:
        # The executors write the table themselves (Arrow to Parquet, no JVM rows).
        count = write_frames(spark, files, table_dir, protocol)
        table = spark.read.schema(frames_struct()).parquet("file://" + str(table_dir))
        info["detail"] = f"{len(files)} files -> {count:,} frames in {table_dir}"
    with steps.stage("reports") as info, sql_conf(spark, report_settings(spark)):
        computed = reports(table)
        tables = collect_reports(computed)
        for name, frame in computed.items():
            if name.startswith("_"):
                frame.unpersist()
        write_reports(tables, folder)
        info["detail"] = ", ".join(f"{name} {len(t)}" for name, t in tables.items())
    with steps.stage("html") as info:
        page = write_html(folder, tables)
        info["detail"] = str(page)
    return Summary(
        out=folder,
        files=len(files),
        frames=count,
        sessions=len(tables["sessions"]),
        violations=len(tables["violations"]),
        stalls=len(tables["stalls"]),
        master=spark.sparkContext.master or "",
        timings=dict(steps.timings),
        tables=tables,
    )

"""``polymux.pipeline``: what crossed the wire, analysed with Spark (PySpark).

Decodes raw polymux captures (``*.pmcap.parquet`` from ``polymux.tracing.CaptureRecorder``)
and packet captures (pcap, pcapng) with the ``polymux.wire`` codecs inside Spark, into a
frames table, and reports bytes and frames per channel, throughput per second, flow-control
stalls, channel lifetimes, ping RTTs and protocol violations (DataFrames, CSV, Parquet, and
an HTML page with plots). The only polymux package that imports pyspark (extra
``polymux[spark]``); pyspark is imported inside the functions, so importing this package is
cheap.

    summary = polymux.pipeline.analyze(["captures/"], "report/")       # local[*]

or step by step on your own SparkSession::

    frames = ingest(spark, ["captures/"]).cache()
    tables = reports(frames)            # dict of DataFrames
"""

from __future__ import annotations

from polymux.pipeline.ingest import (
    INGEST_SETTINGS,
    InputFile,
    decode_units,
    find_inputs,
    ingest,
    write_frames,
)
from polymux.pipeline.jobs import Summary, analyze, collect_reports, write_reports
from polymux.pipeline.page import write_html
from polymux.pipeline.reports import REPORTS, reports
from polymux.pipeline.schema import FRAME_FIELDS, FRAME_TABLE_COLUMNS, frames_struct
from polymux.pipeline.spark import Progress, build_session, sql_conf, under_spark_submit


__all__ = [
    "FRAME_FIELDS",
    "FRAME_TABLE_COLUMNS",
    "INGEST_SETTINGS",
    "REPORTS",
    "InputFile",
    "Progress",
    "Summary",
    "analyze",
    "build_session",
    "collect_reports",
    "decode_units",
    "find_inputs",
    "frames_struct",
    "ingest",
    "reports",
    "sql_conf",
    "under_spark_submit",
    "write_frames",
    "write_html",
    "write_reports",
]

"""The frames table: the Spark mirror of ``polymux.tracing.FRAME_FIELDS``, plus three
columns the ingest adds.

The first 14 columns are exactly the contract's frame record (kept in sync with
``polymux.tracing.FRAME_FIELDS`` by a test). Three more follow them (a superset, so
anything reading the contract's columns by name keeps working):

- ``seq`` (int64): the record's position in its session as decoded (both directions
  interleaved in time order): a total order within a session, also between records that
  share a ``time_ns``.
- ``credit_before`` (int64, null): for records with a ``credit``, the credit of the same
  (channel, ``credit_dir``) before this record (null on its first record). Stall detection
  needs only the records where the credit crosses zero, so the reports need no sort.
- ``detection`` (str, null): how the session's format was chosen, on the session's first
  record (``seq`` 0; null on the others): ``"recorded in the capture"``, ``"forced
  (--protocol)"``, or the detector's verdict with its confidence and evidence (``"detected
  yamux (confidence 0.97: ...)"``, ``"ambiguous: mplex or multiplex (decoded as mplex;
  ...)"``), plus what a retry did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from polymux.formats.records import FRAME_FIELDS


if TYPE_CHECKING:
    from pyspark.sql.types import StructType


__all__ = ["EXTRA_FIELDS", "FRAME_FIELDS", "FRAME_TABLE_COLUMNS", "frames_struct"]

# FRAME_FIELDS, the contract's frame record fields (name, type) in order, is the one the
# formats' walks write (polymux.formats.records), re-exported here.

EXTRA_FIELDS: list[tuple[str, str]] = [
    ("seq", "int64"),
    ("credit_before", "int64 | None"),
    ("detection", "str | None"),
]
"""The columns the ingest adds after the contract's (see the module docstring)."""

FRAME_TABLE_COLUMNS: list[str] = [name for name, _ in FRAME_FIELDS + EXTRA_FIELDS]
"""Column names of the frames table, in order."""


def frames_struct() -> StructType:
    """The Spark schema of the frames table (nullable exactly where the contract says
    ``| None``)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fields = []
    for name, kind in FRAME_FIELDS + EXTRA_FIELDS:
        base = kind.split("|")[0].strip()
        spark_type = StringType() if base == "str" else LongType()
        fields.append(StructField(name, spark_type, nullable="None" in kind))
    return StructType(fields)

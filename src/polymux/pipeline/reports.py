"""Reports: pure DataFrame -> DataFrame functions over the frames table.

Built for speed (the reports, not the decoding, are what makes a naive Spark pipeline
slow): the frames table is read twice in all, with no window or sort over it and no Python
UDF.

1. One aggregation by (session, format, channel, direction, second) -- the "fine" table,
   small and cached -- from which traffic, throughput, lifetimes and sessions derive.
2. One filter keeping the rare rows the other reports need -- pings, pongs, violations and
   the records where a sender's credit crosses zero (``credit`` against ``credit_before``,
   which the ingest computed in decode order) -- also cached; stalls, ping RTTs and
   violations derive from it (a window over these few rows pairs stall starts and ends).

Definitions (see docs/pipeline.md):

- bytes are application bytes: the ``length`` of ``data`` records;
- a stall is an interval during which a sender's credit (``credit`` for ``credit_dir`` on a
  channel) was <= 0: from the record that brought it to <= 0 until the next record that
  raised it above 0 (``ended_by`` ``credit``), a reset of the channel (``reset``), or the
  end of the capture (the session's last record, ``end_of_capture``). Zero credit that
  lasts until the sender ends the channel itself (``end``/``close``) is not a stall: the
  sender had nothing left to send (an ``end`` needs no credit);
- a channel's lifetime runs from its first ``open`` (else its first record) to its first
  ``reset``, or to its last record once it is closed (any ``close``, or an ``end`` from
  every direction that sent data on it), else to the end of the capture;
- a ping's RTT is the time from a ``ping`` to the first later ``pong`` with the same
  ``ping_id`` in the other direction;
- ``channel_name`` is the name the channel was opened with, where the format has names
  (null otherwise), and ``detection`` how the session's format was chosen; both are
  constant per channel / session, so they ride along as aggregates (no extra scan).
"""

from __future__ import annotations

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


__all__ = ["REPORTS", "reports"]

REPORTS: dict[str, str] = {
    "sessions": "one row per session: format and how it was chosen, span, frames, data bytes each way, channels, resets, violations",
    "traffic": "frames and data bytes per session, channel (with its name) and direction",
    "throughput": "data bytes and frames per session, channel and direction in 1-second windows",
    "stalls": "intervals a sender sat at zero credit on a channel",
    "stall_totals": "stalls and stalled time per session, channel and sender",
    "lifetimes": "per channel: open/close/end/reset counts, opened, ended, lifetime",
    "pings": "ping RTTs (ping matched with the pong carrying its id)",
    "violations": "protocol violations and truncated streams with their byte offsets",
}
"""The report names and what each holds."""

_NS = 1_000_000_000


def _count(cond: Column) -> Column:
    from pyspark.sql import functions as F

    return F.sum(F.when(cond, 1).otherwise(0))


def fine_table(frames: DataFrame) -> DataFrame:
    """The one aggregation over the frames table: per (session, format, channel, direction,
    second) the frames, data frames and bytes, first/last times, the counts and times of
    open/close/end/reset records; then the channel's name and the session's detection.

    The two strings are looked up apart and joined to the (small) aggregate: a string
    among the aggregates (``max(channel_name)``) keeps Spark from its hash aggregation and
    sorted all 16 Mi rows of the benchmark (reports 8.9 -> 21 s). Names and detections are
    on few rows (null elsewhere), which Parquet's statistics skip."""
    from pyspark.sql import functions as F

    kind = F.col("frame_type")
    t = F.col("time_ns")
    counts = (
        frames.select(
            "session",
            "format",
            "channel",
            "direction",
            F.expr(f"time_ns div {_NS}").alias("second"),
            "frame_type",
            "length",
            "time_ns",
        )
        .groupBy("session", "format", "channel", "direction", "second")
        .agg(
            F.count(F.lit(1)).alias("frames"),
            _count(kind == "data").alias("data_frames"),
            F.sum(F.when(kind == "data", F.col("length")).otherwise(0)).alias("data_bytes"),
            F.min(t).alias("first_ns"),
            F.max(t).alias("last_ns"),
            _count(kind == "open").alias("opens"),
            _count(kind == "open_ack").alias("open_acks"),
            _count(kind == "end").alias("ends"),
            _count(kind == "close").alias("closes"),
            _count(kind == "reset").alias("resets"),
            F.min(F.when(kind == "open", t)).alias("first_open_ns"),
            F.min(F.when(kind == "reset", t)).alias("first_reset_ns"),
            F.min(F.when(kind.isin("end", "close"), t)).alias("first_end_ns"),
        )
    )
    names = (
        frames.where(F.col("channel_name").isNotNull())
        .groupBy("session", "channel")
        .agg(F.max("channel_name").alias("channel_name"))
    )
    detections = (
        frames.where(F.col("detection").isNotNull())
        .groupBy("session")
        .agg(F.max("detection").alias("detection"))
    )
    return counts.join(names, ["session", "channel"], "left").join(detections, ["session"], "left")


def event_rows(frames: DataFrame) -> DataFrame:
    """The rare rows: pings, pongs, violations, truncations, and the records where a
    sender's credit crosses zero (``stall`` = ``start``/``end``)."""
    from pyspark.sql import functions as F

    credit, before, kind = F.col("credit"), F.col("credit_before"), F.col("frame_type")
    starts = credit.isNotNull() & (credit <= 0) & (before.isNull() | (before > 0))
    ends = credit.isNotNull() & (credit > 0) & before.isNotNull() & (before <= 0)
    special = kind.isin("ping", "pong", "violation", "truncated")
    return frames.where(special | starts | ends).select(
        "session",
        "format",
        "direction",
        "channel",
        "channel_name",
        "frame_type",
        "time_ns",
        "seq",
        "offset",
        "credit_dir",
        "ping_id",
        "error",
        F.when(starts, F.lit("start")).when(ends, F.lit("end")).alias("stall"),
    )


def reports(frames: DataFrame) -> dict[str, DataFrame]:
    """All reports of a frames table (see :data:`REPORTS`), as DataFrames.

    Small intermediate tables are cached; they are returned too, under names starting
    with ``_`` (``unpersist`` them when done). The frames table itself is scanned twice.
    """
    from pyspark.sql import Window, functions as F

    fine = fine_table(frames).cache()
    events = event_rows(frames).cache()

    per_dir = (
        fine.groupBy("session", "format", "channel", "direction")
        .agg(
            F.sum("frames").alias("frames"),
            F.sum("data_frames").alias("data_frames"),
            F.sum("data_bytes").alias("data_bytes"),
            F.min("first_ns").alias("first_ns"),
            F.max("last_ns").alias("last_ns"),
            F.sum("opens").alias("opens"),
            F.sum("open_acks").alias("open_acks"),
            F.sum("ends").alias("ends"),
            F.sum("closes").alias("closes"),
            F.sum("resets").alias("resets"),
            F.min("first_open_ns").alias("first_open_ns"),
            F.min("first_reset_ns").alias("first_reset_ns"),
            F.min("first_end_ns").alias("first_end_ns"),
            F.max("channel_name").alias("channel_name"),
            F.max("detection").alias("detection"),
        )
        .cache()
    )
    traffic = per_dir.select(
        "session",
        "format",
        "channel",
        "channel_name",
        "direction",
        "frames",
        "data_frames",
        "data_bytes",
        "first_ns",
        "last_ns",
    )
    throughput = fine.where(F.col("data_frames") > 0).select(
        "session",
        "format",
        "channel",
        "channel_name",
        "direction",
        "second",
        F.col("data_bytes").alias("bytes"),
        F.col("data_frames").alias("frames"),
    )
    bounds = per_dir.groupBy("session").agg(
        F.min("first_ns").alias("session_start_ns"), F.max("last_ns").alias("session_end_ns")
    )

    has_data = F.col("data_frames") > 0
    per_channel = (
        per_dir.where(F.col("channel") != "")
        .groupBy("session", "format", "channel")
        .agg(
            F.sum("opens").alias("opens"),
            F.sum("open_acks").alias("open_acks"),
            F.sum("ends").alias("ends"),
            F.sum("closes").alias("closes"),
            F.sum("resets").alias("resets"),
            F.min("first_open_ns").alias("first_open_ns"),
            F.min_by("direction", F.col("first_open_ns")).alias("opened_by"),
            F.min("first_ns").alias("first_ns"),
            F.max("last_ns").alias("last_ns"),
            F.min("first_reset_ns").alias("first_reset_ns"),
            F.max("channel_name").alias("channel_name"),
            _count(has_data).alias("data_dirs"),
            _count(has_data & F.col("first_end_ns").isNotNull()).alias("ended_data_dirs"),
            F.sum(F.when(F.col("direction") == "c2s", F.col("data_bytes")).otherwise(0)).alias(
                "data_bytes_c2s"
            ),
            F.sum(F.when(F.col("direction") == "s2c", F.col("data_bytes")).otherwise(0)).alias(
                "data_bytes_s2c"
            ),
        )
        .join(bounds, "session")
    )
    ended = (
        F.when(F.col("first_reset_ns").isNotNull(), F.lit("reset"))
        .when(
            (F.col("closes") > 0) | ((F.col("ends") > 0) & (F.col("ended_data_dirs") == F.col("data_dirs"))),
            F.lit("closed"),
        )
        .otherwise(F.lit("end_of_capture"))
    )
    open_ns = F.coalesce(F.col("first_open_ns"), F.col("first_ns"))
    end_ns = (
        F.when(F.col("ended") == "reset", F.col("first_reset_ns"))
        .when(F.col("ended") == "closed", F.col("last_ns"))
        .otherwise(F.col("session_end_ns"))
    )
    lifetimes = (
        per_channel.withColumn("ended", ended)
        .withColumn("open_ns", open_ns)
        .withColumn("end_ns", end_ns)
        .select(
            "session",
            "format",
            "channel",
            "channel_name",
            "opened_by",
            "opens",
            "open_acks",
            "ends",
            "closes",
            "resets",
            "open_ns",
            "end_ns",
            ((F.col("end_ns") - F.col("open_ns")) / _NS).alias("lifetime_s"),
            "ended",
            "data_bytes_c2s",
            "data_bytes_s2c",
        )
    )

    # stalls: pair each start with the next transition of the same sender and channel
    transitions = events.where(F.col("stall").isNotNull())
    order = Window.partitionBy("session", "channel", "credit_dir").orderBy("seq")
    sender_end = per_dir.select(
        "session",
        "channel",
        F.col("direction").alias("credit_dir"),
        F.col("first_end_ns").alias("sender_end_ns"),
        F.col("first_reset_ns").alias("dir_reset_ns"),
    )
    channel_reset = sender_end.groupBy("session", "channel").agg(F.min("dir_reset_ns").alias("reset_ns"))
    start = F.col("time_ns")
    by_credit = F.when(F.col("next_stall") == "end", F.col("next_ns"))
    by_reset = F.when(F.col("reset_ns") >= start, F.col("reset_ns"))
    by_sender = F.when(F.col("sender_end_ns") >= start, F.col("sender_end_ns"))
    end = F.least(by_credit, by_reset, by_sender, F.col("session_end_ns"))
    ended_by = (
        F.when(end == by_credit, F.lit("credit"))
        .when(end == by_reset, F.lit("reset"))
        .when(end == by_sender, F.lit("sender_end"))
        .otherwise(F.lit("end_of_capture"))
    )
    stalls = (
        transitions.select(
            "session",
            "format",
            "channel",
            "channel_name",
            "credit_dir",
            "stall",
            "time_ns",
            F.lead("stall").over(order).alias("next_stall"),
            F.lead("time_ns").over(order).alias("next_ns"),
        )
        .where(F.col("stall") == "start")
        .join(bounds, "session")
        .join(
            sender_end.select("session", "channel", "credit_dir", "sender_end_ns"),
            ["session", "channel", "credit_dir"],
            "left",
        )
        .join(channel_reset, ["session", "channel"], "left")
        .select(
            "session",
            "format",
            "channel",
            "channel_name",
            F.col("credit_dir").alias("sender"),
            start.alias("start_ns"),
            end.alias("end_ns"),
            ended_by.alias("ended_by"),
        )
        # zero credit until the sender itself ended the channel: nothing was waiting
        .where(F.col("ended_by") != "sender_end")
        .withColumn("duration_s", (F.col("end_ns") - F.col("start_ns")) / _NS)
        .cache()
    )
    stall_totals = stalls.groupBy("session", "format", "channel", "sender").agg(
        F.max("channel_name").alias("channel_name"),
        F.count(F.lit(1)).alias("stalls"),
        F.sum("duration_s").alias("stalled_s"),
        F.max("duration_s").alias("longest_s"),
    )

    kind = F.col("frame_type")
    ping = events.where((kind == "ping") & F.col("ping_id").isNotNull()).alias("p")
    pong = events.where((kind == "pong") & F.col("ping_id").isNotNull()).alias("q")
    pings = (
        ping.join(
            pong,
            (F.col("p.session") == F.col("q.session"))
            & (F.col("p.ping_id") == F.col("q.ping_id"))
            & (F.col("p.direction") != F.col("q.direction"))
            & (F.col("q.seq") > F.col("p.seq")),
            "left",
        )
        .groupBy(
            F.col("p.session").alias("session"),
            F.col("p.format").alias("format"),
            F.col("p.direction").alias("direction"),
            F.col("p.ping_id").alias("ping_id"),
            F.col("p.time_ns").alias("sent_ns"),
        )
        .agg(F.min("q.time_ns").alias("answered_ns"))
        .withColumn("rtt_ms", (F.col("answered_ns") - F.col("sent_ns")) / 1e6)
    )

    violations = events.where(kind.isin("violation", "truncated")).select(
        "session", "format", "direction", "offset", kind.alias("kind"), "error", "time_ns"
    )

    data_dir = F.when(F.col("data_frames") > 0, F.col("direction"))
    sessions = (
        per_dir.groupBy("session", "format")
        .agg(
            F.max("detection").alias("detection"),
            F.min("first_ns").alias("start_ns"),
            F.max("last_ns").alias("end_ns"),
            F.sum("frames").alias("frames"),
            F.sum(F.when(data_dir == "c2s", F.col("data_bytes")).otherwise(0)).alias("data_bytes_c2s"),
            F.sum(F.when(data_dir == "s2c", F.col("data_bytes")).otherwise(0)).alias("data_bytes_s2c"),
            F.countDistinct(F.when(F.col("channel") != "", F.col("channel"))).alias("channels"),
            F.sum("resets").alias("resets"),
        )
        .join(
            violations.groupBy("session").agg(F.count(F.lit(1)).alias("violations")),
            "session",
            "left",
        )
        .select(
            "session",
            "format",
            "detection",
            "start_ns",
            "end_ns",
            ((F.col("end_ns") - F.col("start_ns")) / _NS).alias("duration_s"),
            "frames",
            "data_bytes_c2s",
            "data_bytes_s2c",
            "channels",
            "resets",
            F.coalesce(F.col("violations"), F.lit(0)).alias("violations"),
        )
    )
    return {
        "sessions": sessions,
        "traffic": traffic,
        "throughput": throughput,
        "stalls": stalls,
        "stall_totals": stall_totals,
        "lifetimes": lifetimes,
        "pings": pings,
        "violations": violations,
        "_fine": fine,
        "_events": events,
        "_per_dir": per_dir,
        "_stalls": stalls,
    }


SORT_KEYS: dict[str, list[str]] = {
    "sessions": ["session"],
    "traffic": ["session", "channel", "direction"],
    "throughput": ["session", "channel", "direction", "second"],
    "stalls": ["session", "channel", "sender", "start_ns"],
    "stall_totals": ["session", "channel", "sender"],
    "lifetimes": ["session", "channel"],
    "pings": ["session", "direction", "sent_ns", "ping_id"],
    "violations": ["session", "direction", "offset"],
}
"""The order each report is written in (deterministic, so runs compare equal)."""

"""The frame record and the raw capture chunk: what each format's frame-record walk
(:mod:`polymux.formats.walk`) produces, what :mod:`polymux.tracing` records and the
pipeline consumes (``docs/tracing.md``; :mod:`polymux.tracing.records` re-exports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, TypeAlias


if TYPE_CHECKING:
    import pyarrow as pa


__all__ = [
    "C2S",
    "DIRECTIONS",
    "FRAME_FIELDS",
    "FRAME_TYPES",
    "S2C",
    "Chunk",
    "FrameRecord",
    "frame_schema",
]

C2S = "c2s"
"""Bytes sent by the client (the side that opened the connection)."""

S2C = "s2c"
"""Bytes sent by the server (the side that accepted the connection)."""

DIRECTIONS = (C2S, S2C)
"""Both directions, client first."""

Chunk: TypeAlias = tuple[int, str, bytes]
"""One raw capture chunk: ``(time_ns, direction, data)``; ``direction`` is ``"c2s"`` or
``"s2c"``, ``time_ns`` nanoseconds since the Unix epoch."""

FRAME_FIELDS: list[tuple[str, str]] = [
    ("session", "str"),
    ("direction", "str"),
    ("time_ns", "int64"),
    ("format", "str"),
    ("offset", "int64"),
    ("channel", "str"),
    ("frame_type", "str"),
    ("length", "int64"),
    ("flags", "int64"),
    ("credit", "int64 | None"),
    ("credit_dir", "str"),
    ("ping_id", "int64 | None"),
    ("error", "str | None"),
    ("channel_name", "str | None"),
]
"""The frame record's fields ``(name, type)``, in order (the versioned contract)."""

FRAME_TYPES = (
    "handshake",
    "open",
    "open_ack",
    "data",
    "end",
    "close",
    "reset",
    "window_update",
    "window_request",
    "stop_reading",
    "ping",
    "pong",
    "heartbeat",
    "go_away",
    "cancel",
    "cancel_ack",
    "control",
    "unknown",
    "violation",
    "truncated",
)
"""Every ``frame_type`` the decoder produces (``docs/tracing.md`` says which formats use
which)."""


class FrameRecord(NamedTuple):
    """One decoded frame (or an event a frame carries), as the pipeline stores it.

    A frame that carries application data *and* opens or ends a channel (a yamux Data
    frame with SYN or FIN, a Streamux chunk that starts or terminates a message) gives
    several records with the same ``offset``: ``open`` before ``data`` before ``end``.
    """

    session: str
    """Session id (a recorded session's id, or a TCP flow's ``client-server`` addresses)."""
    direction: str
    """``"c2s"`` (sent by the client) or ``"s2c"``."""
    time_ns: int
    """Time of the chunk that completed the frame (ns since the Unix epoch)."""
    format: str
    """Wire format (one of :data:`polymux.PROTOCOLS`)."""
    offset: int
    """Byte offset of the frame's first byte in its direction's stream."""
    channel: str
    """Channel key, unique within the session: ``"7"`` where ids are session-wide, ``"c7"``
    / ``"s7"`` where each side numbers the channels it opens (``#2`` etc. is appended when
    an id is reused); ``""`` for session-level frames."""
    frame_type: str
    """What the frame is, lowercase (:data:`FRAME_TYPES`)."""
    length: int
    """Payload bytes; for ``data`` the application bytes; for ``window_update`` the
    credit granted (format's unit)."""
    flags: int
    """The frame's raw flag or type bits, per format (``docs/tracing.md``)."""
    credit: int | None
    """After this frame, the send credit left on this channel for ``credit_dir`` (bytes,
    or messages for omnistreams); ``None`` where the frame does not change credit or the
    format has no flow control."""
    credit_dir: str
    """The direction ``credit`` belongs to (``"c2s"``, ``"s2c"``, or ``""``)."""
    ping_id: int | None
    """The ping's opaque value or id, for ``ping``/``pong``."""
    error: str | None
    """The violation (``violation``, ``truncated``), or the error a frame carries (a reset
    or go-away with an error text or code)."""
    channel_name: str | None = None
    """The channel's name, on every record of the channel, where the format names channels
    (MultiplexingStream Offer, mplex/multiplex NewStream, omnistreams creation metadata
    ``name``); ``None`` for formats without names (yamux, Streamux), session-level records
    and channels whose opening frame is not in the capture."""


def frame_schema() -> pa.Schema:
    """The pyarrow schema of frame records (``*.pmframes.parquet`` files): the
    :data:`FRAME_FIELDS` in order, nullable exactly where the type says ``| None``."""
    import pyarrow as pa

    types = {"str": pa.string(), "int64": pa.int64()}
    return pa.schema(
        [
            pa.field(name, types[kind.split("|")[0].strip()], nullable="None" in kind)
            for name, kind in FRAME_FIELDS
        ]
    )

"""The frame record and the raw capture chunk: the shapes :mod:`polymux.tracing` produces
and the pipeline consumes (see ``docs/tracing.md``). They are defined with the formats'
frame-record walks, in :mod:`polymux.formats.records`, and re-exported here."""

from __future__ import annotations

from polymux.formats.records import (
    C2S,
    DIRECTIONS,
    FRAME_FIELDS,
    FRAME_TYPES,
    S2C,
    Chunk,
    FrameRecord,
    frame_schema,
)


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

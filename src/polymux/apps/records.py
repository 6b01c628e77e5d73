"""Records on a channel: each is a msgpack map, preceded by its length as 4 bytes
big-endian. The prefix lets raw bytes follow a record on the same channel (the file
transfer streams file data after its offer) and bounds what a peer can make us buffer."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack


__all__ = [
    "MAX_RECORD",
    "RecordError",
    "decode_record",
    "encode_record",
    "field",
    "read_record",
    "write_record",
]

MAX_RECORD = 64 * 1024
"""Largest record (msgpack bytes) accepted by default."""

_LENGTH = struct.Struct(">I")


class RecordError(ValueError):
    """A record was malformed: a bad length, bad msgpack, not a map, or a missing field."""


def encode_record(record: dict[str, Any]) -> bytes:
    """The length-prefixed msgpack encoding of ``record``."""
    body: bytes = msgpack.packb(record, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


def write_record(writer: asyncio.StreamWriter, record: dict[str, Any]) -> None:
    """Queue ``record`` on ``writer`` (call ``await writer.drain()`` after)."""
    writer.write(encode_record(record))


async def read_record(reader: asyncio.StreamReader, *, limit: int = MAX_RECORD) -> dict[str, Any] | None:
    """Read one record; ``None`` at a clean end of the channel before a record starts.

    Raises :class:`RecordError` for a record longer than ``limit``, one cut short, or one
    that is not a msgpack map with string keys.
    """
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise RecordError(f"record: the channel ended inside a length prefix ({len(exc.partial)} of 4 bytes)")
    (length,) = _LENGTH.unpack(head)
    if length > limit:
        raise RecordError(f"record: length {length} exceeds the limit of {limit} bytes")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise RecordError(f"record: the channel ended after {len(exc.partial)} of {length} bytes")
    return decode_record(body)


def decode_record(body: bytes) -> dict[str, Any]:
    """Decode a record body (without its prefix); raises :class:`RecordError`."""
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise RecordError(f"record: not valid msgpack ({exc})") from None
    if not isinstance(value, dict):
        raise RecordError(f"record: expected a msgpack map, got {type(value).__name__}")
    kind = value.get("type")
    if not isinstance(kind, str):
        raise RecordError(f"record: field 'type' must be a string, got {kind!r}")
    return value


def field(record: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``record[name]``, checked to be of ``kind``; raises :class:`RecordError`."""
    value = record.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RecordError(f"record {record.get('type')!r}: field {name!r} must be {expected}, got {value!r}")
    return value

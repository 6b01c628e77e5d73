"""Unsigned LEB128 varints (protobuf's), bounded in length."""

from __future__ import annotations

from polymux.wire._buffer import INCOMPLETE as _INCOMPLETE, Incomplete


__all__ = ["Incomplete", "encode_uvarint", "read_uvarint", "uvarint_size"]


def encode_uvarint(n: int) -> bytes:
    """Encode a non-negative integer as an unsigned varint."""
    if n < 0:
        raise ValueError(f"uvarint must be non-negative, got {n}")
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def uvarint_size(n: int) -> int:
    """Bytes :func:`encode_uvarint` takes for ``n``."""
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def read_uvarint(buf: bytes | memoryview, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    """Read a varint at ``pos``; return ``(value, new pos)``.

    Raises :class:`Incomplete` when the buffer ends first, and ``ValueError`` when the
    varint is longer than ``max_bytes`` bytes (the caller names the format and field).
    """
    value = 0
    shift = 0
    i = pos
    limit = pos + max_bytes
    while True:
        if i >= end:
            if end >= limit:
                raise ValueError(f"varint longer than {max_bytes} bytes")
            raise _INCOMPLETE
        if i >= limit:
            raise ValueError(f"varint longer than {max_bytes} bytes")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7

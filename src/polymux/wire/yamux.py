"""yamux frames (hashicorp/yamux ``spec.md``).

Every frame starts with a 12-byte big-endian header: version (0), type, flags, stream id,
length. Data frames carry ``length`` body bytes; for the other types ``length`` is a value:
a window delta (WindowUpdate), an opaque ping value (Ping) or an error code (GoAway).

Sans-I/O: :func:`encode_header` and :class:`Decoder` (zero-copy bodies). Malformed input
(version other than 0, unknown type, a data frame longer than ``max_data``) raises
:class:`ProtocolError` naming the field and the value.
"""

from __future__ import annotations

import struct
from enum import IntEnum, IntFlag
from typing import NamedTuple

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError
from polymux.wire._buffer import INCOMPLETE, FrameBuffer


__all__ = [
    "HEADER",
    "INITIAL_WINDOW",
    "MAX_WINDOW",
    "Decoder",
    "Flag",
    "Frame",
    "GoAwayCode",
    "Type",
    "encode_frame",
    "encode_header",
]

HEADER = struct.Struct(">BBHII")
"""The 12-byte header: version, type, flags, stream id, length."""

INITIAL_WINDOW = 256 * 1024
"""Every stream starts with this receive window in both directions."""

MAX_WINDOW = 2**32 - 1
"""A window is a u32 in every implementation: an update beyond it is a protocol error."""

_VERSION = 0


class Type(IntEnum):
    """Frame types."""

    DATA = 0
    WINDOW_UPDATE = 1
    PING = 2
    GO_AWAY = 3


class Flag(IntFlag):
    """Frame flags (may ride on Data and WindowUpdate; SYN/ACK on Ping)."""

    SYN = 1
    ACK = 2
    FIN = 4
    RST = 8


class GoAwayCode(IntEnum):
    """GoAway reasons."""

    NORMAL = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


class Frame(NamedTuple):
    """One frame; ``body`` is only non-empty for Data frames."""

    type: int
    flags: int
    stream_id: int
    length: int
    body: BytesLike = b""


def encode_header(type: int, flags: int, stream_id: int, length: int) -> bytes:
    """The 12-byte header."""
    return HEADER.pack(_VERSION, type, flags, stream_id, length)


def encode_frame(frame: Frame) -> bytes:
    """Encode one frame (Data frames: ``length`` must equal ``len(body)``)."""
    if frame.type == Type.DATA and frame.length != len(frame.body):
        raise ValueError(f"yamux Data frame length {frame.length} != body length {len(frame.body)}")
    return encode_header(frame.type, frame.flags, frame.stream_id, frame.length) + bytes(frame.body)


class Decoder:
    """Incremental decoder for one direction of a yamux connection.

    At most one incomplete frame (12 + ``max_data`` bytes) is buffered.
    """

    def __init__(self, max_data: int, fmt: str = "yamux") -> None:
        self.max_data = max_data
        self.format = fmt
        self._buffer = FrameBuffer(HEADER.size)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return self._buffer.pending

    def partial_stream(self) -> int | None:
        """The stream id of the incomplete frame held back, once its header is in."""
        head = self._buffer.head(HEADER.size)
        return None if head is None else int(HEADER.unpack(head)[3])

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Decode every complete frame."""
        if not isinstance(data, bytes):
            data = bytes(data)
        buffer = self._buffer
        whole, pos = buffer.resume(data, self._frame_size) if buffer.held else (None, 0)
        out = [] if whole is None else [self._frame(memoryview(whole), 0, len(whole))]
        mv = memoryview(data)
        end = len(data)
        unpack = HEADER.unpack_from
        max_data = self.max_data
        need = 0  # the size of the frame the loop stops inside, when known
        while end - pos >= 12:
            version, type_, flags, stream_id, length = unpack(data, pos)
            if type_ == 0 and version == 0 and length <= max_data:
                stop = pos + 12 + length
                if stop > end:
                    need = 12 + length
                    break
                out.append(Frame(0, flags, stream_id, length, mv[pos + 12 : stop]))
                pos = stop
                continue
            total = 12 + self._data_length(data, pos)
            if pos + total > end:  # pragma: no cover - only DATA has a body, and it took the fast path
                need = total
                break
            out.append(self._frame(mv, pos, pos + total))
            pos += total
        if pos < end:
            buffer.hold(mv[pos:], need)
        return out

    def _frame_size(self, head: bytes) -> int:
        if len(head) < 12:
            raise INCOMPLETE
        return 12 + self._data_length(head, 0)

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """Where the first ``most`` frames of ``data`` from ``start`` end, from their headers
        (``FrameBuffer.walk``); ``start`` where it cannot tell."""
        return self._buffer.walk(data, start, most, self._frame_size)

    def _data_length(self, buf: bytes, pos: int) -> int:
        """Validate the header at ``pos``; return how many body bytes follow it."""
        version, type_, _flags, stream_id, length = HEADER.unpack_from(buf, pos)
        if version != _VERSION:
            raise ProtocolError(self.format, f"frame header version is {version}, expected 0")
        if type_ > Type.GO_AWAY:
            raise ProtocolError(self.format, f"frame header has unknown type {type_} (stream {stream_id})")
        if type_ != Type.DATA:
            return 0
        if length > self.max_data:
            raise ProtocolError(
                self.format,
                f"data frame of {length} bytes on stream {stream_id} exceeds the {self.max_data}-byte limit",
            )
        return int(length)

    def _frame(self, buf: memoryview, pos: int, stop: int) -> Frame:
        _version, type_, flags, stream_id, length = HEADER.unpack_from(buf, pos)
        body = buf[pos + 12 : stop] if type_ == Type.DATA else b""
        return Frame(type_, flags, stream_id, length, body)

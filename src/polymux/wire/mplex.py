"""mplex (libp2p) / multiplex (maxogden) frames.

Every frame is ``uvarint header, uvarint length, body``; ``header = stream id << 3 | flag``
(the spec's ``id = flag >> 3`` is an erratum). Flags name who sends: a stream's opener is
its *initiator*; the other side is its *receiver*. Both sides count ids on their own, so a
stream is named by its id *and* whose it is, which the flag's side tells.

Sans-I/O: :func:`encode_header` builds what precedes a body; :class:`Decoder` turns a byte
stream into :class:`Frame` objects with zero-copy bodies. Limits: header varints of at most
9 bytes (ids below 2**60, as the libp2p spec says), and a configurable maximum body size
(1 MiB in the references).
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError
from polymux.wire._buffer import FrameBuffer, Incomplete
from polymux.wire._varint import encode_uvarint, read_uvarint


__all__ = [
    "MAX_HEADER_VARINT",
    "MAX_MESSAGE_SIZE",
    "Decoder",
    "Flag",
    "Frame",
    "encode_frame",
    "encode_header",
]

MAX_MESSAGE_SIZE = 1024 * 1024
"""Default largest body (go-mplex, js-libp2p-mplex: 1 MiB)."""

MAX_HEADER_VARINT = 9
"""Longest header varint (libp2p spec: ids up to 2**60 - 1)."""

_MAX_LENGTH_VARINT = 9


class Flag(IntEnum):
    """Frame flags (low three bits of the header)."""

    NEW_STREAM = 0
    MESSAGE_RECEIVER = 1
    MESSAGE_INITIATOR = 2
    CLOSE_RECEIVER = 3
    CLOSE_INITIATOR = 4
    RESET_RECEIVER = 5
    RESET_INITIATOR = 6


class Frame(NamedTuple):
    """One frame: stream id, flag and body (a view of the received bytes when decoded)."""

    stream_id: int
    flag: int
    body: BytesLike = b""


def encode_header(stream_id: int, flag: int, length: int) -> bytes:
    """Everything of a frame before its body."""
    if not 0 <= flag <= 6:
        raise ValueError(f"mplex flag must be 0..6, got {flag}")
    if not 0 <= stream_id < 1 << 60:
        raise ValueError(f"mplex stream id must be in 0..2**60-1, got {stream_id}")
    return encode_uvarint(stream_id << 3 | flag) + encode_uvarint(length)


def encode_frame(frame: Frame) -> bytes:
    """Encode one frame."""
    return encode_header(frame.stream_id, frame.flag, len(frame.body)) + bytes(frame.body)


class Decoder:
    """Incremental decoder for one direction of an mplex connection.

    ``feed(data)`` returns the complete frames in ``data`` (plus earlier leftovers).
    Bodies lying wholly inside one fed ``bytes`` chunk are views of it. Malformed input
    raises :class:`ProtocolError` naming the format, the field and the value; at most one
    incomplete frame (header + ``max_message_size``) is buffered.
    """

    def __init__(self, max_message_size: int = MAX_MESSAGE_SIZE, fmt: str = "mplex") -> None:
        self.max_message_size = max_message_size
        self.format = fmt
        self._buffer = FrameBuffer(MAX_HEADER_VARINT + _MAX_LENGTH_VARINT)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return self._buffer.pending

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Decode every complete frame."""
        if not isinstance(data, bytes):
            data = bytes(data)
        buffer = self._buffer
        whole, pos = buffer.resume(data, self._frame_size) if buffer.held else (None, 0)
        out = [] if whole is None else [self._whole_frame(whole)]
        mv = memoryview(data)
        end = len(data)
        header = self._header
        append = out.append
        limit = self.max_message_size
        need = 0  # the size of the frame the loop stops inside, when known
        while pos < end:
            # Fast path: one-byte header and a length of one or two bytes (ids < 16,
            # bodies < 16 KiB) covers nearly every frame of a bulk transfer.
            h = data[pos]
            if h < 0x80 and end - pos >= 3 and (h & 7) != 7:
                b1 = data[pos + 1]
                if b1 < 0x80 and b1 <= limit:
                    stop = pos + 2 + b1
                    if stop > end:
                        need = stop - pos
                        break
                    append(Frame(h >> 3, h & 7, mv[pos + 2 : stop]))
                    pos = stop
                    continue
                b2 = data[pos + 2]
                if b1 >= 0x80 and b2 < 0x80:
                    length = (b1 & 0x7F) | b2 << 7
                    if length <= limit:
                        stop = pos + 3 + length
                        if stop > end:
                            need = stop - pos
                            break
                        append(Frame(h >> 3, h & 7, mv[pos + 3 : stop]))
                        pos = stop
                        continue
                elif b1 >= 0x80 and end - pos >= 4 and data[pos + 3] < 0x80:
                    # three-byte length: bodies of 16 KiB up to 2 MiB (64 KiB writes)
                    length = (b1 & 0x7F) | (b2 & 0x7F) << 7 | data[pos + 3] << 14
                    if length <= limit:
                        stop = pos + 4 + length
                        if stop > end:
                            need = stop - pos
                            break
                        append(Frame(h >> 3, h & 7, mv[pos + 4 : stop]))
                        pos = stop
                        continue
            try:
                header_len, body_len, stream_id, flag = header(data, pos, end)
            except Incomplete as incomplete:
                incomplete.__traceback__ = None  # a shared instance: see wire._buffer
                break
            stop = pos + header_len + body_len
            if stop > end:
                need = stop - pos
                break
            append(Frame(stream_id, flag, mv[pos + header_len : stop]))
            pos = stop
        if pos < end:
            buffer.hold(mv[pos:], need)
        return out

    def _frame_size(self, head: bytes) -> int:
        header_len, body_len, _stream_id, _flag = self._header(head, 0, len(head))
        return header_len + body_len

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """Where the first ``most`` frames of ``data`` from ``start`` end, from their headers
        (``FrameBuffer.walk``); ``start`` where it cannot tell."""
        return self._buffer.walk(data, start, most, self._frame_size)

    def _whole_frame(self, frame: bytes) -> Frame:
        header_len, _body_len, stream_id, flag = self._header(frame, 0, len(frame))
        return Frame(stream_id, flag, memoryview(frame)[header_len:])

    def _header(self, buf: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
        """Return ``(header length, body length, stream id, flag)``."""
        fmt = self.format
        try:
            head, at = read_uvarint(buf, pos, end, MAX_HEADER_VARINT)
        except ValueError:
            raise ProtocolError(
                fmt, f"frame header varint is longer than {MAX_HEADER_VARINT} bytes"
            ) from None
        flag = head & 7
        if flag == 7:
            raise ProtocolError(fmt, f"frame header has unknown flag 7 (stream id {head >> 3})")
        try:
            length, at = read_uvarint(buf, at, end, _MAX_LENGTH_VARINT)
        except ValueError:
            raise ProtocolError(
                fmt, f"frame length varint is longer than {_MAX_LENGTH_VARINT} bytes"
            ) from None
        if length > self.max_message_size:
            raise ProtocolError(
                fmt,
                f"frame length {length} of stream {head >> 3} exceeds the maximum message size "
                f"{self.max_message_size}",
            )
        return at - pos, length, head >> 3, flag

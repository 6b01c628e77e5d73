"""smux frames (xtaci/smux ``frame.go``, ``session.go``; PROTOCOL-NOTES A6).

Every frame starts with an 8-byte header: version u8 (1 or 2, the same on both ends: it
is configured, not negotiated), cmd u8, length u16 **little-endian**, stream id u32
**little-endian**. Commands: SYN 0 (open), FIN 1 (end of writing), PSH 2 (data: ``length``
payload bytes), NOP 3 (keepalive), UPD 4 (protocol version 2 only: an 8-byte body,
consumed u32 LE then window u32 LE). SYN, FIN and NOP carry no body.

Sans-I/O: :func:`encode_header`, :func:`frame_parts` (header and payload view, no copy) and
:class:`Decoder` (zero-copy bodies). Malformed input (another version, an unknown command,
UPD in version 1, a body on SYN/FIN/NOP, a UPD body that is not 8 bytes) raises
:class:`ProtocolError` naming the field and the value. A frame is at most 8 + 65,535 bytes,
so the decoder holds at most that much of an incomplete one.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError
from polymux.wire._buffer import INCOMPLETE, FrameBuffer


__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "INITIAL_PEER_WINDOW",
    "MAX_PAYLOAD",
    "UPD_BODY",
    "VERSIONS",
    "Cmd",
    "Decoder",
    "Frame",
    "decode_upd",
    "encode_frame",
    "encode_header",
    "encode_upd",
    "frame_parts",
]

HEADER = struct.Struct("<BBHI")
"""The 8-byte header: version, cmd, length, stream id (little-endian)."""

HEADER_SIZE = HEADER.size

UPD_BODY = struct.Struct("<II")
"""The body of a UPD frame: bytes consumed (cumulative, modulo 2**32), window."""

MAX_PAYLOAD = 0xFFFF
"""The largest body a frame can carry (``length`` is a u16)."""

INITIAL_PEER_WINDOW = 262_144
"""Version 2: what a sender may have in flight on a stream before the receiver's first UPD
(xtaci's ``initialPeerWindow``)."""

VERSIONS = (1, 2)
"""Protocol versions: 2 adds per-stream flow control (UPD)."""


class Cmd(IntEnum):
    """Frame commands."""

    SYN = 0
    FIN = 1
    PSH = 2
    NOP = 3
    UPD = 4


_PSH = Cmd.PSH
_UPD = Cmd.UPD


class Frame(NamedTuple):
    """One frame. ``body`` is the payload of a PSH frame (a view into the decoded bytes) and
    the 8 bytes of a UPD frame (:func:`decode_upd`); empty for the others."""

    cmd: int
    stream_id: int
    body: BytesLike = b""


def encode_header(version: int, cmd: int, stream_id: int, length: int = 0) -> bytes:
    """The 8-byte header."""
    return HEADER.pack(version, cmd, length, stream_id)


def encode_upd(version: int, stream_id: int, consumed: int, window: int) -> bytes:
    """A whole UPD frame: ``consumed`` is taken modulo 2**32, as xtaci counts it."""
    if version < 2:
        raise ValueError(f"smux UPD exists only in protocol version 2, not {version}")
    return HEADER.pack(version, _UPD, UPD_BODY.size, stream_id) + UPD_BODY.pack(consumed & 0xFFFFFFFF, window)


def decode_upd(body: BytesLike) -> tuple[int, int]:
    """``(consumed, window)`` of a UPD frame's body."""
    consumed, window = UPD_BODY.unpack_from(body)
    return int(consumed), int(window)


def frame_parts(version: int, frame: Frame) -> tuple[bytes, BytesLike]:
    """The header and the body of ``frame`` (the body as given: no copy)."""
    cmd, stream_id, body = frame
    n = len(body)
    if not 0 <= cmd <= _UPD:
        raise ValueError(f"smux has no command {cmd}")
    if n > MAX_PAYLOAD:
        raise ValueError(f"smux frame body of {n} bytes exceeds {MAX_PAYLOAD}")
    if cmd == _UPD:
        if version < 2 or n != UPD_BODY.size:
            raise ValueError(
                f"smux UPD needs protocol version 2 and an 8-byte body (version {version}, {n} bytes)"
            )
    elif cmd != _PSH and n:
        raise ValueError(f"smux {Cmd(cmd).name} frame carries no body (got {n} bytes)")
    return HEADER.pack(version, cmd, n, stream_id), body


def encode_frame(version: int, frame: Frame) -> bytes:
    """``frame`` as one ``bytes`` (a copy: :func:`frame_parts` avoids it)."""
    header, body = frame_parts(version, frame)
    return header + bytes(body)


class Decoder:
    """Incremental decoder for one direction of an smux connection of ``version``.

    At most one incomplete frame (8 + 65,535 bytes) is held back.
    """

    def __init__(self, version: int, fmt: str = "smux") -> None:
        if version not in VERSIONS:
            raise ValueError(f"smux protocol version must be 1 or 2, got {version!r}")
        self.version = version
        self.format = fmt
        self._buffer = FrameBuffer(HEADER_SIZE)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return self._buffer.pending

    def partial_stream(self) -> int | None:
        """The stream id of the incomplete frame held back, once its header is in."""
        head = self._buffer.head(HEADER_SIZE)
        return None if head is None else int(HEADER.unpack(head)[3])

    def feed(self, data: BytesLike) -> list[Frame]:
        """Decode every complete frame in the bytes received so far."""
        if not isinstance(data, bytes):
            data = bytes(data)
        buffer = self._buffer
        whole, pos = buffer.resume(data, self._frame_size) if buffer.held else (None, 0)
        out = [] if whole is None else [self._frame(memoryview(whole), 0)]
        end = len(data)
        mv = memoryview(data)
        unpack = HEADER.unpack_from
        version = self.version
        need = 0  # the size of the frame the loop stops inside, when known
        while end - pos >= HEADER_SIZE:
            ver, cmd, length, stream_id = unpack(data, pos)
            if cmd == _PSH and ver == version:  # the fast path: data
                stop = pos + HEADER_SIZE + length
                if stop > end:
                    need = stop - pos
                    break
                out.append(Frame(_PSH, stream_id, mv[pos + HEADER_SIZE : stop]))
                pos = stop
                continue
            size = HEADER_SIZE + self._body_length(data, pos)
            if pos + size > end:
                need = size
                break
            out.append(self._frame(mv, pos))
            pos += size
        if pos < end:
            buffer.hold(mv[pos:], need)
        return out

    def _frame_size(self, head: bytes) -> int:
        if len(head) < HEADER_SIZE:
            raise INCOMPLETE
        return HEADER_SIZE + self._body_length(head, 0)

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """Where the first ``most`` frames of ``data`` from ``start`` end, from their headers
        (``FrameBuffer.walk``); ``start`` where it cannot tell."""
        return self._buffer.walk(data, start, most, self._frame_size)

    def _body_length(self, buf: BytesLike, pos: int) -> int:
        """Validate the header at ``pos``; return how many body bytes follow it."""
        version, cmd, length, stream_id = HEADER.unpack_from(buf, pos)
        if version != self.version:
            raise ProtocolError(
                self.format,
                f"frame header version is {version}, expected {self.version} "
                "(both ends must be configured with the same smux protocol version)",
            )
        if cmd > _UPD:
            raise ProtocolError(self.format, f"frame header has unknown cmd {cmd} (stream {stream_id})")
        if cmd == _PSH:
            return int(length)
        if cmd == _UPD:
            if version < 2:
                raise ProtocolError(
                    self.format, f"UPD (cmd 4) on stream {stream_id} in protocol version {version}"
                )
            if length != UPD_BODY.size:
                raise ProtocolError(
                    self.format, f"UPD frame length is {length} on stream {stream_id}, must be 8"
                )
            return UPD_BODY.size
        if length:
            raise ProtocolError(
                self.format, f"{Cmd(cmd).name} frame length is {length} on stream {stream_id}, must be 0"
            )
        return 0

    @staticmethod
    def _frame(buf: memoryview, pos: int) -> Frame:
        _version, cmd, length, stream_id = HEADER.unpack_from(buf, pos)
        if cmd == _PSH or cmd == _UPD:
            return Frame(cmd, stream_id, buf[pos + HEADER_SIZE : pos + HEADER_SIZE + length])
        return Frame(cmd, stream_id)

"""Nerdbank.Streams MultiplexingStream frames, protocol versions 1, 2 and 3.

Sans-I/O: :func:`encode_frame` / :func:`encode_header` turn frames into bytes and
:class:`Decoder` turns a byte stream back into :class:`Handshake` and :class:`Frame`
objects. Nothing here keeps state beyond the decoder's partial-frame buffer.

Wire facts (from the reference implementation, ``MultiplexingStream.Formatters.cs``):

* v1: a 20-byte handshake (magic ``2F DF 1D 50`` + 16 random bytes), then frames
  with a 7-byte big-endian header: code (u8), channel id (i32), payload length (u16).
* v2: handshake msgpack ``[[2, 0], bin(16 random bytes)]``; each frame is one msgpack
  array ``[code]``, ``[code, id]`` or ``[code, id, bin(payload)]``.
* v3: no handshake; frames ``[code]``, ``[code, id, source]`` or
  ``[code, id, source, bin(payload)]``; ``source`` is from the sender's perspective
  (local 1, remote -1, seeded 0).
* Payloads are at most 20,480 bytes; the v1 reader allocates exactly that much.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple, cast

import msgpack

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError
from polymux.wire._buffer import INCOMPLETE as _INCOMPLETE, FrameBuffer, Incomplete


__all__ = [
    "MAX_PAYLOAD",
    "V1_MAGIC",
    "ChannelSource",
    "ControlCode",
    "Decoder",
    "Frame",
    "Handshake",
    "content_prefix",
    "decode_content_processed",
    "decode_offer",
    "decode_offer_accepted",
    "decode_termination",
    "decode_window_adjust",
    "encode_content_processed",
    "encode_frame",
    "encode_handshake",
    "encode_header",
    "encode_offer",
    "encode_offer_accepted",
    "encode_termination",
    "encode_window_adjust",
    "format_name",
]

MAX_PAYLOAD = 20 * 1024
"""Largest payload a frame may carry (the reference's ``FramePayloadMaxLength``)."""

V1_MAGIC = bytes.fromhex("2fdf1d50")
"""First four bytes of the v1 handshake."""

_V1_HEADER = struct.Struct(">BiH")
_V1_HANDSHAKE_LEN = 20
_RANDOM_LEN = 16


class ControlCode(IntEnum):
    """Frame control codes (``MultiplexingStream.ControlCode.cs``)."""

    OFFER = 0
    OFFER_ACCEPTED = 1
    CONTENT = 2
    CONTENT_WRITING_COMPLETED = 3
    CHANNEL_TERMINATED = 4
    CONTENT_PROCESSED = 5
    CONTENT_READING_COMPLETED = 6
    CHANNEL_WINDOW_ADJUST = 7
    CHANNEL_WINDOW_GROWTH_REQUEST = 8


class ChannelSource(IntEnum):
    """v3 channel source, written from the sender's perspective."""

    LOCAL = 1
    REMOTE = -1
    SEEDED = 0


def format_name(version: int) -> str:
    """Return the polymux protocol name of a MultiplexingStream version."""
    return f"mstream-v{version}"


@dataclass(frozen=True, slots=True)
class Handshake:
    """The v1/v2 handshake: protocol version and 16 random bytes (odd/even election)."""

    version: tuple[int, int]
    """``(major, minor)``; v1's handshake carries no version and decodes as ``(1, 0)``."""
    random: bytes
    """16 random bytes; the side whose bytes compare greater is the "odd" party."""


class Frame(NamedTuple):
    """One MultiplexingStream frame.

    A ``NamedTuple`` rather than a dataclass: decoding builds one per 20 KiB of data,
    and tuple construction is the cheapest immutable record Python has. ``code`` is an
    ``int`` rather than :class:`ControlCode` so that codes this module does not know
    survive decoding (the reference ignores them).
    """

    code: int
    """Control code."""
    channel_id: int | None = None
    """Channel id, ``None`` for frames without one."""
    payload: BytesLike = b""
    """Payload; decoded frames hold a view into the received bytes (no copy)."""
    source: int | None = None
    """v3 only: channel source from the sender's perspective (see :class:`ChannelSource`)."""


# -- encoding ------------------------------------------------------------------------------


def _packb(obj: object) -> bytes:
    return cast(bytes, msgpack.packb(obj, use_bin_type=True))


def _pack_uint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    if n <= 0xFF:
        return b"\xcc" + bytes((n,))
    if n <= 0xFFFF:
        return b"\xcd" + n.to_bytes(2, "big")
    if n <= 0xFFFF_FFFF:
        return b"\xce" + n.to_bytes(4, "big")
    return b"\xcf" + n.to_bytes(8, "big")


def _pack_bin_header(n: int) -> bytes:
    # n <= MAX_PAYLOAD (20 KiB, checked by encode_header): bin8 or bin16
    if n <= 0xFF:
        return b"\xc4" + bytes((n,))
    return b"\xc5" + n.to_bytes(2, "big")


_SOURCE_BYTES = {1: b"\x01", 0: b"\x00", -1: b"\xff"}


def encode_handshake(version: int, random: bytes) -> bytes:
    """Encode the handshake a v1 or v2 party sends first (v3 has none)."""
    if len(random) != _RANDOM_LEN:
        raise ValueError(f"handshake random must be {_RANDOM_LEN} bytes, got {len(random)}")
    if version == 1:
        return V1_MAGIC + random
    if version == 2:
        return _packb([[2, 0], random])
    raise ValueError(f"mstream-v{version} has no handshake")


def content_prefix(version: int, channel_id: int, source: int) -> bytes:
    """What precedes the payload's length in a Content frame with a payload (v2/v3): a
    sender encodes it once per channel, then appends the length (bin8 or bin16) per frame;
    ``content_prefix(...) + length + payload`` equals :func:`encode_frame`'s."""
    if version == 2:
        return b"\x93" + _pack_uint(ControlCode.CONTENT) + _pack_uint(channel_id)
    return b"\x94" + _pack_uint(ControlCode.CONTENT) + _pack_uint(channel_id) + _SOURCE_BYTES[source]


def encode_header(
    version: int, code: int, channel_id: int | None, payload_len: int, source: int | None = None
) -> bytes:
    """Encode everything of a frame that precedes its payload.

    Sending ``encode_header(...)`` followed by the payload bytes equals
    :func:`encode_frame`, without copying the payload.
    """
    if payload_len > MAX_PAYLOAD:
        raise ValueError(f"payload of {payload_len} bytes exceeds the {MAX_PAYLOAD}-byte maximum")
    if version == 1:
        return _V1_HEADER.pack(code, channel_id or 0, payload_len)
    if channel_id is None:
        if payload_len:
            raise ValueError("a frame with a payload needs a channel id")
        return b"\x91" + _pack_uint(code)
    if version == 2:
        if payload_len:
            return b"\x93" + _pack_uint(code) + _pack_uint(channel_id) + _pack_bin_header(payload_len)
        return b"\x92" + _pack_uint(code) + _pack_uint(channel_id)
    if source not in _SOURCE_BYTES:
        raise ValueError(f"mstream-v3 frames need a channel source of -1, 0 or 1, got {source!r}")
    head = _pack_uint(code) + _pack_uint(channel_id) + _SOURCE_BYTES[source]
    if payload_len:
        return b"\x94" + head + _pack_bin_header(payload_len)
    return b"\x93" + head


def encode_frame(version: int, frame: Frame) -> bytes:
    """Encode one frame."""
    payload = frame.payload
    return encode_header(version, frame.code, frame.channel_id, len(payload), frame.source) + bytes(payload)


# -- payloads ------------------------------------------------------------------------------


def _unpack_payload(version: int, what: str, payload: BytesLike) -> list[Any]:
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(format_name(version), f"{what} payload is not valid msgpack ({exc})") from None
    if not isinstance(value, list):
        raise ProtocolError(
            format_name(version), f"{what} payload must be a msgpack array, got {type(value).__name__}"
        )
    return value


def _int_field(version: int, what: str, field: str, value: Any, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProtocolError(format_name(version), f"{what} field {field} is invalid: {value!r}")
    return value


def encode_offer(version: int, name: str, window: int | None) -> bytes:
    """Offer payload: v1 the UTF-8 name; v2/v3 msgpack ``[name]`` or ``[name, window]``."""
    if version == 1:
        return name.encode()
    return _packb([name] if window is None else [name, window])


def decode_offer(version: int, payload: BytesLike) -> tuple[str, int | None]:
    """Return ``(name, receiving window or None)`` from an Offer payload."""
    if version == 1:
        try:
            return bytes(payload).decode(), None
        except UnicodeDecodeError as exc:
            raise ProtocolError(format_name(version), f"Offer name is not UTF-8 ({exc})") from None
    if not payload:
        return "", None
    value = _unpack_payload(version, "Offer", payload)
    if not value or not isinstance(value[0], str):
        raise ProtocolError(format_name(version), f"Offer field name is invalid: {value[:1]!r}")
    window = _int_field(version, "Offer", "receivingWindow", value[1]) if len(value) > 1 else None
    return value[0], window


def encode_offer_accepted(version: int, window: int | None) -> bytes:
    """OfferAccepted payload: empty for v1, msgpack ``[window]`` for v2/v3."""
    if version == 1 or window is None:
        return b""
    return _packb([window])


def decode_offer_accepted(version: int, payload: BytesLike) -> int | None:
    """Return the acceptor's receiving window, or ``None`` when it gave none."""
    if version == 1 or not payload:
        return None
    value = _unpack_payload(version, "OfferAccepted", payload)
    if not value:
        return None
    return _int_field(version, "OfferAccepted", "receivingWindow", value[0])


def encode_content_processed(n: int) -> bytes:
    """ContentProcessed payload: msgpack ``[bytes processed]`` (a delta)."""
    return _packb([n])


def decode_content_processed(version: int, payload: BytesLike) -> int:
    """Return the number of bytes the peer processed (a delta)."""
    value = _unpack_payload(version, "ContentProcessed", payload)
    if not value:
        raise ProtocolError(format_name(version), "ContentProcessed payload is an empty array")
    return _int_field(version, "ContentProcessed", "bytesProcessed", value[0])


def encode_window_adjust(window: int) -> bytes:
    """ChannelWindowAdjust payload: msgpack ``[new absolute window]``."""
    return _packb([window])


def decode_window_adjust(version: int, payload: BytesLike) -> int:
    """Return the new absolute window from a ChannelWindowAdjust payload."""
    value = _unpack_payload(version, "ChannelWindowAdjust", payload)
    if not value:
        raise ProtocolError(format_name(version), "ChannelWindowAdjust payload is an empty array")
    return _int_field(version, "ChannelWindowAdjust", "window", value[0])


def encode_termination(version: int, message: str | None) -> bytes:
    """ChannelTerminated payload: the error text in msgpack ``[text]`` (v2+ only)."""
    if version == 1 or not message:
        return b""
    return _packb([message])


def decode_termination(version: int, payload: BytesLike) -> str | None:
    """Return the error text of a ChannelTerminated frame, or ``None``."""
    if version == 1 or not payload:
        return None
    value = _unpack_payload(version, "ChannelTerminated", payload)
    if not value:
        return None
    if not isinstance(value[0], str):
        raise ProtocolError(
            format_name(version), f"ChannelTerminated field error is not a string: {value[0]!r}"
        )
    return value[0]


# -- decoding ------------------------------------------------------------------------------


# Longest possible v2/v3 envelope header: array16 (3) + code, id, source (up to 9 each:
# any msgpack integer width is legal) + bin32 header (5).
_MAX_HEADER = 3 + 9 + 9 + 9 + 5


def _read_int(buf: memoryview, pos: int, end: int, fmt: str, field: str) -> tuple[int | None, int]:
    """Read a msgpack integer (or nil) at ``pos``; return ``(value, new pos)``."""
    if pos >= end:
        raise _INCOMPLETE
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    if b >= 0xE0:
        return b - 0x100, pos + 1
    if b == 0xC0:
        return None, pos + 1
    if 0xCC <= b <= 0xD3:
        size = 1 << ((b - 0xCC) & 3)
        if pos + 1 + size > end:
            raise _INCOMPLETE
        signed = b >= 0xD0
        return int.from_bytes(buf[pos + 1 : pos + 1 + size], "big", signed=signed), pos + 1 + size
    where = field if field.startswith("handshake") else f"frame field {field}"
    raise ProtocolError(fmt, f"{where} must be a msgpack integer, got type byte 0x{b:02x}")


_V2_COUNTS = (1, 2, 3)
_V3_COUNTS = (1, 3, 4)
_BIN_SIZES = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_FIXINT_SOURCE = {0x01: 1, 0x00: 0, 0xFF: -1}
_BAD = 99  # not a valid source: "take the general parser"


class Decoder:
    """Incremental decoder for one direction of a MultiplexingStream connection.

    ``feed(data)`` returns every complete :class:`Handshake` (first, for v1/v2 when
    ``handshake`` is true) and :class:`Frame` in ``data``. Payloads of frames that lie
    wholly inside one ``data`` chunk are zero-copy views of it, so hand the decoder
    immutable ``bytes``. Malformed input raises :class:`ProtocolError`; after that the
    decoder must not be used again. At most one frame (20 KiB + header) is buffered.
    """

    def __init__(self, version: int, *, handshake: bool = True) -> None:
        if version not in (1, 2, 3):
            raise ValueError(f"unknown MultiplexingStream version {version!r}")
        self.version = version
        self.format = format_name(version)
        self._need_handshake = handshake and version != 3
        self._buffer = FrameBuffer(_MAX_HEADER)
        # First byte of a frame with every element present (the fast path's shape).
        self._content_marker = 0x94 if version == 3 else 0x93

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame | Handshake]:
        """Decode as much of ``data`` (plus earlier leftovers) as forms complete frames."""
        if not isinstance(data, bytes):
            data = bytes(data)
        # The first item straddles feeds (or is the handshake): complete it, then parse the
        # rest in place. (A handshake is decided within its first 22 bytes: none piles up.)
        buffer = self._buffer
        whole, pos = (
            buffer.resume(data, self._frame_size) if buffer.held or self._need_handshake else (None, 0)
        )
        out: list[Frame | Handshake] = (
            [] if whole is None else [self._parse(memoryview(whole), 0, len(whole))]
        )
        mv = memoryview(data)
        end = len(data)
        header = self._header
        append = out.append
        marker = self._content_marker
        v3 = self.version == 3
        v1 = self.version == 1
        cid: int | None
        source: int | None
        # The hot loop: one header parse and one slice per frame, payloads are views.
        # Inlined here for the header every bulk frame of a real peer has (v2/v3: a full
        # fixarray of fixints with a bin16 payload); anything else goes through _header.
        unpack_v1 = _V1_HEADER.unpack_from
        need = 0  # the size of the frame the loop stops inside, when known
        while pos < end:
            if v1:
                if end - pos < 7:
                    break
                code, cid, length = unpack_v1(data, pos)
                stop = pos + 7 + length
                if length <= MAX_PAYLOAD and cid >= 0:
                    if stop > end:
                        need = stop - pos
                        break
                    append(Frame(code, cid, mv[pos + 7 : stop]))
                    pos = stop
                    continue
                # fall through: _header raises the precise error
            elif end - pos >= 8 and data[pos] == marker and data[pos + 1] < 0x80:
                # code a fixint; channel id a fixint, uint8 or uint16 (256+ channels)
                code = data[pos + 1]
                cid = data[pos + 2]
                at = pos + 3
                if cid >= 0x80:
                    if cid == 0xCC:
                        cid = data[at]
                        at += 1
                    elif cid == 0xCD and at + 2 <= end:
                        cid = (data[at] << 8) | data[at + 1]
                        at += 2
                    else:
                        cid = -1
                if v3 and at < end:
                    source = _FIXINT_SOURCE.get(data[at], _BAD)
                    at += 1
                else:
                    source = None if not v3 else _BAD
                if cid >= 0 and source != _BAD and at + 3 <= end:
                    kind = data[at]
                    if kind == 0xC5:
                        length = (data[at + 1] << 8) | data[at + 2]
                        at += 3
                    elif kind == 0xC4:
                        length = data[at + 1]
                        at += 2
                    else:
                        length = MAX_PAYLOAD + 1
                    stop = at + length
                    if length <= MAX_PAYLOAD and stop <= end:
                        append(Frame(code, cid, mv[at:stop], source))
                        pos = stop
                        continue
            try:
                code, cid, source, header_len, payload_len = header(mv, pos, end)
            except Incomplete as incomplete:
                incomplete.__traceback__ = None  # a shared instance: see wire._buffer
                break
            stop = pos + header_len + payload_len
            if stop > end:
                need = stop - pos
                break
            append(Frame(code, cid, mv[pos + header_len : stop], source))
            pos = stop
        if pos < end:
            buffer.hold(mv[pos:], need)
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame (or handshake) held back."""
        return self._buffer.pending

    def _frame_size(self, head: bytes) -> int:
        return self._frame_length(memoryview(head), 0, len(head))

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """Where the first ``most`` frames of ``data`` from ``start`` end, from their headers
        (``FrameBuffer.walk``); ``start`` where it cannot tell,
        and until the handshake (not a frame) is in."""
        if self._need_handshake:
            return start
        return self._buffer.walk(data, start, most, self._frame_size)

    # The methods below look at one frame starting at ``pos``.

    def _frame_length(self, buf: memoryview, pos: int, end: int) -> int:
        """Return the whole length of the frame (or handshake) at ``pos``."""
        if self._need_handshake:
            if self.version == 1:
                return _V1_HANDSHAKE_LEN
            return self._v2_handshake_length(buf, pos, end)
        header = self._header(buf, pos, end)
        return header[3] + header[4]

    def _parse(self, buf: memoryview, pos: int, end: int) -> Frame | Handshake:
        if self._need_handshake:
            self._need_handshake = False
            return self._parse_handshake(buf, pos, end)
        code, cid, source, header_len, _payload_len = self._header(buf, pos, end)
        return Frame(code, cid, buf[pos + header_len : end], source)

    def _header(self, buf: memoryview, pos: int, end: int) -> tuple[int, int | None, int | None, int, int]:
        """Parse a frame header: ``(code, channel id, source, header length, payload length)``."""
        if self.version == 1:
            if end - pos < 7:
                raise _INCOMPLETE
            code, cid, length = _V1_HEADER.unpack_from(buf, pos)
            if length > MAX_PAYLOAD:
                raise ProtocolError(
                    self.format, f"frame payload length {length} exceeds the {MAX_PAYLOAD}-byte maximum"
                )
            if cid < 0:
                raise ProtocolError(self.format, f"frame channel id is negative: {cid}")
            return code, cid, None, 7, length
        # Fast path for the shape every Content frame of a real peer has: a fixarray of
        # fixints and a bin8/bin16 payload. Anything else takes the general parser.
        if end - pos >= 8 and buf[pos] == self._content_marker:
            code = buf[pos + 1]
            cid = buf[pos + 2]
            if code < 0x80 and cid < 0x80:
                if self.version == 3:
                    source: int | None = _FIXINT_SOURCE.get(buf[pos + 3], _BAD)
                    at = pos + 4
                else:
                    source = None
                    at = pos + 3
                if source != _BAD:
                    kind = buf[at]
                    if kind == 0xC5:
                        length = (buf[at + 1] << 8) | buf[at + 2]
                        if length <= MAX_PAYLOAD:
                            return code, cid, source, at + 3 - pos, length
                    elif kind == 0xC4:
                        return code, cid, source, at + 2 - pos, buf[at + 1]
        return self._envelope(buf, pos, end)

    def _envelope(self, buf: memoryview, pos: int, end: int) -> tuple[int, int | None, int | None, int, int]:
        """General v2/v3 header parser (any msgpack integer widths), with validation."""
        fmt = self.format
        start = pos
        if pos >= end:  # pragma: no cover - callers pass >= 1 byte (feed loops while pos < end)
            raise _INCOMPLETE
        b = buf[pos]
        if 0x90 <= b <= 0x9F:
            count = b & 0x0F
            pos += 1
        elif b == 0xDC:
            if end - pos < 3:
                raise _INCOMPLETE
            count = int.from_bytes(buf[pos + 1 : pos + 3], "big")
            pos += 3
        else:
            raise ProtocolError(fmt, f"frame must be a msgpack array, got type byte 0x{b:02x}")
        allowed = _V2_COUNTS if self.version == 2 else _V3_COUNTS
        if count not in allowed:
            raise ProtocolError(fmt, f"frame array has {count} elements; expected one of {allowed}")
        code, pos = _read_int(buf, pos, end, fmt, "code")
        if code is None or code < 0:
            raise ProtocolError(fmt, f"frame field code is invalid: {code!r}")
        cid: int | None = None
        source: int | None = None
        if count >= 2:
            cid, pos = _read_int(buf, pos, end, fmt, "channelId")
            if cid is not None and cid < 0:
                raise ProtocolError(fmt, f"frame field channelId is negative: {cid}")
            if self.version == 3:
                if cid is None:
                    raise ProtocolError(fmt, "frame field channelId is nil")
                source, pos = _read_int(buf, pos, end, fmt, "source")
                if source not in (-1, 0, 1):
                    raise ProtocolError(fmt, f"frame field source is invalid: {source!r}")
        payload_len = 0
        if count == allowed[-1]:
            if pos >= end:
                raise _INCOMPLETE
            b = buf[pos]
            size = _BIN_SIZES.get(b)
            if size is None:
                raise ProtocolError(fmt, f"frame field payload must be msgpack bin, got type byte 0x{b:02x}")
            if end - pos < 1 + size:
                raise _INCOMPLETE
            payload_len = int.from_bytes(buf[pos + 1 : pos + 1 + size], "big")
            pos += 1 + size
            if payload_len > MAX_PAYLOAD:
                raise ProtocolError(
                    fmt, f"frame payload length {payload_len} exceeds the {MAX_PAYLOAD}-byte maximum"
                )
            if cid is None:
                raise ProtocolError(fmt, "frame has a payload but no channel id")
        return code, cid, source, pos - start, payload_len

    def _v2_handshake_length(self, buf: memoryview, pos: int, end: int) -> int:
        # [[major, minor], bin(16)]: fixarray(2) fixarray(2) int int bin8(16) 16 bytes
        start = pos
        if pos >= end:
            raise _INCOMPLETE
        if buf[pos] != 0x92:
            raise ProtocolError(
                self.format, f"handshake must be a 2-element msgpack array, got type byte 0x{buf[pos]:02x}"
            )
        pos += 1
        if pos >= end:
            raise _INCOMPLETE
        if buf[pos] != 0x92:
            raise ProtocolError(
                self.format,
                f"handshake field version must be a [major, minor] array, got type byte 0x{buf[pos]:02x}",
            )
        _major, pos = _read_int(buf, pos + 1, end, self.format, "handshake version.major")
        _minor, pos = _read_int(buf, pos, end, self.format, "handshake version.minor")
        if end - pos < 2:
            raise _INCOMPLETE
        if buf[pos] != 0xC4 or buf[pos + 1] != _RANDOM_LEN:
            raise ProtocolError(
                self.format,
                "handshake field random must be 16 bytes of msgpack bin, got type byte "
                f"0x{buf[pos]:02x} length byte {buf[pos + 1]}",
            )
        return pos + 2 + _RANDOM_LEN - start

    def _parse_handshake(self, buf: memoryview, pos: int, end: int) -> Handshake:
        if self.version == 1:
            if bytes(buf[pos : pos + 4]) != V1_MAGIC:
                raise ProtocolError(
                    self.format, f"handshake magic is {bytes(buf[pos : pos + 4]).hex()}, expected 2fdf1d50"
                )
            return Handshake((1, 0), bytes(buf[pos + 4 : end]))
        major, p = _read_int(buf, pos + 2, end, self.format, "version.major")
        minor, p = _read_int(buf, p, end, self.format, "version.minor")
        if major is None or minor is None:
            raise ProtocolError(self.format, "handshake field version holds nil")
        return Handshake((major, minor), bytes(buf[end - _RANDOM_LEN : end]))

"""omnistreams messages (``specs/omnistreams-multiplexer.md``, PROTOCOL-NOTES A3).

A message is ``type (1 byte), stream id (1 byte, all types but CONTROL), payload``. The
protocol needs message boundaries from below: over WebSocket one mux message is one binary
WebSocket message; over byte streams (TCP, unix sockets, pipes) polymux prefixes each
message with its length as a **4-byte big-endian unsigned integer** (the length of type,
id and payload together; 0 is invalid). :class:`LengthPrefixDecoder` undoes that prefix.

Two numberings exist; both are supported (:data:`SPEC` is the default):

============================  ==========  ===========================================
message                       ``SPEC``    ``LEGACY`` (npm omnistreams 0.9.0, Go, Rust)
============================  ==========  ===========================================
CONTROL                       0           5
CREATE_RECEIVE_STREAM         1           0
STREAM_DATA                   2           1
STREAM_END                    3           2
CANCEL_RECEIVE_STREAM         4           (none)
STREAM_REQUEST_DATA           5           4
CANCEL_SEND_STREAM            6           3 (``TERMINATE_SENDER``)
============================  ==========  ===========================================

Sans-I/O: :func:`encode_header` builds what precedes a payload, :func:`decode` parses one
whole message (payload as a view, no copy).
"""

from __future__ import annotations

import struct
from enum import Enum
from typing import NamedTuple

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError
from polymux.wire._buffer import INCOMPLETE, FrameBuffer


__all__ = [
    "LEGACY",
    "LENGTH_PREFIX",
    "MAX_MESSAGE_SIZE",
    "NUMBERINGS",
    "SPEC",
    "Kind",
    "LengthPrefixDecoder",
    "Message",
    "Numbering",
    "decode",
    "encode",
    "encode_header",
    "encode_length",
]

LENGTH_PREFIX = 4
"""Bytes of the length prefix polymux puts before each message on byte streams."""

MAX_MESSAGE_SIZE = 1024 * 1024 + 2
"""Default largest message (type, id and a 1 MiB payload); ``SessionConfig.max_message_size``
overrides it."""

_LENGTH = struct.Struct(">I")


class Kind(Enum):
    """What a message means, whatever its number in the numbering in use."""

    CONTROL = "CONTROL"
    CREATE = "CREATE_RECEIVE_STREAM"
    DATA = "STREAM_DATA"
    END = "STREAM_END"
    CANCEL_RECEIVE = "CANCEL_RECEIVE_STREAM"
    REQUEST_DATA = "STREAM_REQUEST_DATA"
    CANCEL_SEND = "CANCEL_SEND_STREAM"


class Numbering:
    """One assignment of type bytes to message kinds."""

    __slots__ = ("by_code", "codes", "name")

    def __init__(self, name: str, codes: dict[Kind, int]) -> None:
        self.name = name
        """``"spec"`` or ``"legacy"``."""
        self.codes = codes
        """Kind -> type byte (a kind missing here cannot be sent in this numbering)."""
        self.by_code = {code: kind for kind, code in codes.items()}
        """Type byte -> kind."""

    def __repr__(self) -> str:
        return f"<omnistreams numbering {self.name!r}>"

    def code(self, kind: Kind) -> int:
        """The type byte of ``kind``; ``ValueError`` when this numbering has none."""
        try:
            return self.codes[kind]
        except KeyError:
            raise ValueError(f"omnistreams: the {self.name} numbering has no {kind.value} message") from None


SPEC = Numbering(
    "spec",
    {
        Kind.CONTROL: 0,
        Kind.CREATE: 1,
        Kind.DATA: 2,
        Kind.END: 3,
        Kind.CANCEL_RECEIVE: 4,
        Kind.REQUEST_DATA: 5,
        Kind.CANCEL_SEND: 6,
    },
)
"""The spec's numbering (omnistreams-spec HEAD, 2019-06-15)."""

LEGACY = Numbering(
    "legacy",
    {
        Kind.CREATE: 0,
        Kind.DATA: 1,
        Kind.END: 2,
        Kind.CANCEL_SEND: 3,
        Kind.REQUEST_DATA: 4,
        Kind.CONTROL: 5,
    },
)
"""The older numbering every implementation uses (npm ``omnistreams`` 0.9.0, the Go and Rust
ports). It has no CANCEL_RECEIVE_STREAM."""

NUMBERINGS = {"spec": SPEC, "legacy": LEGACY}
"""Numberings by name (``SessionConfig.omnistreams_numbering``)."""


class Message(NamedTuple):
    """One decoded message. ``stream_id`` is ``None`` for CONTROL; ``payload`` is a view."""

    kind: Kind
    stream_id: int | None
    payload: BytesLike = b""


def encode_header(kind: Kind, stream_id: int | None, numbering: Numbering = SPEC) -> bytes:
    """The bytes before the payload: the type byte, then the stream id (not for CONTROL)."""
    code = numbering.code(kind)
    if kind is Kind.CONTROL:
        if stream_id is not None:
            raise ValueError("omnistreams: a CONTROL message has no stream id")
        return bytes((code,))
    if stream_id is None or not 0 <= stream_id <= 255:
        raise ValueError(f"omnistreams: stream id must be in 0..255, got {stream_id!r}")
    return bytes((code, stream_id))


def encode(kind: Kind, stream_id: int | None, payload: BytesLike = b"", numbering: Numbering = SPEC) -> bytes:
    """One whole message."""
    if kind is Kind.REQUEST_DATA and len(payload) != 1:
        raise ValueError("omnistreams: STREAM_REQUEST_DATA carries exactly one byte (the count)")
    return encode_header(kind, stream_id, numbering) + bytes(payload)


def encode_length(size: int) -> bytes:
    """The 4-byte big-endian length prefix of a message of ``size`` bytes (byte streams)."""
    if not 0 < size <= 0xFFFFFFFF:
        raise ValueError(f"omnistreams: message length must be in 1..2**32-1, got {size}")
    return _LENGTH.pack(size)


_NO_PAYLOAD = (Kind.END, Kind.CANCEL_RECEIVE, Kind.CANCEL_SEND)


def decode(message: BytesLike, numbering: Numbering = SPEC) -> Message:
    """Parse one whole message; raise :class:`ProtocolError` naming the field on bad input."""
    view = memoryview(message)
    if not view:
        raise ProtocolError("omnistreams", "empty message (no type byte)")
    code = view[0]
    kind = numbering.by_code.get(code)
    if kind is None:
        raise ProtocolError(
            "omnistreams",
            f"unknown message type {code} (the {numbering.name} numbering has 0..{len(numbering.codes) - 1})",
        )
    if kind is Kind.CONTROL:
        return Message(kind, None, view[1:])
    if len(view) < 2:
        raise ProtocolError("omnistreams", f"{kind.value} message of 1 byte has no stream id byte")
    stream_id = view[1]
    payload = view[2:]
    if kind is Kind.REQUEST_DATA and len(payload) != 1:
        raise ProtocolError(
            "omnistreams",
            f"STREAM_REQUEST_DATA for stream {stream_id} has {len(payload)} count bytes (expected 1)",
        )
    if kind in _NO_PAYLOAD and payload:
        raise ProtocolError(
            "omnistreams", f"{kind.value} for stream {stream_id} carries {len(payload)} unexpected bytes"
        )
    return Message(kind, stream_id, payload)


class LengthPrefixDecoder:
    """Splits a byte stream into messages at polymux's 4-byte big-endian length prefixes.

    ``feed(data)`` returns the complete messages (views where possible); a length of 0 or
    above ``max_size`` raises :class:`ProtocolError`, so memory stays bounded.
    """

    __slots__ = ("_buffer", "max_size")

    def __init__(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        if max_size <= 0:
            raise ValueError(f"max_size must be positive, got {max_size}")
        self.max_size = max_size
        self._buffer = FrameBuffer(LENGTH_PREFIX)

    @property
    def pending(self) -> int:
        """Bytes held back waiting for the rest of a message."""
        return self._buffer.pending

    def _check(self, size: int) -> None:
        if size == 0 or size > self.max_size:
            what = (
                "0 (a message needs a type byte)"
                if size == 0
                else f"{size} > max_message_size {self.max_size}"
            )
            raise ProtocolError("omnistreams", f"length prefix {what}")

    def _message_size(self, head: bytes) -> int:
        if len(head) < LENGTH_PREFIX:
            raise INCOMPLETE
        (size,) = _LENGTH.unpack_from(head)
        self._check(size)
        return LENGTH_PREFIX + int(size)

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """Where the first ``most`` messages of ``data`` from ``start`` end, from their length
        prefixes (``FrameBuffer.walk``); ``start`` where it cannot tell."""
        return self._buffer.walk(data, start, most, self._message_size)

    def feed(self, data: BytesLike) -> list[BytesLike]:
        """Return the whole messages completed by ``data``."""
        buffer = self._buffer
        whole, pos = buffer.resume(data, self._message_size) if buffer.held else (None, 0)
        out: list[BytesLike] = [] if whole is None else [memoryview(whole)[LENGTH_PREFIX:]]
        view = memoryview(data)
        end = len(view)
        need = 0  # the size of the message the loop stops inside, when known
        while end - pos >= LENGTH_PREFIX:
            (size,) = _LENGTH.unpack_from(view, pos)
            self._check(size)
            stop = pos + LENGTH_PREFIX + size
            if stop > end:
                need = stop - pos
                break
            out.append(view[pos + LENGTH_PREFIX : stop])
            pos = stop
        if pos < end:
            buffer.hold(view[pos:], need)
        return out

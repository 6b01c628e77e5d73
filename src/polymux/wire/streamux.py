"""Streamux (kstenerud/streamux, the 2019-06-04 specification that go-streamux implements).

* Initialize message: 5 bytes. Byte 0 is the protocol version (1); bytes 1-4 are a
  big-endian 32-bit word, most significant bit first: 2 reserved bits (0), quick-init
  request, quick-init allowed, id min (4 bits), id max (5), id recommended (5), length
  min (4), length max (5), length recommended (5). Recommended 31 is the wildcard.
* Negotiation (both peers compute the same result, :func:`negotiate`): min = max of the
  mins, max = min of the maxes (fail if max < min), recommended = min of both (a wildcard
  defers to the other; both wildcards: the midpoint rounded up), value = clamp; then if
  id + length > 30 bits: both over 15 become 15, else the larger becomes 30 - smaller.
  Quick init: the requester's recommended values win.
* Chunk header: a little-endian integer of 1-4 bytes (by id + length bits: 1-6, 7-14,
  15-22, 23-30); from the least significant bit: termination, response, length, id;
  unused high bits must be 0.
* Length-0 chunks are out of band: cancel (response 0, termination 0), cancel ack
  (response 1, termination 0); an empty first chunk with termination is a ping (or an
  empty request), its empty response a ping ack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError
from polymux.wire._buffer import INCOMPLETE, FrameBuffer


__all__ = [
    "PROTOCOL_VERSION",
    "WILDCARD",
    "Chunk",
    "Decoder",
    "InitMessage",
    "Negotiated",
    "NegotiationError",
    "cap_bits",
    "decode_init",
    "encode_header",
    "encode_init",
    "negotiate",
]

FORMAT = "streamux"
PROTOCOL_VERSION = 1
WILDCARD = 31
INIT_SIZE = 5


class NegotiationError(ProtocolError):
    """The two initialize messages do not negotiate: the session is dead."""

    def __init__(self, message: str) -> None:
        super().__init__(FORMAT, f"negotiation failed: {message}")


@dataclass(frozen=True, slots=True)
class InitMessage:
    """One peer's initialize message."""

    version: int = PROTOCOL_VERSION
    quick_request: bool = False
    quick_allowed: bool = False
    id_min: int = 1
    id_max: int = 29
    id_rec: int = 14
    length_min: int = 6
    length_max: int = 30
    length_rec: int = 16

    def check(self) -> None:
        """Raise :class:`NegotiationError` if this message is invalid on its own."""
        if not 1 <= self.version <= 255:
            raise NegotiationError(f"protocol version {self.version} is out of range")
        if self.quick_request and self.quick_allowed:
            raise NegotiationError("a peer set both quick init request and quick init allowed")
        for name, lo, hi, rec, lo_range, hi_range in (
            ("id", self.id_min, self.id_max, self.id_rec, (0, 15), (0, 29)),
            ("length", self.length_min, self.length_max, self.length_rec, (1, 15), (1, 30)),
        ):
            if not lo_range[0] <= lo <= lo_range[1]:
                raise NegotiationError(f"{name} min bits {lo} is out of range {lo_range}")
            if not hi_range[0] <= hi <= hi_range[1]:
                raise NegotiationError(f"{name} max bits {hi} is out of range {hi_range}")
            if hi < lo:
                raise NegotiationError(f"{name} max bits {hi} < min bits {lo}")
            if rec == WILDCARD:
                if self.quick_request:
                    raise NegotiationError(f"a quick init request uses the wildcard for {name} bits")
            elif not lo <= rec <= hi:
                raise NegotiationError(f"{name} recommended bits {rec} is outside {lo}..{hi}")


def encode_init(m: InitMessage) -> bytes:
    """The 5-byte initialize message. A field that does not fit its bit width raises
    ``ValueError`` (semantic validity is :meth:`InitMessage.check`'s job)."""
    for name, value, bits in (
        ("version", m.version, 8),
        ("id_min", m.id_min, 4),
        ("id_max", m.id_max, 5),
        ("id_rec", m.id_rec, 5),
        ("length_min", m.length_min, 4),
        ("length_max", m.length_max, 5),
        ("length_rec", m.length_rec, 5),
    ):
        if not 0 <= value < 1 << bits:
            raise ValueError(f"streamux initialize field {name}={value} does not fit {bits} bits")
    word = (
        int(m.quick_request) << 29
        | int(m.quick_allowed) << 28
        | (m.id_min & 0xF) << 24
        | (m.id_max & 0x1F) << 19
        | (m.id_rec & 0x1F) << 14
        | (m.length_min & 0xF) << 10
        | (m.length_max & 0x1F) << 5
        | (m.length_rec & 0x1F)
    )
    return bytes((m.version,)) + word.to_bytes(4, "big")


def decode_init(data: BytesLike) -> InitMessage:
    """Parse an initialize message (5 bytes). Reserved bits set is a protocol error."""
    if len(data) != INIT_SIZE:
        raise ProtocolError(FORMAT, f"initialize message is {len(data)} bytes, expected {INIT_SIZE}")
    word = int.from_bytes(bytes(data[1:5]), "big")
    if word >> 30:
        raise ProtocolError(FORMAT, f"initialize message has reserved bits set: 0x{word >> 30:x}")
    return InitMessage(
        version=data[0],
        quick_request=bool(word >> 29 & 1),
        quick_allowed=bool(word >> 28 & 1),
        id_min=word >> 24 & 0xF,
        id_max=word >> 19 & 0x1F,
        id_rec=word >> 14 & 0x1F,
        length_min=word >> 10 & 0xF,
        length_max=word >> 5 & 0x1F,
        length_rec=word & 0x1F,
    )


class Negotiated(NamedTuple):
    """The session's bit widths."""

    id_bits: int
    length_bits: int

    @property
    def header_size(self) -> int:
        """Bytes per chunk header (1-4)."""
        return (self.id_bits + self.length_bits + 2 + 7) // 8

    @property
    def max_length(self) -> int:
        """The longest chunk payload."""
        return (1 << self.length_bits) - 1

    @property
    def id_count(self) -> int:
        """How many request ids exist (2**id_bits)."""
        return 1 << self.id_bits


def _negotiate_one(
    name: str, us: tuple[int, int, int], them: tuple[int, int, int], quick: tuple[int, int, int] | None
) -> int:
    lo = max(us[0], them[0])
    hi = min(us[1], them[1])
    if hi < lo:
        raise NegotiationError(f"{name} bits: max {hi} < min {lo}")
    if quick is not None:
        rec = quick[2]
        if not lo <= rec <= hi:
            raise NegotiationError(f"quick init {name} bits {rec} outside the negotiated {lo}..{hi}")
        return rec
    a, b = us[2], them[2]
    if a == WILDCARD and b == WILDCARD:
        rec = (hi - lo + 1) // 2 + lo  # the midpoint, rounded up
    elif a == WILDCARD:
        rec = b
    elif b == WILDCARD:
        rec = a
    else:
        rec = min(a, b)
    return min(max(rec, lo), hi)


def cap_bits(id_bits: int, length_bits: int) -> tuple[int, int]:
    """Bring id + length bits down to 30: both over 15 become 15, else the larger one
    becomes 30 minus the smaller."""
    if id_bits + length_bits > 30:
        if id_bits > 15 and length_bits > 15:
            return 15, 15
        if id_bits > length_bits:
            return 30 - length_bits, length_bits
        return id_bits, 30 - id_bits
    return id_bits, length_bits


def negotiate(us: InitMessage, them: InitMessage) -> Negotiated:
    """Negotiate the bit widths; both peers reach the same result (order does not matter)."""
    us.check()
    them.check()
    if us.version != them.version:
        raise NegotiationError(f"protocol versions differ: {us.version} and {them.version}")
    if us.quick_request and them.quick_request:
        raise NegotiationError("both peers requested quick init")
    quick: InitMessage | None = None
    for requester, server in ((us, them), (them, us)):
        if requester.quick_request:
            if not server.quick_allowed:
                raise NegotiationError("quick init requested, but the other peer does not allow it")
            quick = requester
    id_bits = _negotiate_one(
        "id",
        (us.id_min, us.id_max, us.id_rec),
        (them.id_min, them.id_max, them.id_rec),
        None if quick is None else (quick.id_min, quick.id_max, quick.id_rec),
    )
    length_bits = _negotiate_one(
        "length",
        (us.length_min, us.length_max, us.length_rec),
        (them.length_min, them.length_max, them.length_rec),
        None if quick is None else (quick.length_min, quick.length_max, quick.length_rec),
    )
    id_bits, length_bits = cap_bits(id_bits, length_bits)
    if length_bits == 0:  # pragma: no cover - check(): length min >= 1, id max <= 29, so cap_bits leaves >= 1
        raise NegotiationError("length bits negotiated to 0")
    return Negotiated(id_bits, length_bits)


class Chunk(NamedTuple):
    """One message chunk (payload a view of the received bytes when decoded)."""

    id: int
    response: bool
    termination: bool
    payload: BytesLike = b""


def encode_header(n: Negotiated, request_id: int, length: int, response: bool, termination: bool) -> bytes:
    """A chunk header in the negotiated width."""
    if not 0 <= request_id < 1 << n.id_bits:
        raise ValueError(f"streamux request id {request_id} does not fit {n.id_bits} bits")
    if not 0 <= length < 1 << n.length_bits:
        raise ValueError(f"streamux chunk length {length} does not fit {n.length_bits} bits")
    value = (request_id << n.length_bits | length) << 2 | int(response) << 1 | int(termination)
    return value.to_bytes(n.header_size, "little")


class Decoder:
    """Incremental chunk decoder for one direction, once the widths are negotiated.

    Unused high header bits set is a protocol error. At most one incomplete chunk (header +
    ``max_length``) is buffered.
    """

    def __init__(self, n: Negotiated, *, stream_bodies: bool = False) -> None:
        self.negotiated = n
        self._size = n.header_size
        self._length_mask = (1 << n.length_bits) - 1
        self._limit = 1 << (n.id_bits + n.length_bits + 2)
        self._buffer = FrameBuffer(self._size)
        # stream_bodies: a chunk's body is delivered as it arrives, as non-terminated
        # pieces (never empty) and a last piece with the chunk's own flags, so memory
        # does not grow with the negotiated chunk length (up to 1 GiB at 30 bits).
        self._stream = stream_bodies
        self._current: tuple[int, bool, bool] | None = None  # id, response, termination
        self._left = 0  # body bytes of the current chunk still to come
        self._got = 0  # bytes of the current chunk received, header included

    @property
    def pending(self) -> int:
        """Bytes of an incomplete chunk held back (with ``stream_bodies``: plus the body
        bytes still expected of the chunk being streamed)."""
        return self._got if self._current is not None else self._buffer.pending

    def feed(self, data: bytes | bytearray | memoryview) -> list[Chunk]:
        """Decode every complete chunk (with ``stream_bodies``, also the pieces of
        incomplete ones)."""
        if not isinstance(data, bytes):
            data = bytes(data)
        if self._stream:
            return self._feed_streaming(data)
        return self._feed(data)

    def _feed_streaming(self, data: bytes) -> list[Chunk]:
        out: list[Chunk] = []
        pos = 0
        end = len(data)
        mv = memoryview(data)
        while True:
            current = self._current
            if current is not None:
                take = min(self._left, end - pos)
                self._left -= take
                self._got += take
                cid, response, termination = current
                if self._left:
                    if take:
                        out.append(Chunk(cid, response, False, mv[pos : pos + take]))
                    return out
                self._current = None
                # The last piece carries the chunk's flags. It is never empty (an empty
                # non-terminated one would read as a cancel): _left was positive, and a
                # read that brings none of it returned above.
                out.append(Chunk(cid, response, termination, mv[pos : pos + take]))
                pos += take
            # Whole chunks, and the header of a partial one.
            size = self._size
            rest = self._feed(mv[pos:]) if pos < end else []
            out += rest
            buffer = self._buffer
            if buffer.pending < size:
                return out
            # A chunk whose header is in: deliver what arrived of its body, stream the rest.
            partial = buffer.take()
            value = int.from_bytes(partial[:size], "little")
            lbits = self.negotiated.length_bits
            length = value >> 2 & self._length_mask
            have = len(partial) - size
            current = (value >> (2 + lbits), bool(value & 2), bool(value & 1))
            if have:
                out.append(Chunk(current[0], current[1], False, partial[size:]))
            self._current = current
            self._left = length - have
            self._got = size + have
            return out

    def _feed(self, data: bytes | memoryview) -> list[Chunk]:
        size = self._size
        lbits = self.negotiated.length_bits
        mask = self._length_mask
        limit = self._limit
        buffer = self._buffer
        whole, pos = buffer.resume(data, self._chunk_size) if buffer.held else (None, 0)
        out = [] if whole is None else [self._whole_chunk(whole)]
        mv = memoryview(data)
        end = len(data)
        need = 0  # the size of the chunk the loop stops inside, when known
        while end - pos >= size:
            value = int.from_bytes(data[pos : pos + size], "little")
            if value >= limit:
                self._check(value)
            length = value >> 2 & mask
            stop = pos + size + length
            if stop > end:
                need = size + length
                break
            out.append(Chunk(value >> (2 + lbits), bool(value & 2), bool(value & 1), mv[pos + size : stop]))
            pos = stop
        if pos < end:
            buffer.hold(mv[pos:], need)
        return out

    def _whole_chunk(self, chunk: bytes) -> Chunk:
        size = self._size
        value = int.from_bytes(chunk[:size], "little")
        return Chunk(
            value >> (2 + self.negotiated.length_bits),
            bool(value & 2),
            bool(value & 1),
            memoryview(chunk)[size:],
        )

    def _chunk_size(self, head: bytes) -> int:
        size = self._size
        if len(head) < size:
            raise INCOMPLETE
        return size + (self._check(int.from_bytes(head[:size], "little")) >> 2 & self._length_mask)

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """Where the first ``most`` chunks of ``data`` from ``start`` end, from their headers
        (``FrameBuffer.walk``); ``start`` where it cannot tell.
        With ``stream_bodies``, the rest of a body being streamed comes first (it counts as
        one chunk: its pieces cost per piece, not per byte)."""
        if self._current is not None:
            start = min(start + self._left, len(data))
            most -= 1
        return self._buffer.walk(data, start, most, self._chunk_size)

    def _check(self, value: int) -> int:
        """Raise if a header sets bits beyond the negotiated widths; return it."""
        if value >= self._limit:
            n = self.negotiated
            raise ProtocolError(
                FORMAT,
                f"chunk header 0x{value:0{2 * self._size}x} has unused high bits set "
                f"(id {n.id_bits} bits, length {n.length_bits} bits)",
            )
        return value

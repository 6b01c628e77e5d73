"""Passive decoding of captured bytes into :class:`~polymux.tracing.FrameRecord` rows.

Both directions of one connection are decoded together, chunk by chunk in time order, with
the :mod:`polymux.wire` codecs (no engine runs: nothing is answered, nothing is sent). The
per-format trackers below follow the engines' rules (``polymux/engine/*.py``) only as far
as a bystander can: channel keys, frame types and the credit each direction has left.

How offsets stay exact: each direction's codec is fed whole chunks (its fast path); the
frames it returns are sized by a formula, and the sum must equal what the codec consumed
(``fed - pending``). Where it does not (an encoding that is legal but not minimal, such as
a wide msgpack integer), the bytes since the last known frame boundary are replayed
through a fresh codec, a frame at a time, which gives every frame's end exactly. Where the
codec raises, the shortest prefix that makes a fresh codec raise is found by bisection,
and the bad frame starts after the last complete frame before it. Memory per direction is bounded by the
codec's largest frame.

The live path (:meth:`FrameDecoder.feed_parts`, what ``CaptureRecorder(mode="records")``
runs on the event loop) walks frame headers itself where the format's tracker knows their
common shapes (:meth:`_Tracker.fast_header`): a data frame's payload is skipped, never
copied (only its first ``payload_prefix`` bytes are kept), whatever views it arrives in;
anything else (a handshake, an unusual encoding, a malformed header) goes to the codec
from that frame on, so verdicts and error messages are the codec's own.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from polymux import formats
from polymux._types import BytesLike
from polymux.engine.flow import SendCredit
from polymux.engine.omnistreams import decode_metadata
from polymux.exceptions import ProtocolError
from polymux.tracing.records import C2S, S2C, Chunk, FrameRecord
from polymux.wire._varint import Incomplete, read_uvarint, uvarint_size


__all__ = ["FrameDecoder", "decode_chunks"]

_OTHER = {C2S: S2C, S2C: C2S}
_PREFIX = {C2S: "c", S2C: "s"}  # who opened a channel: the client or the server

_new_record = tuple.__new__
"""Builds a :class:`FrameRecord` from a tuple of its 14 fields, without the NamedTuple's
own ``__new__`` (a Python function: 4x slower, and records are built once per frame)."""

MAX_HELD = 16 * 1024 * 1024
"""Bytes a direction may hold before it can be decoded (Streamux before negotiation)."""


class _Elided:
    """A data frame's payload of which only the first bytes were kept (the live path):
    ``len()`` is the payload's length, ``bytes()`` the kept bytes."""

    __slots__ = ("head", "length")

    def __init__(self, head: bytes, length: int) -> None:
        self.head = head
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __bytes__(self) -> bytes:
        return self.head


FastHeader = tuple[int, int, bool, tuple[Any, ...]]
"""What :meth:`_Tracker.fast_header` returns for a frame it knows: ``(header length,
payload length, data, fields)``; ``data``: the payload is application data (only a prefix
is kept); ``fields`` go to :meth:`_Tracker.fast_item`."""


class _Codec(Protocol):
    """What the decoder needs of a per-direction codec: ``feed`` and ``pending``."""

    def feed(self, data: bytes) -> list[Any]: ...

    @property
    def pending(self) -> int: ...


class _Violation(Exception):
    """A tracker found the frame breaks the protocol (beyond what the codec checks);
    ``records`` are those the frame gave before the violation."""

    def __init__(self, message: str, records: list[FrameRecord] | None = None) -> None:
        super().__init__(message)
        self.records = records or []


class _Direction:
    """Decoding state of one direction."""

    __slots__ = (
        "boundary",
        "codec",
        "fast",
        "fed",
        "frame",
        "hold",
        "keep",
        "kept",
        "last_time",
        "name",
        "skip",
        "stopped",
        "tail",
    )

    def __init__(self, name: str, codec: _Codec, fast: bool) -> None:
        self.name = name
        self.codec = codec
        self.fed = 0  # stream offset just past the bytes fed to the codec (or walked)
        self.boundary = 0  # stream offset just past the last complete frame
        self.tail = bytearray()  # the bytes from boundary to fed (what the codec holds)
        self.stopped = False
        self.last_time = 0
        # The live path (FrameDecoder.feed_parts): ``fast`` while the codec holds nothing
        # and the tracker walks headers itself; ``hold``: the start of a header cut by the
        # end of a part; ``frame``: (size, payload length, data, fields) of the frame being
        # walked, ``skip`` its payload bytes still to come, ``kept`` the payload bytes kept
        # so far and ``keep`` how many more to keep.
        self.fast = fast
        self.hold: bytearray | None = None
        self.frame: tuple[int, int, bool, tuple[Any, ...]] | None = None
        self.skip = 0
        self.keep = 0
        self.kept = bytearray()


class _Tracker:
    """Per-format interpretation: codecs, frame sizes, and frames -> records."""

    fmt: str = ""

    def __init__(self, decoder: FrameDecoder) -> None:
        self.decoder = decoder
        self.fmt = decoder.format
        self.channel_names: dict[str, str] = {}
        """Channel key -> name, from the frame that opened the channel (formats with names)."""

    def codec(self, direction: str) -> _Codec:
        """A fresh codec for ``direction`` in its state at the last frame boundary."""
        raise NotImplementedError

    def size(self, item: Any) -> int:
        """The encoded size of ``item`` if it used the minimal encoding."""
        raise NotImplementedError

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        """Records for one decoded item. May raise :class:`_Violation`."""
        raise NotImplementedError

    def truncated_detail(self, direction: str) -> str:
        """What an unfinished direction was in the middle of."""
        return "frame"

    # The live path (optional per format): walk frame headers without the codec.

    MAX_HEAD = 0
    """The longest header :meth:`fast_header` reads (0: no live path, the codec decodes)."""

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        """The frame at ``buf[pos:end]``, if its header has a shape this tracker knows and
        the codec would accept: a :data:`FastHeader`; ``None`` if the header is cut short
        (``end`` comes first, with fewer than :attr:`MAX_HEAD` bytes); ``False`` for
        anything else (the codec takes over from this frame)."""
        return False

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        """The codec's item for a walked frame: ``fields`` from :meth:`fast_header`, the
        whole payload (``bytes``), or an :class:`_Elided` one for data frames."""
        raise NotImplementedError

    def fast_record(
        self,
        direction: str,
        fields: tuple[Any, ...],
        data: bool,
        length: int,
        kept: bytes,
        offset: int,
        time_ns: int,
    ) -> FrameRecord | None:
        """The one record of a walked frame of the most common kinds (plain data of
        ``length`` payload bytes; a credit grant, ``kept`` its whole payload), or ``None``
        (having changed no state) when the frame needs :meth:`records` (it opens or ends a
        channel, breaks the credit ...). The bulk of a capture goes this way."""
        return None

    def payload(self, item: Any) -> Any:
        """The payload of a decoded item (for the records' payload prefix)."""
        return b""

    def fast_run(
        self,
        direction: str,
        buf: Any,
        pos: int,
        end: int,
        offset: int,
        time_ns: int,
        out: list[FrameRecord],
        payloads: list[bytes | None] | None,
        prefix: int,
    ) -> int:
        """Records of the whole frames from ``buf[pos:]`` on (``offset``: the stream offset
        of ``pos``) as long as they are of the most common kinds, each exactly as
        :meth:`records` would give it (and its payload prefix, when ``payloads`` is given):
        one loop over many frames, for chunks that hold many. Returns where it stopped (at
        a frame boundary: a frame it leaves to the general path, or one not whole in
        ``buf``)."""
        return pos

    # helpers

    def rec(
        self,
        direction: str,
        time_ns: int,
        offset: int,
        channel: str,
        frame_type: str,
        length: int = 0,
        flags: int = 0,
        credit: int | None = None,
        credit_dir: str = "",
        ping_id: int | None = None,
        error: str | None = None,
    ) -> FrameRecord:
        if self.decoder.one_way:
            credit, credit_dir = None, ""
        # tuple.__new__: a NamedTuple's own __new__ is a Python function, 4x slower, and
        # this runs once per frame
        return _new_record(
            FrameRecord,
            (
                self.decoder.session,
                direction,
                time_ns,
                self.fmt,
                offset,
                channel,
                frame_type,
                length,
                flags,
                credit,
                credit_dir,
                ping_id,
                error,
                self.channel_names.get(channel) if channel else None,
            ),
        )


# -- credit bookkeeping (what a bystander sees of engine/flow.py's SendCredit) -------------


_Credit = SendCredit
"""One direction's send credit on one channel, as the engines count it (``left``: the
window minus what is in flight, negative once a sender overran it)."""


# -- yamux ---------------------------------------------------------------------------------


class _YamuxTracker(_Tracker):
    """yamux: stream ids are session-wide (client odd, server even); 256 KiB windows each
    way from the start, grown by WindowUpdate deltas (also on SYN/ACK frames); only Data
    bytes count."""

    MAX_DATA = 16 * 1024 * 1024  # the largest window go-yamux and polymux grow to

    def __init__(self, decoder: FrameDecoder) -> None:
        super().__init__(decoder)
        from polymux.wire import yamux

        self.wire = yamux
        self.credit: dict[tuple[int, str], _Credit] = {}

    def codec(self, direction: str) -> _Codec:
        return self.wire.Decoder(self.MAX_DATA, self.fmt)

    def size(self, item: Any) -> int:
        return 12 + (len(item.body) if item.type == 0 else 0)

    MAX_HEAD = 12

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        if end - pos < 12:
            return None
        version, type_, flags, sid, length = self.wire.HEADER.unpack_from(buf, pos)
        if version or type_ > 3:
            return False
        if type_:
            return 12, 0, False, (type_, flags, sid, length)
        if length > self.MAX_DATA:
            return False
        return 12, length, True, (0, flags, sid, length)

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        type_, flags, sid, length = fields
        return self.wire.Frame(type_, flags, sid, length, payload)

    def fast_run(
        self,
        direction: str,
        buf: Any,
        pos: int,
        end: int,
        offset: int,
        time_ns: int,
        out: list[FrameRecord],
        payloads: list[bytes | None] | None,
        prefix: int,
    ) -> int:
        # plain Data frames (their sender's credit) and plain WindowUpdates (the other's)
        if self.decoder.one_way:
            return pos
        unpack = self.wire.HEADER.unpack_from
        credits = self.credit
        other = _OTHER[direction]
        session = self.decoder.session
        fmt = self.fmt
        append = out.append
        base = offset - pos
        max_data = self.MAX_DATA
        new = _new_record
        record_type = FrameRecord
        mine: dict[int, tuple[_Credit, str]] = {}  # stream id -> (credit, key), for this run
        theirs: dict[int, tuple[_Credit, str]] = {}
        while end - pos >= 12:
            version, type_, flags, sid, length = unpack(buf, pos)
            if version or flags or type_ > 1 or not sid or not length:
                break
            if type_:
                entry = theirs.get(sid)
                if entry is None:
                    credit = credits.get((sid, other))
                    if credit is None:
                        break
                    entry = theirs[sid] = (credit, str(sid))
                credit, channel = entry
                credit.window += length
                left = (credit.window or 0) - credit.in_flight
                append(new(record_type, (session, direction, time_ns, fmt, base + pos, channel, "window_update", length, 0, left, other, None, None, None)))  # fmt: skip
                if payloads is not None:
                    payloads.append(b"")
                pos += 12
                continue
            stop = pos + 12 + length
            if stop > end or length > max_data:
                break
            entry = mine.get(sid)
            if entry is None:
                credit = credits.get((sid, direction))
                if credit is None:
                    break
                entry = mine[sid] = (credit, str(sid))
            credit, channel = entry
            left = (credit.window or 0) - credit.in_flight - length
            if left < 0:
                break
            credit.in_flight += length
            append(new(record_type, (session, direction, time_ns, fmt, base + pos, channel, "data", length, 0, left, direction, None, None, None)))  # fmt: skip
            if payloads is not None:
                payloads.append(bytes(buf[pos + 12 : pos + 12 + min(prefix, length)]))
            pos = stop
        return pos

    def fast_record(
        self,
        direction: str,
        fields: tuple[Any, ...],
        data: bool,
        length: int,
        kept: bytes,
        offset: int,
        time_ns: int,
    ) -> FrameRecord | None:
        sid = fields[2]
        credit = self.credit.get((sid, direction))
        if not data or not length or fields[1] or credit is None or self.decoder.one_way:
            return None
        left = credit.left - length
        if left < 0:
            return None
        credit.in_flight += length
        return _new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, str(sid), "data",
                length, 0, left, direction, None, None, None,
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return item.body

    def _credit(self, sid: int, direction: str) -> _Credit:
        c = self.credit.get((sid, direction))
        if c is None:
            c = self.credit[(sid, direction)] = _Credit(self.wire.INITIAL_WINDOW)
        return c

    def _charge(self, sid: int, direction: str, n: int, out: list[FrameRecord]) -> int:
        """``n`` data bytes sent on ``sid``: the credit left (a violation when the sender
        overran it; ``out``: the frame's records so far)."""
        credit = self.credit.get((sid, direction)) or self._credit(sid, direction)
        credit.in_flight += n
        left = credit.left
        if left < 0 and not self.decoder.one_way:
            raise _Violation(
                f"{self.fmt}: stream {sid} overran its send window: {n} bytes with {left + n} left", out
            )
        return left

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        type_, flags, sid, length = item.type, item.flags, item.stream_id, item.length
        if type_ == 0 and not flags and length and not self.decoder.one_way:
            # The bulk of any capture: plain data, one record (the general path below gives
            # the same record, through more steps).
            left = self._charge(sid, direction, length, [])
            dec = self.decoder
            return [
                _new_record(FrameRecord, (
                    dec.session, direction, time_ns, self.fmt, offset, str(sid), "data", length, 0,
                    left, direction, None, None, None,
                ))
            ]  # fmt: skip
        rec = self.rec
        if type_ == 2:  # ping
            kind = "pong" if flags & 2 else "ping"
            return [rec(direction, time_ns, offset, "", kind, 0, flags, ping_id=length)]
        if type_ == 3:  # go away
            names = {0: "normal", 1: "protocol error", 2: "internal error"}
            error = None if length == 0 else f"go away code {length} ({names.get(length, 'unknown')})"
            return [rec(direction, time_ns, offset, "", "go_away", 0, flags, error=error)]
        channel = str(sid) if sid else ""
        other = _OTHER[direction]
        out: list[FrameRecord] = []
        if type_ == 1:  # window update: the delta grows the other direction's credit
            grant = self._credit(sid, other)
            grant.window += length
            if flags & 1:
                out.append(rec(direction, time_ns, offset, channel, "open", length, flags, grant.left, other))
            elif flags & 2:
                out.append(
                    rec(direction, time_ns, offset, channel, "open_ack", length, flags, grant.left, other)
                )
            elif length or not flags & 12:
                out.append(
                    rec(
                        direction, time_ns, offset, channel, "window_update", length, flags, grant.left, other
                    )
                )
        else:  # data
            if flags & 1:
                out.append(rec(direction, time_ns, offset, channel, "open", 0, flags))
            elif flags & 2:
                out.append(rec(direction, time_ns, offset, channel, "open_ack", 0, flags))
            n = len(item.body)
            if n or not flags & 15:
                left = self._charge(sid, direction, n, out)
                out.append(rec(direction, time_ns, offset, channel, "data", n, flags, left, direction))
        if flags & 8:
            out.append(rec(direction, time_ns, offset, channel, "reset", 0, flags))
        elif flags & 4:
            out.append(rec(direction, time_ns, offset, channel, "end", 0, flags))
        return out


# -- MultiplexingStream --------------------------------------------------------------------

_MSTREAM_TYPES = {
    0: "open",
    1: "open_ack",
    2: "data",
    3: "end",
    5: "window_update",
    6: "stop_reading",
    7: "window_update",
    8: "window_request",
}


class _MStreamTracker(_Tracker):
    """MultiplexingStream v1/v2/v3 (Nerdbank.Streams). v2/v3: each side's receive window
    comes with its Offer or OfferAccepted (102,400 bytes when absent), ContentProcessed
    returns credit as a delta, ChannelWindowAdjust sets a larger absolute window. The
    opener may not send before the OfferAccepted. v1 has no flow control."""

    def __init__(self, decoder: FrameDecoder) -> None:
        super().__init__(decoder)
        from polymux.wire import mstream

        self.wire = mstream
        self.version = int(formats.get(self.fmt).option("version"))
        self.handshaken: set[str] = set()
        self.credit: dict[tuple[str, str], _Credit] = {}
        self.default_window = 5 * mstream.MAX_PAYLOAD  # engine/mstream.DEFAULT_REMOTE_WINDOW
        self.max_payload = mstream.MAX_PAYLOAD
        self._v1 = struct.Struct(">BiH")  # the v1 header: code, channel id, payload length
        self._sources = {0x01: 1, 0x00: 0, 0xFF: -1}  # v3 source fixints

    def codec(self, direction: str) -> _Codec:
        return self.wire.Decoder(self.version, handshake=direction not in self.handshaken)

    MAX_HEAD = 3 + 9 + 9 + 9 + 5  # the longest v2/v3 header (any integer width, bin32)

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        version = self.version
        if version != 3 and direction not in self.handshaken:
            return False  # the handshake: the codec's
        avail = end - pos
        if version == 1:
            if avail < 7:
                return None
            code, cid, length = self._v1.unpack_from(buf, pos)
            if length > self.max_payload or cid < 0:
                return False
            return 7, length, code == 2, (code, cid, None)
        # v2/v3: msgpack arrays of positive fixints ([code], [code, id(, source)]), ids up
        # to uint16, and a bin8/bin16 payload; other encodings are legal but the codec's.
        # None only while every byte seen fits such a header: the codec may reject the
        # frame from its first bytes, and must then do so at the same chunk.
        if not avail:
            return None
        first = buf[pos]
        v3 = version == 3
        full = 0x94 if v3 else 0x93
        if first != full and first != full - 1 and first != 0x91:
            return False
        if avail < 2:
            return None
        code = buf[pos + 1]
        if code >= 0x80:
            return False
        if first == 0x91:
            return 2, 0, False, (code, None, None)
        at = pos + 2
        if at >= end:
            return None
        cid = buf[at]
        at += 1
        if cid >= 0x80 and cid != 0xCC and cid != 0xCD:
            return False
        if cid >= 0x80:
            if cid == 0xCC:
                if at + 1 > end:
                    return None
                cid = buf[at]
                at += 1
            elif cid == 0xCD:
                if at + 2 > end:
                    return None
                cid = buf[at] << 8 | buf[at + 1]
                at += 2
            else:
                return False
        source = None
        if v3:
            if at >= end:
                return None
            source = self._sources.get(buf[at])
            if source is None:
                return False
            at += 1
        if first != full:
            return at - pos, 0, False, (code, cid, source)
        if at + 1 > end:
            return None
        kind = buf[at]
        if kind != 0xC4 and kind != 0xC5:
            return False
        if kind == 0xC4:
            if at + 2 > end:
                return None
            length = buf[at + 1]
            at += 2
        elif kind == 0xC5:
            if at + 3 > end:
                return None
            length = buf[at + 1] << 8 | buf[at + 2]
            at += 3
        else:
            return False
        if length > self.max_payload:
            return False
        return at - pos, length, code == 2, (code, cid, source)

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        code, cid, source = fields
        return self.wire.Frame(code, cid, payload, source)

    def fast_run(
        self,
        direction: str,
        buf: Any,
        pos: int,
        end: int,
        offset: int,
        time_ns: int,
        out: list[FrameRecord],
        payloads: list[bytes | None] | None,
        prefix: int,
    ) -> int:
        # v3 frames of the shape every peer sends in bulk: [code, id, source, bin8/16] with
        # fixints, Content (code 2) and ContentProcessed (code 5) of a channel we track
        if self.version != 3 or self.decoder.one_way:
            return pos
        credits = self.credit
        other = _OTHER[direction]
        session = self.decoder.session
        fmt = self.fmt
        names = self.channel_names
        append = out.append
        base = offset - pos
        opener = {1: _PREFIX[direction], -1: _PREFIX[other]}
        sources = self._sources
        while end - pos >= 6 and buf[pos] == 0x94:
            code = buf[pos + 1]
            cid = buf[pos + 2]
            source = sources.get(buf[pos + 3])
            kind = buf[pos + 4]
            if cid >= 0x80 or not source or (code != 2 and code != 5):
                break
            if kind == 0xC5:
                length = buf[pos + 5] << 8 | buf[pos + 6] if end - pos >= 7 else -1
                at = pos + 7
            elif kind == 0xC4:
                length = buf[pos + 5]
                at = pos + 6
            else:
                break
            stop = at + length
            if length < 0 or stop > end or length > self.max_payload:
                break
            channel = f"{opener[source]}{cid}"
            if code == 2:
                credit = credits.get((channel, direction))
                if credit is None or credit.left < length:
                    break
                credit.in_flight += length
                record = _new_record(
                    FrameRecord,
                    (
                        session, direction, time_ns, fmt, base + pos, channel, "data", length, 2,
                        credit.left, direction, None, None, names.get(channel),
                    ),
                )  # fmt: skip
                kept = bytes(buf[at : at + min(prefix, length)]) if payloads is not None else b""
            else:
                kept = bytes(buf[at:stop])
                record = self._fast_processed(direction, channel, kept, base + pos, time_ns)  # type: ignore[assignment]
                if record is None:
                    break
                kept = kept[:prefix]
            append(record)
            if payloads is not None:
                payloads.append(kept)
            pos = stop
        return pos

    def _fast_processed(
        self, direction: str, channel: str, payload: bytes, offset: int, time_ns: int
    ) -> FrameRecord | None:
        """A ContentProcessed whose payload is msgpack ``[uint]`` in its shortest form."""
        n = len(payload)
        if self.version < 2 or self.decoder.one_way or n < 2 or payload[0] != 0x91:
            return None
        b = payload[1]
        if b < 0x80 and n == 2:
            processed = b
        elif b == 0xCD and n == 4:
            processed = payload[2] << 8 | payload[3]
        elif b == 0xCE and n == 6:
            processed = int.from_bytes(payload[2:6], "big")
        else:
            return None
        other = _OTHER[direction]
        grant = self.credit.get((channel, other))
        if grant is None or processed > grant.in_flight:
            return None
        grant.in_flight -= processed
        return _new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "window_update",
                processed, 5, grant.left, other, None, None, self.channel_names.get(channel),
            ),
        )  # fmt: skip

    def fast_record(
        self,
        direction: str,
        fields: tuple[Any, ...],
        data: bool,
        length: int,
        kept: bytes,
        offset: int,
        time_ns: int,
    ) -> FrameRecord | None:
        code, cid, source = fields
        if not (data and length) and code != 5:
            return None
        if self.version != 3:
            channel = str(cid)
        elif source == 0:
            channel = f"seed{cid}"
        else:
            channel = f"{_PREFIX[direction if source == 1 else _OTHER[direction]]}{cid}"
        if code == 5:  # ContentProcessed: credit given back to the other direction
            return self._fast_processed(direction, channel, kept, offset, time_ns)
        left: int | None = None
        credit_dir = ""
        if self.version >= 2 and not self.decoder.one_way:
            credit = self.credit.get((channel, direction))
            if credit is None or credit.left < length:
                return None
            credit.in_flight += length
            left = credit.left
            credit_dir = direction
        elif self.version >= 2:
            return None
        return _new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "data", length, 2,
                left, credit_dir, None, None, self.channel_names.get(channel),
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return b"" if isinstance(item, self.wire.Handshake) else item.payload

    def size(self, item: Any) -> int:
        wire = self.wire
        if isinstance(item, wire.Handshake):
            return 20 if self.version == 1 else 22
        n = len(item.payload)
        if self.version == 1:
            return 7 + n
        return len(wire.encode_header(self.version, item.code, item.channel_id, n, item.source)) + n

    def _channel(self, direction: str, item: Any) -> str:
        cid = item.channel_id
        if cid is None:
            return ""
        if self.version != 3:
            return str(cid)
        source = item.source
        if source == 0:
            return f"seed{cid}"
        opener = direction if source == 1 else _OTHER[direction]
        return f"{_PREFIX[opener]}{cid}"

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        wire = self.wire
        if isinstance(item, wire.Handshake):
            self.handshaken.add(direction)
            major = item.version[0]
            if major != self.version:
                raise _Violation(
                    f"{self.fmt}: handshake field version is {major}.{item.version[1]}, expected {self.version}.x"
                )
            return [self.rec(direction, time_ns, offset, "", "handshake", 0, major)]
        code = item.code
        channel = self._channel(direction, item)
        payload = item.payload
        n = len(payload)
        other = _OTHER[direction]
        rec = self.rec
        flow = self.version >= 2
        if code == 2:  # Content
            if not flow:
                return [rec(direction, time_ns, offset, channel, "data", n, code)]
            credit = self.credit.get((channel, direction))
            if credit is None:  # no window granted to this direction yet (not accepted)
                credit = self.credit[(channel, direction)] = _Credit(0)
            credit.in_flight += n
            if credit.left < 0 and not self.decoder.one_way:
                raise _Violation(
                    f"{self.fmt}: channel {channel}: Content of {n} bytes overran the send window "
                    f"({credit.left + n} bytes left)"
                )
            return [rec(direction, time_ns, offset, channel, "data", n, code, credit.left, direction)]
        try:
            if code == 0:  # Offer: the opener's receive window is the other side's credit
                name, window = wire.decode_offer(self.version, payload)
                self.channel_names[channel] = name
                if not flow:
                    return [rec(direction, time_ns, offset, channel, "open", n, code)]
                grant = self.credit[(channel, other)] = _Credit(
                    self.default_window if window is None else window
                )
                return [rec(direction, time_ns, offset, channel, "open", n, code, grant.left, other)]
            if code == 1:  # OfferAccepted: the acceptor's window is the opener's credit
                window = wire.decode_offer_accepted(self.version, payload)
                if not flow:
                    return [rec(direction, time_ns, offset, channel, "open_ack", n, code)]
                grant = self.credit.setdefault((channel, other), _Credit(0))
                grant.window = self.default_window if window is None else window
                return [rec(direction, time_ns, offset, channel, "open_ack", n, code, grant.left, other)]
            if code == 4:  # ChannelTerminated
                message = wire.decode_termination(self.version, payload)
                kind = "close" if message is None else "reset"
                return [rec(direction, time_ns, offset, channel, kind, n, code, error=message)]
            if code == 5 and flow:  # ContentProcessed: a delta for the other direction
                processed = wire.decode_content_processed(self.version, payload)
                grant = self.credit.setdefault((channel, other), _Credit(0))
                if processed > grant.in_flight and not self.decoder.one_way:
                    raise _Violation(
                        f"{self.fmt}: channel {channel}: ContentProcessed acknowledges {processed} bytes, "
                        f"but only {grant.in_flight} are in flight"
                    )
                grant.in_flight -= processed
                return [
                    rec(
                        direction,
                        time_ns,
                        offset,
                        channel,
                        "window_update",
                        processed,
                        code,
                        grant.left,
                        other,
                    )
                ]
            if code == 7 and flow:  # ChannelWindowAdjust: a new absolute window (only grows)
                window = wire.decode_window_adjust(self.version, payload)
                grant = self.credit.setdefault((channel, other), _Credit(0))
                growth = max(0, window - grant.window)
                grant.window += growth
                return [
                    rec(direction, time_ns, offset, channel, "window_update", growth, code, grant.left, other)
                ]
        except ProtocolError as exc:
            raise _Violation(str(exc)) from None
        return [rec(direction, time_ns, offset, channel, _MSTREAM_TYPES.get(code, "unknown"), n, code)]

    def truncated_detail(self, direction: str) -> str:
        return "frame" if direction in self.handshaken or self.version == 3 else "handshake"


# -- mplex / multiplex ---------------------------------------------------------------------

_MPLEX_TYPES = ("open", "data", "data", "end", "end", "reset", "reset")


class _Generations:
    """Channel keys for formats whose ids are reused: ``c3``, then ``c3#2`` ..."""

    def __init__(self) -> None:
        self.current: dict[str, str] = {}
        self.count: dict[str, int] = {}

    def new(self, key: str) -> str:
        n = self.count.get(key, 0) + 1
        self.count[key] = n
        name = key if n == 1 else f"{key}#{n}"
        self.current[key] = name
        return name

    def get(self, key: str) -> str:
        return self.current.get(key, key)


class _MplexTracker(_Tracker):
    """mplex / multiplex: each side numbers the streams it opens; a frame's flag says
    whether its sender is the stream's initiator (even flags) or receiver (odd). No flow
    control on the wire."""

    def __init__(self, decoder: FrameDecoder) -> None:
        super().__init__(decoder)
        from polymux.wire import mplex

        self.wire = mplex
        spec = formats.get(self.fmt)
        self.max_size = int(spec.option("max_message_size"))
        self.id_names = bool(spec.option("id_names", False))
        self.names = _Generations()

    def codec(self, direction: str) -> _Codec:
        return self.wire.Decoder(self.max_size, self.fmt)

    def size(self, item: Any) -> int:
        n = len(item.body)
        return uvarint_size(item.stream_id << 3 | item.flag) + uvarint_size(n) + n

    MAX_HEAD = 18  # two 9-byte varints

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        # In the codec's order (a bad flag is rejected before the length is read).
        try:
            head, at = read_uvarint(buf, pos, end, 9)
            flag = head & 7
            if flag == 7:
                return False
            length, at = read_uvarint(buf, at, end, 9)
        except Incomplete as incomplete:
            incomplete.__traceback__ = None  # a shared instance: keep no frames alive
            return None
        except ValueError:
            return False
        if length > self.max_size:
            return False
        return at - pos, length, flag == 1 or flag == 2, (head >> 3, flag)

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        return self.wire.Frame(fields[0], fields[1], payload)

    def fast_run(
        self,
        direction: str,
        buf: Any,
        pos: int,
        end: int,
        offset: int,
        time_ns: int,
        out: list[FrameRecord],
        payloads: list[bytes | None] | None,
        prefix: int,
    ) -> int:
        # Message frames with a one-byte header (ids < 16) and a length of 1-3 bytes
        session = self.decoder.session
        fmt = self.fmt
        current = self.names.current
        names = self.channel_names
        append = out.append
        base = offset - pos
        limit = self.max_size
        other = _OTHER[direction]
        while end - pos >= 3:
            h = buf[pos]
            flag = h & 7
            if h >= 0x80 or (flag != 1 and flag != 2):
                break
            b1 = buf[pos + 1]
            if b1 < 0x80:
                length = b1
                at = pos + 2
            elif buf[pos + 2] < 0x80:
                length = (b1 & 0x7F) | buf[pos + 2] << 7
                at = pos + 3
            elif end - pos >= 4 and buf[pos + 3] < 0x80:
                length = (b1 & 0x7F) | (buf[pos + 2] & 0x7F) << 7 | buf[pos + 3] << 14
                at = pos + 4
            else:
                break
            stop = at + length
            if stop > end or length > limit or not length:
                break
            key = f"{_PREFIX[direction if flag == 2 else other]}{h >> 3}"
            channel = current.get(key, key)
            record = _new_record(
                FrameRecord,
                (
                    session,
                    direction,
                    time_ns,
                    fmt,
                    base + pos,
                    channel,
                    "data",
                    length,
                    flag,
                    None,
                    "",
                    None,
                    None,
                    names.get(channel),
                ),
            )  # fmt: skip
            append(record)
            if payloads is not None:
                payloads.append(bytes(buf[at : at + min(prefix, length)]))
            pos = stop
        return pos

    def fast_record(
        self,
        direction: str,
        fields: tuple[Any, ...],
        data: bool,
        length: int,
        kept: bytes,
        offset: int,
        time_ns: int,
    ) -> FrameRecord | None:
        if not data:
            return None
        sid, flag = fields
        opener = direction if flag % 2 == 0 else _OTHER[direction]
        key = f"{_PREFIX[opener]}{sid}"
        channel = self.names.current.get(key, key)
        return _new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "data", length, flag,
                None, "", None, None, self.channel_names.get(channel),
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return item.body

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        flag = item.flag
        opener = direction if flag % 2 == 0 else _OTHER[direction]
        key = f"{_PREFIX[opener]}{item.stream_id}"
        body = item.body
        if flag == 0:
            channel = self.names.new(key)
            # multiplex names a stream by its id when the NewStream body is empty
            name = bytes(body).decode("utf-8", "replace")
            self.channel_names[channel] = name or (str(item.stream_id) if self.id_names else "")
        else:
            channel = self.names.get(key)
        error = None
        if flag >= 5 and body:
            error = bytes(body).decode("utf-8", "replace")
        return [
            self.rec(direction, time_ns, offset, channel, _MPLEX_TYPES[flag], len(body), flag, error=error)
        ]


# -- Streamux ------------------------------------------------------------------------------


class _StreamuxInit:
    """The initialize message, as a decoded item."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


class _StreamuxCodec:
    """One direction of Streamux: the 5-byte initialize message, then chunks once the
    widths are known (both initialize messages, or a quick-init request's own values)."""

    def __init__(self, tracker: _StreamuxTracker, direction: str, init_done: bool) -> None:
        self.tracker = tracker
        self.direction = direction
        self.init_done = init_done
        self.held = bytearray()
        self.chunks: Any = None

    @property
    def pending(self) -> int:
        return len(self.held) + (self.chunks.pending if self.chunks is not None else 0)

    def feed(self, data: bytes) -> list[Any]:
        wire = self.tracker.wire
        out: list[Any] = []
        if self.chunks is None:
            self.held += data
            if not self.init_done:
                if len(self.held) < wire.INIT_SIZE:
                    return out
                out.append(_StreamuxInit(wire.decode_init(bytes(self.held[: wire.INIT_SIZE]))))
                del self.held[: wire.INIT_SIZE]
                self.init_done = True
                self.tracker.saw_init(self.direction, out[-1].message)
            negotiated = self.tracker.negotiated
            if negotiated is None:
                if len(self.held) > MAX_HELD:
                    raise ProtocolError(
                        self.tracker.fmt,
                        f"more than {MAX_HELD} bytes of chunks arrived before negotiation "
                        "(no initialize message from the other side)",
                    )
                return out
            self.chunks = wire.Decoder(negotiated)
            data = bytes(self.held)
            self.held.clear()
        out.extend(self.chunks.feed(data))
        return out


class _StreamuxTracker(_Tracker):
    """Streamux (2019-06-04): a channel is one request and its response. Request ids are
    scoped per sender and reused once done. Length-0 chunks are out of band: cancel, cancel
    ack, ping (an empty terminated first chunk) and its empty response, the pong."""

    def __init__(self, decoder: FrameDecoder) -> None:
        super().__init__(decoder)
        from polymux.wire import streamux

        self.wire = streamux
        self.inits: dict[str, Any] = {}  # as the codecs decode them
        self.recorded: set[str] = set()  # directions whose initialize message is behind the boundary
        self.negotiated: Any = None
        self.names = _Generations()
        self.open: dict[str, list[bool]] = {}  # key -> [request ended, response ended]
        self.pings: set[str] = set()

    def codec(self, direction: str) -> _Codec:
        return _StreamuxCodec(self, direction, direction in self.recorded)

    def saw_init(self, direction: str, message: Any) -> None:
        """A codec decoded ``direction``'s initialize message: negotiate once possible
        (a failed negotiation is reported by :meth:`records`)."""
        self.inits[direction] = message
        if self.negotiated is not None:
            return
        try:
            if message.quick_request:
                message.check()
                self.negotiated = self.wire.Negotiated(
                    *self.wire.cap_bits(message.id_rec, message.length_rec)
                )
            elif self.decoder.one_way:  # the peer's message is not there: assume it matched
                self.negotiated = self.wire.negotiate(message, message)
            elif len(self.inits) == 2:
                self.negotiated = self.wire.negotiate(self.inits[C2S], self.inits[S2C])
        except ProtocolError:
            return
        if self.negotiated is not None:
            self.decoder._release(_OTHER[direction])

    def size(self, item: Any) -> int:
        if isinstance(item, _StreamuxInit):
            return self.wire.INIT_SIZE
        return int(self.negotiated.header_size) + len(item.payload)

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        rec = self.rec
        if isinstance(item, _StreamuxInit):
            self.recorded.add(direction)
            if len(self.inits) == 2:
                try:  # both sides must agree, quick init or not
                    self.wire.negotiate(self.inits[C2S], self.inits[S2C])
                except ProtocolError as exc:
                    raise _Violation(str(exc)) from None
            else:
                try:
                    item.message.check()
                except ProtocolError as exc:
                    raise _Violation(str(exc)) from None
            return [rec(direction, time_ns, offset, "", "handshake", 0, item.message.version)]
        cid, response, termination, payload = item
        n = len(payload)
        flags = int(response) << 1 | int(termination)
        opener = _OTHER[direction] if response else direction
        key = f"{_PREFIX[opener]}{cid}"
        if not response:
            if n == 0 and not termination:
                self.open.pop(key, None)
                return [rec(direction, time_ns, offset, self.names.get(key), "cancel", 0, flags)]
            state = self.open.get(key)
            out: list[FrameRecord] = []
            if state is None or state[0]:
                if n == 0:  # an empty first chunk with termination: a ping
                    self.pings.add(key)
                    return [rec(direction, time_ns, offset, "", "ping", 0, flags, ping_id=cid)]
                state = self.open[key] = [False, False]
                out.append(rec(direction, time_ns, offset, self.names.new(key), "open", 0, flags))
            channel = self.names.get(key)
            if n:
                out.append(rec(direction, time_ns, offset, channel, "data", n, flags))
            if termination:
                state[0] = True
                out.append(rec(direction, time_ns, offset, channel, "end", 0, flags))
                self._done(key, state)
            return out
        if n == 0 and not termination:
            return [rec(direction, time_ns, offset, self.names.get(key), "cancel_ack", 0, flags)]
        if n == 0 and termination and key in self.pings and key not in self.open:
            self.pings.discard(key)
            return [rec(direction, time_ns, offset, "", "pong", 0, flags, ping_id=cid)]
        channel = self.names.get(key)
        out = []
        if n:
            out.append(rec(direction, time_ns, offset, channel, "data", n, flags))
        if termination:
            out.append(rec(direction, time_ns, offset, channel, "end", 0, flags))
            state = self.open.get(key)
            if state is not None:
                state[1] = True
                self._done(key, state)
        return out

    def _done(self, key: str, state: list[bool]) -> None:
        if state[0] and state[1]:
            del self.open[key]

    def payload(self, item: Any) -> Any:
        return b"" if isinstance(item, _StreamuxInit) else item.payload

    def truncated_detail(self, direction: str) -> str:
        if direction not in self.inits:
            return "initialize message"
        if self.negotiated is None:
            return "chunks that were never decoded (no negotiation)"
        return "chunk"


# -- omnistreams ---------------------------------------------------------------------------


class _OmniCodec:
    """One direction of omnistreams over a byte stream: length-prefixed messages."""

    def __init__(self, tracker: _OmniTracker) -> None:
        self.tracker = tracker
        self.split = tracker.wire.LengthPrefixDecoder()

    @property
    def pending(self) -> int:
        return int(self.split.pending)

    def feed(self, data: bytes) -> list[Any]:
        decode = self.tracker.wire.decode
        numbering = self.tracker.numbering
        return [decode(message, numbering) for message in self.split.feed(data)]


class _OmniTracker(_Tracker):
    """omnistreams (4-byte length prefixes on byte streams): a stream is one-way, from its
    creator; ids are per sender and reused; the receiver grants message credits with
    STREAM_REQUEST_DATA (one count byte), and each STREAM_DATA message costs one."""

    def __init__(self, decoder: FrameDecoder) -> None:
        super().__init__(decoder)
        from polymux.wire import omnistreams

        self.wire = omnistreams
        self.numbering = omnistreams.NUMBERINGS[formats.get(self.fmt).option("numbering")]
        self.names = _Generations()
        self.credit: dict[str, _Credit] = {}

    def codec(self, direction: str) -> _Codec:
        return _OmniCodec(self)

    def size(self, item: Any) -> int:
        return 4 + 1 + (0 if item.stream_id is None else 1) + len(item.payload)

    MAX_HEAD = 6  # length prefix, type byte, stream id

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        wire = self.wire
        if end - pos < 4:
            return None
        size = buf[pos] << 24 | buf[pos + 1] << 16 | buf[pos + 2] << 8 | buf[pos + 3]
        if size == 0 or size > wire.MAX_MESSAGE_SIZE:
            return False  # the codec refuses the prefix at once
        if end - pos < 5:
            return None
        kind = self.numbering.by_code.get(buf[pos + 4])
        if kind is None:
            return False
        K = wire.Kind
        if kind is K.CONTROL:
            return 5, size - 1, False, (kind, None)
        if size < 2:
            return False
        if end - pos < 6:
            return None
        n = size - 2
        if (kind is K.REQUEST_DATA and n != 1) or (n and kind in (K.END, K.CANCEL_RECEIVE, K.CANCEL_SEND)):
            return False
        return 6, n, kind is K.DATA, (kind, buf[pos + 5])

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        return self.wire.Message(fields[0], fields[1], payload)

    def fast_record(
        self,
        direction: str,
        fields: tuple[Any, ...],
        data: bool,
        length: int,
        kept: bytes,
        offset: int,
        time_ns: int,
    ) -> FrameRecord | None:
        if not data:
            return None
        key = f"{_PREFIX[direction]}{fields[1]}"
        channel = self.names.current.get(key, key)
        credit = self.credit.get(channel)
        if credit is None or credit.left < 1 or self.decoder.one_way:
            return None
        credit.in_flight += 1
        return _new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "data", length,
                self.numbering.codes[fields[0]], credit.left, direction, None, None,
                self.channel_names.get(channel),
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return item.payload

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        kind = item.kind
        K = self.wire.Kind
        flags = self.numbering.codes[kind]
        n = len(item.payload)
        rec = self.rec
        if kind is K.CONTROL:
            return [rec(direction, time_ns, offset, "", "control", n, flags)]
        sid = item.stream_id
        # Data flows from the stream's creator: it sends CREATE, DATA, END and
        # CANCEL_RECEIVE; the receiver sends REQUEST_DATA and CANCEL_SEND.
        receiver_side = kind in (K.REQUEST_DATA, K.CANCEL_SEND)
        sender = _OTHER[direction] if receiver_side else direction
        key = f"{_PREFIX[sender]}{sid}"
        if kind is K.CREATE:
            channel = self.names.new(key)
            self.credit[channel] = _Credit(0)
            meta = decode_metadata(item.payload)
            if meta is not None and "name" in meta:
                value = meta["name"]
                self.channel_names[channel] = value if isinstance(value, str) else str(value)
            return [rec(direction, time_ns, offset, channel, "open", n, flags)]
        channel = self.names.get(key)
        credit = self.credit.setdefault(channel, _Credit(0))
        if kind is K.DATA:
            credit.in_flight += 1
            if credit.left < 0 and not self.decoder.one_way:
                raise _Violation(
                    f"{self.fmt}: stream {channel}: STREAM_DATA beyond the requested message credit"
                )
            return [rec(direction, time_ns, offset, channel, "data", n, flags, credit.left, sender)]
        if kind is K.REQUEST_DATA:
            count = item.payload[0]
            credit.window += count
            return [
                rec(direction, time_ns, offset, channel, "window_update", count, flags, credit.left, sender)
            ]
        if kind is K.END:
            return [rec(direction, time_ns, offset, channel, "end", n, flags)]
        return [rec(direction, time_ns, offset, channel, "reset", n, flags)]  # either cancel


# -- the decoder ---------------------------------------------------------------------------


def _tracker_class(fmt: str) -> Callable[[FrameDecoder], _Tracker]:
    spec = formats.get(fmt)
    if spec.trace is None:
        return _CodecTracker
    tracker: Callable[[FrameDecoder], _Tracker] = formats.load(spec.trace)
    return tracker


class _CodecTracker(_Tracker):
    """The trace of a format whose codec module offers the registry's trace hooks
    (:mod:`polymux.formats`): ``trace_decoder(format)`` and ``trace_frame(format, frame)``
    -> ``(size, channel, frame_type, length, flags)``. Credit is not followed."""

    def __init__(self, decoder: FrameDecoder) -> None:
        super().__init__(decoder)
        self.wire = formats.get(self.fmt).codec()

    def codec(self, direction: str) -> _Codec:
        codec: _Codec = self.wire.trace_decoder(self.fmt)
        return codec

    def size(self, item: Any) -> int:
        return int(self.wire.trace_frame(self.fmt, item)[0])

    def payload(self, item: Any) -> Any:
        return getattr(item, "body", b"")  # the codec's frame type: a body, or nothing to keep

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        _size, channel, frame_type, length, flags = self.wire.trace_frame(self.fmt, item)
        key = "" if channel is None else str(channel)
        return [self.rec(direction, time_ns, offset, key, frame_type, length, flags)]


class FrameDecoder:
    """Incremental decoder of one connection (both directions) into frame records.

    ``feed(chunk)`` takes chunks in time order (both directions interleaved) and returns
    the records of the frames they complete; ``finish()`` returns the records for what is
    left (a ``truncated`` record per direction that ends inside a frame). Bad input never
    raises: a violation gives one ``violation`` record at the bad frame's offset, with the
    codec's message, and that direction is not decoded further.

    Args:
        format: one of :data:`polymux.PROTOCOLS` (``ValueError`` otherwise).
        session: the ``session`` value of the records.
        one_way: only one direction was captured: credit is not tracked (``None``, no
            flow-control violations), and Streamux assumes the other side's initialize
            message equalled this side's.
        payload_prefix: keep the first bytes of each frame's payload, at most this many
            (:meth:`take_payloads`); ``None``: keep none.
        codec_only: decode every frame with the codec, never walking headers (the
            reference the walk is tested against; slower, same records).
    """

    def __init__(
        self,
        format: str,
        *,
        session: str,
        one_way: bool = False,
        payload_prefix: int | None = None,
        codec_only: bool = False,
    ) -> None:
        if payload_prefix is not None and payload_prefix < 0:
            raise ValueError(f"payload_prefix must be >= 0, got {payload_prefix}")
        self.format = format
        self.session = session
        self.one_way = one_way
        self._tracker = _tracker_class(format)(self)
        fast = self._tracker.MAX_HEAD > 0 and not codec_only
        self._walks = fast
        self._dirs = {name: _Direction(name, self._tracker.codec(name), fast) for name in (C2S, S2C)}
        self._out: list[FrameRecord] = []
        self._to_release: list[str] = []
        self._time = 0
        self._prefix = payload_prefix
        self._payloads: list[bytes | None] | None = None if payload_prefix is None else []
        self._taken = 0  # records whose payloads take_payloads() has handed out

    def feed(self, chunk: Chunk) -> list[FrameRecord]:
        """Decode one ``(time_ns, direction, data)`` chunk; return the new records."""
        time_ns, direction, data = chunk
        d = self._dirs.get(direction)
        if d is None:
            raise ValueError(f"chunk direction must be 'c2s' or 's2c', got {direction!r}")
        self._time = time_ns
        if not d.stopped and data:
            d.last_time = time_ns
            if self._walks:
                self._walk(d, (data,), time_ns)
            else:
                self._feed(d, bytes(data), time_ns)
            self._release_held(time_ns)
        return self._take()

    def feed_parts(self, time_ns: int, direction: str, parts: Sequence[BytesLike]) -> list[FrameRecord]:
        """Decode bytes of one direction given as parts (a batch the session wrote, or a
        chunk it received), all at ``time_ns``; return the new records.

        The live path: a data frame's payload is never copied, whatever views it arrives
        in (its first ``payload_prefix`` bytes are kept), for formats whose tracker walks
        headers; the others, and anything unusual, go through the codec as in :meth:`feed`.
        """
        d = self._dirs.get(direction)
        if d is None:
            raise ValueError(f"chunk direction must be 'c2s' or 's2c', got {direction!r}")
        self._time = time_ns
        if not d.stopped:
            self._walk(d, parts, time_ns)
            if self._to_release:
                self._release_held(time_ns)
        return self._take()

    def take_payloads(self) -> list[bytes | None]:
        """With ``payload_prefix`` set: the payload prefixes of the records returned since
        the last call, in the same order (``None`` where a record has none: one record per
        frame carries them, the ``data`` one if the frame has one, else its first)."""
        payloads = self._payloads
        if payloads is None:
            raise ValueError("FrameDecoder: no payload_prefix was given")
        out = payloads[: self._taken]
        del payloads[: self._taken]
        self._taken = 0
        return out

    def _release_held(self, time_ns: int) -> None:
        while self._to_release:
            other = self._dirs[self._to_release.pop()]
            if not other.stopped and other.fed > other.boundary:
                self._feed(other, b"", time_ns)

    def _take(self) -> list[FrameRecord]:
        out = self._out
        if not out:
            return []
        self._out = []
        payloads = self._payloads
        if payloads is not None:
            self._taken += len(out)
            if len(payloads) < self._taken:
                payloads += [None] * (self._taken - len(payloads))
        return out

    def finish(self) -> list[FrameRecord]:
        """Records for the end of the capture: ``truncated`` where a direction stopped
        inside a frame."""
        for d in self._dirs.values():
            if d.stopped:
                continue
            pending = d.fed - d.boundary
            if pending:
                what = self._tracker.truncated_detail(d.name)
                self._out.append(
                    self._tracker.rec(
                        d.name,
                        d.last_time,
                        d.boundary,
                        "",
                        "truncated",
                        pending,
                        error=f"{self.format}: the {d.name} stream ends inside a {what} "
                        f"({pending} bytes at offset {d.boundary})",
                    )
                )
            d.stopped = True
        return self._take()

    # -- internals ---------------------------------------------------------------------------

    def _release(self, direction: str) -> None:
        """Bytes held by ``direction``'s codec can now be decoded (a tracker says so, from
        inside the other direction's feed; they are decoded right after it)."""
        self._to_release.append(direction)

    def _feed(self, d: _Direction, data: bytes, time_ns: int) -> None:
        start = d.boundary
        try:
            items = d.codec.feed(data)
        except ProtocolError as exc:
            self._replay_to_error(d, bytes(d.tail) + data, time_ns, exc)
            return
        d.fed += len(data)
        consumed = d.fed - d.codec.pending
        size = self._tracker.size
        sizes = [size(item) for item in items]
        if start + sum(sizes) != consumed:
            sizes = self._exact_sizes(d, bytes(d.tail) + data, sizes)
        # Keep the bytes the codec holds (from the new boundary), for a later replay.
        drop = consumed - start
        if drop >= len(d.tail):
            d.tail = bytearray(data[drop - len(d.tail) :])
        else:
            del d.tail[:drop]
            d.tail += data
        d.boundary = consumed
        self._emit(d, items, sizes, start, time_ns)

    def _walk(self, d: _Direction, parts: Sequence[BytesLike], time_ns: int) -> None:
        """The live path over parts of one direction: walk the frames whose headers the
        tracker knows, skipping data payloads; hand the codec the rest (from a frame
        boundary on) and take over again once it holds nothing. The hot loop of
        frame-record capture, written for few Python calls per frame: a frame whose
        record :meth:`_Tracker.fast_record` gives costs one header parse and that call."""
        tracker = self._tracker
        head = tracker.fast_header
        fast_record = tracker.fast_record
        run = tracker.fast_run
        runs = 2 * tracker.MAX_HEAD  # a part with more than this may hold several frames
        name = d.name
        prefix = self._prefix or 0
        out = self._out
        payloads = self._payloads
        count = len(parts)
        i = 0
        while i < count:
            part = parts[i]
            i += 1
            end = len(part)
            if not end:
                continue
            d.last_time = time_ns
            pos = 0
            while pos < end:
                if d.skip:  # inside a walked frame's payload
                    skip = d.skip
                    take = skip if skip < end - pos else end - pos  # noqa: FURB136 - no call in the hot loop
                    if d.keep:
                        k = d.keep if d.keep < take else take  # noqa: FURB136
                        d.kept += part[pos : pos + k]  # (a few bytes of a data payload)
                        d.keep -= k
                    pos += take
                    d.fed += take
                    d.skip = skip - take
                    if take == skip:
                        size, payload_len, data, fields = d.frame  # type: ignore[misc]
                        d.frame = None
                        kept = bytes(d.kept)
                        record = fast_record(name, fields, data, payload_len, kept, d.boundary, time_ns)
                        if record is None:
                            self._complete(d, time_ns, size, payload_len, data, fields, kept)
                            if d.stopped:
                                return
                            continue
                        d.boundary += size
                        out.append(record)
                        if payloads is not None:
                            if len(payloads) == self._taken + len(out) - 1:
                                payloads.append(kept[:prefix])
                            else:
                                self._attach(len(out) - 1, kept[:prefix])
                    continue
                if not d.fast:  # the codec's turn: it holds part of a frame, or the format is its
                    rest = part[pos:] if pos else part
                    self._feed(d, rest if type(rest) is bytes else bytes(rest), time_ns)
                    d.fast = self._walks and not d.stopped and d.codec.pending == 0
                    if d.stopped:
                        return
                    break
                # a frame boundary (or a header begun in an earlier part)
                hold = d.hold
                if hold is None:
                    if end - pos > runs:  # many frames here, perhaps: one loop over them
                        if payloads is not None and len(payloads) < self._taken + len(out):
                            payloads += [None] * (self._taken + len(out) - len(payloads))
                        stop = run(name, part, pos, end, d.boundary, time_ns, out, payloads, prefix)
                        if stop != pos:
                            d.boundary += stop - pos
                            d.fed += stop - pos
                            pos = stop
                            continue
                    found = head(name, part, pos, end)
                    if found is None:  # the header goes on in the next part
                        d.hold = bytearray(part[pos:])
                        d.fed += end - pos
                        break
                    if found is False:
                        d.fast = False
                        continue
                    header_len, payload_len, data, fields = found  # type: ignore[misc]
                    at = pos + header_len
                    whole = at + payload_len <= end  # the whole frame is in this part
                    if whole or (at == end and i < count and len(parts[i]) == payload_len):
                        # (or its payload is the next part: a batch the session wrote)
                        if whole:
                            pos = at + payload_len
                            body = part[at:pos]
                        else:
                            pos = end
                            body = parts[i]
                            i += 1
                        size = header_len + payload_len
                        d.fed += size
                        kept = bytes(body[:prefix] if data else body)
                        record = fast_record(name, fields, data, payload_len, kept, d.boundary, time_ns)
                        if record is None:
                            self._complete(d, time_ns, size, payload_len, data, fields, kept)
                            if d.stopped:
                                return
                            continue
                        d.boundary += size
                        out.append(record)
                        if payloads is not None:
                            if len(payloads) == self._taken + len(out) - 1:
                                payloads.append(kept[:prefix])
                            else:
                                self._attach(len(out) - 1, kept[:prefix])
                        continue
                    used = header_len
                else:
                    have = len(hold)
                    more = part[pos : pos + tracker.MAX_HEAD]
                    buf = bytes(hold) + bytes(more)
                    found = head(name, buf, 0, len(buf))
                    if found is None and len(buf) < tracker.MAX_HEAD:
                        hold += more
                        d.fed += len(more)
                        pos += len(more)
                        continue
                    if found is None or found is False:
                        # the codec takes over from the frame's first byte
                        d.fast = False
                        d.hold = None
                        d.fed = d.boundary
                        self._feed(d, buf[:have] + bytes(part[pos:]), time_ns)
                        d.fast = self._walks and not d.stopped and d.codec.pending == 0
                        if d.stopped:
                            return
                        break
                    d.hold = None
                    header_len, payload_len, data, fields = found  # type: ignore[misc]
                    used = header_len - have  # the header's bytes in this part
                pos += used
                d.fed += used
                if not payload_len:
                    self._complete(d, time_ns, header_len, 0, data, fields, b"")
                    if d.stopped:
                        return
                    continue
                d.frame = (header_len + payload_len, payload_len, data, fields)
                d.skip = payload_len
                d.keep = (prefix if prefix < payload_len else payload_len) if data else payload_len  # noqa: FURB136
                d.kept = bytearray()

    def _complete(
        self,
        d: _Direction,
        time_ns: int,
        size: int,
        payload_len: int,
        data: bool,
        fields: tuple[Any, ...],
        kept: bytes,
    ) -> None:
        """A walked frame is whole (``kept``: its payload, or a data frame's first bytes):
        its records."""
        offset = d.boundary
        tracker = self._tracker
        record = tracker.fast_record(d.name, fields, data, payload_len, kept, offset, time_ns)
        d.boundary = offset + size
        if record is not None:
            self._out.append(record)
            if self._payloads is not None:
                self._attach(len(self._out) - 1, kept[: self._prefix])
            return
        item = tracker.fast_item(fields, _Elided(kept, payload_len) if data and payload_len else kept)
        out = self._out
        try:
            records = tracker.records(d.name, item, offset, time_ns)
        except _Violation as exc:
            out.extend(exc.records)
            self._violation(d, offset, time_ns, str(exc))
            return
        if self._payloads is None:
            out += records
        else:
            start = len(out)
            out += records
            if records:
                self._attach(start, kept[: self._prefix])

    def _emit(
        self,
        d: _Direction,
        items: list[Any],
        sizes: list[int],
        offset: int,
        time_ns: int,
        payloads: list[bytes | None] | None = None,
    ) -> int | None:
        """Records of ``items`` (of ``sizes`` bytes), the first at ``offset``. Returns the
        offset past the last one, or None if one broke the protocol (a violation record
        at its offset, and the direction stops). With ``payload_prefix``, each item's
        payload prefix (``payloads``, else taken from the item) goes with its records."""
        out = self._out
        records = self._tracker.records
        name = d.name
        keep = self._payloads
        try:
            for i, (item, n) in enumerate(zip(items, sizes, strict=True)):
                start = len(out)
                out.extend(records(name, item, offset, time_ns))
                if keep is not None and len(out) > start:
                    if payloads is not None:
                        shown = payloads[i]
                    else:
                        shown = bytes(memoryview(self._tracker.payload(item))[: self._prefix])
                    self._attach(start, shown)
                offset += n  # past this frame only once its records are in
        except _Violation as exc:
            out.extend(exc.records)
            self._violation(d, offset, time_ns, str(exc))
            return None
        return offset

    def _attach(self, start: int, payload: bytes | None) -> None:
        """Give the payload prefix to the frame's records from ``start`` on: to its
        ``data`` record, else its first."""
        keep = self._payloads
        assert keep is not None
        out = self._out
        base = self._taken  # payloads[base + i] belongs to out[i]
        if len(out) == start + 1 and len(keep) == base + start:
            keep.append(payload)  # one record, nothing to pad: the common case
            return
        keep += [None] * (base + len(out) - len(keep))
        at = start
        for i in range(start, len(out)):
            if out[i].frame_type == "data":
                at = i
                break
        keep[base + at] = payload

    def _violation(self, d: _Direction, offset: int, time_ns: int, message: str) -> None:
        self._out.append(self._tracker.rec(d.name, time_ns, offset, "", "violation", error=message))
        d.stopped = True
        d.tail = bytearray()

    def _fresh(self, d: _Direction) -> _Codec:
        return self._tracker.codec(d.name)

    def _exact_sizes(self, d: _Direction, data: bytes, guesses: list[int]) -> list[int]:
        """Sizes of the items a codec decoded from ``data`` (from the boundary), found by
        replaying through a fresh codec: minimal sizes first, then a byte at a time."""
        codec = self._fresh(d)
        sizes: list[int] = []
        pos = 0
        for guess in guesses:
            got = codec.feed(data[pos : pos + guess])
            end = pos + guess
            while not got and end < len(data):
                got = codec.feed(data[end : end + 1])
                end += 1
            sizes.append(end - pos)
            pos = end
        return sizes

    def _replay_to_error(self, d: _Direction, data: bytes, time_ns: int, exc: ProtocolError) -> None:
        """The codec raised inside ``data`` (the bytes from the boundary). Find the
        shortest prefix of ``data`` that makes a fresh codec raise (errors only appear as
        bytes are added: a binary search, each probe at the codec's full speed); the
        frames the prefix before it holds are decoded and emitted, and the violation is
        reported where the bad frame starts (after the last complete frame)."""
        error = exc
        lo, hi = 0, len(data)  # data[:lo] decodes; data[:hi] raises
        try:
            self._fresh(d).feed(data)
        except ProtocolError as probe:
            error = probe
            while hi - lo > 1:
                mid = (lo + hi) // 2
                try:
                    self._fresh(d).feed(data[:mid])
                except ProtocolError as probe:
                    error = probe
                    hi = mid
                else:
                    lo = mid
        else:  # the fresh codec disagrees with the live one: report at the boundary
            lo = 0
        codec = self._fresh(d)
        items = codec.feed(data[:lo])
        good = lo - codec.pending  # bytes of complete frames before the bad one
        sizes = [self._tracker.size(item) for item in items]
        if sum(sizes) != good:
            sizes = self._exact_sizes(d, data[:good], sizes)
        offset = self._emit(d, items, sizes, d.boundary, time_ns)
        if offset is not None:
            self._violation(d, offset, time_ns, str(error))


def decode_chunks(
    format: str, chunks: Iterable[Chunk], *, session: str, one_way: bool = False
) -> Iterator[FrameRecord]:
    """Decode the chunks of one connection (both directions, in time order) into frame
    records, with the :mod:`polymux.wire` codecs of ``format``.

    Never raises on bad input: a protocol violation becomes one ``violation`` record (at
    the byte offset where the bad frame starts in its direction, ``error`` the codec's
    message) and that direction stops there; a stream that ends inside a frame gives a
    ``truncated`` record. An unknown ``format`` or a direction other than ``"c2s"`` /
    ``"s2c"`` raises ``ValueError`` (a caller's mistake, not bad input). ``one_way``: see
    :class:`FrameDecoder`.
    """
    decoder = FrameDecoder(format, session=session, one_way=one_way)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.finish()

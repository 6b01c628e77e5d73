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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from polymux import formats
from polymux.engine.flow import SendCredit
from polymux.engine.omnistreams import decode_metadata
from polymux.exceptions import ProtocolError
from polymux.tracing.records import C2S, S2C, Chunk, FrameRecord
from polymux.wire._varint import uvarint_size


__all__ = ["FrameDecoder", "decode_chunks"]

_OTHER = {C2S: S2C, S2C: C2S}
_PREFIX = {C2S: "c", S2C: "s"}  # who opened a channel: the client or the server

MAX_HELD = 16 * 1024 * 1024
"""Bytes a direction may hold before it can be decoded (Streamux before negotiation)."""


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

    __slots__ = ("boundary", "codec", "fed", "last_time", "name", "stopped", "tail")

    def __init__(self, name: str, codec: _Codec) -> None:
        self.name = name
        self.codec = codec
        self.fed = 0  # stream offset just past the bytes fed to the codec
        self.boundary = 0  # stream offset just past the last complete frame
        self.tail = bytearray()  # the bytes from boundary to fed (what the codec holds)
        self.stopped = False
        self.last_time = 0


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
        return FrameRecord(
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
                FrameRecord(
                    dec.session, direction, time_ns, self.fmt, offset, str(sid), "data", length, 0,
                    left, direction, None, None, None,
                )
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

    def codec(self, direction: str) -> _Codec:
        return self.wire.Decoder(self.version, handshake=direction not in self.handshaken)

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
    """

    def __init__(self, format: str, *, session: str, one_way: bool = False) -> None:
        self.format = format
        self.session = session
        self.one_way = one_way
        self._tracker = _tracker_class(format)(self)
        self._dirs = {name: _Direction(name, self._tracker.codec(name)) for name in (C2S, S2C)}
        self._out: list[FrameRecord] = []
        self._to_release: list[str] = []
        self._time = 0

    def feed(self, chunk: Chunk) -> list[FrameRecord]:
        """Decode one ``(time_ns, direction, data)`` chunk; return the new records."""
        time_ns, direction, data = chunk
        d = self._dirs.get(direction)
        if d is None:
            raise ValueError(f"chunk direction must be 'c2s' or 's2c', got {direction!r}")
        self._time = time_ns
        if not d.stopped and data:
            d.last_time = time_ns
            self._feed(d, bytes(data), time_ns)
            while self._to_release:
                other = self._dirs[self._to_release.pop()]
                if not other.stopped and other.fed > other.boundary:
                    self._feed(other, b"", time_ns)
        out, self._out = self._out, []
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
        out, self._out = self._out, []
        return out

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

    def _emit(
        self, d: _Direction, items: list[Any], sizes: list[int], offset: int, time_ns: int
    ) -> int | None:
        """Records of ``items`` (of ``sizes`` bytes), the first at ``offset``. Returns the
        offset past the last one, or None if one broke the protocol (a violation record
        at its offset, and the direction stops)."""
        out = self._out
        records = self._tracker.records
        name = d.name
        try:
            for item, n in zip(items, sizes, strict=True):
                out.extend(records(name, item, offset, time_ns))
                offset += n  # past this frame only once its records are in
        except _Violation as exc:
            out.extend(exc.records)
            self._violation(d, offset, time_ns, str(exc))
            return None
        return offset

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

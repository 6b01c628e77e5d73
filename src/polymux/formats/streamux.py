"""Streamux (kstenerud/streamux, 2019-06-04): the format's definition, its frame-record
walk and its signature.

The codec is :mod:`polymux.wire.streamux`, the engine
:class:`polymux.engine.streamux.StreamuxEngine` (with its capabilities and
:class:`~polymux.engine.streamux.StreamuxOptions`).
"""

from __future__ import annotations

from typing import Any

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.engine.streamux import CAPABILITIES, StreamuxEngine, StreamuxOptions
from polymux.exceptions import ProtocolError
from polymux.formats.format import Format, FormatDocs
from polymux.formats.records import C2S, S2C, FrameRecord
from polymux.formats.signature import Fit, Probe, Signature, sides
from polymux.formats.walk import OTHER, PREFIX, Codec, Generations, Violation, Walk, WalkHost
from polymux.wire import streamux as wire


__all__ = ["MAX_HELD", "STREAMUX", "StreamuxWalk"]

MAX_HELD = 16 * 1024 * 1024
"""Bytes a direction may hold before it can be decoded (before negotiation)."""


class _StreamuxInit:
    """The initialize message, as a decoded item."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


class _StreamuxCodec:
    """One direction of Streamux: the 5-byte initialize message, then chunks once the
    widths are known (both initialize messages, or a quick-init request's own values)."""

    def __init__(self, walk: StreamuxWalk, direction: str, init_done: bool) -> None:
        self.walk = walk
        self.direction = direction
        self.init_done = init_done
        self.held = bytearray()
        self.chunks: Any = None

    @property
    def pending(self) -> int:
        return len(self.held) + (self.chunks.pending if self.chunks is not None else 0)

    def feed(self, data: bytes) -> list[Any]:
        wire = self.walk.wire
        out: list[Any] = []
        if self.chunks is None:
            self.held += data
            if not self.init_done:
                if len(self.held) < wire.INIT_SIZE:
                    return out
                out.append(_StreamuxInit(wire.decode_init(bytes(self.held[: wire.INIT_SIZE]))))
                del self.held[: wire.INIT_SIZE]
                self.init_done = True
                self.walk.saw_init(self.direction, out[-1].message)
            negotiated = self.walk.negotiated
            if negotiated is None:
                if len(self.held) > MAX_HELD:
                    raise ProtocolError(
                        self.walk.fmt,
                        f"more than {MAX_HELD} bytes of chunks arrived before negotiation "
                        "(no initialize message from the other side)",
                    )
                return out
            self.chunks = wire.Decoder(negotiated)
            data = bytes(self.held)
            self.held.clear()
        out.extend(self.chunks.feed(data))
        return out


class StreamuxWalk(Walk):
    """Streamux (2019-06-04): a channel is one request and its response. Request ids are
    scoped per sender and reused once done. Length-0 chunks are out of band: cancel, cancel
    ack, ping (an empty terminated first chunk) and its empty response, the pong."""

    def __init__(self, decoder: WalkHost) -> None:
        super().__init__(decoder)
        self.wire = wire
        self.inits: dict[str, Any] = {}  # as the codecs decode them
        self.recorded: set[str] = set()  # directions whose initialize message is behind the boundary
        self.negotiated: Any = None
        self.names = Generations()
        self.open: dict[str, list[bool]] = {}  # key -> [request ended, response ended]
        self.pings: set[str] = set()

    def codec(self, direction: str) -> Codec:
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
            self.decoder.release(OTHER[direction])

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
                    raise Violation(str(exc)) from None
            else:
                try:
                    item.message.check()
                except ProtocolError as exc:
                    raise Violation(str(exc)) from None
            return [rec(direction, time_ns, offset, "", "handshake", 0, item.message.version)]
        cid, response, termination, payload = item
        n = len(payload)
        flags = int(response) << 1 | int(termination)
        opener = OTHER[direction] if response else direction
        key = f"{PREFIX[opener]}{cid}"
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


# -- the signature ---------------------------------------------------------------------------


def _fits(probe: Probe) -> list[Fit]:
    """A 5-byte initialize message, version 1, reserved bits 0, valid bit ranges (and both
    negotiate, when both are there)."""
    present = {d: h for d, h in probe.heads.items() if h}
    hs = list(present.values())
    if not all(h[0] == 1 and len(h) >= wire.INIT_SIZE for h in hs):
        return []
    try:
        inits = [wire.decode_init(h[: wire.INIT_SIZE]) for h in hs]
        for init in inits:
            init.check()
        if len(inits) == 2:
            n = wire.negotiate(*inits)
    except ProtocolError:
        return []
    if len(inits) == 2:
        return [
            Fit(
                "streamux",
                0.97,
                f"Streamux initialize messages both ways, negotiating {n.id_bits}-bit ids "
                f"and {n.length_bits}-bit lengths",
            )
        ]
    return [Fit("streamux", 0.85, f"a Streamux initialize message ({sides(present)})")]


# -- the format ------------------------------------------------------------------------------


def _engine(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
    assert isinstance(fmt.options, StreamuxOptions)
    return StreamuxEngine(config, options=fmt.options)


STREAMUX: Format = Format(
    "streamux",
    "Streamux",
    "streamux",
    CAPABILITIES,
    _engine,
    StreamuxWalk,
    Signature(_fits, handshake=True, rank=30),
    StreamuxOptions(),
    FormatDocs(
        page="formats/streamux.md",
        tested_against="none maintained: the specification's tables are the test vectors",
        credit="the slow-reader policy",
        names="the acceptor sees the request id",
        half_close="the request ends with `write_eof()`, then the response comes",
        pings="an empty request is a ping",
        limits="a channel is one request; the negotiated id width caps requests in flight "
        "(`StreamuxOptions.id_bits`); chunks up to 30 length bits",
    ),
)
"""Streamux."""

"""Sans-I/O yamux engine (hashicorp/yamux ``spec.md``; PROTOCOL-NOTES A5).

Rules:

* Clients allocate odd stream ids, servers even ones. A stream opens with SYN on its
  first frame (we send a WindowUpdate with SYN); the peer answers ACK (or RST). Data may
  flow before the ACK, so an opened stream is usable at once.
* Every stream starts with a 256 KiB window each way. We return credit as the
  application consumes, once half the window is consumed (as hashicorp does). A peer
  that sends past our window is a protocol error: GoAway(protocol error) and the session
  ends.
* Credit is encoded when the output is taken (:meth:`YamuxEngine.data_to_send`), not when
  the application consumes: a window update for a stream whose FIN or RST arrived in the
  meantime (the output waited while the socket was full) is never sent, and several
  updates for one stream go out as one. (One already on the wire can still cross the
  peer's FIN: docs/yamux-smux-interop.md.)
* Window auto-tuning (as go-yamux and py-libp2p do): when a window's worth was consumed
  within ``4 x RTT`` (RTT from pings), the reader keeps up and the sender is window-bound,
  so the window doubles, up to :attr:`YamuxOptions.max_receive_window` per stream, within
  a session-wide :attr:`YamuxOptions.window_budget` so many streams cannot claim unbounded
  memory.
* Time is a parameter: the I/O layer sets :attr:`YamuxEngine.now` before calling in.
* Frames for streams that do not exist are dropped (hashicorp: data discarded with a
  warning); a SYN for a stream id in use or of the wrong parity, data after FIN, and an
  unrequested ping ACK are protocol errors.
* GoAway: ``close()`` sends GoAway(normal) and refuses new streams from then on; a
  received GoAway stops our new opens (:class:`~polymux.engine.events.SessionClosed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine, run_size
from polymux.engine.channel import HALF_CLOSE, IGNORE, ChannelRecord, ChannelState, Input, Refuse, Transitions
from polymux.engine.events import (
    ChannelAccepted,
    ChannelOpened,
    ChannelReset,
    CreditAvailable,
    DataReceived,
    Event,
    PingAcked,
    SessionClosed,
)
from polymux.engine.flow import ReceiveWindow, SendCredit
from polymux.engine.spec import Capabilities, FormatOptions
from polymux.exceptions import ProtocolError
from polymux.wire import yamux as wire
from polymux.wire.yamux import Flag, GoAwayCode, Type


__all__ = ["CAPABILITIES", "YamuxEngine", "YamuxOptions", "YamuxRecord"]

CAPABILITIES = Capabilities(
    names=False,
    credit="bytes",
    ping=True,
    half_close=True,
    reset_message=False,
    acceptance=False,
    open_acknowledged=True,
)
"""yamux: no names, a byte window per stream, pings; a stream is usable before its ACK."""


@dataclass(frozen=True, slots=True)
class YamuxOptions(FormatOptions):
    """yamux's own settings (``polymux.formats.get("yamux").configure(...)``). The
    :class:`~polymux.SessionConfig` keywords ``max_receive_window`` and ``window_budget``
    of older releases still set them."""

    legacy: ClassVar[Mapping[str, str]] = {
        "max_receive_window": "max_receive_window",
        "window_budget": "window_budget",
    }

    max_receive_window: int = 16 * 1024 * 1024
    """The largest receive window auto-tuning may grow a stream's to (from the protocol's
    256 KiB; go-yamux's default maximum)."""

    window_budget: int = 256 * 1024 * 1024
    """Window granted beyond the initial 256 KiB per stream, summed over the session; growth
    stops there, so many streams cannot claim unbounded memory."""

    def __post_init__(self) -> None:
        for name in ("max_receive_window", "window_budget"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"YamuxOptions.{name} must be a positive int, got {value!r}")


_S = ChannelState
_AFTER_FIN = Refuse("data for stream {id} after its FIN")

TRANSITIONS = Transitions(
    {
        **HALF_CLOSE,
        (_S.HALF_CLOSED_REMOTE, Input.RECV_DATA): _AFTER_FIN,
        (_S.OFFERED_REMOTE_ENDED, Input.RECV_DATA): _AFTER_FIN,
        (_S.HALF_CLOSED_REMOTE, Input.RECV_END): IGNORE,  # a FIN on a later frame again
        (_S.OFFERED_REMOTE_ENDED, Input.RECV_END): IGNORE,
    }
)
"""yamux's stream states: the common half-close life (a stream is usable before its ACK;
rejecting is RST), data after the peer's FIN is an error, a repeated FIN is ignored."""


@dataclass(slots=True, eq=False)
class YamuxRecord(ChannelRecord):
    """A stream's record with yamux's own fields."""

    acked: bool = False
    """Our stream: the peer's ACK arrived (:class:`ChannelAccepted` was reported)."""
    epoch: float = 0.0
    """When the window was last returned (auto-tuning: a window consumed within 4 x RTT
    grows)."""


class YamuxEngine(Engine[YamuxRecord]):
    """One side of a yamux session.

    Args:
        config: ``send_frame``, ``ack_min``, ``max_session_memory``.
        is_client: the connecting side (odd stream ids); the listener is the server.
        options: yamux's own settings; by default :class:`YamuxOptions` with what
            ``config`` sets of their legacy keywords.
    """

    format = "yamux"
    _tables = (TRANSITIONS, TRANSITIONS)
    _ids_per_origin = False  # clients odd, servers even

    def __init__(
        self,
        config: SessionConfig | None = None,
        *,
        is_client: bool = True,
        options: YamuxOptions | None = None,
    ) -> None:
        super().__init__(CAPABILITIES)
        self.config = config or SessionConfig()
        self.options = options if options is not None else YamuxOptions().merged(config)
        """yamux's own settings."""
        self.is_client = is_client
        self.max_frame = self.config.send_frame
        self._decoder = wire.Decoder(max(self.options.max_receive_window, wire.INITIAL_WINDOW))
        self._next_id = 1 if is_client else 2
        self._pings: dict[int, float] = {}
        self._next_ping = 1
        self._grown = 0  # bytes of window granted beyond the initial ones, session-wide
        self._credit: dict[int, tuple[YamuxRecord, int]] = {}  # handle -> window update due
        self.now = 0.0
        """The current time (seconds, any monotonic clock); set by the I/O layer."""
        self.rtt: float | None = None
        """The latest round-trip time measured with a ping."""
        self.local_goaway = False
        """We sent GoAway: no new streams either way."""
        self.remote_goaway: int | None = None
        """The peer's GoAway code, once it sent one."""

    @property
    def ready(self) -> bool:
        """yamux has no handshake."""
        return True

    def data_to_send(self) -> list[BytesLike]:
        """Return (and forget) the byte chunks to write, in order; window updates due go
        last, one per stream, and none for a stream the peer has ended since."""
        if self._credit:
            out = self._out
            channels = self._channels
            for record, delta in self._credit.values():
                if not record.remote_end and record.handle in channels:
                    out.append(wire.encode_header(Type.WINDOW_UPDATE, 0, record.wire_id, delta))
            self._credit.clear()
        return super().data_to_send()

    @property
    def has_output(self) -> bool:
        """Whether :meth:`data_to_send` has anything."""
        return bool(self._out or self._credit)

    @property
    def can_open(self) -> bool:
        """Whether new streams may be opened (no GoAway sent or received)."""
        return not self.local_goaway and self.remote_goaway is None

    # -- receiving ---------------------------------------------------------------------------

    def _receive(self, data: bytes, runs: DataRuns) -> None:
        by_wire = self._by_wire
        receiving = TRANSITIONS.receiving
        for type_, flags, stream_id, length, body in self._decoder.feed(data):
            if type_ == Type.DATA and not flags:
                # Fast path: plain data for a live stream.
                record = by_wire.get(stream_id)
                if record is not None and record.state in receiving and length:
                    if record.recv is not None and not record.recv.received(length):
                        raise self._overrun(record, length)
                    runs.add(record, body, length)
                    continue
            runs.flush()
            self._on_frame(type_, flags, stream_id, length, body, runs.events)

    def _failed(self, exc: ProtocolError) -> ProtocolError:
        self._go_away(GoAwayCode.PROTOCOL_ERROR)
        return exc

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """From the frames' 12-byte headers."""
        return self._decoder.whole_frames(data, start, most)

    def _unfinished_input(self) -> tuple[int, str]:
        where = self._decoder.partial_stream()
        return self._decoder.pending, "frame" if where is None else f"frame on stream {where}"

    def _on_frame(
        self, type_: int, flags: int, stream_id: int, length: int, body: BytesLike, events: list[Event]
    ) -> None:
        if type_ == Type.PING:
            self._on_ping(flags, length, events)
            return
        if type_ == Type.GO_AWAY:
            if self.remote_goaway is None:
                self.remote_goaway = length
                events.append(SessionClosed(length, _goaway_text(length)))
            return
        # Data or WindowUpdate: a stream frame.
        if stream_id == 0:
            raise self._error(f"{Type(type_).name} frame for stream 0 (the session)")
        record = self._by_wire.get(stream_id)
        if flags & Flag.SYN:
            if record is not None:
                raise self._error(f"SYN for stream {stream_id}, which is already open")
            if (stream_id % 2 == 1) == self.is_client:
                raise self._error(f"SYN for stream {stream_id}, an id of our parity")
            record = self._new_record(stream_id, local=False)
            # No new streams once either side said GoAway: refused (RST), the session goes
            # on (hashicorp's own OpenStream does not check its GoAway, so a real peer may
            # still send one).
            if self.local_goaway or self.remote_goaway is not None:
                self.reject_channel(record.handle)
                return
            events.append(ChannelOpened(record.handle, record.name))
        if record is None:
            return  # unknown or closed stream: dropped (hashicorp logs and discards)
        handle = record.handle
        if flags & Flag.ACK and record.local_origin and not record.acked:
            record.acked = True
            events.append(ChannelAccepted(handle))
        if type_ == Type.WINDOW_UPDATE:
            if length:
                was_blocked = record.send.available == 0
                if record.send.available + length > wire.MAX_WINDOW:
                    raise self._error(
                        f"WindowUpdate of {length} for stream {stream_id} makes its window "
                        f"{record.send.available + length}, beyond {wire.MAX_WINDOW}"
                    )
                record.send.grow(length)
                if was_blocked:
                    events.append(CreditAvailable(handle))
        elif length:
            self._step(record, Input.RECV_DATA)  # (refused after the peer's FIN)
            if record.recv is not None and not record.recv.received(length):
                raise self._overrun(record, length)
            events.append(DataReceived(handle, body, length))
        if flags & Flag.RST:
            self._step(record, Input.RECV_RESET)
            events.append(ChannelReset(handle, None))
            return
        if flags & Flag.FIN:
            self._recv_end(record, events)

    def _on_ping(self, flags: int, opaque: int, events: list[Event]) -> None:
        if flags & Flag.SYN:
            self.peer_pings += 1
            self._out.append(wire.encode_header(Type.PING, Flag.ACK, 0, opaque))
        elif flags & Flag.ACK:
            sent = self._pings.pop(opaque, None)
            if sent is None:
                raise self._error(f"ping ACK with opaque value {opaque}, which we never sent")
            self.rtt = max(0.0, self.now - sent)
            events.append(PingAcked(opaque))

    # -- commands ----------------------------------------------------------------------------

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Open a stream (WindowUpdate with SYN); usable at once."""
        if not self.can_open:
            why = (
                "we sent GoAway"
                if self.local_goaway
                else f"the peer sent GoAway ({_goaway_text(self.remote_goaway)})"
            )
            raise RuntimeError(f"{self.format}: cannot open a stream: {why}")
        stream_id = self._next_id
        if stream_id > 0xFFFFFFFF:
            raise RuntimeError(f"{self.format}: stream ids are exhausted (ids are 32-bit)")
        self._next_id += 2
        record = self._new_record(stream_id, local=True, name=name)
        self._send_flags(record, Flag.SYN)
        return record.handle

    def _on_accept(self, record: YamuxRecord) -> None:
        """Accepting an incoming stream: WindowUpdate with ACK."""
        self._send_flags(record, Flag.ACK)

    def _on_reject(self, record: YamuxRecord, previous: ChannelState) -> None:
        """Refusing an incoming stream: RST."""
        self._send_flags(record, Flag.RST)

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue Data frames of at most :attr:`max_frame` bytes (views of ``data``)."""
        record = self._writable(channel)
        total = run_size(data, more)
        record.send.consume(total)
        if total:
            sid = record.wire_id
            self._queue_frames(
                record, data, more, total, lambda size: wire.encode_header(Type.DATA, 0, sid, size)
            )

    def _send_end(self, record: YamuxRecord) -> None:
        """Half-close: FIN on a WindowUpdate (the stream is gone once the peer's FIN came)."""
        self._send_flags(record, Flag.FIN)

    def _send_reset(self, record: YamuxRecord, previous: ChannelState, message: str | None) -> None:
        """Reset: RST (yamux carries no message)."""
        self._send_flags(record, Flag.RST)

    def ack_consumed(self, channel: int, n: int) -> None:
        """Return credit once half the window is consumed, growing the window when the
        reader keeps up (auto-tuning)."""
        due = self._credit_due(channel, n)
        if due is None:
            return
        record, credit = due
        recv = record.recv
        assert recv is not None
        growth = 0
        max_window = self.options.max_receive_window
        if self.rtt is not None and self.now - record.epoch < 4 * self.rtt and recv.window < max_window:
            granted = len(self._channels) * wire.INITIAL_WINDOW + self._grown
            growth = min(
                recv.window,
                max_window - recv.window,
                self.options.window_budget - self._grown,
                # Growth stays within the session's memory budget.
                (self.config.max_session_memory - granted) // 2,
            )
            if growth > 0:
                recv.grow(growth, threshold=(recv.window + growth) // 2)
                self._grown += growth
            else:
                growth = 0
        record.epoch = self.now
        due = self._credit.get(channel)
        self._credit[channel] = (record, credit + growth + (due[1] if due is not None else 0))

    def ping(self) -> int:
        """Send a ping; returns its opaque value (a :class:`PingAcked` event follows)."""
        opaque = self._next_ping
        self._next_ping = (self._next_ping + 1) & 0xFFFFFFFF or 1
        self._pings[opaque] = self.now
        self._out.append(wire.encode_header(Type.PING, Flag.SYN, 0, opaque))
        return opaque

    def close(self) -> None:
        """Send GoAway(normal): no new streams; open ones may finish."""
        self._go_away(GoAwayCode.NORMAL)

    # -- helpers -----------------------------------------------------------------------------

    def _go_away(self, code: int) -> None:
        if not self.local_goaway:
            self.local_goaway = True
            self._out.append(wire.encode_header(Type.GO_AWAY, 0, 0, code))

    def _new_record(self, stream_id: int, *, local: bool, name: str = "") -> YamuxRecord:
        return self._create(
            YamuxRecord,
            stream_id,
            local=local,
            name=name or str(stream_id),
            send=SendCredit(wire.INITIAL_WINDOW),
            recv=ReceiveWindow(wire.INITIAL_WINDOW, wire.INITIAL_WINDOW // 2),
            epoch=self.now,
        )

    def _send_flags(self, record: YamuxRecord, flags: int) -> None:
        self._out.append(wire.encode_header(Type.WINDOW_UPDATE, flags, record.wire_id, 0))

    def _release(self, record: YamuxRecord) -> None:
        self._credit.pop(record.handle, None)
        if record.recv is not None and record.recv.window > wire.INITIAL_WINDOW:
            self._grown -= record.recv.window - wire.INITIAL_WINDOW


def _goaway_text(code: int | None) -> str:
    names = {0: "normal", 1: "protocol error", 2: "internal error"}
    return f"code {code}: {names.get(code or 0, 'unknown')}" if code is not None else "none"

"""Sans-I/O smux engine (xtaci/smux protocol versions 1 and 2; PROTOCOL-NOTES A6).

Rules, read from xtaci/smux 1.5.16 (Debian's) and v1.5.57 (``session.go``, ``stream.go``):

* The version is configured, not negotiated: ``protocol="smux"`` is version 1 (xtaci's
  default), ``"smux-v2"`` version 2; a frame of the other version is a protocol error.
* Stream ids: the client (the connecting side) opens odd ids from 3, the server even ids
  from 2 (every xtaci release since v1.0.7; before it the server began at 4). Any id of the
  peer's parity is accepted; a SYN for an id of ours, or for an open stream, is a protocol
  error. Ids are never reused: at the end of the 32-bit space no stream can be opened.
* Nothing acknowledges an open: a stream is usable once its SYN is sent. smux has no names.
* FIN is the only end, and ends its sender's writing (a half-close); once both sides sent
  one the stream is gone. smux has no reset: :meth:`SmuxEngine.reset_channel` and
  :meth:`SmuxEngine.reject_channel` send FIN and forget the stream, and what the peer sends
  on it afterwards is dropped (xtaci does the same after ``Close()``).
* Received data always reaches the application: every byte goes out as an event before the
  ``ChannelEnded`` / ``ChannelClosed`` of its stream, also after our own FIN (xtaci v1.5.54 and
  later discard unread bytes when the peer's FIN meets their ``CloseWrite()``; we never do).
* Version 1 has no flow control on the wire (xtaci bounds a session-wide receive buffer by
  not reading the connection): :attr:`SmuxEngine.has_flow_control` is False and the session's
  slow-reader policy bounds memory, as for mplex.
* Version 2: a sender may have 256 KiB in flight on a stream before it hears from the
  receiver; then ``UPD(consumed, window)`` says how many bytes the receiver has consumed in
  all (modulo 2**32) and its window, so the sender may have ``window - (sent - consumed)``
  more in flight. A window may shrink (xtaci announces 64 KiB by default). Our window is
  ``receive_window`` within half the session's memory budget (down to 64 KiB: a budget full
  of windows would stop the session reading, and with it the credit that our own writes
  wait for), announced by a UPD right after SYN or at accept; what the peer may have sent
  on its first guess of 256 KiB shrinks to our window as we acknowledge. Credit goes back
  as the application consumes, batched (``max(ack_min, window / 8)``), encoded when the
  output is taken and never for a stream whose FIN arrived. xtaci also stops reading its
  connection while its session buffer (``MaxReceiveBuffer``, 4 MiB) is full, and its
  streams' windows add up to more: a stream waiting to write our credit then never reads
  it. So all streams together keep half of :attr:`SmuxOptions.peer_buffer` in flight, each still up to
  half its window (:class:`~polymux.engine.flow.SharedSendLimit`). Data beyond what we allowed is a
  :class:`~polymux.exceptions.FlowControlError`; a UPD that says more was consumed than was
  sent is a protocol error.
* Keepalive is NOP, and nothing answers a NOP: :meth:`SmuxEngine.ping` sends one, and the
  next whole frame from the peer (its own NOP every ``KeepAliveInterval``, 10 s in xtaci, or
  anything else) acknowledges every ping outstanding. So :attr:`SmuxEngine.ping_answered`
  is False and the session allows one more keepalive interval for it. xtaci closes a session
  that received nothing for ``KeepAliveTimeout`` (30 s): our NOPs keep it open.
* Frames for a stream that is gone (FIN, PSH, UPD) are dropped, as xtaci drops them; so is
  data after the peer's FIN (xtaci's own writers can send frames after their FIN when a
  stream is closed while a write is under way). A frame for an id that was never opened is a
  protocol error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine, run_size
from polymux.engine.channel import HALF_CLOSE, IGNORE, ChannelRecord, ChannelState, Input, Transitions
from polymux.engine.events import ChannelOpened, CreditAvailable, Event, PingAcked
from polymux.engine.flow import (
    ReceiveWindow,
    SendCredit,
    SharedSendLimit,
    budget_window,
    default_ack_threshold,
)
from polymux.engine.spec import Capabilities, FormatOptions
from polymux.wire import smux as wire
from polymux.wire.smux import Cmd


__all__ = ["CAPABILITIES", "SmuxEngine", "SmuxOptions", "SmuxRecord"]

CAPABILITIES = {
    version: Capabilities(
        names=False,
        credit="bytes" if version == 2 else None,
        ping=True,
        half_close=True,
        reset_message=False,
        acceptance=False,
        ping_answered=False,
    )
    for version in wire.VERSIONS
}
"""What each protocol version carries: no names, NOP keepalives that nothing answers, and
in version 2 a byte window per stream (UPD)."""


@dataclass(frozen=True, slots=True)
class SmuxOptions(FormatOptions):
    """smux's own settings (``polymux.formats.get("smux-v2").configure(...)``). The
    :class:`~polymux.SessionConfig` keyword ``smux_peer_buffer`` of older releases still
    sets :attr:`peer_buffer`."""

    legacy: ClassVar[Mapping[str, str]] = {"smux_peer_buffer": "peer_buffer"}

    peer_buffer: int = 4 * 1024 * 1024
    """Version 2: the peer's session-wide receive buffer (xtaci/smux's
    ``MaxReceiveBuffer``, 4 MiB by default). A session keeps at most half of it in flight
    over all its streams (each stream may still reach half its window): xtaci stops reading
    its connection while that buffer is full, and a stream whose reader waits for our credit
    would then never read it (an echo over 64 streams deadlocked so). Raise it to match a
    peer configured with a larger buffer."""

    def __post_init__(self) -> None:
        if not isinstance(self.peer_buffer, int) or self.peer_buffer <= 0:
            raise ValueError(f"SmuxOptions.peer_buffer must be a positive int, got {self.peer_buffer!r}")


_MASK = 0xFFFFFFFF
_S = ChannelState

TRANSITIONS = Transitions(
    {
        **{k: v for k, v in HALF_CLOSE.items() if k[1] is not Input.RECV_RESET},  # no reset frame
        # xtaci's writers can send frames after their FIN when a stream is closed while a
        # write is under way, and sends a second FIN on Close() after CloseWrite(): dropped.
        (_S.HALF_CLOSED_REMOTE, Input.RECV_DATA): IGNORE,
        (_S.OFFERED_REMOTE_ENDED, Input.RECV_DATA): IGNORE,
        (_S.HALF_CLOSED_REMOTE, Input.RECV_END): IGNORE,
        (_S.OFFERED_REMOTE_ENDED, Input.RECV_END): IGNORE,
    }
)
"""smux's stream states: the common half-close life without a reset from the peer (ours and
a refusal are a FIN); what follows the peer's FIN is dropped."""


@dataclass(slots=True, eq=False)
class SmuxRecord(ChannelRecord):
    """A stream's record with smux version 2's counters."""

    peer_consumed: int = 0
    """The ``consumed`` of the peer's last UPD (modulo 2**32)."""
    acked: int = 0
    """Bytes we have reported consumed (our UPDs carry it modulo 2**32)."""
    window: int = 0
    """The receive window we announce (our UPDs carry it)."""
    heard: bool = False
    """A UPD came from the peer (until then its window is the 256 KiB guess)."""


class SmuxEngine(Engine[SmuxRecord]):
    """One side of an smux session.

    Args:
        version: the protocol version, 1 or 2 (both ends must use the same).
        config: ``send_frame`` (capped at 65,535), and for version 2 ``receive_window``,
            ``ack_min`` and ``max_session_memory``.
        is_client: the connecting side (odd stream ids); the listener is the server.
        options: smux's own settings; by default :class:`SmuxOptions` with what ``config``
            sets of their legacy keywords.
    """

    _tables = (TRANSITIONS, TRANSITIONS)
    _ids_per_origin = False  # clients odd, servers even

    def __init__(
        self,
        version: int = 1,
        config: SessionConfig | None = None,
        *,
        is_client: bool = True,
        options: SmuxOptions | None = None,
    ) -> None:
        if version not in wire.VERSIONS:
            raise ValueError(f"smux protocol version must be 1 or 2, got {version!r}")
        super().__init__(CAPABILITIES[version])
        self.version = version
        self.format = "smux" if version == 1 else "smux-v2"
        self.config = config or SessionConfig()
        self.options = options if options is not None else SmuxOptions().merged(config)
        """smux's own settings."""
        self.is_client = is_client
        self.max_frame = min(self.config.send_frame, wire.MAX_PAYLOAD)
        self._decoder = wire.Decoder(version, self.format)
        self._next_id = 3 if is_client else 2
        self._peer_max = -1  # the highest id the peer opened
        self._pings: list[int] = []  # outstanding pings, oldest first
        self._next_ping = 1
        self._credit: dict[int, SmuxRecord] = {}  # handle -> stream with a UPD due
        self._granted = 0  # receive windows of live streams, summed (max_session_memory)
        # Version 2: what is in flight over all streams, within half the peer's session
        # buffer (SmuxOptions.peer_buffer); streams it held back, told when it frees.
        self._shared = SharedSendLimit(self.options.peer_buffer // 2) if version == 2 else None
        self._held_back: set[int] = set()

    @property
    def ready(self) -> bool:
        """smux has no handshake."""
        return True

    def data_to_send(self) -> list[BytesLike]:
        """Return (and forget) the byte chunks to write, in order; UPDs due go last, one per
        stream, and none for a stream whose FIN arrived since."""
        if self._credit:
            out = self._out
            channels = self._channels
            for record in self._credit.values():
                if not record.remote_end and record.handle in channels:
                    out.append(wire.encode_upd(2, record.wire_id, record.acked, record.window))
            self._credit.clear()
        return super().data_to_send()

    @property
    def has_output(self) -> bool:
        """Whether :meth:`data_to_send` has anything."""
        return bool(self._out or self._credit)

    # -- receiving ---------------------------------------------------------------------------

    def _receive(self, data: bytes, runs: DataRuns) -> None:
        by_wire = self._by_wire
        receiving = TRANSITIONS.receiving
        frames = self._decoder.feed(data)
        for cmd, stream_id, body in frames:
            if cmd == Cmd.PSH:
                record = by_wire.get(stream_id)
                if record is None:
                    self._check_known(stream_id, "PSH")
                    continue  # gone: dropped
                if record.state not in receiving and self._step(record, Input.RECV_DATA) is None:
                    continue
                n = len(body)
                if n:
                    recv = record.recv
                    if recv is not None and not recv.received(n):
                        raise self._overrun(record, n)
                    runs.add(record, body, n)
                continue
            runs.flush()
            self._on_frame(cmd, stream_id, body, runs.events)
        if frames and self._pings:
            # Any whole frame is the peer's sign of life: nothing answers a NOP.
            runs.flush()
            runs.events.extend(PingAcked(opaque) for opaque in self._pings)
            self._pings.clear()

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """From the frames' 8-byte headers."""
        return self._decoder.whole_frames(data, start, most)

    def _unfinished_input(self) -> tuple[int, str]:
        where = self._decoder.partial_stream()
        return self._decoder.pending, "frame" if where is None else f"frame on stream {where}"

    def _on_frame(self, cmd: int, stream_id: int, body: BytesLike, events: list[Event]) -> None:
        if cmd == Cmd.NOP:
            self.peer_pings += 1  # its keepalive: the session measures how often it comes
            return
        if cmd == Cmd.SYN:
            self._on_syn(stream_id, events)
            return
        record = self._by_wire.get(stream_id)
        if record is None:
            self._check_known(stream_id, Cmd(cmd).name)
            return  # a stream that is gone: dropped
        if cmd == Cmd.FIN:
            self._recv_end(record, events)
            return
        # UPD (the decoder lets it through in version 2 only)
        consumed, window = wire.decode_upd(body)
        send = record.send
        was_blocked = send.available == 0
        delta = (consumed - record.peer_consumed) & _MASK
        if not send.release(delta):
            raise self._error(
                f"UPD on stream {stream_id} says {delta} more bytes were consumed, "
                f"but {send.in_flight} were in flight"
            )
        record.peer_consumed = consumed
        record.heard = True
        # An absolute window that may also shrink (no arithmetic: the peer's value).
        send.window = window
        if was_blocked and send.available:
            events.append(CreditAvailable(record.handle))
        shared = self._shared
        if shared is not None and delta:
            shared.release(delta)
            self._wake_held_back(events)

    def _on_syn(self, stream_id: int, events: list[Event]) -> None:
        if (stream_id % 2 == 1) == self.is_client:
            raise self._error(
                f"SYN for stream {stream_id}, an id of our parity (the client opens odd ids, the server even)"
            )
        if stream_id in self._by_wire:
            raise self._error(f"SYN for stream {stream_id}, which is already open")
        self._peer_max = max(self._peer_max, stream_id)
        record = self._new_record(stream_id, local=False)
        events.append(ChannelOpened(record.handle, record.name))

    def _check_known(self, stream_id: int, what: str) -> None:
        """A frame for ``stream_id``, which is not live: fine if it was open once (the frame
        raced with our FIN, or followed the peer's), a protocol error if it never was."""
        ours = (stream_id % 2 == 1) == self.is_client
        if stream_id >= self._next_id if ours else stream_id > self._peer_max:
            raise self._error(f"{what} frame for stream {stream_id}, which was never opened")

    # -- commands ----------------------------------------------------------------------------

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Open a stream (SYN; in version 2 also our window, if it is not the 256 KiB the
        peer assumes); usable at once. ``name`` stays local and ``extra`` is ignored: smux
        carries neither names nor metadata."""
        stream_id = self._next_id
        if stream_id > _MASK:
            raise RuntimeError(f"{self.format}: stream ids are exhausted (ids are 32-bit)")
        self._next_id += 2
        record = self._new_record(stream_id, local=True, name=name)
        self._out.append(wire.encode_header(self.version, Cmd.SYN, stream_id))
        self._announce(record)
        return record.handle

    def _on_accept(self, record: SmuxRecord) -> None:
        """Accepting an incoming stream: nothing on the wire but, in version 2, our window."""
        self._announce(record)

    def _on_reject(self, record: SmuxRecord, previous: ChannelState) -> None:
        """Refusing an incoming stream: FIN (smux has no reset)."""
        self._fin(record)

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue PSH frames of at most :attr:`max_frame` bytes (views of ``data``)."""
        record = self._writable(channel)
        total = run_size(data, more)
        record.send.consume(total)
        if self._shared is not None:
            self._shared.consume(total)
        if total:
            sid, version = record.wire_id, self.version
            self._queue_frames(
                record, data, more, total, lambda size: wire.encode_header(version, Cmd.PSH, sid, size)
            )

    def _send_end(self, record: SmuxRecord) -> None:
        """Half-close: FIN (the stream is gone once the peer's FIN came too)."""
        self._fin(record)

    def _send_reset(self, record: SmuxRecord, previous: ChannelState, message: str | None) -> None:
        """End the stream abnormally: smux has no reset (nor a message), so FIN unless sent
        already; what the peer sends on it afterwards is dropped."""
        if not previous.local_end:
            self._fin(record)

    def send_credit(self, channel: int) -> int:
        """Bytes that may be sent on ``channel`` now: its window, and in version 2 also
        the session-wide limit (see :class:`~polymux.engine.flow.SharedSendLimit`)."""
        credit = super().send_credit(channel)
        shared = self._shared
        if shared is None or credit <= 0:
            return credit
        record = self._channels[channel]
        send = record.send
        # Half the window the peer announced, or before its first UPD (sent at its first
        # read) one frame: enough to make it acknowledge.
        half = (send.window or 0) // 2 if record.heard else self.max_frame
        allowed = shared.allows(credit, send.in_flight, half)
        if allowed <= 0:
            self._held_back.add(channel)
        return allowed

    def _wake_held_back(self, events: list[Event]) -> None:
        """The session-wide limit freed room: the streams it held back may try again."""
        if self._held_back:
            events.extend(CreditAvailable(handle) for handle in self._held_back if handle in self._channels)
            self._held_back.clear()

    def ack_consumed(self, channel: int, n: int) -> None:
        """Version 2: return credit (a UPD) once enough is consumed. Version 1: nothing."""
        due = self._credit_due(channel, n)
        if due is not None:
            record, credit = due
            recv = record.recv
            assert recv is not None
            record.acked += credit
            self._credit[channel] = record
            if recv.window > record.window:
                # A window below the 256 KiB the peer starts with: what it may have sent on
                # that guess shrinks as we acknowledge, down to our window.
                recv.window = max(record.window, wire.INITIAL_PEER_WINDOW - record.acked)

    def heartbeat(self) -> bool:
        """A NOP, with no ping waiting for what follows it: the regular keepalive of
        xtaci's (its NOP every ``KeepAliveInterval``), which the session sends so that its
        peer sees one every interval (our keepalive pings alone come every other one)."""
        self._out.append(wire.encode_header(self.version, Cmd.NOP, 0))
        return True

    def ping(self) -> int:
        """Send a NOP; returns an opaque value. Nothing answers a NOP: the next whole frame
        from the peer acknowledges it (:class:`~polymux.engine.events.PingAcked`)."""
        opaque = self._next_ping
        self._next_ping += 1
        self._pings.append(opaque)
        self._out.append(wire.encode_header(self.version, Cmd.NOP, 0))
        return opaque

    # -- helpers -----------------------------------------------------------------------------

    def _new_record(self, stream_id: int, *, local: bool, name: str = "") -> SmuxRecord:
        recv: ReceiveWindow | None = None
        send = SendCredit(None)
        window = 0
        if self.version == 2:
            # Half the session's memory budget for the windows (the other half is for what
            # we write), so that a peer that keeps to them never makes the session stop
            # reading: the credit that lets our own writes go comes in by reading.
            config = self.config
            window = budget_window(config.receive_window, config.max_session_memory // 2, self._granted)
            self._granted += window
            threshold = default_ack_threshold(window, config.ack_min)
            # Until it hears from us the peer may have 256 KiB in flight, whatever our window.
            recv = ReceiveWindow(max(window, wire.INITIAL_PEER_WINDOW), threshold)
            send = SendCredit(wire.INITIAL_PEER_WINDOW)
        return self._create(
            SmuxRecord,
            stream_id,
            local=local,
            name=name or str(stream_id),
            send=send,
            recv=recv,
            window=window,
        )

    def _announce(self, record: SmuxRecord) -> None:
        """Version 2: tell the peer our window when it is not the one it assumes."""
        if record.recv is not None and record.window != wire.INITIAL_PEER_WINDOW:
            self._out.append(wire.encode_upd(2, record.wire_id, record.acked, record.window))

    def _fin(self, record: SmuxRecord) -> None:
        self._out.append(wire.encode_header(self.version, Cmd.FIN, record.wire_id))

    def _release(self, record: SmuxRecord) -> None:
        self._credit.pop(record.handle, None)
        self._granted -= record.window
        self._held_back.discard(record.handle)
        if self._shared is not None and record.send.in_flight:
            # Gone: what it had in flight no longer fills the peer's buffer.
            self._shared.release(record.send.in_flight)
            record.send.in_flight = 0

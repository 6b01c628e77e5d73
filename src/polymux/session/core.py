"""The sans-I/O session core: everything a multiplexed session decides, with no I/O.

:class:`SessionCore` sits on a format's engine (:mod:`polymux.engine`) and owns what is
common to every format and every I/O flavour:

* the channel table, and what each channel has written and not yet sent;
* the fair send scheduler: the engine's control frames first, then one frame per channel
  in round-robin order among channels with data and credit, up to ``batch_bytes``;
* credit accounting for what the application consumed;
* offers: the offer filter, ``max_channels`` / ``max_inbound_channels``, the accept
  backlog, the open rate (a token bucket charged per open as it is read), names;
* the bounds of SECURITY.md: the memory budget (``max_session_memory``), queued control
  frames (``max_queued_control``), ``send_timeout``, the slow-reader policy;
* deadlines: keepalive, idle, handshake (or a server's first frame), stream-open,
  channel-close, slow-reader reset.

Call order (as in h11, h2 and aioquic): feed it what happened (:meth:`receive_data`,
:meth:`receive_eof`, application calls such as :meth:`write` or :meth:`consumed`, and
:meth:`handle_timer` at :meth:`next_deadline`), then act on :meth:`events` and write
:meth:`data_to_send` while the socket takes it. Time is always passed in; the core never
reads a clock. Drivers: :mod:`polymux.aio` (asyncio) and :mod:`polymux.anyio`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine import Engine, events as ev
from polymux.exceptions import (
    ChannelClosedError,
    ChannelOverflow,
    ChannelRejected,
    ChannelReset,
    FormatMismatch,
    LimitExceeded,
    PolymuxError,
    ProtocolError,
    SessionClosed,
)
from polymux.session import events as ce
from polymux.sniff import identify, show


__all__ = ["NoRoomToOpen", "SessionCore"]

_COALESCE = 64 * 1024
"""Writes smaller than this are joined into one chunk when sent; larger ones go as views."""

# Why reading from the peer is paused (bits of SessionCore._read_block); reading resumes
# only once every reason is gone.
_SLOW_READER = 1
"""A channel's reader is full and the format has no credit to withhold (``slow_reader``)."""
_CONTROLS = 2
"""omnistreams: too many control messages unread by the application."""
_BACKLOG = 4
"""Replies cannot be written (the peer does not read): ``max_queued_control``."""
_BUDGET = 8
"""The session holds ``max_session_memory`` (unread bytes, and unsent bytes while the
socket takes nothing). Only what the application or the peer can bring down counts: a
Streamux response held until its request ends is bounded by the format's own limits
(``streamux_response_hold``, ``streamux_hold_budget``), since only reading ends the request."""
_STALLED = _BACKLOG | _BUDGET

# What the memory budget counts (SessionCore._hold / _release).
_UNREAD = 0
_UNSENT = 1
_HOLDING = 2

_MAX_UNREAD_CONTROLS = 1024
"""Control messages (omnistreams) held unread before the session stops reading."""

_EARLY = 4096
"""A violation in a read that starts within the peer's first this many bytes means that the
peer probably speaks another protocol: :class:`FormatMismatch`."""
_FIRST_BYTES = 64
"""The peer's first bytes kept for that diagnosis."""


def _mismatch(fmt: str, error: ProtocolError, first: bytes) -> ProtocolError:
    """``error`` (a violation in the peer's first bytes ``first``) as the diagnosis it is:
    a :class:`FormatMismatch` saying what the peer sent and, where the bytes tell, what it
    is. A more precise error (a flow-control overrun, a failed negotiation: each needs
    bytes of the format) stays what it is."""
    if type(error) is not ProtocolError:
        return error
    foreign = identify(first)
    if foreign is not None:
        detail = (
            f"the peer speaks {foreign.name}, not {fmt}: it sent {foreign.what}, so it is "
            f"{foreign.peer} (as {fmt}: {error.detail})"
        )
    else:
        detail = (
            f"the peer's first bytes are not {fmt}: it probably speaks another protocol or "
            f"another multiplexing format (it sent {show(first)}; as {fmt}: {error.detail})"
        )
    mismatch = FormatMismatch(fmt, detail, first, foreign.name if foreign else None)
    mismatch.__cause__ = error
    return mismatch


_BUSY_READ = 64 * 1024
"""A socket read at least this large means the peer had more queued: it is busy, not dead
(keepalive waits longer for an answer that sits behind what it sent)."""

STALL_TIMEOUT_WITHOUT_CREDIT = 120.0
"""The default ``stall_timeout`` of formats without credit on the wire (mstream-v1, mplex,
multiplex, Streamux, smux version 1): there a peer stops reading to slow us down, so a
peer that takes none of our bytes for a while is applying backpressure, not dead."""

# Per-channel deadlines (SessionCore._timers entries).
_OPEN = 0  # stream_open_timeout: the peer never acknowledged our open
_CLOSE = 1  # close_timeout: a close()d channel whose peer never ended it
_OVERFLOW = 2  # slow_reader_timeout: a full channel held the connection too long

_QUANTUM = 64 * 1024
"""Bytes a channel may send per scheduler turn while others wait (at least one frame):
fair at that grain, and consecutive frames of one channel merge on receive."""

_NO_DEQUE: deque[BytesLike] = deque()
"""Shared, always empty: a channel's write queue until it first needs one (an empty deque
costs ~600 bytes, and a session may hold 100,000 idle channels)."""


class NoRoomToOpen(LimitExceeded):
    """``max_unacked_opens`` of our opens await acknowledgement: wait for
    :class:`~polymux.session.events.RoomToOpen` and try again."""


OfferFilter = Callable[[str], bool]


class CoreChannel:
    """What the core knows about one channel (the driver keeps the reader side)."""

    __slots__ = (
        "accepted",
        "buf",
        "buffered",
        "closing",
        "eof_requested",
        "eof_sent",
        "handle",
        "held",
        "high",
        "holding",
        "label",
        "lingering",
        "local",
        "low",
        "name",
        "paused",
        "queued",
        "read_closed",
        "reading_paused",
        "remote_ended",
        "slow",
        "slow_since",
        "unconsumed",
    )

    def __init__(self, handle: int, name: str, label: str, local: bool, high: int, low: int) -> None:
        self.handle = handle
        self.high = high  # the writer's high-water mark (drain() blocks above it) ...
        self.low = low  # ... and its low-water mark (drain() resumes at it)
        self.name = name
        self.label = label
        self.local = local
        self.accepted = False
        self.buf: deque[BytesLike] = _NO_DEQUE
        self.buffered = 0  # written by the application, not yet handed to the engine
        self.eof_requested = False
        self.eof_sent = False
        self.queued = False  # in the scheduler's ready queue
        self.paused = False  # the writer's drain() blocks
        self.held = False  # paused by the session's unsent budget (in _held_writers)
        self.holding = False  # the format holds its unsent bytes back (Engine.may_hold)
        self.unconsumed = 0  # received, not yet consumed by the application
        self.remote_ended = False
        self.read_closed = False  # close(): what still arrives is dropped (credit returned)
        self.reading_paused = False  # plain protocols: pause_reading()
        self.slow = False  # holding the connection (slow-reader policy)
        self.slow_since = 0.0
        self.closing = False  # close() was called
        self.lingering = False  # done for the driver; the engine waits for the peer's end


class SessionCore:
    """One multiplexed session, sans I/O (see the module docstring).

    Args:
        engine: the format's engine (already created with ``config``).
        config: the session's limits and tuning.
        now: the current time (seconds, any monotonic clock the driver keeps using).
        offer_filter: ``offer_filter(name) -> bool`` accepts or refuses the peer's offers.
        has_handler: the driver runs a handler per incoming channel (no accept backlog).
        first_frame_deadline: the peer must speak first (a server's accepted connection):
            on formats with no handshake too, it must send a whole frame within
            ``handshake_timeout`` of the connection, or the session ends. A channel we open
            lifts the deadline (the peer may then only listen).
    """

    def __init__(
        self,
        engine: Engine,
        config: SessionConfig,
        now: float,
        *,
        offer_filter: OfferFilter | None = None,
        has_handler: bool = False,
        first_frame_deadline: bool = False,
    ) -> None:
        self.engine = engine
        self.config = config
        self.format = engine.format
        self._offer_filter = offer_filter
        self._has_handler = has_handler
        self._events: list[ce.CoreEvent] = []
        self.channels: dict[int, CoreChannel] = {}
        self._ready_queue: deque[CoreChannel] = deque()
        self._inbound = 0  # live channels the peer opened
        self._untaken = 0  # incoming channels not yet taken by the application
        self._handlers = 0  # channel handlers still running (a reset channel's too)
        self._open_tokens = max(1.0, config.inbound_channel_rate)
        self._open_stamp = now
        self._now = now
        # Ending.
        self.error: BaseException | None = None
        """Why the session ended, once it has (a clean end leaves ``None`` until
        :meth:`connection_lost`)."""
        self.failed = False
        """The session ended because of an error, not a clean close."""
        self.closing = False
        """No new channels (aclose() was called, or the session failed)."""
        self.peer_goaway: str | None = None
        """The peer's go-away, once it sent one."""
        self.lost = False
        self._peer_received = 0  # bytes from the peer, counted up to _EARLY
        self._peer_first = b""  # its first _FIRST_BYTES bytes
        # Reading and writing the socket.
        self._read_block = 0
        self._read_pausers = 0
        self._write_paused = False
        self._socket_unsent = 0  # what the driver last told of the socket's unsent bytes
        # The memory budget (max_session_memory). _held: bytes received and not yet
        # consumed by the application, plus bytes written and not yet sent, counted per
        # channel up to twice its high-water mark (an application that ignores drain()
        # owns the rest); over the budget, reading stops. _unsent: all unsent bytes; over
        # half the budget, every writer's drain() blocks.
        budget = config.max_session_memory
        self._held = 0  # what counts now: unread + holding (+ unsent while the socket is paused)
        self._unread = 0  # received, not yet consumed by the application
        self._unsent_counted = 0  # unsent, counted per channel up to twice its high-water mark
        self._holding = 0  # unsent bytes the format holds back (Engine.may_hold): not in _held
        self._hold_limit, self._hold_resume = budget, budget * 3 // 4
        self._unsent = 0
        self._unsent_limit, self._unsent_resume = budget // 2, budget // 4
        self._unsent_cap = 2 * config.write_buffer_high
        self._high = config.write_buffer_high
        self._low = config.low_water
        self._held_writers: set[CoreChannel] = set()
        # Deadlines. Per channel: a heap of (when, kind, handle), checked lazily.
        self._timers: list[tuple[float, int, int]] = []
        self._open_pending: set[int] = set()  # our opens the peer has not acknowledged
        self._ready = engine.ready
        # handshake_timeout: the peer's handshake is due (formats with one), or on a server's
        # accepted connection of a format without one, its first whole frame.
        self._first_frame_due = first_frame_deadline and self._ready
        self._heard = False  # a whole frame came from the peer
        self._handshake_at: float | None = (
            now + config.handshake_timeout if not self._ready or self._first_frame_due else None
        )
        self._last_activity = now  # last whole frame received, or last channel gone
        self._last_busy = -1e9  # last full socket read
        self._stall_at: float | None = None
        self._stall_mark = 0
        # Pings: ours and the keepalive's. opaque -> time sent.
        self._pings: dict[int, float] = {}
        self._keepalive = engine.has_ping and config.keepalive_interval is not None
        self._ping_due: float | None = None
        self._ka_opaque: int | None = None
        self._ka_deadline = 0.0
        # Liveness judges the peer only on what it has had a chance to answer: our ping
        # must have left our buffers (_ka_offset: where it ends in what we wrote; taken
        # once _bytes_out - unsent reaches it), and we must be reading (_ka_unread: reading
        # was paused since the last check).
        self._bytes_out = 0  # bytes data_to_send() returned, in all
        self._ka_offset: int | None = None
        self._ka_taken_at: float | None = None  # when the ping was seen out of our buffers
        self._ka_mark = 0  # bytes the peer had taken at the last sign of progress ...
        self._ka_progress_at = 0.0  # ... and when
        self._ka_unread = False
        self._ka_writable = False  # the socket took bytes from the keepalive ping on
        self._ka_peer_pings = 0  # the peer's pings when ours went out (formats without credit)
        self._credit = engine.has_flow_control
        self._heartbeat_at: float | None = None
        # omnistreams control messages not yet taken by the application.
        self._controls: deque[bytes] = deque()

    def connection_made(self, now: float) -> None:
        """The connection is up: the clocks start (and, without a handshake, the session is
        ready: a first ping measures the round-trip time)."""
        self._now = self._open_stamp = self._last_activity = now
        if not self._ready:
            self._handshake_at = now + self.config.handshake_timeout
        else:
            self._on_ready(now)
            if self._first_frame_due:
                self._handshake_at = now + self.config.handshake_timeout

    @property
    def peer_silent(self) -> bool:
        """Whether no whole frame has come from the peer yet (not even its handshake): a
        full server sheds such connections first."""
        return not self._heard

    # -- the driver's side: events, output, deadlines ----------------------------------------

    def events(self) -> list[ce.CoreEvent]:
        """Return (and forget) what happened since the last call, in order."""
        out, self._events = self._events, []
        return out

    @property
    def reading(self) -> bool:
        """Whether the driver should read from the peer now (False: pause reading)."""
        return not self._read_block

    @property
    def has_output(self) -> bool:
        """Whether :meth:`data_to_send` would return anything (without a scheduler turn)."""
        return bool(self._ready_queue) or self.engine.has_output

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must next be called (``None``: no deadline)."""
        deadlines = [self._handshake_at, self._stall_at, self._ping_due, self._heartbeat_at]
        if self._ka_opaque is not None:
            deadlines.append(self._ka_deadline)
        timeout = self.config.idle_timeout
        if timeout is not None and not self.channels and self.error is None:
            deadlines.append(self._last_activity + timeout)
        if self._timers:
            deadlines.append(self._timers[0][0])
        due = [d for d in deadlines if d is not None]
        return min(due) if due else None

    def data_to_send(self) -> list[BytesLike]:
        """The next batch of bytes to write (empty: nothing now): the engine's control frames
        first, then channel data round robin, at most ``batch_bytes`` of it. Call it again
        while it returns something and the socket is not paused."""
        engine = self.engine
        if self.lost:
            return []
        if self.failed:
            return engine.data_to_send()  # the last words (a go-away), no more data
        out = engine.data_to_send()
        if self._ka_opaque is not None and self._ka_offset is None and out:
            # The keepalive ping goes out now (control frames come first): it is taken
            # once everything up to here has left our buffers.
            self._ka_offset = self._bytes_out + sum(map(len, out))
            if self._ka_writable:
                self._ka_taken_at = self._now  # provisional: the timer checks the socket
        ready = self._ready_queue
        if ready:
            turn = max(engine.max_frame, _QUANTUM)
            batch_limit = self.config.batch_bytes
            size = 0
            while ready and size < batch_limit:
                channel = ready.popleft()
                channel.queued = False
                # Round robin, up to a quantum per turn while others wait (a run of frames
                # of one channel: the receiver takes it as one event and one wake-up); a
                # channel alone may fill the batch.
                quantum = turn if ready else batch_limit - size
                size += self._send_turn(channel, quantum)
                if self._wants_send(channel):
                    channel.queued = True
                    ready.append(channel)
            out += engine.data_to_send()
        if out:
            self._bytes_out += sum(map(len, out))
        if self._read_block & _BACKLOG and not self._write_paused:
            self._block_reading(_BACKLOG, False)
        return out

    def socket_paused(self, paused: bool, unsent: int) -> None:
        """The socket stopped (or resumed) taking our bytes; ``unsent``: its buffered bytes."""
        self._write_paused = paused
        self._socket_unsent = unsent
        if paused:
            self._ka_writable = False
        self._check_budget()  # unsent bytes count while the socket is paused
        if paused:
            self._arm_stall(unsent)

    def handle_timer(self, now: float, unsent: int = 0) -> None:
        """Act on the deadlines that are due at ``now`` (``unsent``: the socket's buffered
        bytes, to tell a slow reader from one that reads nothing)."""
        self._now = now
        self._socket_unsent = unsent
        if self.lost or self.failed:
            return
        if self._handshake_at is not None and now >= self._handshake_at:
            self._handshake_at = None
            what = "not one whole frame" if self._first_frame_due else "no handshake"
            self._fail(
                SessionClosed(
                    f"{self.format}: {what} from the peer within "
                    f"{self.config.handshake_timeout:g} s (handshake_timeout)"
                )
            )
            return
        if self._stall_at is not None and now >= self._stall_at:
            self._check_stall(now, unsent)
            if self.failed:
                return
        if self._ka_opaque is not None and now >= self._ka_deadline:
            self._check_keepalive(now, unsent)
            if self.failed:
                return
        if self._ping_due is not None and now >= self._ping_due and self._ka_opaque is None:
            self._ping_due = None
            if self._ready and not self.closing:
                self._keepalive_ping(now, unsent)
        if self._heartbeat_at is not None and now >= self._heartbeat_at:
            self._heartbeat(now)
        timeout = self.config.idle_timeout
        if self._read_block:
            # Not reading: nothing the peer sent can be seen; idleness counts from when we read.
            self._last_activity = max(self._last_activity, now)
        if (
            timeout is not None
            and not self.channels
            and self.error is None
            and now - self._last_activity >= timeout
        ):
            self.error = SessionClosed(
                f"{self.format}: closed after {timeout:g} s with no channels and no frame received "
                "(idle_timeout)"
            )
            self.closing = True
            if not self.engine.closed:
                self.engine.close()  # a go-away where the format has one
            self._events.append(ce.Failed(self.error))
            return
        timers = self._timers
        while timers and timers[0][0] <= now:
            _when, kind, handle = heapq.heappop(timers)
            channel = self.channels.get(handle)
            if channel is not None:
                self._channel_timer(kind, channel)

    # -- the peer's side -----------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes from the peer. Then take :meth:`events` and write :meth:`data_to_send`."""
        if self.error is not None and self.failed:
            return
        self._now = now
        engine = self.engine
        engine.now = now
        early = self._peer_received < _EARLY
        if early:  # the peer's first bytes: kept to tell a peer of another protocol
            self._peer_received += len(data)
            if len(self._peer_first) < _FIRST_BYTES:
                self._peer_first += bytes(data[: _FIRST_BYTES - len(self._peer_first)])
        try:
            events = engine.receive_data(data)
        except ProtocolError as exc:
            self._fail(_mismatch(self.format, exc, self._peer_first) if early else exc)
            return
        if events or engine.has_output:
            # Whole frames arrived (bytes of a frame that never ends do not count).
            self._last_activity = now
            self._heard = True
            if self._first_frame_due:
                self._first_frame_due = False
                self._handshake_at = None
            if len(data) >= _BUSY_READ:
                self._last_busy = now
        for event in events:
            if self.failed:
                break  # the session ended on an earlier event of this read (an open too many)
            self._on_event(event)
        if self._write_paused and engine.queued_frames > self.config.max_queued_control:
            # The peer sends frames that need answers and does not read them.
            self._block_reading(_BACKLOG, True)

    def receive_eof(self) -> None:
        """The peer closed its side of the connection: the session is over (the driver
        then reports :meth:`connection_lost`)."""
        self.closing = True
        try:
            self.engine.receive_eof()
        except ProtocolError as exc:  # the connection ended inside a frame
            if self.error is None:
                early = 0 < self._peer_received < _EARLY  # all it ever sent: a few bytes
                self.error = _mismatch(self.format, exc, self._peer_first) if early else exc
                self.failed = True

    def connection_lost(self, exc: BaseException | None) -> None:
        """The connection is gone: every channel finishes (events follow)."""
        if self.lost:
            return
        self.lost = True
        self.closing = True
        self.engine.closed = True
        if self.error is not None:
            cause: BaseException | None = self.error
            error = SessionClosed(f"{self.format}: session ended: {self.error}")
        elif exc is not None:
            cause = exc
            error = SessionClosed(f"{self.format}: connection lost: {exc}")
            self.failed = True
        else:
            cause = None
            error = SessionClosed(f"{self.format}: the session's connection was closed")
        error.__cause__ = cause
        if self.error is None:
            self.error = error
        for channel in list(self.channels.values()):
            if channel.remote_ended:
                # What the peer sent before its end stays readable; only writing fails.
                self._finish(channel, None, write_error=error)
            else:
                self._finish(channel, error)
        self._pings.clear()
        self._timers.clear()
        self._held_writers.clear()
        self._stall_at = self._handshake_at = self._ping_due = self._heartbeat_at = None
        self._ka_opaque = None
        self._events.append(ce.RoomToOpen(everyone=True))

    # -- the application's side: the session -------------------------------------------------

    def check_open(self) -> None:
        """Raise :class:`SessionClosed` unless new channels may be opened now."""
        if self.error is not None and (self.failed or self.lost):
            raise SessionClosed(f"{self.format}: the session is closed") from self.error
        if self.closing:
            raise SessionClosed(f"{self.format}: the session is closing")
        if self.peer_goaway is not None or not self.engine.can_open:
            raise SessionClosed(f"{self.format}: no new channels: {self.peer_goaway or 'we are going away'}")

    def open_channel(self, name: str = "", metadata: Mapping[str, Any] | None = None) -> int:
        """Open (offer) a channel; return its handle. An :class:`~ce.Accepted` event follows
        once the peer accepted it (formats whose opens are usable at once: at once).

        Raises :class:`SessionClosed`, :class:`LimitExceeded`, or :class:`NoRoomToOpen`
        (wait for :class:`~ce.RoomToOpen`)."""
        self.check_open()
        config = self.config
        engine = self.engine
        if len(self.channels) >= config.max_channels:
            raise LimitExceeded(f"{self.format}: max_channels={config.max_channels} channels are open")
        if len(self.channels) - self._inbound >= config.max_outbound_channels:
            raise LimitExceeded(
                f"{self.format}: max_outbound_channels={config.max_outbound_channels} channels are open"
            )
        if engine.open_acknowledged and len(self._open_pending) >= config.max_unacked_opens:
            raise NoRoomToOpen(
                f"{self.format}: max_unacked_opens={config.max_unacked_opens} opened channels await the "
                "peer's acknowledgement"
            )
        try:
            handle = engine.open_channel(name, extra=metadata)
        except RuntimeError as exc:  # e.g. every request id in flight (Streamux)
            raise LimitExceeded(str(exc)) from None
        channel = CoreChannel(
            handle, engine.channel_name(handle), engine.describe(handle), True, self._high, self._low
        )
        self.channels[handle] = channel
        if self._first_frame_due:  # the application uses the session: the peer may only listen
            self._first_frame_due = False
            self._handshake_at = None
        if not engine.needs_acceptance:  # usable at once (mplex, yamux)
            channel.accepted = True
            if engine.open_acknowledged:
                self._open_pending.add(handle)
                self._add_timer(self._now + config.stream_open_timeout, _OPEN, handle)
        return handle

    def ping(self, now: float, *, by_application: bool = True) -> int:
        """Send a ping; a :class:`~ce.PingAnswered` event follows. Formats without pings
        raise :class:`PolymuxError`, and so do formats whose ping nothing answers (smux's
        NOP) when the application asks: there is no round trip to measure."""
        if not self.engine.has_ping or (by_application and not self.engine.ping_answered):
            raise PolymuxError(f"{self.format} has no ping (nothing answers its keepalive)")
        self.engine.now = now
        opaque = self.engine.ping()
        self._pings[opaque] = now
        return opaque

    def forget_ping(self, opaque: int) -> None:
        """The application stopped waiting for this ping's answer."""
        self._pings.pop(opaque, None)

    def send_control(self, data: bytes) -> None:
        """Send a control message (omnistreams)."""
        if self.error is not None and (self.failed or self.lost):
            raise SessionClosed(f"{self.format}: the session is closed") from self.error
        self.engine.send_control(data)

    def take_control(self) -> bytes | None:
        """The oldest control message not yet taken, or ``None``."""
        if not self._controls:
            return None
        data = self._controls.popleft()
        if self._read_block & _CONTROLS and len(self._controls) <= _MAX_UNREAD_CONTROLS // 2:
            self._block_reading(_CONTROLS, False)
        return data

    def close(self) -> None:
        """Graceful close: no new channels, and a go-away where the format has one."""
        self.closing = True
        self.engine.close()

    def fail(self, error: BaseException) -> None:
        """End the session because of ``error`` (a :class:`~ce.Failed` event follows)."""
        self._fail(error)

    def unsent(self) -> bool:
        """Whether any channel still has data (or its end) to send."""
        return any(
            (ch.buffered or (ch.eof_requested and not ch.eof_sent)) and not ch.lingering
            for ch in self.channels.values()
        )

    def handler_started(self) -> None:
        """A channel handler began (counted until it returns: Rapid Reset)."""
        self._handlers += 1

    def handler_finished(self) -> None:
        self._handlers -= 1

    def taken(self, handle: int) -> None:
        """The application took an incoming channel (``accept_channel``): the backlog shrinks."""
        self._untaken -= 1

    # -- the application's side: one channel -------------------------------------------------

    def write(self, handle: int, data: BytesLike) -> bool:
        """Queue ``data`` (the core keeps a reference: bytes, or a read-only view of
        bytes). Returns True when the writer must pause now (``drain()`` blocks); a
        :class:`~ce.WriteResumed` event says when it may go on."""
        channel = self.channels[handle]
        buf = channel.buf
        if buf is _NO_DEQUE:
            buf = channel.buf = deque()
        buf.append(data)
        n = len(data)
        old = channel.buffered
        channel.buffered = new = old + n
        self._unsent += n
        cap = self._unsent_cap
        if channel.holding:
            self._hold(n, _HOLDING)
            if self._may_hold(channel):  # within the format's limits (else it was reset)
                return False
        elif old < cap:
            self._hold(min(new, cap) - old, _UNSENT)
        if not channel.queued and channel.accepted:
            channel.queued = True
            self._ready_queue.append(channel)
        if not channel.paused and (new > channel.high or self._unsent - self._holding > self._unsent_limit):
            # Over our own high-water mark, or the session holds half its memory budget
            # in unsent bytes (held responses apart: the format bounds those).
            if self._may_hold(channel):
                return False
            channel.paused = True
            if new <= channel.high:
                self._hold_writer(channel)
            return True
        return False

    def set_write_limits(self, handle: int, high: int, low: int) -> bool | None:
        """Set a channel's own high/low-water marks; returns the new pause state if it
        changed (True: pause; a resume comes as a :class:`~ce.WriteResumed` event), else None."""
        channel = self.channels.get(handle)
        if channel is None:
            return None
        channel.high, channel.low = high, low
        return self._update_pause(channel)

    def write_limits(self, handle: int) -> tuple[int, int]:
        """A channel's ``(low, high)`` water marks."""
        channel = self.channels.get(handle)
        if channel is None:
            return self._low, self._high
        return channel.low, channel.high

    def write_eof(self, handle: int) -> None:
        """Half-close once the queued data is sent."""
        channel = self.channels.get(handle)
        if channel is None or channel.eof_requested:
            return
        channel.eof_requested = True
        if not channel.queued and channel.accepted:
            channel.queued = True
            self._ready_queue.append(channel)

    def close_channel(self, handle: int) -> None:
        """``close()``: finish writing after the queued data and stop reading (what still
        arrives is dropped, its credit returned); reset if the peer does not end its side
        within ``close_timeout``."""
        channel = self.channels.get(handle)
        if channel is None or channel.closing:
            return
        channel.closing = True
        channel.read_closed = True
        if channel.unconsumed:
            n, channel.unconsumed = channel.unconsumed, 0
            self._release(n, _UNREAD)
            self._ack(channel, n)
        self._set_slow(channel, False)
        self.write_eof(handle)
        self._add_timer(self._now + self.config.close_timeout, _CLOSE, handle)

    def reset(self, handle: int, message: str | None = None) -> None:
        """Terminate the channel at once (``message`` to the peer where the format carries
        one); queued data is dropped. A :class:`~ce.Finished` event follows."""
        channel = self.channels.get(handle)
        if channel is None:
            return
        self._engine_reset(channel, message)
        self._finish(channel, None)

    def consumed(self, handle: int, n: int, now: float | None = None) -> None:
        """The application consumed ``n`` bytes of the channel: credit and budget. ``now``:
        the time, when it moved since the core last heard it (yamux tunes windows by it)."""
        if now is not None:
            self._now = now
        channel = self.channels.get(handle)
        if channel is None:
            self._ack_handle(handle, n)
            return
        n = min(n, channel.unconsumed)
        if n <= 0:
            return
        channel.unconsumed -= n
        self._release(n, _UNREAD)
        self._ack(channel, n)
        if channel.slow and channel.unconsumed <= self.config.receive_window // 2:
            self._set_slow(channel, False)

    def reader_waiting(self, handle: int) -> None:
        """The reader needs more than it holds: credit all it holds, so the peer can send the
        rest (``readexactly(n)`` with n beyond the window would deadlock otherwise)."""
        channel = self.channels.get(handle)
        if channel is None:
            return
        if channel.unconsumed:
            self.consumed(handle, channel.unconsumed)
        self._set_slow(channel, False)

    def reading_paused(self, handle: int, paused: bool) -> None:
        """A plain protocol paused (or resumed) reading its channel: with credit on the
        wire its credit is withheld by the driver; without, the connection pauses."""
        channel = self.channels.get(handle)
        if channel is None or channel.reading_paused == paused:
            return
        channel.reading_paused = paused
        if not self.engine.has_flow_control:
            if paused and self.config.slow_reader == "reset":
                self._reader_behind(channel)
            else:
                self._pause_for(channel, paused)

    # -- engine events ---------------------------------------------------------------------

    def _on_event(self, event: ev.Event) -> None:
        channels = self.channels
        if isinstance(event, ev.DataReceived):
            channel = channels.get(event.channel)
            n = event.flow_controlled_length
            if channel is None or channel.read_closed or channel.lingering:
                self._ack_handle(event.channel, n)  # dropped: keep the peer's credit flowing
                return
            channel.unconsumed += n
            self._hold(n, _UNREAD)
            self._events.append(ce.Data(event.channel, event.data, event.more, n))
            if not self.engine.has_flow_control and channel.unconsumed > self.config.receive_window:
                self._reader_behind(channel)
        elif isinstance(event, ev.CreditAvailable):
            channel = channels.get(event.channel)
            if channel is not None and not channel.queued and channel.accepted:
                channel.queued = True
                self._ready_queue.append(channel)
        elif isinstance(event, ev.ChannelOpened):
            self._on_offer(event.channel, event.name)
        elif isinstance(event, ev.ChannelAccepted):
            self._settle_open(event.channel)
            channel = channels.get(event.channel)
            # pragma below: the engine reports acceptance only of an offer it still tracks,
            # and it tracks ours exactly as long as the core does (the None test is a guard).
            if channel is not None:  # pragma: no branch
                if not channel.accepted:
                    channel.accepted = True
                    if channel.buffered or channel.eof_requested:
                        channel.queued = True
                        self._ready_queue.append(channel)
                self._events.append(ce.Accepted(event.channel))
        elif isinstance(event, ev.ChannelEnded):
            channel = channels.get(event.channel)
            if channel is not None:
                channel.remote_ended = True
                if not channel.read_closed:
                    self._events.append(ce.Ended(event.channel))
        elif isinstance(event, ev.ChannelClosed):
            channel = channels.get(event.channel)
            if channel is not None:
                write_error = (
                    None
                    if event.local_done
                    else ChannelClosedError(f"{self.format}: {channel.label} was closed by the peer")
                )
                self._finish(channel, None, write_error=write_error)
        elif isinstance(event, ev.ChannelReset):
            channel = channels.get(event.channel)
            if channel is not None:
                error = ChannelReset(self.format, channel.label, event.message)
                if not channel.accepted:
                    # No engine resets an offer it has not seen accepted (MultiplexingStream
                    # reports ChannelRejected); kept for one that would.
                    self._events.append(ce.OpenFailed(event.channel, error))  # pragma: no cover
                self._finish(channel, error)
        elif isinstance(event, ev.ChannelRejected):
            channel = channels.get(event.channel)
            # pragma below: only a pending offer of ours is rejected, and nothing else in
            # the same read can have ended it (the None test is a guard).
            if channel is not None:  # pragma: no branch
                self._events.append(
                    ce.OpenFailed(event.channel, ChannelRejected(self.format, channel.label, channel.name))
                )
                self._finish(channel, None)
        elif isinstance(event, ev.ReadingStopped):
            channel = channels.get(event.channel)
            if channel is not None:
                self._drop_unsent(channel)
                stopped = ChannelClosedError(f"{self.format}: the peer stopped reading {channel.label}")
                self._events.append(ce.WritingStopped(event.channel, stopped))
                self.write_eof(event.channel)
        elif isinstance(event, ev.SessionReady):
            # pragma below: engines report SessionReady once, and only when they were not
            # ready at the start (the test is a guard).
            if not self._ready:  # pragma: no branch
                self._on_ready(self._now)
        elif isinstance(event, ev.SessionClosed):
            # The peer's go-away: no new channels; open ones may finish. One that reports an
            # error ends the session (as hashicorp's handleGoAway does).
            self.peer_goaway = f"the peer is going away ({event.message})"
            self._events.append(ce.RoomToOpen(everyone=True))  # waiting opens fail: no new channels
            if event.code:
                self._fail(SessionClosed(f"{self.format}: the peer went away with {event.message}"))
        elif isinstance(event, ev.PingAcked):
            sent = self._pings.pop(event.opaque, None)
            if event.opaque == self._ka_opaque:
                self._ka_opaque = None
                self._ping_due = self._now + (self.config.keepalive_interval or 0.0)
            if sent is not None:
                self._events.append(ce.PingAnswered(event.opaque, max(0.0, self._now - sent)))
        elif isinstance(event, ev.ControlReceived):  # pragma: no branch (the last event type)
            self._controls.append(event.data)
            self._events.append(ce.ControlArrived())
            if len(self._controls) >= _MAX_UNREAD_CONTROLS:
                self._block_reading(_CONTROLS, True)  # bounded memory: wait for the application

    def _on_ready(self, now: float) -> None:
        self._ready = True
        self._handshake_at = None
        self._events.append(ce.Ready())
        if self.engine.has_ping:
            self.ping(now, by_application=False)  # at once: the RTT drives window tuning
            if self._keepalive:
                self._ping_due = now + (self.config.keepalive_interval or 0.0)

    def _on_offer(self, handle: int, name: str) -> None:
        engine = self.engine
        config = self.config
        # Token bucket: a peer opening channels faster than the rate is abusive. Charged for
        # every open as it is read, refused ones and ones already reset (Rapid Reset) too.
        now = self._now
        rate = config.inbound_channel_rate
        self._open_tokens = min(max(1.0, rate), self._open_tokens + (now - self._open_stamp) * rate)
        self._open_stamp = now
        if self._open_tokens < 1:
            self._fail(ProtocolError(self.format, f"the peer opens channels faster than {rate:g} per second"))
            return
        self._open_tokens -= 1
        if not engine.is_live(handle):
            return  # opened and reset (or cancelled) within the same read: nothing to take
        refuse = (
            self.closing
            or len(self.channels) >= config.max_channels
            or max(self._inbound, self._handlers) >= config.max_inbound_channels
            or len(name) > config.max_name_bytes  # characters: a fast first check
            or len(name.encode("utf-8", "surrogatepass")) > config.max_name_bytes
            or (self._offer_filter is not None and not self._offer_filter(name))
            or (not self._has_handler and self._untaken >= config.accept_backlog)
        )
        if refuse:
            engine.reject_channel(handle)
            return
        engine.accept_channel(handle)
        channel = CoreChannel(handle, name, engine.describe(handle), False, self._high, self._low)
        channel.accepted = True
        self.channels[handle] = channel
        self._inbound += 1
        if not self._has_handler:
            self._untaken += 1
        self._events.append(ce.Incoming(handle, name))

    # -- the scheduler ---------------------------------------------------------------------

    def _wants_send(self, channel: CoreChannel) -> bool:
        """Whether a scheduler turn would do anything now (exactly what ``_send_turn``
        acts on: a channel that says yes and then does nothing would spin the scheduler)."""
        if not channel.accepted or channel.lingering or self.channels.get(channel.handle) is not channel:
            return False
        if channel.buffered:
            return self.engine.send_credit(channel.handle) > 0
        return channel.eof_requested and not channel.eof_sent and self.engine.is_live(channel.handle)

    def _send_turn(self, channel: CoreChannel, quantum: int) -> int:
        """One channel's turn: at most ``quantum`` bytes (within its credit), or its end."""
        if not channel.accepted or self.channels.get(channel.handle) is not channel:
            return 0
        engine = self.engine
        handle = channel.handle
        if channel.buffered:
            credit = engine.send_credit(handle)
            if credit <= 0:
                return 0
            n = min(quantum, credit, channel.buffered)
            engine.send_data(handle, *self._take(channel, n))
            return n
        if channel.eof_requested and not channel.eof_sent and engine.is_live(handle):
            channel.eof_sent = True
            if engine.end_channel(handle):
                self._finish(channel, None)
            elif channel.closing:
                # close(): the application is done with the channel; the engine lingers
                # until the peer ends too (its data is dropped meanwhile).
                channel.lingering = True
                self._events.append(ce.Finished(handle, lingering=True))
        return 0

    def _take(self, channel: CoreChannel, n: int) -> list[BytesLike]:
        """Remove and return up to ``n`` queued bytes as parts, in order: large writes as
        they are or as views (no copy), runs of small writes joined (one copy of at most
        ``_COALESCE`` bytes). The engine frames the parts as one run, so frames are full
        however the application cut its writes."""
        buf = channel.buf
        parts: list[BytesLike] = []
        size = 0
        while buf and size < n:
            head = buf[0]
            room = n - size
            if len(head) >= _COALESCE or len(buf) == 1:
                if len(head) > room:
                    view = memoryview(head)
                    buf[0] = view[room:]
                    parts.append(view[:room])
                    size += room
                else:
                    parts.append(buf.popleft())
                    size += len(head)
                continue
            # A run of small writes, joined.
            limit = min(room, _COALESCE)
            run: list[BytesLike] = []
            got = 0
            while buf and got < limit:
                part = buf[0]
                size_ = len(part)
                if size_ >= _COALESCE:
                    break
                left = limit - got
                if size_ > left:
                    view = memoryview(part)
                    run.append(view[:left])
                    buf[0] = view[left:]
                    got = limit
                    break
                run.append(buf.popleft())
                got += size_
            parts.append(run[0] if len(run) == 1 else b"".join(run))
            size += got
        old = channel.buffered
        channel.buffered = new = old - size
        self._sent(size)
        cap = self._unsent_cap
        if channel.holding:
            # The format lets it go now (a Streamux request ended): counted as any unsent.
            channel.holding = False
            self._release(old, _HOLDING)
            self._hold(min(new, cap), _UNSENT)
        elif new < cap:
            self._release(min(old, cap) - new, _UNSENT)
        if channel.paused and new <= channel.low:
            self._update_pause(channel)
        return parts

    def _update_pause(self, channel: CoreChannel) -> bool | None:
        """Pause or resume a writer by its marks (and the session's budget); returns the
        new state when it changed."""
        if channel.paused and channel.buffered <= channel.low:
            if self._unsent - self._holding > self._unsent_limit:
                self._hold_writer(channel)  # resumes once the session's unsent bytes fall
                return None
            channel.paused = False
            self._events.append(ce.WriteResumed(channel.handle))
            return False
        if not channel.paused and channel.buffered > channel.high and not self._may_hold(channel):
            channel.paused = True
            return True
        return None

    def _may_hold(self, channel: CoreChannel) -> bool:
        """Whether the writer goes on past its high-water mark because the format holds
        the channel's bytes back itself until the peer finishes something that needs the
        application to go on (a Streamux response waits for the end of its request:
        ``Engine.may_hold``). Past the format's bound for that, the channel is reset (and
        True: nothing to pause)."""
        try:
            hold = self.engine.may_hold(channel.handle, channel.buffered)
        except LimitExceeded as exc:
            problem = str(exc).removeprefix(f"{self.format}: ")
            self._engine_reset(channel, problem)
            self._finish(channel, ChannelOverflow(f"{self.format}: {channel.label} was reset: {problem}"))
            return True
        if hold and not channel.holding:
            # Held back, it counts in full towards max_session_memory (the format's own
            # limits apply too); past the budget, the largest such channel is reset rather
            # than reading paused, which would hold back the very request it waits for.
            channel.holding = True
            self._release(min(channel.buffered, self._unsent_cap), _UNSENT)
            self._hold(channel.buffered, _HOLDING)
        return hold

    # -- bounds: reading paused, the memory budget, send_timeout ----------------------------

    def _block_reading(self, reason: int, on: bool) -> None:
        before = self._read_block
        after = before | reason if on else before & ~reason
        if after == before:
            return
        self._read_block = after
        if after and not before:
            self._ka_unread = True  # the keepalive does not judge what we did not read
            if self._keepalive and not self._credit and self._heartbeat_at is None:
                self._heartbeat_at = self._now + self._heartbeat_period()
        if on and reason & _STALLED and self._write_paused:
            self._arm_stall(self._socket_unsent)

    def _pause_for(self, channel: CoreChannel, paused: bool) -> None:
        """Without credit on the wire, the only way to stop the peer is to stop reading the
        whole connection (head-of-line blocking, as MultiplexingStream v1 does)."""
        self._read_pausers += 1 if paused else -1
        self._block_reading(_SLOW_READER, self._read_pausers > 0)

    def _set_slow(self, channel: CoreChannel, slow: bool) -> None:
        if channel.slow == slow:
            return
        channel.slow = slow
        self._pause_for(channel, slow)

    def _reader_behind(self, channel: CoreChannel) -> None:
        """The reader holds ``receive_window`` unread bytes and the format cannot slow the
        peer down: apply ``slow_reader``."""
        config = self.config
        if config.slow_reader == "reset" and config.slow_reader_timeout == 0:
            self._overflow(channel)
            return
        if channel.slow:
            return
        self._set_slow(channel, True)  # blocks the whole connection
        channel.slow_since = self._now
        if config.slow_reader == "reset":
            self._add_timer(self._now + config.slow_reader_timeout, _OVERFLOW, channel.handle)

    def _overflow(self, channel: CoreChannel) -> None:
        """slow_reader="reset": drop this channel so the others can go on."""
        config = self.config
        message = (
            f"reader fell behind: {channel.unconsumed} bytes unread"
            + (f" for {config.slow_reader_timeout:g} s" if config.slow_reader_timeout else "")
            + f" (receive_window={config.receive_window}, slow_reader='reset')"
        )
        self._engine_reset(channel, message)
        self._finish(
            channel, ChannelOverflow(f"{self.format}: {channel.label} was reset: {message}"), drop_unread=True
        )

    def _hold(self, n: int, kind: int) -> None:
        """``n`` more bytes held, of ``kind`` (_UNREAD, _UNSENT or _HOLDING)."""
        if kind == _UNREAD:
            self._unread += n
        elif kind == _UNSENT:
            self._unsent_counted += n
        else:
            self._holding += n
        self._check_budget()

    def _release(self, n: int, kind: int) -> None:
        """``n`` held bytes of ``kind`` were consumed, sent or dropped."""
        if kind == _UNREAD:
            self._unread -= n
        elif kind == _UNSENT:
            self._unsent_counted -= n
        else:
            self._holding -= n
        self._check_budget()

    def _check_budget(self) -> None:
        """Pause reading while the session holds more than max_session_memory: unread bytes,
        and unsent bytes while the socket takes nothing. Only what the application (reading)
        or the peer (taking our bytes) can bring down counts, so that reading, once paused,
        always resumes: bytes waiting for the peer's credit do not count (reading is what
        brings the credit), nor bytes the format holds until the peer ends a request
        (Streamux: reading is what ends it; the format bounds them itself)."""
        held = self._unread + (self._unsent_counted if self._write_paused else 0)
        self._held = held
        if held > self._hold_limit:
            if not self._read_block & _BUDGET:
                self._block_reading(_BUDGET, True)
        elif self._read_block & _BUDGET and held <= self._hold_resume:
            self._block_reading(_BUDGET, False)

    def _sent(self, n: int) -> None:
        self._unsent -= n
        if self._held_writers and self._unsent - self._holding <= self._unsent_resume:
            held, self._held_writers = self._held_writers, set()
            for channel in held:
                channel.held = False
                if channel.handle in self.channels:
                    self._update_pause(channel)

    def _hold_writer(self, channel: CoreChannel) -> None:
        channel.held = True
        self._held_writers.add(channel)

    def _arm_stall(self, unsent: int) -> None:
        """Start the ``send_timeout`` clock when reading is held back because the peer does
        not read what we must send it."""
        timeout = self.config.send_timeout
        if timeout is None or self._stall_at is not None or self.lost:
            return
        if self._write_paused and self._read_block & _STALLED:
            self._stall_mark = unsent
            self._stall_at = self._now + timeout

    def _check_stall(self, now: float, unsent: int) -> None:
        self._stall_at = None
        if not (self._write_paused and self._read_block & _STALLED):
            return
        if unsent < self._stall_mark:  # the peer read some: a slow reader, not a stalled one
            self._arm_stall(unsent)
            return
        timeout = self.config.send_timeout
        self._fail(
            SessionClosed(
                f"{self.format}: the peer sends but is not reading: {unsent} bytes unsent and "
                f"no progress for {timeout:g} s (send_timeout)"
            )
        )

    def _ka_timeout(self) -> float:
        """How long the keepalive waits for its answer. Nothing answers a ping of some
        formats (smux's NOP): the peer's next frame does, and an idle peer sends one only
        every ITS keepalive interval (xtaci/smux: 10 s), so one interval of ours more."""
        timeout = self.config.keepalive_timeout
        if not self.engine.ping_answered:
            timeout += self.config.keepalive_interval or 0.0
        return timeout

    def _stall_timeout(self) -> float:
        """How long the peer may take none of our bytes while our ping waits behind them
        (``stall_timeout``; by default ``keepalive_timeout`` where the format has credit, and
        :data:`STALL_TIMEOUT_WITHOUT_CREDIT` where stopping to read is its backpressure)."""
        stall = self.config.stall_timeout
        if stall is not None:
            return stall
        return self.config.keepalive_timeout if self._credit else STALL_TIMEOUT_WITHOUT_CREDIT

    def _keepalive_ping(self, now: float, unsent: int) -> None:
        try:
            self._ka_opaque = self.ping(now, by_application=False)
        except RuntimeError:  # every request id in flight (Streamux): try again later
            self._ping_due = now + (self.config.keepalive_interval or 0.0)
            return
        self._ka_deadline = now + self._ka_timeout()
        self._ka_offset = self._ka_taken_at = None
        # Out at once if the socket takes bytes now (data_to_send confirms it).
        self._ka_writable = not self._write_paused
        self._ka_mark = self._bytes_out - unsent
        self._ka_progress_at = now
        self._ka_unread = bool(self._read_block)
        self._ka_peer_pings = self.engine.peer_pings

    def _heartbeat_period(self) -> float:
        """While we do not read, a format without credit pings this often: the peer's
        answers wait unread, but our pings tell the peer that we are alive and applying
        backpressure (it counts them, as we count its own: :meth:`_check_keepalive`)."""
        return min(self.config.keepalive_interval or 0.0, self.config.keepalive_timeout / 2)

    def _heartbeat(self, now: float) -> None:
        if not self._read_block or self.closing or not self._ready:
            self._heartbeat_at = None
            return
        self.engine.now = now
        try:
            self.engine.ping()  # its answer is not awaited (nor read, for now)
        except RuntimeError:  # every request id in flight (Streamux): the next one, then
            pass
        self._heartbeat_at = now + self._heartbeat_period()

    def _check_keepalive(self, now: float, unsent: int) -> None:
        """The keepalive ping's deadline passed. Liveness judges the peer only on what it
        could have answered:

        * while we do not read (our own limits: budget, a slow application), its answer may
          sit unread in our socket: no verdict, and the clock starts again once we read;
        * while our ping has not left our buffers (``unsent``: the socket's unsent bytes),
          the peer has not had it: a peer that takes our bytes slowly is applying
          backpressure, and only one that takes none for ``stall_timeout`` is stalled;
        * once it has, an answer is due within the timeout. On formats without credit the
          peer's own ping counts too (a polymux peer that applies backpressure by not
          reading pings while it does not read). A busy peer (full socket reads: the
          answer sits behind what it sends) gets more time, never past 4 x the timeout.
        """
        timeout = self._ka_timeout()
        if self._read_block or self._ka_unread:
            self._ka_unread = bool(self._read_block)
            self._ka_taken_at = None
            self._ka_deadline = now + (timeout if self._credit else self._heartbeat_period())
            return
        taken = self._bytes_out - unsent
        if self._ka_offset is None or taken < self._ka_offset:
            self._ka_taken_at = None
            if taken != self._ka_mark:
                self._ka_mark, self._ka_progress_at = taken, now
            stall = self._stall_timeout()
            idle = now - self._ka_progress_at
            if idle < stall:
                self._ka_deadline = now + min(timeout, stall - idle)
                return
            self._keepalive_failed(
                f"keepalive failed: the peer has taken none of our bytes (our ping among them) for "
                f"{idle:.3g} s (stall_timeout={stall:g}): it stopped reading"
            )
            return
        if self._ka_taken_at is None:
            self._ka_taken_at = now  # out of our buffers since the last check at most
            self._ka_deadline = now + timeout
            return
        waited = now - self._ka_taken_at
        if not self._credit and self.engine.peer_pings != self._ka_peer_pings:
            # The peer pinged us since: alive, and not reading for now (its answer waits).
            self._pings.pop(self._ka_opaque or 0, None)
            self._ka_opaque = None
            self._ping_due = now + (self.config.keepalive_interval or 0.0)
            return
        if waited < 4 * timeout and now - self._last_busy < timeout:
            self._ka_deadline = now + timeout
            return
        self._keepalive_failed(
            f"keepalive failed: no answer to a ping within {waited:.3g} s "
            f"(keepalive_timeout={self.config.keepalive_timeout:g})"
        )

    def _keepalive_failed(self, problem: str) -> None:
        # pragma below: handle_timer calls this only while a keepalive ping is out.
        if self._ka_opaque is not None:  # pragma: no branch
            self._pings.pop(self._ka_opaque, None)
        self._ka_opaque = None
        self._fail(SessionClosed(f"{self.format}: {problem}"))

    # -- channels ----------------------------------------------------------------------------

    def _add_timer(self, when: float, kind: int, handle: int) -> None:
        timers = self._timers
        if len(timers) > 2 * len(self.channels) + 64:
            # Entries of channels that are gone wait in the heap until due (a churn of
            # 10,000 channels would keep 10,000): drop them once they are most of it.
            live = self.channels
            timers[:] = [t for t in timers if t[2] in live]
            heapq.heapify(timers)
        heapq.heappush(timers, (when, kind, handle))

    def _channel_timer(self, kind: int, channel: CoreChannel) -> None:
        config = self.config
        if kind == _OPEN:
            if channel.handle not in self._open_pending:
                return  # acknowledged meanwhile
            self._settle_open(channel.handle, timed_out=True)
            self._engine_reset(channel, None)
            error = ChannelReset(
                self.format,
                channel.label,
                f"not acknowledged within stream_open_timeout={config.stream_open_timeout:g} s",
                by_peer=False,
            )
            self._finish(channel, error)
        elif kind == _CLOSE:
            self.reset(channel.handle)  # the peer never ended its side
        elif channel.slow and self._now - channel.slow_since >= config.slow_reader_timeout:
            self._overflow(channel)  # _OVERFLOW: still full since its timer was set

    def _settle_open(self, handle: int, timed_out: bool = False) -> None:
        """Our open of ``handle`` was acknowledged, or the channel ended: make room for a
        waiting open (``timed_out``: the first waiting open fails instead, since a peer that
        does not accept would reset it too)."""
        if handle not in self._open_pending:
            return
        self._open_pending.discard(handle)
        if timed_out:
            config = self.config
            self._events.append(
                ce.RoomToOpen(
                    LimitExceeded(
                        f"{self.format}: no room to open a channel: max_unacked_opens="
                        f"{config.max_unacked_opens} opened channels await the peer's acknowledgement, "
                        f"and one was not acknowledged within stream_open_timeout="
                        f"{config.stream_open_timeout:g} s"
                    )
                )
            )
        else:
            self._events.append(ce.RoomToOpen())

    @property
    def room_to_open(self) -> int:
        """How many more opens may await acknowledgement now."""
        return self.config.max_unacked_opens - len(self._open_pending)

    def _engine_reset(self, channel: CoreChannel, message: str | None) -> None:
        engine = self.engine
        if engine.is_live(channel.handle) and not engine.closed:
            engine.reset_channel(channel.handle, message)

    def _drop_unsent(self, channel: CoreChannel) -> None:
        channel.buf.clear()
        if channel.buffered:
            n, channel.buffered = channel.buffered, 0
            if channel.holding:
                channel.holding = False
                self._release(n, _HOLDING)
            else:
                self._release(min(n, self._unsent_cap), _UNSENT)
            self._sent(n)

    def _finish(
        self,
        channel: CoreChannel,
        error: Exception | None,
        *,
        write_error: Exception | None = None,
        drop_unread: bool = False,
    ) -> None:
        """Final state: the core forgets the channel (its reader keeps what arrived)."""
        handle = channel.handle
        if self.channels.pop(handle, None) is None:
            # Every caller finds the channel live first; a second finish stays harmless.
            return  # pragma: no cover
        self._settle_open(handle)
        if not channel.local:
            self._inbound -= 1
        self._drop_unsent(channel)
        if channel.unconsumed:
            self._release(channel.unconsumed, _UNREAD)
            channel.unconsumed = 0
        self._set_slow(channel, False)
        if channel.reading_paused and not self.engine.has_flow_control:
            channel.reading_paused = False
            self._pause_for(channel, False)
        if channel.held:
            self._held_writers.discard(channel)
        if not self.channels:
            self._last_activity = self._now
        self._events.append(ce.Finished(handle, error, write_error, drop_unread))

    def _ack(self, channel: CoreChannel, n: int) -> None:
        self._ack_handle(channel.handle, n)

    def _ack_handle(self, handle: int, n: int) -> None:
        engine = self.engine
        if engine.closed:
            return
        engine.now = self._now
        engine.ack_consumed(handle, n)

    def _fail(self, error: BaseException) -> None:
        """End the session because of ``error`` (once: later failures add nothing)."""
        if self.failed:
            return
        self.error = error
        self.failed = True
        self.closing = True
        self._events.append(ce.Failed(error))

"""The sans-I/O session core: everything a multiplexed session decides, with no I/O.

:class:`SessionCore` sits on a format's engine (:mod:`polymux.engine`) and owns what is
common to every format and every I/O flavour. It is the composition of one module per job:

* :mod:`~polymux.session.channels`: the channel table, and each channel's life as two
  state tables (our writing, the peer's as the application takes it);
* :mod:`~polymux.session.scheduler`: the fair send scheduler (control frames first, then
  channel data round robin, up to ``batch_bytes``);
* :mod:`~polymux.session.budget`: ``max_session_memory``, the writers' marks, and every
  reason reading from the peer pauses;
* :mod:`~polymux.session.liveness`: keepalive, heartbeats, ``stall_timeout``,
  ``send_timeout``, ``idle_timeout``, the handshake and first-frame deadlines, pings;
* :mod:`~polymux.session.offers`: the peer's offers (the filter, the limits, the open
  rate) and the limits on ours;
* :mod:`~polymux.session.controls`, :mod:`~polymux.session.pairs` and
  :mod:`~polymux.session.requests`: control messages, stream pairs on one-way formats, and
  request/answer exchanges, so that every driver has them.

This module turns the engine's events into channel state, takes the application's calls,
and keeps the per-channel deadlines (stream-open, channel-close, slow-reader reset) and the
slow-reader policy.

Call order (as in h11, h2 and aioquic): feed it what happened (:meth:`receive_data`,
:meth:`receive_eof`, application calls such as :meth:`write` or :meth:`consumed`, and
:meth:`handle_timer` at :meth:`next_deadline`), then act on :meth:`events` and write
:meth:`data_to_send` while the socket takes it. Time is always passed in; the core never
reads a clock. Drivers: :mod:`polymux.aio` (asyncio) and :mod:`polymux.anyio`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine import Engine, events as ev
from polymux.exceptions import (
    ChannelClosedError,
    ChannelOverflow,
    ChannelRejected,
    ChannelReset,
    LimitExceeded,
    PolymuxError,
    ProtocolError,
    SessionClosed,
)
from polymux.session import events as ce
from polymux.session.budget import BACKLOG, Budget, Pressure
from polymux.session.channels import NO_QUEUE, ChannelTable, CoreChannel, Receiving, Sending, Step, Timer
from polymux.session.controls import Controls
from polymux.session.liveness import BUSY_READ, STALL_TIMEOUT_WITHOUT_CREDIT, Liveness
from polymux.session.offers import NoRoomToOpen, OfferFilter, Offers
from polymux.session.pairs import PAIR, REPLY, Pairs, pair_role
from polymux.session.requests import Requests
from polymux.session.scheduler import Scheduler


__all__ = ["STALL_TIMEOUT_WITHOUT_CREDIT", "CoreChannel", "NoRoomToOpen", "OfferFilter", "SessionCore"]

_READING = Receiving.OPEN
_ANSWER = Receiving.ANSWER
_LINGERING = Sending.LINGERING


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
        self.format = fmt = engine.format
        self.now = now
        """The time the core last heard (the engines' clock too)."""
        self._events: list[ce.CoreEvent] = []
        self._has_handler = has_handler
        self._credit = engine.has_flow_control
        self.table = ChannelTable()
        self.channels = self.table.channels
        """Live channels by the engine's handle."""
        self.pressure = pressure = Pressure()
        self.budget = Budget(engine, config, pressure, self.channels, self)
        self.scheduler = Scheduler(engine, config.batch_bytes, self.budget, self.channels, self)
        self.liveness = Liveness(
            engine, config, now, pressure, self, first_frame_deadline=first_frame_deadline
        )
        pressure.listener = self.liveness
        self.offers = Offers(fmt, config, self.table, now, offer_filter, has_handler)
        self.controls = Controls(pressure)
        self.pairs = Pairs(fmt)
        self.requests = Requests(fmt)
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
        """The connection is gone."""

    def connection_made(self, now: float) -> None:
        """The connection is up: the clocks start (and, without a handshake, the session is
        ready: a first ping measures the round-trip time)."""
        self.now = self.offers.stamp = now
        if self.liveness.ready:
            self._on_ready(now)
        self.liveness.connection_made(now)

    @property
    def peer_silent(self) -> bool:
        """Whether no whole frame has come from the peer yet (not even its handshake): a
        full server sheds such connections first."""
        return not self.liveness.heard

    # -- the driver's side: events, output, deadlines ----------------------------------------

    def events(self) -> list[ce.CoreEvent]:
        """Return (and forget) what happened since the last call, in order."""
        out, self._events = self._events, []
        return out

    def emit(self, event: ce.CoreEvent) -> None:
        """Queue an event for the driver (the core's own modules report through this)."""
        self._events.append(event)

    @property
    def reading(self) -> bool:
        """Whether the driver should read from the peer now (False: pause reading)."""
        return not self.pressure.bits

    @property
    def has_output(self) -> bool:
        """Whether :meth:`data_to_send` would return anything (without a scheduler turn)."""
        return bool(self.scheduler.ready) or self.engine.has_output

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must next be called (``None``: no deadline)."""
        due = self.liveness.next_deadline(not self.channels and self.error is None)
        timers = self.table.timers
        if timers and (due is None or timers[0][0] < due):
            return timers[0][0]
        return due

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
        live = self.liveness
        if live.ka_opaque is not None and live.ka_offset is None and out:
            live.ping_leaves(out, self.now)
        if self.scheduler.ready:
            out += self.scheduler.batch()
        if out:
            live.bytes_out += sum(map(len, out))
        pressure = self.pressure
        if pressure.bits & BACKLOG and not pressure.write_paused:
            pressure.block(BACKLOG, False)
        return out

    def socket_paused(self, paused: bool, unsent: int) -> None:
        """The socket stopped (or resumed) taking our bytes; ``unsent``: its buffered bytes."""
        self.pressure.write_paused = paused
        self.pressure.socket_unsent = unsent
        self.budget.check()  # unsent bytes count while the socket is paused
        self.liveness.socket_paused(paused, unsent)

    def handle_timer(self, now: float, unsent: int = 0) -> None:
        """Act on the deadlines that are due at ``now`` (``unsent``: the socket's buffered
        bytes, to tell a slow reader from one that reads nothing)."""
        self.now = now
        self.pressure.socket_unsent = unsent
        if self.lost or self.failed:
            return
        live = self.liveness
        live.on_timer(now, unsent)
        if self.failed:
            return
        idle = live.idle_check(now, not self.channels and self.error is None)
        if idle is not None:
            self.error = idle
            self.closing = True
            if not self.engine.closed:
                self.engine.close()  # a go-away where the format has one
            self.emit(ce.Failed(idle))
            return
        for kind, channel in self.table.due(now):
            self._channel_timer(kind, channel)

    # -- the peer's side -----------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes from the peer. Then take :meth:`events` and write :meth:`data_to_send`."""
        if self.error is not None and self.failed:
            return
        self.now = now
        engine = self.engine
        engine.now = now
        try:
            events = engine.receive_data(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if events or engine.has_output:
            # Whole frames arrived (bytes of a frame that never ends do not count).
            live = self.liveness
            live.last_activity = now
            live.heard = True
            if live.first_frame_due:
                live.lift_first_frame()
            if len(data) >= BUSY_READ:
                live.last_busy = now
        for event in events:
            if self.failed:
                break  # the session ended on an earlier event of this read (an open too many)
            self._on_event(event)
        if self.pressure.write_paused and engine.queued_frames > self.config.max_queued_control:
            # The peer sends frames that need answers and does not read them.
            self.pressure.block(BACKLOG, True)

    def receive_eof(self) -> None:
        """The peer closed its side of the connection: the session is over (the driver
        then reports :meth:`connection_lost`)."""
        self.closing = True
        try:
            self.engine.receive_eof()
        except ProtocolError as exc:
            if self.error is None:
                self.error = exc
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
            if channel.receiving.ended:
                # What the peer sent before its end stays readable; only writing fails.
                self._finish(channel, None, write_error=error)
            else:
                self._finish(channel, error)
        self.liveness.lost()
        self.table.timers.clear()
        self.budget.held_writers.clear()
        self.emit(ce.RoomToOpen(everyone=True))

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
        engine = self.engine
        self.offers.check_open(engine.open_acknowledged)
        try:
            handle = engine.open_channel(name, extra=metadata)
        except RuntimeError as exc:  # e.g. every request id in flight (Streamux)
            raise LimitExceeded(str(exc)) from None
        usable = not engine.needs_acceptance  # usable at once (mplex, yamux)
        budget = self.budget
        channel = CoreChannel(
            handle,
            engine.channel_name(handle),
            engine.describe(handle),
            True,
            budget.high,
            budget.low,
            accepted=usable,
        )
        self.table.add(channel)
        if self.liveness.first_frame_due:  # the application uses the session: the peer may only listen
            self.liveness.lift_first_frame()
        if usable and engine.open_acknowledged:
            self.offers.pending.add(handle)
            self.table.add_timer(self.now + self.config.stream_open_timeout, Timer.OPEN, handle)
        return handle

    def open_pair(self, name: str = "") -> int:
        """One-way formats (omnistreams): open the first half of a stream pair; return its
        handle (ours to write). A :class:`~ce.PairAnswered` event follows with the peer's
        half (ours to read) once a polymux peer opened it back. See
        :mod:`polymux.session.pairs`; raises as :meth:`open_channel` does."""
        if not self.engine.one_way:
            raise PolymuxError(f"{self.format}: channels carry data both ways: open_channel() is a pair")
        token = self.pairs.new_token()
        handle = self.open_channel(name, {PAIR: token})
        self.pairs.wait(token, handle)
        return handle

    def request(self, name: str, body: BytesLike, limit: int | None = None) -> int:
        """Open a channel, send ``body`` and our end on it, and collect the peer's whole
        answer (at most ``limit`` bytes); return its handle. An :class:`~ce.Answered` event
        follows. See :mod:`polymux.session.requests`; raises as :meth:`open_channel` does,
        and :class:`ChannelClosedError` on one-way formats (no answer can come back)."""
        if self.engine.one_way:
            raise ChannelClosedError(
                f"{self.format}: streams carry data from their opener to their acceptor only: "
                "a request has no way back (open_pair() makes a two-way channel)"
            )
        handle = self.open_channel(name)
        self.channels[handle].step(Step.ANSWER)
        self.requests.start(handle, limit)
        if body:
            self.write(handle, body)
        self.write_eof(handle)
        return handle

    def cancel_request(self, handle: int) -> None:
        """The application gave up the request: it is reset on the wire, and no
        :class:`~ce.Answered` follows."""
        self.requests.forget(handle)
        self.reset(handle)

    def ping(self, now: float, *, by_application: bool = True) -> int:
        """Send a ping; a :class:`~ce.PingAnswered` event follows. Formats without pings
        raise :class:`PolymuxError`, and so do formats whose ping nothing answers (smux's
        NOP) when the application asks: there is no round trip to measure."""
        return self.liveness.ping(now, by_application=by_application)

    def forget_ping(self, opaque: int) -> None:
        """The application stopped waiting for this ping's answer."""
        self.liveness.pings.pop(opaque, None)

    def send_control(self, data: bytes) -> None:
        """Send a control message (omnistreams; other formats raise :class:`PolymuxError`)."""
        if self.error is not None and (self.failed or self.lost):
            raise SessionClosed(f"{self.format}: the session is closed") from self.error
        self.engine.send_control(data)

    def take_control(self) -> bytes | None:
        """The oldest control message not yet taken, or ``None``."""
        return self.controls.take()

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
            (ch.buffered or (ch.sending.end_wanted and not ch.sending.end_sent))
            and ch.sending is not _LINGERING
            for ch in self.channels.values()
        )

    def handler_started(self) -> None:
        """A channel handler began (counted until it returns: Rapid Reset)."""
        self.table.handlers += 1

    def handler_finished(self) -> None:
        """A channel handler returned."""
        self.table.handlers -= 1

    def taken(self, handle: int) -> None:
        """The application took an incoming channel (``accept_channel``): the backlog shrinks."""
        self.table.untaken -= 1

    @property
    def room_to_open(self) -> int:
        """How many more opens may await acknowledgement now."""
        return self.offers.room

    # -- the application's side: one channel -------------------------------------------------

    def write(self, handle: int, data: BytesLike) -> bool:
        """Queue ``data`` (the core keeps a reference: bytes, or a read-only view of
        bytes). Returns True when the writer must pause now (``drain()`` blocks); a
        :class:`~ce.WriteResumed` event says when it may go on."""
        channel = self.channels[handle]
        buf = channel.buf
        if buf is NO_QUEUE:
            buf = channel.buf = deque()
        buf.append(data)
        n = len(data)
        old = channel.buffered
        channel.buffered = new = old + n
        budget = self.budget
        if budget.wrote(channel, n, old, new):
            return False  # the format holds it back (within its limits)
        if not channel.queued and channel.sending.accepted:
            channel.queued = True
            self.scheduler.ready.append(channel)
        if not channel.paused and (
            new > channel.high or budget.unsent - budget.holding > budget.unsent_limit
        ):
            return budget.pause(channel, new)
        return False

    def set_write_limits(self, handle: int, high: int, low: int) -> bool | None:
        """Set a channel's own high/low-water marks; returns the new pause state if it
        changed (True: pause; a resume comes as a :class:`~ce.WriteResumed` event), else None."""
        channel = self.channels.get(handle)
        if channel is None:
            return None
        channel.high, channel.low = high, low
        return self.budget.update_pause(channel)

    def write_limits(self, handle: int) -> tuple[int, int]:
        """A channel's ``(low, high)`` water marks."""
        channel = self.channels.get(handle)
        if channel is None:
            return self.budget.low, self.budget.high
        return channel.low, channel.high

    def write_eof(self, handle: int) -> None:
        """Half-close once the queued data is sent."""
        channel = self.channels.get(handle)
        if channel is None or channel.sending.end_wanted:
            return
        channel.step(Step.END)
        self.scheduler.wake(channel)

    def close_channel(self, handle: int) -> None:
        """``close()``: finish writing after the queued data and stop reading (what still
        arrives is dropped, its credit returned); reset if the peer does not end its side
        within ``close_timeout``."""
        channel = self.channels.get(handle)
        if channel is None or channel.receiving.closed:
            return
        channel.step(Step.CLOSE)
        if channel.unconsumed:
            n, channel.unconsumed = channel.unconsumed, 0
            self.budget.consumed(n)
            self._ack(handle, n)
        self._set_slow(channel, False)
        self.write_eof(handle)
        self.table.add_timer(self.now + self.config.close_timeout, Timer.CLOSE, handle)

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
            self.now = now
        channel = self.channels.get(handle)
        if channel is None:
            self._ack(handle, n)
            return
        n = min(n, channel.unconsumed)
        if n <= 0:
            return
        channel.unconsumed -= n
        self.budget.consumed(n)
        self._ack(handle, n)
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
        if not self._credit:
            if paused and self.config.slow_reader == "reset":
                self._reader_behind(channel)
            else:
                self.pressure.pause_for(paused)

    # -- engine events ---------------------------------------------------------------------

    def _on_event(self, event: ev.Event) -> None:
        channels = self.channels
        if isinstance(event, ev.DataReceived):
            channel = channels.get(event.channel)
            n = event.flow_controlled_length
            if channel is None or channel.receiving is not _READING:
                if channel is None or channel.receiving.closed:
                    self._ack(event.channel, n)  # dropped: keep the peer's credit flowing
                    return
                # pragma below: the engines refuse data after the peer's end, so only a
                # request's answer is left here (data on an ENDED channel would be delivered).
                if channel.receiving is _ANSWER:  # pragma: no branch
                    self._ack(event.channel, n)
                    failed = self.requests.data(event.channel, event.data, event.more)
                    if failed is not None:
                        self.emit(failed)
                        self.reset(event.channel)  # the answer passed its limit
                    return
            channel.unconsumed += n
            self.budget.received(n)
            self._events.append(ce.Data(event.channel, event.data, event.more, n))
            if not self._credit and channel.unconsumed > self.config.receive_window:
                self._reader_behind(channel)
        elif isinstance(event, ev.CreditAvailable):
            channel = channels.get(event.channel)
            if channel is not None and not channel.queued and channel.sending.accepted:
                channel.queued = True
                self.scheduler.ready.append(channel)
        elif isinstance(event, ev.ChannelOpened):
            self._on_offer(event.channel, event.name)
        elif isinstance(event, ev.ChannelAccepted):
            self._settle_open(event.channel)
            channel = channels.get(event.channel)
            # pragma below: the engine reports acceptance only of an offer it still tracks,
            # and it tracks ours exactly as long as the core does (the None test is a guard).
            if channel is not None:  # pragma: no branch
                if not channel.sending.accepted:
                    channel.step(Step.ACCEPT)
                    if channel.buffered or channel.sending.end_wanted:
                        self.scheduler.wake(channel)
                self.emit(ce.Accepted(event.channel))
        elif isinstance(event, ev.ChannelEnded):
            channel = channels.get(event.channel)
            if channel is not None:
                answer = channel.receiving is _ANSWER
                channel.step(Step.PEER_END)
                if answer:
                    self.emit(self.requests.ended(event.channel))
                    self.close_channel(event.channel)
                elif not channel.receiving.closed:
                    self.emit(ce.Ended(event.channel))
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
                if not channel.sending.accepted:
                    # No engine resets an offer it has not seen accepted (MultiplexingStream
                    # reports ChannelRejected); kept for one that would.
                    self._open_failed(event.channel, error)  # pragma: no cover
                self._finish(channel, error)
        elif isinstance(event, ev.ChannelRejected):
            channel = channels.get(event.channel)
            # pragma below: only a pending offer of ours is rejected, and nothing else in
            # the same read can have ended it (the None test is a guard).
            if channel is not None:  # pragma: no branch
                self._open_failed(event.channel, ChannelRejected(self.format, channel.label, channel.name))
                self._finish(channel, None)
        elif isinstance(event, ev.ReadingStopped):
            channel = channels.get(event.channel)
            if channel is not None:
                self.budget.dropped(channel)
                stopped = ChannelClosedError(f"{self.format}: the peer stopped reading {channel.label}")
                self.emit(ce.WritingStopped(event.channel, stopped))
                self.write_eof(event.channel)
        elif isinstance(event, ev.SessionReady):
            # pragma below: engines report SessionReady once, and only when they were not
            # ready at the start (the test is a guard).
            if not self.liveness.ready:  # pragma: no branch
                self._on_ready(self.now)
        elif isinstance(event, ev.SessionClosed):
            # The peer's go-away: no new channels; open ones may finish. One that reports an
            # error ends the session (as hashicorp's handleGoAway does).
            self.peer_goaway = f"the peer is going away ({event.message})"
            self.emit(ce.RoomToOpen(everyone=True))  # waiting opens fail: no new channels
            if event.code:
                self._fail(SessionClosed(f"{self.format}: the peer went away with {event.message}"))
        elif isinstance(event, ev.PingAcked):
            rtt = self.liveness.ping_acked(event.opaque, self.now)
            if rtt is not None:
                self.emit(ce.PingAnswered(event.opaque, rtt))
        elif isinstance(event, ev.ControlReceived):  # pragma: no branch (the last event type)
            self.controls.arrived(event.data)
            self.emit(ce.ControlArrived())

    def _on_ready(self, now: float) -> None:
        self.emit(ce.Ready())
        self.liveness.on_ready(now)

    def _on_offer(self, handle: int, name: str) -> None:
        offers = self.offers
        too_fast = offers.charge(self.now)
        if too_fast is not None:
            self._fail(too_fast)
            return
        engine = self.engine
        if not engine.is_live(handle):
            return  # opened and reset (or cancelled) within the same read: nothing to take
        if offers.refuse(name, self.closing):
            engine.reject_channel(handle)
            return
        engine.accept_channel(handle)
        budget = self.budget
        channel = CoreChannel(
            handle, name, engine.describe(handle), False, budget.high, budget.low, accepted=True
        )
        self.table.add(channel)
        role = pair_role(engine.metadata_object(handle)) if engine.one_way else None
        if role is None:
            self._incoming(ce.Incoming(handle, name))
        elif role[0] == REPLY:
            answered = self.pairs.answer(role[1], handle)
            if answered is None:
                self.reset(handle)  # an answer nobody waits for
            else:
                self.emit(answered)
        else:  # the first half of the peer's pair: open the other half back
            try:
                reply = self.open_channel(name, {REPLY: role[1]})
            except PolymuxError as exc:
                self.reset(handle)
                self.emit(ce.PairFailed(name, exc))
                return
            self._incoming(ce.IncomingPair(handle, reply, name))

    def _incoming(self, event: ce.Incoming | ce.IncomingPair) -> None:
        if not self._has_handler:
            self.table.untaken += 1
        self.emit(event)

    # -- hooks of the core's modules ---------------------------------------------------------

    def end_sent(self, channel: CoreChannel, done: bool) -> None:
        """The scheduler sent ``channel``'s end (``done``: the engine is done with it)."""
        if done:
            self._finish(channel, None)
        elif channel.sending is _LINGERING:
            # close(): the application is done with the channel; the engine lingers until
            # the peer ends too (its data is dropped meanwhile).
            self.emit(ce.Finished(channel.handle, lingering=True))

    def reset_held(self, channel: CoreChannel, problem: str) -> None:
        """The format holds more of ``channel``'s bytes than it allows: reset it."""
        self._engine_reset(channel, problem)
        self._finish(channel, ChannelOverflow(f"{self.format}: {channel.label} was reset: {problem}"))

    # -- the slow-reader policy (formats without credit) ------------------------------------

    def _set_slow(self, channel: CoreChannel, slow: bool) -> None:
        if channel.slow == slow:
            return
        channel.slow = slow
        self.pressure.pause_for(slow)

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
        channel.slow_since = self.now
        if config.slow_reader == "reset":
            self.table.add_timer(self.now + config.slow_reader_timeout, Timer.OVERFLOW, channel.handle)

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

    # -- channels ----------------------------------------------------------------------------

    def _channel_timer(self, kind: Timer, channel: CoreChannel) -> None:
        config = self.config
        if kind == Timer.OPEN:
            if channel.handle not in self.offers.pending:
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
        elif kind == Timer.CLOSE:
            self.reset(channel.handle)  # the peer never ended its side
        elif channel.slow and self.now - channel.slow_since >= config.slow_reader_timeout:
            self._overflow(channel)  # OVERFLOW: still full since its timer was set

    def _settle_open(self, handle: int, timed_out: bool = False) -> None:
        room = self.offers.settle(handle, timed_out)
        if room is not None:
            self.emit(room)

    def _open_failed(self, handle: int, error: Exception) -> None:
        if handle in self.requests:
            self.requests.open_failed(handle, error)
        else:
            self.emit(ce.OpenFailed(handle, error))

    def _engine_reset(self, channel: CoreChannel, message: str | None) -> None:
        engine = self.engine
        if engine.is_live(channel.handle) and not engine.closed:
            engine.reset_channel(channel.handle, message)

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
        if self.table.pop(handle) is None:
            # Every caller finds the channel live first; a second finish stays harmless.
            return  # pragma: no cover
        self._settle_open(handle)
        self.budget.finished(channel)
        self._set_slow(channel, False)
        if channel.reading_paused and not self._credit:
            channel.reading_paused = False
            self.pressure.pause_for(False)
        if not self.channels:
            self.liveness.last_activity = self.now
        if self.requests.answers:
            answered = self.requests.finished(handle, error)
            if answered is not None:
                self.emit(answered)
        if self.pairs.tokens:
            paired = self.pairs.finished(handle, error)
            if paired is not None:
                self.emit(paired)
        self._events.append(ce.Finished(handle, error, write_error, drop_unread))

    def _ack(self, handle: int, n: int) -> None:
        engine = self.engine
        if engine.closed:
            return
        engine.now = self.now
        engine.ack_consumed(handle, n)

    def _fail(self, error: BaseException) -> None:
        """End the session because of ``error`` (once: later failures add nothing)."""
        if self.failed:
            return
        self.error = error
        self.failed = True
        self.closing = True
        self.emit(ce.Failed(error))

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
* :mod:`~polymux.session.peer`: what the peer's frames do (the engine's events turned
  into channel state and the core's events);
* :mod:`~polymux.session.lifecycle`: how channels end, their deadlines (stream-open,
  close, slow-reader) and the slow-reader policy;
* :mod:`~polymux.session.controls`, :mod:`~polymux.session.pairs` and
  :mod:`~polymux.session.requests`: control messages, stream pairs on one-way formats, and
  request/answer exchanges, so that every driver has them.

This module composes them and is the core's interface: one method per call of the driver
(bytes, time, the socket's state) and of the application (the session's, and each
channel's), each handing the work to the module whose job it is.

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
from polymux.engine import Engine
from polymux.engine.plane import NO_CREDIT_STEP, Inbox, Plane
from polymux.exceptions import (
    ChannelClosedError,
    LimitExceeded,
    PolymuxError,
    ProtocolError,
    SessionClosed,
)
from polymux.session import events as ce
from polymux.session.budget import BACKLOG, Budget, Pressure
from polymux.session.channels import NO_QUEUE, ChannelTable, CoreChannel, Sending, Step, Timer
from polymux.session.controls import Controls
from polymux.session.diagnosis import describe_end
from polymux.session.lifecycle import Lifecycle
from polymux.session.liveness import BUSY_READ, STALL_TIMEOUT_WITHOUT_CREDIT, Liveness
from polymux.session.offers import NoRoomToOpen, OfferFilter, Offers
from polymux.session.pairs import PAIR, Pairs
from polymux.session.peer import EARLY, FIRST_BYTES, PeerEvents, mismatch
from polymux.session.requests import Requests
from polymux.session.scheduler import Scheduler


__all__ = ["STALL_TIMEOUT_WITHOUT_CREDIT", "CoreChannel", "NoRoomToOpen", "OfferFilter", "SessionCore"]

_LINGERING = Sending.LINGERING
_OPEN = Sending.OPEN


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
        is_client: which end of the connection this is, for the errors' words ("the
            server closed ...") and for judging the peer's first bytes (``None``: unknown).
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
        is_client: bool | None = None,
    ) -> None:
        self.engine = engine
        self.is_client = is_client
        self.config = config
        self.format = fmt = engine.format
        self.now = now
        """The time the core last heard (the engines' clock too)."""
        self.pending: list[ce.CoreEvent] = []
        """Events not yet taken (:meth:`events` takes them; the core's modules append to
        this very list, and a ``polymux.session.dispatch.Dispatcher`` drains it)."""
        self._credit = engine.has_flow_control
        self.table = ChannelTable()
        self.channels = self.table.channels
        """Live channels by the engine's handle."""
        self.pressure = pressure = Pressure()
        self.lifecycle = lifecycle = Lifecycle(self, self.pending.append)
        self.budget = Budget(engine, config, pressure, self.channels, lifecycle)
        self.scheduler = Scheduler(engine, config.batch_bytes, self.budget, self.channels, lifecycle)
        self.liveness = Liveness(
            engine, config, now, pressure, self, first_frame_deadline=first_frame_deadline
        )
        pressure.listener = self.liveness
        self.offers = Offers(fmt, config, self.table, now, offer_filter, has_handler)
        self.controls = Controls(pressure)
        self.pairs = Pairs(fmt)
        self.requests = Requests(fmt)
        self.peer = PeerEvents(self, self.pending.append, has_handler=has_handler)
        # The data plane (polymux.engine.plane): the engine's data frames into inboxes.
        self.plane = Plane()
        """The inboxes' shared state (``on_report``: the driver's hook)."""
        self.runs = engine.runs
        """The engine's receiving side: after :meth:`receive_data`, the driver wakes the
        readers of ``runs.woken`` (and clears it)."""
        self._behind_at = config.receive_window if not engine.has_flow_control else 1 << 62
        self._report_floor = min(NO_CREDIT_STEP, max(1, config.receive_window // 4))
        pressure.on_change = self._reading_changed
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
        self._peer_received = 0  # bytes from the peer, counted up to EARLY
        self._peer_first = b""  # its first FIRST_BYTES bytes
        self.peer_closed = False
        """The peer closed the connection first (its end of stream came before ours)."""

    def connection_made(self, now: float) -> None:
        """The connection is up: the clocks start (and, without a handshake, the session is
        ready: a first ping measures the round-trip time)."""
        self.now = self.offers.stamp = now
        if self.liveness.ready:
            self.peer.ready(now)
        self.liveness.connection_made(now)

    @property
    def peer_silent(self) -> bool:
        """Whether no whole frame has come from the peer yet (not even its handshake): a
        full server sheds such connections first."""
        return not self.liveness.heard

    # -- the driver's side: events, output, deadlines ----------------------------------------

    def events(self) -> list[ce.CoreEvent]:
        """Return (and forget) what happened since the last call, in order."""
        pending = self.pending
        out = pending.copy()
        pending.clear()
        return out

    def emit(self, event: ce.CoreEvent) -> None:
        """Queue an event for the driver (the core's own modules report through this)."""
        self.pending.append(event)

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
        lifecycle = self.lifecycle
        for kind, channel in self.table.due(now):
            lifecycle.timer(kind, channel)

    # -- the peer's side -----------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> bool:
        """Bytes from the peer. Returns whether the driver must act (take :meth:`events`,
        follow :attr:`reading`, write :meth:`data_to_send`, the deadline): False when the
        read held only data for inboxes and changed nothing else. Either way, wake the
        readers of ``runs.woken``."""
        if self.error is not None and self.failed:
            return False
        bits = self.pressure.bits
        self.now = now
        engine = self.engine
        engine.now = now
        early = self._peer_received < EARLY
        if early:  # the peer's first bytes: kept to tell a peer of another protocol
            self._peer_received += len(data)
            if len(self._peer_first) < FIRST_BYTES:
                self._peer_first += bytes(data[: FIRST_BYTES - len(self._peer_first)])
        try:
            events = engine.receive_data(data)
        except ProtocolError as exc:
            self._fail(mismatch(self.format, exc, self._peer_first, self.is_client) if early else exc)
            return True
        live = self.liveness
        live.rx_at = now  # any byte: the peer is there (heartbeats judge by it)
        beat = engine.peer_heartbeats + engine.peer_pings != live.beats_seen
        if beat:
            live.beat_heard(now)  # (the driver then looks at the deadline again)
        runs = self.runs
        if events or engine.has_output or runs.received:
            # Whole frames arrived (bytes of a frame that never ends do not count).
            live.last_activity = now
            live.heard = True
            if live.first_frame_due:
                live.lift_first_frame()
            if len(data) >= BUSY_READ:
                live.last_busy = now
        if events:
            on_event = self.peer.on_event
            for event in events:
                if self.failed:
                    break  # the session ended on an earlier event of this read (an open too many)
                on_event(event)
        received = runs.received
        if received:
            runs.received = 0
            self.budget.received(received)
        if runs.behind:
            self._behind()
        pressure = self.pressure
        if pressure.write_paused and engine.queued_frames > self.config.max_queued_control:
            # The peer sends frames that need answers and does not read them.
            pressure.block(BACKLOG, True)
        return (
            beat
            or bool(self.pending)
            or pressure.bits != bits
            or engine.has_output
            or bool(self.scheduler.ready)
        )

    def _behind(self) -> None:
        """Inboxes past their limit (formats without credit): the slow-reader policy."""
        behind, self.runs.behind = self.runs.behind, []
        channels = self.channels
        for inbox in behind:
            inbox.behind = False
            channel = channels.get(inbox.handle)
            if channel is not None and inbox.unconsumed > inbox.behind_at and not channel.slow:
                self.lifecycle.reader_behind(channel)

    # -- the data plane: inboxes ---------------------------------------------------------------

    def new_inbox(self, handle: int) -> Inbox:
        """The inbox of a new channel (its data arrives as events until :meth:`stream`)."""
        inbox = Inbox(self.plane, handle)
        inbox.behind_at = self._behind_at
        return inbox

    def stream(self, handle: int, owner: object) -> Inbox | None:
        """The channel's reader is a stream (``owner``, woken when data arrives for it
        while it waits): its data frames go straight into its inbox, returned (None: the
        channel is gone)."""
        channel = self.channels.get(handle)
        if channel is None:
            return None
        inbox = channel.inbox
        inbox.owner = owner
        channel.streamed = True
        if not channel.receiving.closed:
            self.engine.attach_inbox(handle, inbox)
        inbox.report_at = self._report_at(handle)
        inbox.report_on_wait = self.engine.credit_estimated
        return inbox

    def _report_at(self, handle: int) -> int:
        step = self.engine.credit_step(handle)
        return min(step, self._report_floor) if step == NO_CREDIT_STEP else step

    def report(self, now: float) -> None:
        """Take what the inboxes consumed (:attr:`Plane.reports`): credit and budget."""
        self.now = now
        channels = self.channels
        for inbox in self.plane.take():
            n = inbox.pending
            if not n:
                continue
            inbox.pending = 0
            handle = inbox.handle
            channel = channels.get(handle)
            if channel is None or channel.inbox is not inbox:
                self.ack(handle, n)  # a channel gone: credit only (harmless when moot)
                continue
            self.budget.consumed(n)
            self.ack(handle, n)
            if channel.slow and inbox.unconsumed <= self.config.receive_window // 2:
                self.lifecycle.set_slow(channel, False)
            inbox.report_at = self._report_at(handle)

    def _reading_changed(self, paused: bool) -> None:
        """Reading from the peer paused (or resumed): while paused, every consumed byte is
        reported at once, and what was consumed so far is reported now (the budget and the
        slow-reader check need exact counts to resume)."""
        plane = self.plane
        plane.eager = paused
        if paused:
            for channel in self.channels.values():
                if channel.inbox.pending:
                    plane.report(channel.inbox)

    def receive_eof(self) -> None:
        """The peer closed its side of the connection: the session is over (the driver
        then reports :meth:`connection_lost`)."""
        self.peer_closed = not self.closing
        self.closing = True
        try:
            self.engine.receive_eof()
        except ProtocolError as exc:  # the connection ended inside a frame
            if self.error is None:
                early = 0 < self._peer_received < EARLY  # all it ever sent: a few bytes
                self.error = mismatch(self.format, exc, self._peer_first, self.is_client) if early else exc
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
        describe_end(self, error, exc)  # how it ended; why, when the peer never spoke the format
        if self.error is None:
            self.error = error
        for channel in list(self.channels.values()):
            if channel.receiving.ended:
                # What the peer sent before its end stays readable; only writing fails.
                self.lifecycle.finish(channel, None, write_error=error)
            else:
                self.lifecycle.finish(channel, error)
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
            inbox=self.new_inbox(handle),
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
        ``polymux.session.pairs``; raises as :meth:`open_channel` does."""
        if not self.engine.one_way:
            raise PolymuxError(f"{self.format}: channels carry data both ways: open_channel() is a pair")
        token = self.pairs.new_token()
        handle = self.open_channel(name, {PAIR: token})
        self.pairs.wait(token, handle)
        return handle

    def request(self, name: str, body: BytesLike, limit: int | None = None) -> int:
        """Open a channel, send ``body`` and our end on it, and collect the peer's whole
        answer (at most ``limit`` bytes); return its handle. An :class:`~ce.Answered` event
        follows. See ``polymux.session.requests``; raises as :meth:`open_channel` does,
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

    def send_now(self, handle: int, data: BytesLike) -> list[BytesLike] | None:
        """The data plane's sending half: frame ``data`` (bytes, or a read-only view of
        bytes) at once and return the bytes to write now (the engine's control frames
        first), when nothing else waits to go out: no channel in the scheduler's round, none
        of this channel's data queued, the socket taking our bytes, credit for all of it,
        and nothing for the core to follow (a keepalive ping leaving). Else None: call
        :meth:`write`, which queues it for the scheduler. Either way the order on the wire is
        the order of the writes, and the scheduler's fairness holds (there is nobody to be
        fair to)."""
        channel = self.channels.get(handle)
        if (
            channel is None
            or channel.sending is not _OPEN
            or channel.buffered
            or channel.holding
            or self.scheduler.ready
            or self.pressure.write_paused
            or self.lost
            or self.failed
            or self.liveness.ka_opaque is not None
        ):
            return None
        n = len(data)
        if n > self.config.batch_bytes:
            return None
        engine = self.engine
        if engine.send_credit(handle) < n:
            return None
        engine.send_data(handle, data)
        out = engine.data_to_send()
        self.liveness.bytes_out += sum(map(len, out))
        return out

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
        within ``close_timeout``, or takes none of the queued data for that long (while
        it takes some, the deadline moves on: closing never drops data a peer reads)."""
        channel = self.channels.get(handle)
        if channel is None or channel.receiving.closed:
            return
        channel.step(Step.CLOSE)
        if channel.streamed:
            self.engine.attach_inbox(handle, None)  # what still comes is dropped (and credited)
        inbox = channel.inbox
        n = inbox.drop() + inbox.pending
        inbox.pending = 0
        if n:
            self.budget.consumed(n)
            self.ack(handle, n)
        self.lifecycle.set_slow(channel, False)
        self.write_eof(handle)
        channel.progress = 0
        self.table.add_timer(self.now + self.config.close_timeout, Timer.CLOSE, handle)

    def reset(self, handle: int, message: str | None = None) -> None:
        """Terminate the channel at once (``message`` to the peer where the format carries
        one); queued data is dropped. A :class:`~ce.Finished` event follows."""
        channel = self.channels.get(handle)
        if channel is None:
            return
        self.lifecycle.engine_reset(channel, message)
        self.lifecycle.finish(channel, None)

    def consumed(self, handle: int, n: int, now: float | None = None) -> None:
        """The application consumed ``n`` bytes of the channel: credit and budget. ``now``:
        the time, when it moved since the core last heard it (yamux tunes windows by it)."""
        if now is not None:
            self.now = now
        channel = self.channels.get(handle)
        if channel is None:
            self.ack(handle, n)
            return
        inbox = channel.inbox
        n = min(n, inbox.unconsumed)
        if n <= 0:
            return
        inbox.unconsumed -= n
        self.budget.consumed(n)
        self.ack(handle, n)
        if channel.slow and inbox.unconsumed <= self.config.receive_window // 2:
            self.lifecycle.set_slow(channel, False)

    def reader_waiting(self, handle: int) -> None:
        """The reader needs more than it holds: credit all it holds, so the peer can send the
        rest (``readexactly(n)`` with n beyond the window would deadlock otherwise)."""
        channel = self.channels.get(handle)
        if channel is None:
            return
        inbox = channel.inbox
        n = inbox.unconsumed + inbox.pending
        if n:
            inbox.unconsumed = inbox.pending = 0
            self.budget.consumed(n)
            self.ack(handle, n)
        self.lifecycle.set_slow(channel, False)

    def reading_paused(self, handle: int, paused: bool) -> None:
        """A plain protocol paused (or resumed) reading its channel: with credit on the
        wire its credit is withheld by the driver; without, the connection pauses."""
        channel = self.channels.get(handle)
        if channel is None or channel.reading_paused == paused:
            return
        channel.reading_paused = paused
        if not self._credit:
            if paused and self.config.slow_reader == "reset":
                self.lifecycle.reader_behind(channel)
            else:
                self.pressure.pause_for(paused)

    # -- for the core's own modules (peer.py, lifecycle.py), not the drivers -------------------

    def settle_open(self, handle: int, timed_out: bool = False) -> None:
        """Our open of ``handle`` was acknowledged, or ended: room for a waiting open (see
        ``Offers.settle``)."""
        room = self.offers.settle(handle, timed_out)
        if room is not None:
            self.emit(room)

    def open_failed(self, handle: int, error: Exception) -> None:
        """The peer refused our open of ``handle``: the request's failure, or an
        :class:`~ce.OpenFailed` event (a :class:`~ce.Finished` follows)."""
        if handle in self.requests:
            self.requests.open_failed(handle, error)
        else:
            self.emit(ce.OpenFailed(handle, error))

    def ack(self, handle: int, n: int) -> None:
        """Credit ``n`` consumed (or dropped) bytes of ``handle`` to the peer."""
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

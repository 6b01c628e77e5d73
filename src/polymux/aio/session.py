"""The asyncio session: :class:`MuxProtocol` drives an engine over a real transport, and
:class:`Session` is the public face of one multiplexed connection.

The send scheduler lives here. It runs in one loop callback per batch: control frames the
engine queued come first, then one frame per channel in round-robin order among the
channels that have data and credit, until ``batch_bytes`` are gathered; the batch goes to
the socket in one ``write()``. It stops while the socket transport is paused
(``pause_writing``) and resumes on ``resume_writing``. So one bulk channel cannot starve
the others, and no channel sends past its credit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Self, cast

from polymux._types import CaptureSink
from polymux.aio.channel import (
    ChannelStreamProtocol,
    ChannelStreamReader,
    ChannelTransport,
    SendOnlyStreamReader,
)
from polymux.config import SessionConfig
from polymux.engine import Engine, events as ev, make_engine
from polymux.engine.omnistreams import ControlReceived
from polymux.exceptions import (
    ChannelRejected,
    ChannelReset,
    LimitExceeded,
    PolymuxError,
    ProtocolError,
    SessionClosed,
)


__all__ = ["ChannelHandler", "MuxProtocol", "OfferFilter", "Session"]

_clock = time.monotonic
"""The engines' clock (RTT, window tuning). Not ``loop.time()``: uvloop's has millisecond
resolution, which measured a loopback RTT as 0 and kept yamux windows from ever growing."""

logger = logging.getLogger("polymux")

ChannelHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None] | None]
"""``handler(reader, writer)``: called for each incoming channel, like the callback of
``asyncio.start_server``."""

OfferFilter = Callable[[str], bool]
"""``offer_filter(name) -> bool``: accept (True) or reject (False) an incoming offer."""

StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]

_MAX_UNREAD_CONTROLS = 1024
"""Control messages (omnistreams) held unread before the session stops reading the connection."""

# Why reading from the peer is paused (bits of MuxProtocol._read_block); reading resumes
# only once every reason is gone.
_SLOW_READER = 1
"""A channel's reader is full and the format has no credit to withhold (``slow_reader``)."""
_CONTROLS = 2
"""omnistreams: too many control messages unread by the application."""
_BACKLOG = 4
"""Replies cannot be written (the peer does not read): ``max_queued_control``."""
_BUDGET = 8
"""The session holds ``max_session_memory`` (unread plus unsent bytes)."""
_STALLED = _BACKLOG | _BUDGET
"""Reasons that, with the socket unwritable, start the ``send_timeout`` clock."""

_BUSY_READ = 64 * 1024
"""A socket read at least this large means the peer had more queued: it is busy, not dead
(keepalive waits longer for an answer that sits behind what it sent)."""


class MuxProtocol(asyncio.Protocol):
    """Runs one engine on one connection: feeds it received bytes, dispatches its events
    to channel transports and writes what it produces through the send scheduler."""

    def __init__(
        self,
        protocol: str,
        config: SessionConfig | None = None,
        *,
        is_client: bool = True,
        handler: ChannelHandler | None = None,
        offer_filter: OfferFilter | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.config = config or SessionConfig()
        self.engine = engine or make_engine(protocol, self.config, is_client=is_client)
        self.is_client = is_client
        self._handler = handler
        self._offer_filter = offer_filter
        self._transport: asyncio.Transport | None = None
        self._channels: dict[int, ChannelTransport] = {}
        self._offers: dict[int, asyncio.Future[None]] = {}
        self._incoming: deque[tuple[str, StreamPair]] = deque()
        self._accept_waiters: deque[tuple[str | None, asyncio.Future[StreamPair]]] = deque()
        self._ready_queue: deque[ChannelTransport] = deque()
        self._acks_due: list[ChannelTransport] = []  # channels whose consumed bytes await credit
        self._flush_pending = False
        self._write_paused = False
        self._read_pausers = 0
        self._read_block = 0  # why reading is paused: _SLOW_READER | _CONTROLS | ...
        # The memory budget (max_session_memory). _held: bytes received and not yet consumed
        # by the application, plus bytes written and not yet sent, counted per channel up to
        # twice its high-water mark (an application that ignores drain() owns the rest);
        # over the budget, reading stops. _unsent: all unsent bytes; over half the budget,
        # every writer's drain() blocks.
        budget = self.config.max_session_memory
        self._held = 0
        self._hold_limit, self._hold_resume = budget, budget * 3 // 4
        self._unsent = 0
        self._unsent_limit, self._unsent_resume = budget // 2, budget // 4
        self._unsent_cap = 2 * self.config.write_buffer_high
        self._held_writers: set[ChannelTransport] = set()
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_mark = 0  # unsent socket bytes when the send_timeout clock (re)started
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._handlers = 0  # channel handlers still running (a reset channel's too)
        self._last_busy = -1e9  # loop time of the last full socket read
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closing = False
        self._inbound = 0  # live channels the peer opened
        self._open_tokens = max(1.0, self.config.inbound_channel_rate)
        self._open_stamp = self.loop.time()
        self._error: BaseException | None = None
        self._peer_goaway: str | None = None
        self._failed = False  # the session ended because of an error (not a clean close)
        self._eof_written = False
        self._pings: dict[int, tuple[asyncio.Future[float], float]] = {}
        self._keepalive: asyncio.Task[None] | None = None
        self._open_timers: dict[int, asyncio.TimerHandle] = {}  # our yamux opens not yet ACKed
        self._open_room: deque[asyncio.Future[None]] = deque()  # opens waiting for max_unacked_opens
        self._capture: CaptureSink | None = None
        self._last_activity = self.loop.time()  # last whole frame received, or last channel gone
        self._idle_timer: asyncio.TimerHandle | None = None
        # omnistreams: control messages not yet read, and stream pairs waiting for their answer.
        self._controls: deque[bytes] = deque()
        self._control_waiters: deque[asyncio.Future[bytes]] = deque()
        self._controls_paused = False
        self._pairs: dict[str, asyncio.Future[tuple[ChannelStreamReader, ChannelTransport]]] = {}
        self._pair_tasks: set[asyncio.Task[None]] = set()
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self.session = Session(self)
        self.on_connection_made: Callable[[], None] | None = None
        """Called once the connection is made: servers count a session only from then on
        (a TLS handshake that fails never makes it, nor ends it)."""

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        if self.on_connection_made is not None:
            self.on_connection_made()
        if self.config.capture is not None:
            self._start_capture(self._transport)
        if self.engine.ready:
            self.ready.set_result(None)
        else:
            # Both sides: a peer that connects and never completes the handshake must not
            # hold a socket until idle_timeout.
            self._handshake_timer = self.loop.call_later(
                self.config.handshake_timeout, self._handshake_expired
            )
        if self._supports_ping():
            if self.engine.ready:
                self._send_ping()  # at once: the RTT drives window tuning
            self._keepalive = self.loop.create_task(self._keep_alive(self.config.keepalive_interval))
        if self.config.idle_timeout is not None:
            self._last_activity = self.loop.time()
            self._idle_timer = self.loop.call_later(self.config.idle_timeout, self._check_idle)
        self._schedule_flush()

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        if self.ready.done() or self._transport is None:
            return
        self._abort(
            SessionClosed(
                f"{self.engine.format}: no handshake from the peer within "
                f"{self.config.handshake_timeout:g} s (handshake_timeout)"
            )
        )

    def _check_idle(self) -> None:
        """``idle_timeout``: close a session that has had no channels and received nothing
        for that long (a half-open connection, or a peer that never speaks)."""
        self._idle_timer = None
        timeout = self.config.idle_timeout
        transport = self._transport
        if transport is None or timeout is None or self._error is not None:
            return
        now = self.loop.time()
        if self._channels or self._incoming or self._offers:
            self._last_activity = now
        idle = now - self._last_activity
        if idle < timeout:
            self._idle_timer = self.loop.call_later(timeout - idle, self._check_idle)
            return
        self._error = SessionClosed(
            f"{self.engine.format}: closed after {timeout:g} s with no channels and no frame received "
            "(idle_timeout)"
        )
        logger.info("%s", self._error)
        self._closing = True
        if not self.engine.closed:
            self.engine.close()  # a go-away where the format has one
        self._shut()

    def _start_capture(self, transport: asyncio.Transport) -> None:
        def addr(name: str) -> str:
            value = transport.get_extra_info(name)
            if isinstance(value, tuple):
                host = str(value[0])
                return f"[{host}]:{value[1]}" if ":" in host else f"{host}:{value[1]}"
            return "" if value is None else str(value)

        info = {
            "format": self.engine.format,
            "role": "client" if self.is_client else "server",
            "local": addr("sockname"),
            "peer": addr("peername"),
        }
        assert self.config.capture is not None
        try:
            self._capture = self.config.capture(info)
        except Exception:  # a broken recorder must not break the session
            logger.exception(
                "%s: the capture factory failed; this session is not recorded", self.engine.format
            )

    # -- pings and keepalive -----------------------------------------------------------------

    def _supports_ping(self) -> bool:
        return type(self.engine).ping is not Engine.ping

    def _send_ping(self) -> asyncio.Future[float]:
        engine = self.engine
        engine.now = _clock()
        opaque = engine.ping()
        fut: asyncio.Future[float] = self.loop.create_future()
        self._pings[opaque] = (fut, engine.now)
        self._schedule_flush()
        return fut

    async def ping(self) -> float:
        """Ping the peer; return the round-trip time in seconds."""
        if self._error is not None or self._transport is None:
            raise SessionClosed(f"{self.engine.format}: the session is closed") from self._error
        if not self._supports_ping() or not self.engine.ping_answered:
            raise PolymuxError(f"{self.engine.format} has no ping (nothing answers its keepalive)")
        fut = self._send_ping()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.config.keepalive_timeout)
        except TimeoutError:
            self._forget_pings(fut)
            raise SessionClosed(
                f"{self.engine.format}: no answer to a ping within {self.config.keepalive_timeout:g} s"
            ) from None

    def _forget_pings(self, fut: asyncio.Future[float]) -> None:
        for opaque, (pending, _sent) in list(self._pings.items()):
            if pending is fut:
                del self._pings[opaque]

    async def _keep_alive(self, interval: float | None) -> None:
        try:
            if not self.engine.ready:
                await asyncio.shield(self.ready)  # a handshake first (Streamux negotiation)
                if self._transport is not None:
                    self._send_ping()  # the RTT
            if interval is None:
                return
            while self._transport is not None:
                await asyncio.sleep(interval)
                fut = self._send_ping()
                timeout = self.config.keepalive_timeout
                if not self.engine.ping_answered:
                    # Nothing answers this ping (smux's NOP): the peer's next frame does, and
                    # an idle peer sends one only every ITS keepalive interval (xtaci: 10 s).
                    timeout += interval
                waited = 0.0
                while True:
                    unsent = self._socket_unsent()
                    try:
                        await asyncio.wait_for(asyncio.shield(fut), timeout)
                        break
                    except TimeoutError:
                        # Only an answer proves the peer alive (a trickle of bytes does not).
                        # A busy peer's answer may sit behind what it sent before it (100,000
                        # channel opens: full socket reads), and our ping behind what we
                        # send (our unsent bytes shrink as the peer reads): wait longer
                        # then, but never past 4 x keepalive_timeout in all.
                        waited += timeout
                        if self._transport is not None and waited < 4 * timeout:
                            busy = self.loop.time() - self._last_busy < timeout
                            if busy or self._socket_unsent() < unsent:
                                continue
                    self._forget_pings(fut)
                    err = SessionClosed(
                        f"{self.engine.format}: keepalive failed: no answer to a ping within "
                        f"{waited:g} s (keepalive_timeout={self.config.keepalive_timeout:g})"
                    )
                    logger.warning("%s", err)
                    self._abort(err)
                    return
        except (asyncio.CancelledError, SessionClosed, ProtocolError):
            return

    def data_received(self, data: bytes) -> None:
        if self._error is not None:
            return
        if self._capture is not None:
            self._capture.received(data)
        engine = self.engine
        engine.now = _clock()
        try:
            events = engine.receive_data(data)
        except ProtocolError as exc:
            logger.warning("%s", exc)
            self._abort(exc)
            return
        if events or engine.has_output:
            # Whole frames arrived (bytes of a frame that never ends do not count).
            self._last_activity = now = self.loop.time()
            if len(data) >= _BUSY_READ:
                self._last_busy = now
        for event in events:
            self._dispatch(event)
        self._schedule_flush()
        if self._write_paused and engine.queued_frames > self.config.max_queued_control:
            # The peer sends frames that need answers and does not read them.
            self._block_reading(_BACKLOG, True)
        if self._drain_waiters:
            self._wake()

    def eof_received(self) -> bool:
        # The peer closed its side of the connection: the session is over.
        self._closing = True
        try:
            self.engine.receive_eof()
        except ProtocolError as exc:
            logger.warning("%s", exc)
            if self._error is None:
                self._error = exc
                self._failed = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._closing = True
        self.engine.closed = True
        if self._capture is not None:
            capture, self._capture = self._capture, None
            capture.close()
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        for timer in self._open_timers.values():
            timer.cancel()
        self._open_timers.clear()
        for handle in (self._stall_timer, self._handshake_timer):
            if handle is not None:
                handle.cancel()
        self._stall_timer = self._handshake_timer = None
        self._held_writers.clear()
        self._wake_openers(everyone=True)
        if self._error is not None:
            cause: BaseException | None = self._error
            error = SessionClosed(f"{self.engine.format}: session ended: {self._error}")
        elif exc is not None:
            cause = exc
            error = SessionClosed(f"{self.engine.format}: connection lost: {exc}")
            self._failed = True
        else:
            cause = None
            error = SessionClosed(f"{self.engine.format}: the session's connection was closed")
        error.__cause__ = cause
        if self._error is None:
            self._error = error
        for channel in list(self._channels.values()):
            channel._fail(error)
        self._channels.clear()
        for fut in self._offers.values():
            if not fut.done():
                fut.set_exception(error)
        self._offers.clear()
        for _name, waiter in self._accept_waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._accept_waiters.clear()
        if not self.ready.done():
            self.ready.set_exception(error)
            self.ready.exception()  # a server's session may have nobody awaiting its handshake
        for ping, _sent in self._pings.values():
            if not ping.done():
                ping.set_exception(error)
                ping.exception()  # keepalive/RTT pings may have no awaiter: no "never retrieved" log
        self._pings.clear()
        for control in self._control_waiters:
            if not control.done():
                control.set_exception(error)
        for pair in self._pairs.values():
            if not pair.done():
                pair.set_exception(error)
        self._control_waiters.clear()
        self._pairs.clear()
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._arm_stall()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._schedule_flush()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Extra information of the underlying transport."""
        if self._transport is None:
            return default
        return self._transport.get_extra_info(name, default)

    # -- events ------------------------------------------------------------------------------

    def _dispatch(self, event: ev.Event) -> None:
        if isinstance(event, ev.DataReceived):
            channel = self._channels.get(event.channel)
            if channel is not None:
                channel._feed(event.data, event.more, event.flow_controlled_length)
            else:
                self._ack(event.channel, event.flow_controlled_length)
        elif isinstance(event, ev.CreditAvailable):
            channel = self._channels.get(event.channel)
            if channel is not None:
                self._want_send(channel)
        elif isinstance(event, ev.ChannelOpened):
            self._on_offer(event.channel, event.name)
        elif isinstance(event, ev.ChannelAccepted):
            self._open_settled(event.channel)
            channel = self._channels.get(event.channel)
            fut = self._offers.pop(event.channel, None)
            if channel is not None:
                channel._accepted = True
                self._want_send(channel)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif isinstance(event, ev.ChannelEnded):
            channel = self._channels.get(event.channel)
            if channel is not None:
                channel._remote_end()
        elif isinstance(event, ev.ChannelClosed):
            channel = self._channels.get(event.channel)
            if channel is not None:
                channel._peer_closed(event.local_done)
        elif isinstance(event, ev.ChannelReset):
            fut = self._offers.pop(event.channel, None)
            channel = self._channels.get(event.channel)
            if fut is not None and not fut.done():
                label = channel._label() if channel else f"#{event.channel}"
                exc = ChannelReset(self.engine.format, label, event.message)
                fut.set_exception(exc)
            if channel is not None:
                channel._peer_reset(event.message)
        elif isinstance(event, ev.ChannelRejected):
            fut = self._offers.pop(event.channel, None)
            channel = self._channels.get(event.channel)
            name = channel.name if channel is not None else ""
            label = channel._label() if channel is not None else f"#{event.channel}"
            if channel is not None:
                channel._finish(None)
            if fut is not None and not fut.done():
                fut.set_exception(ChannelRejected(self.engine.format, label, name))
        elif isinstance(event, ev.ReadingStopped):
            channel = self._channels.get(event.channel)
            if channel is not None:
                channel._peer_stopped_reading()
        elif isinstance(event, ev.SessionReady):
            if self._handshake_timer is not None:
                self._handshake_timer.cancel()
                self._handshake_timer = None
            if not self.ready.done():
                self.ready.set_result(None)
        elif isinstance(event, ev.SessionClosed):
            # The peer's go-away: no new channels; open ones may finish. One that reports
            # an error ends the session (as hashicorp's handleGoAway does).
            self._peer_goaway = f"the peer is going away ({event.message})"
            self._wake_openers(everyone=True)  # opens waiting for room fail now
            if event.code:
                self._abort(SessionClosed(f"{self.engine.format}: the peer went away with {event.message}"))
        elif isinstance(event, ev.PingAcked):
            entry = self._pings.pop(event.opaque, None)
            if entry is not None and not entry[0].done():
                entry[0].set_result(_clock() - entry[1])
        elif isinstance(event, ControlReceived):
            self._on_control(event.data)

    # -- omnistreams: control messages and stream pairs --------------------------------------

    def send_control(self, data: bytes) -> None:
        """Send a control message (formats that have them: omnistreams)."""
        send = getattr(self.engine, "send_control", None)
        if send is None:
            raise PolymuxError(f"{self.engine.format} has no control messages")
        if self._error is not None or self._transport is None:
            raise SessionClosed(f"{self.engine.format}: the session is closed") from self._error
        send(data)
        self._schedule_flush()

    def _on_control(self, data: bytes) -> None:
        while self._control_waiters:
            waiter = self._control_waiters.popleft()
            if not waiter.done():
                waiter.set_result(data)
                return
        self._controls.append(data)
        if len(self._controls) >= _MAX_UNREAD_CONTROLS and not self._controls_paused:
            self._controls_paused = True  # bounded memory: wait for the application to read
            self._block_reading(_CONTROLS, True)

    async def receive_control(self) -> bytes:
        """The next control message from the peer."""
        if self._controls:
            data = self._controls.popleft()
            if self._controls_paused and len(self._controls) <= _MAX_UNREAD_CONTROLS // 2:
                self._controls_paused = False
                self._block_reading(_CONTROLS, False)
            return data
        if self._error is not None or self._transport is None:
            raise SessionClosed(f"{self.engine.format}: the session is closed") from self._error
        waiter: asyncio.Future[bytes] = self.loop.create_future()
        self._control_waiters.append(waiter)
        return await waiter

    def _pair_role(self, handle: int) -> tuple[str, str] | None:
        """``("pair", token)`` for the first half of a stream pair, ``("reply", token)`` for
        the answer to one of ours, None for a plain stream."""
        get = getattr(self.engine, "metadata_object", None)
        meta = get(handle) if get is not None else None
        if not meta:
            return None
        for key, role in (("pair", "pair"), ("replyTo", "reply")):
            token = meta.get(key)
            if isinstance(token, str):
                return role, token
        return None

    def _on_pair_offer(self, role: str, token: str, name: str, channel: ChannelTransport) -> None:
        reader = ChannelStreamReader(limit=self.config.stream_limit, loop=self.loop)
        channel._attach(ChannelStreamProtocol(reader, loop=self.loop), reader)
        if role == "reply":
            waiter = self._pairs.pop(token, None)
            if waiter is None or waiter.done():
                channel.abort()  # an answer nobody waits for
            else:
                waiter.set_result((reader, channel))
            return
        task = self.loop.create_task(self._answer_pair(name, token, reader, channel))
        self._pair_tasks.add(task)
        task.add_done_callback(self._pair_tasks.discard)

    async def _answer_pair(
        self, name: str, token: str, reader: ChannelStreamReader, inbound: ChannelTransport
    ) -> None:
        """The peer opened the first half of a pair: open the other half back, then hand
        ``(reader, writer)`` to the handler or to ``accept_channel``."""
        out_reader = ChannelStreamReader(limit=self.config.stream_limit, loop=self.loop)
        protocol = ChannelStreamProtocol(out_reader, loop=self.loop)
        try:
            out = await self.open_channel(name, protocol, out_reader, metadata={"replyTo": token})
        except PolymuxError as exc:
            logger.info("%s: cannot answer the stream pair %r: %s", self.engine.format, name, exc)
            inbound.abort()
            return
        out._partner = inbound
        writer = asyncio.StreamWriter(out, protocol, reader, self.loop)
        if self._handler is not None:
            await self._run_handler(reader, writer)
            return
        self._incoming.append((name, (reader, writer)))
        self._serve_accept_waiters()

    def _on_offer(self, handle: int, name: str) -> None:
        engine = self.engine
        config = self.config
        # Token bucket: a peer opening channels faster than the rate is abusive. Charged for
        # every open as it is read, refused ones and ones already reset (Rapid Reset) too.
        now = self.loop.time()
        rate = config.inbound_channel_rate
        self._open_tokens = min(max(1.0, rate), self._open_tokens + (now - self._open_stamp) * rate)
        self._open_stamp = now
        if self._open_tokens < 1:
            error = ProtocolError(engine.format, f"the peer opens channels faster than {rate:g} per second")
            logger.warning("%s", error)
            self._abort(error)
            return
        self._open_tokens -= 1
        if not engine.is_live(handle):
            return  # opened and reset (or cancelled) within the same read: nothing to take
        refuse = (
            self._closing
            or len(self._channels) >= config.max_channels
            or max(self._inbound, self._handlers) >= config.max_inbound_channels
            or len(name) > config.max_name_bytes  # characters: a fast first check
            or len(name.encode("utf-8", "surrogatepass")) > config.max_name_bytes
            or (self._offer_filter is not None and not self._offer_filter(name))
            or (self._handler is None and self._backlog_full())
        )
        if refuse:
            engine.reject_channel(handle)
            return
        engine.accept_channel(handle)
        channel = self._new_channel(handle, name, local=False)
        channel._accepted = True
        role = self._pair_role(handle) if getattr(engine, "one_way", False) else None
        if role is not None:
            self._on_pair_offer(role[0], role[1], name, channel)
            return
        reader = ChannelStreamReader(limit=self.config.stream_limit, loop=self.loop)
        if self._handler is not None:
            protocol = ChannelStreamProtocol(reader, self._run_handler, loop=self.loop)
            channel._attach(protocol, reader)
            return
        protocol = ChannelStreamProtocol(reader, loop=self.loop)
        channel._attach(protocol, reader)
        writer = asyncio.StreamWriter(channel, protocol, reader, self.loop)
        self._incoming.append((name, (reader, writer)))
        self._serve_accept_waiters()

    async def _run_handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Run the channel handler; an exception it raises resets the channel, carrying
        ``"Type: message"`` to the peer where the format can."""
        assert self._handler is not None
        # Counted until the handler returns, after its channel is gone too: a peer that
        # opens and resets channels at once (Rapid Reset) cannot start handlers faster
        # than they finish.
        self._handlers += 1
        try:
            result = self._handler(reader, writer)
            if result is not None:
                await result
        except Exception as exc:
            transport = writer.transport
            logger.error("%s: channel handler failed on %s", self.engine.format, transport, exc_info=exc)
            if isinstance(transport, ChannelTransport):
                transport.reset(exc)
        finally:
            self._handlers -= 1

    def _backlog_full(self) -> bool:
        return len(self._incoming) >= self.config.accept_backlog

    def _serve_accept_waiters(self) -> None:
        for waiter_entry in list(self._accept_waiters):
            want, waiter = waiter_entry
            if waiter.done():
                self._accept_waiters.remove(waiter_entry)
                continue
            for entry in self._incoming:
                if want is None or entry[0] == want:
                    self._incoming.remove(entry)
                    self._accept_waiters.remove(waiter_entry)
                    waiter.set_result(entry[1])
                    break

    # -- channels ----------------------------------------------------------------------------

    def _new_channel(self, handle: int, name: str, *, local: bool) -> ChannelTransport:
        channel = ChannelTransport(self, handle, name)
        channel._local_origin = local
        self._channels[handle] = channel
        if not local:
            self._inbound += 1
        return channel

    def _channel_done(self, channel: ChannelTransport) -> None:
        self._open_settled(channel._handle)
        if self._channels.pop(channel._handle, None) is not None and not channel._local_origin:
            self._inbound -= 1
        self._last_activity = self.loop.time()

    def _reset_channel(self, channel: ChannelTransport, message: str | None) -> None:
        if self.engine.is_live(channel._handle) and not self.engine.closed:
            self.engine.reset_channel(channel._handle, message)
            self._schedule_flush()

    def _ack_later(self, channel: ChannelTransport) -> None:
        """``channel`` has consumed bytes to credit: its ``_send_acks`` runs once the loop's
        current callbacks are done, together with every other channel's (one callback per
        iteration for the session, not one per channel: 256 busy readers made 256)."""
        acks = self._acks_due
        acks.append(channel)
        if len(acks) == 1:
            self.loop.call_soon(self._send_acks)

    def _send_acks(self) -> None:
        acks, self._acks_due = self._acks_due, []
        for channel in acks:
            channel._send_acks()

    def _ack(self, handle: int, n: int) -> None:
        if self.engine.closed:
            return
        engine = self.engine
        engine.now = _clock()
        engine.ack_consumed(handle, n)
        if engine.has_output:  # most reads return credit below the batching threshold
            self._schedule_flush()

    def _channel_reading_paused(self, channel: ChannelTransport, paused: bool) -> None:
        # With credit on the wire, pausing a channel withholds its credit (done by the
        # channel itself). Without it, the only way to stop the peer is to stop reading
        # the whole connection (head-of-line blocking, as MultiplexingStream v1 does).
        if self.engine.has_flow_control:
            return
        self._read_pausers += 1 if paused else -1
        self._block_reading(_SLOW_READER, self._read_pausers > 0)

    # -- bounds: reading paused, the memory budget, send_timeout --------------------------------

    def _block_reading(self, reason: int, on: bool) -> None:
        """Pause (``on``) or allow reading from the peer for ``reason``; reading resumes once
        no reason is left."""
        before = self._read_block
        after = before | reason if on else before & ~reason
        if after == before:
            return
        self._read_block = after
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if after and not before:
                transport.pause_reading()
            elif before and not after:
                transport.resume_reading()
        if on and reason & _STALLED:
            self._arm_stall()

    def _socket_unsent(self) -> int:
        """Bytes we must still send that the peer has not taken: the socket transport's
        buffer and the engine's queued frames."""
        transport = self._transport
        return (transport.get_write_buffer_size() if transport is not None else 0) + (
            1 if self.engine.has_output else 0
        )

    def _arm_stall(self) -> None:
        """Start the ``send_timeout`` clock when reading is held back because the peer does
        not read what we must send it."""
        timeout = self.config.send_timeout
        if timeout is None or self._stall_timer is not None or self._transport is None:
            return
        if self._write_paused and self._read_block & _STALLED:
            self._stall_mark = self._socket_unsent()
            self._stall_timer = self.loop.call_later(timeout, self._check_stall)

    def _check_stall(self) -> None:
        self._stall_timer = None
        if self._transport is None or not (self._write_paused and self._read_block & _STALLED):
            return
        unsent = self._socket_unsent()
        if unsent < self._stall_mark:  # the peer read some: a slow reader, not a stalled one
            self._arm_stall()
            return
        timeout = self.config.send_timeout
        error = SessionClosed(
            f"{self.engine.format}: the peer sends but is not reading: {unsent} bytes unsent and "
            f"no progress for {timeout:g} s (send_timeout)"
        )
        logger.warning("%s", error)
        self._abort(error)

    # Bytes an application wrote beyond twice its channel's high-water mark (it ignored
    # drain()) do not count towards pausing the reads: reading brings the credit that lets
    # them go, so a session that wrote 64 MiB at once would otherwise deadlock itself.

    def _hold(self, n: int) -> None:
        """``n`` more bytes held (received and unread, or written and unsent)."""
        self._held += n
        if self._held > self._hold_limit:
            self._block_reading(_BUDGET, True)

    def _release(self, n: int) -> None:
        """``n`` held bytes were consumed, sent or dropped."""
        self._held -= n
        if self._read_block & _BUDGET and self._held <= self._hold_resume:
            self._block_reading(_BUDGET, False)

    def _sent(self, n: int) -> None:
        """``n`` unsent bytes left the channels' buffers (sent, or dropped)."""
        self._unsent -= n
        if self._held_writers and self._unsent <= self._unsent_resume:
            held, self._held_writers = self._held_writers, set()
            for channel in held:
                channel._update_write_pause()

    def _hold_writer(self, channel: ChannelTransport) -> None:
        """``channel``'s writer stays paused until the session's unsent bytes fall."""
        self._held_writers.add(channel)

    async def open_channel(
        self,
        name: str,
        protocol: asyncio.BaseProtocol,
        reader: ChannelStreamReader | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> ChannelTransport:
        """Offer a channel and wait until the peer accepts it (``metadata``: extra keys of
        omnistreams creation metadata)."""
        await self.ready
        if self._open_room or len(self._open_timers) >= self.config.max_unacked_opens:
            await self._room_to_open()
        self._check_open()
        config = self.config
        if len(self._channels) >= config.max_channels:
            raise LimitExceeded(f"{self.engine.format}: max_channels={config.max_channels} channels are open")
        if len(self._channels) - self._inbound >= config.max_outbound_channels:
            raise LimitExceeded(
                f"{self.engine.format}: max_outbound_channels={config.max_outbound_channels} channels are open"
            )
        try:
            if metadata is None:
                handle = self.engine.open_channel(name)
            else:
                handle = cast(Any, self.engine).open_channel(name, extra=metadata)
        except RuntimeError as exc:  # e.g. every request id in flight (Streamux)
            raise LimitExceeded(str(exc)) from None
        channel = self._new_channel(handle, self.engine.channel_name(handle), local=True)
        # Attach before the acceptance: data may follow it in the same read.
        channel._attach(protocol, reader)
        if not self.engine.needs_acceptance:  # usable at once (mplex, yamux)
            channel._accepted = True
            self._schedule_flush()
            if self.engine.format == "yamux":
                self._open_timers[handle] = self.loop.call_later(
                    config.stream_open_timeout, self._open_timed_out, channel
                )
            return channel
        fut: asyncio.Future[None] = self.loop.create_future()
        self._offers[handle] = fut
        self._schedule_flush()
        try:
            await fut
        except asyncio.CancelledError:
            self._offers.pop(handle, None)
            channel.abort()  # rescinds the offer
            raise
        except Exception as exc:
            channel._finish(exc)
            raise
        return channel

    async def _room_to_open(self) -> None:
        """yamux: wait, in order, until fewer than ``max_unacked_opens`` of our opens await
        the peer's ACK (as hashicorp's ``OpenStream`` does: its peer resets SYNs beyond its
        accept backlog). Bounded: the oldest open times out within ``stream_open_timeout``,
        and a slot freed that way fails the first waiting open (``_open_settled``)."""
        limit = self.config.max_unacked_opens
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._open_room.append(waiter)
        try:
            while True:
                await waiter
                if len(self._open_timers) < limit or self._closing or self._peer_goaway:
                    return  # room, or _check_open() says why not
                waiter = self.loop.create_future()
                self._open_room.appendleft(waiter)  # woken for a slot another took: keep our place
        except BaseException:
            if not waiter.done() or waiter.cancelled():
                if waiter in self._open_room:
                    self._open_room.remove(waiter)
            elif waiter.exception() is None:
                self._wake_openers()  # we were given room and leave: pass it on
            raise

    def _wake_openers(self, everyone: bool = False) -> None:
        """Wake as many waiting opens as there is room for (``everyone``: all of them)."""
        room = len(self._open_room) if everyone else self.config.max_unacked_opens - len(self._open_timers)
        while room > 0 and self._open_room:
            waiter = self._open_room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1

    def _open_settled(self, handle: int, timed_out: bool = False) -> None:
        """Our open of ``handle`` was acknowledged, or the channel ended: stop its timer and
        make room for a waiting open. ``timed_out``: the peer never acknowledged it, so the
        first waiting open fails instead (a peer that does not accept would reset it too)."""
        timer = self._open_timers.pop(handle, None)
        if timer is None:
            return
        timer.cancel()
        while timed_out and self._open_room:
            waiter = self._open_room.popleft()
            if not waiter.done():
                config = self.config
                waiter.set_exception(
                    LimitExceeded(
                        f"{self.engine.format}: no room to open a channel: max_unacked_opens="
                        f"{config.max_unacked_opens} opened channels await the peer's acknowledgement, "
                        f"and one was not acknowledged within stream_open_timeout={config.stream_open_timeout:g} s"
                    )
                )
                return
        if self._open_room:
            self._wake_openers()

    def _open_timed_out(self, channel: ChannelTransport) -> None:
        """The peer never acknowledged a stream we opened: reset it."""
        self._open_settled(channel._handle, timed_out=True)
        if channel._done:
            return
        self._reset_channel(channel, None)
        channel._finish(
            ChannelReset(
                self.engine.format,
                channel._label(),
                f"not acknowledged within stream_open_timeout={self.config.stream_open_timeout:g} s",
                by_peer=False,
            )
        )

    def _check_open(self) -> None:
        if self._error is not None:
            raise SessionClosed(f"{self.engine.format}: the session is closed") from self._error
        if self._closing:
            raise SessionClosed(f"{self.engine.format}: the session is closing")
        if self._peer_goaway is not None or not self.engine.can_open:
            raise SessionClosed(
                f"{self.engine.format}: no new channels: {self._peer_goaway or 'we are going away'}"
            )

    async def accept(self, name: str | None) -> StreamPair:
        """Wait for an incoming channel (named ``name``, if given)."""
        for entry in self._incoming:
            if name is None or entry[0] == name:
                self._incoming.remove(entry)
                return entry[1]
        self._check_open()
        waiter: asyncio.Future[StreamPair] = self.loop.create_future()
        self._accept_waiters.append((name, waiter))
        return await waiter

    # -- the send scheduler ------------------------------------------------------------------

    def _want_send(self, channel: ChannelTransport) -> None:
        if not channel._queued:
            channel._queued = True
            self._ready_queue.append(channel)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_pending and self._transport is not None:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        transport = self._transport
        engine = self.engine
        if transport is None or engine.closed and self._error is not None or self._eof_written:
            return
        ready = self._ready_queue
        max_frame = engine.max_frame
        batch_limit = self.config.batch_bytes
        while not self._write_paused:
            out = engine.data_to_send()
            size = 0
            while ready and size < batch_limit:
                channel = ready.popleft()
                channel._queued = False
                # Round-robin one frame per turn while others wait; a channel alone may
                # fill the batch (fewer turns, same order on the wire).
                quantum = max_frame if ready else batch_limit - size
                size += self._send_turn(channel, quantum)
                if channel._wants_send():
                    channel._queued = True
                    ready.append(channel)
            out += engine.data_to_send()
            if not out:
                break
            # One call per batch; uvloop sends the parts with one writev, no join.
            if self._capture is not None:
                self._capture.sent(out)
            transport.writelines(out)
        if not self._write_paused:
            if self._read_block & _BACKLOG and not engine.has_output:
                self._block_reading(_BACKLOG, False)
            self._wake()

    def _send_turn(self, channel: ChannelTransport, quantum: int) -> int:
        """One channel's turn: at most ``quantum`` bytes (within its credit), or its
        end-of-writing."""
        if not channel._accepted:
            return 0
        engine = self.engine
        handle = channel._handle
        if channel._buffered:
            credit = engine.send_credit(handle)
            if credit <= 0:
                return 0
            n = min(quantum, credit, channel._buffered)
            engine.send_data(handle, *channel._take(n))
            return n
        if channel._eof_requested and not channel._eof_sent and engine.is_live(handle):
            channel._eof_sent = True
            closed = engine.end_channel(handle)
            channel._eof_was_sent(closed)
        return 0

    async def flush(self) -> None:
        """Wait until the scheduler has handed everything it can send now to the socket
        transport (data waiting for credit stays queued)."""
        while self._transport is not None and (self._flush_pending or self._write_paused):
            await self._activity()

    async def _activity(self) -> None:
        """Wait for the next scheduler run or received data (or the end of the session)."""
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def _wake(self) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- ending ------------------------------------------------------------------------------

    def _abort(self, exc: BaseException) -> None:
        """End the session because of ``exc`` (a protocol violation, a dead peer)."""
        if self._error is None:
            self._error = exc
            self._failed = True
        self._closing = True
        self._shut()

    def _shut(self) -> None:
        """Close the connection now: send what the engine queued last (a go-away naming
        the error) if the socket takes it at once, and abort (dropping unsent bytes) if it
        does not: a peer that does not read must not keep the socket, its buffers and the
        channels' memory alive."""
        transport = self._transport
        if transport is None:
            return
        out = self.engine.data_to_send()
        if out and not transport.is_closing():
            if self._capture is not None:
                self._capture.sent(out)
            transport.writelines(out)
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()

    async def aclose(self) -> None:
        """Flush what channels have queued (bounded by ``close_timeout``), then close."""
        if self.closed.done():
            return
        self._closing = True
        deadline = self.loop.time() + self.config.close_timeout
        if self._transport is not None:
            try:
                await asyncio.wait_for(self._drain_channels(), self.config.close_timeout)
            except TimeoutError:
                logger.info("%s: close_timeout expired with data unsent", self.engine.format)
            self.engine.close()
            self._flush()
            if not self.engine.can_open and self._channels:
                # The format said goodbye (yamux GoAway): let open channels finish.
                try:
                    await asyncio.wait_for(self._channels_finished(), max(0.0, deadline - self.loop.time()))
                except TimeoutError:
                    logger.info("%s: channels still open at close_timeout", self.engine.format)
            transport = self._transport
            if transport is not None:
                # Half-close and let the peer close its side: closing at once while the
                # peer still sends (credit updates) makes the kernel reset the connection,
                # which can destroy data the peer has not read yet.
                if transport.can_write_eof():
                    transport.write_eof()
                    self._eof_written = True
                else:
                    transport.close()
                try:
                    await asyncio.wait_for(asyncio.shield(self.closed), max(0.0, deadline - self.loop.time()))
                except TimeoutError:
                    logger.info("%s: the peer did not close within close_timeout", self.engine.format)
                    if self._transport is not None:
                        self._transport.abort()
        await asyncio.shield(self.closed)

    async def _channels_finished(self) -> None:
        while self._transport is not None and self._channels:
            await self._activity()

    async def _drain_channels(self) -> None:
        def unsent() -> bool:
            return any(
                (ch._buffered or (ch._eof_requested and not ch._eof_sent)) and not ch._done
                for ch in self._channels.values()
            )

        while self._transport is not None and unsent():
            # Progress needs a scheduler run, or credit from the peer (received data).
            await self._activity()
        await self.flush()


class Session:
    """One multiplexed connection. Get one from :func:`polymux.connect`,
    :func:`polymux.connect_unix`, :func:`polymux.over` or a server.

    Use it as an async context manager (``async with``) so it closes; iterate it
    (``async for reader, writer in session``) to take incoming channels.
    """

    def __init__(self, mux: MuxProtocol) -> None:
        self._mux = mux

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else "open"
        return f"<polymux.Session {self.protocol} {state} channels={len(self._mux._channels)}>"

    @property
    def protocol(self) -> str:
        """The wire format's name (``protocol=``)."""
        return self._mux.engine.format

    @property
    def config(self) -> SessionConfig:
        """The session's configuration."""
        return self._mux.config

    @property
    def engine(self) -> Engine:
        """The sans-I/O engine (for introspection and tests)."""
        return self._mux.engine

    @property
    def is_closed(self) -> bool:
        """Whether the connection is gone."""
        return self._mux.closed.done()

    @property
    def exception(self) -> BaseException | None:
        """Why the session ended abnormally (e.g. a :class:`ProtocolError`), if it did."""
        mux = self._mux
        return mux._error if mux._failed else None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Extra information of the underlying transport (``peername`` ...)."""
        return self._mux.get_extra_info(name, default)

    async def ping(self) -> float:
        """Ping the peer and return the round-trip time in seconds (formats with pings:
        yamux). Raises :class:`~polymux.exceptions.SessionClosed` without an answer
        within ``keepalive_timeout``."""
        return await self._mux.ping()

    @property
    def rtt(self) -> float | None:
        """The latest measured round-trip time (formats with pings), or None."""
        return getattr(self._mux.engine, "rtt", None)

    async def wait_ready(self) -> None:
        """Wait for the handshake (formats that have one)."""
        await self._mux.ready

    async def open_channel(self, name: str = "") -> StreamPair:
        """Offer a channel named ``name``; return its ``(reader, writer)`` once accepted.

        Raises :class:`~polymux.exceptions.ChannelRejected` if the peer rejects it.
        """
        mux = self._mux
        # One-way formats (omnistreams): the opener's reader refuses reads, clearly.
        reader_class = SendOnlyStreamReader if getattr(mux.engine, "one_way", False) else ChannelStreamReader
        reader = reader_class(limit=mux.config.stream_limit, loop=mux.loop)
        protocol = ChannelStreamProtocol(reader, loop=mux.loop)
        channel = await mux.open_channel(name, protocol, reader)
        writer = asyncio.StreamWriter(channel, protocol, reader, mux.loop)
        return reader, writer

    async def open_pair(self, name: str = "") -> StreamPair:
        """A bidirectional ``(reader, writer)`` on any format. On omnistreams, whose streams
        are one-way, this opens a stream to the peer and waits for the polymux peer to open
        one back (creation metadata ``{"pair": token}`` / ``{"replyTo": token}``); its
        handler or ``accept_channel`` gets the matching pair. ``writer.close()`` ends both
        streams. A peer that does not answer pairs (not polymux) never completes it: bound
        the wait with ``asyncio.timeout``. Other formats: the same as :meth:`open_channel`."""
        mux = self._mux
        if not getattr(mux.engine, "one_way", False):
            return await self.open_channel(name)
        token = os.urandom(8).hex()
        answer: asyncio.Future[tuple[ChannelStreamReader, ChannelTransport]] = mux.loop.create_future()
        mux._pairs[token] = answer
        reader = ChannelStreamReader(limit=mux.config.stream_limit, loop=mux.loop)
        protocol = ChannelStreamProtocol(reader, loop=mux.loop)
        out: ChannelTransport | None = None
        try:
            out = await mux.open_channel(name, protocol, reader, metadata={"pair": token})
            in_reader, inbound = await answer
        except BaseException:
            mux._pairs.pop(token, None)
            if out is not None:
                out.abort()
            raise
        out._partner = inbound
        return in_reader, asyncio.StreamWriter(out, protocol, in_reader, mux.loop)

    def send_control(self, data: bytes) -> None:
        """Send a control message: session-level bytes (omnistreams)."""
        self._mux.send_control(data)

    async def receive_control(self) -> bytes:
        """Wait for the peer's next control message (omnistreams). Raises
        :class:`~polymux.exceptions.SessionClosed` when the session ends first."""
        return await self._mux.receive_control()

    async def request(self, body: bytes, name: str = "", *, limit: int | None = None) -> bytes:
        """Send ``body`` on a new channel, end it, and return everything the peer answers
        (Streamux's request/response, usable on any format). ``limit`` bounds the answer:
        a longer one raises :class:`~polymux.exceptions.LimitExceeded`."""
        reader, writer = await self.open_channel(name)
        done = False
        try:
            if body:
                writer.write(body)
            writer.write_eof()
            if limit is None:
                answer = await reader.read()
            else:
                answer = await reader.read(limit + 1)
                while len(answer) <= limit and (more := await reader.read(limit + 1 - len(answer))):
                    answer += more
                if len(answer) > limit:
                    raise LimitExceeded(f"{self.protocol}: the answer exceeds limit={limit} bytes")
            done = True
            return answer
        finally:
            if done:
                writer.close()
            else:
                writer.transport.abort()  # cancelled or failed: cancel the request on the wire

    async def create_channel(
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], name: str = ""
    ) -> tuple[ChannelTransport, asyncio.BaseProtocol]:
        """Open a channel driven by any ``asyncio.Protocol`` (like ``loop.create_connection``)."""
        protocol = protocol_factory()
        channel = await self._mux.open_channel(name, protocol)
        return channel, protocol

    async def accept_channel(self, name: str | None = None) -> StreamPair:
        """Wait for the next incoming channel, or the next one named ``name``.

        Raises :class:`~polymux.exceptions.SessionClosed` when the session ends first.
        """
        return await self._mux.accept(name)

    def __aiter__(self) -> AsyncIterator[StreamPair]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[StreamPair]:
        while True:
            try:
                pair = await self._mux.accept(None)
            except SessionClosed:
                return
            yield pair

    async def aclose(self) -> None:
        """Close gracefully: send what channels have queued (bounded by
        ``close_timeout``), then close the connection. Channels still open then fail
        with :class:`~polymux.exceptions.SessionClosed`."""
        await self._mux.aclose()

    def abort(self) -> None:
        """Close the connection at once."""
        if self._mux._transport is not None:
            self._mux._transport.abort()

    async def wait_closed(self) -> None:
        """Wait until the connection is gone."""
        await asyncio.shield(self._mux.closed)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # For helpers that need the protocol (servers, tests).
    @property
    def mux(self) -> MuxProtocol:
        """The :class:`MuxProtocol` behind this session."""
        return self._mux

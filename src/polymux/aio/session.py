"""The asyncio driver: :class:`MuxProtocol` runs a :class:`~polymux.session.SessionCore` on a
real transport, and :class:`Session` is the public face of one multiplexed connection.

The driver only moves bytes, time and events: received bytes and the clock go into the
core; the core's events become channel transports, readers, writers and futures; its
output goes to the socket in one ``writelines()`` per scheduler batch while the socket
takes it; reading pauses while the core says so; one timer follows the core's next
deadline. Every decision (scheduling, credit, limits, budgets, timeouts) is the core's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Self, cast

from polymux._types import BytesLike, CaptureSink
from polymux.aio._sockinfo import kernel_unsent
from polymux.aio.channel import ChannelTransport
from polymux.aio.reader import ChannelStreamProtocol, ChannelStreamReader, SendOnlyStreamReader
from polymux.aio.streams import Channel
from polymux.config import SessionConfig
from polymux.engine import Engine
from polymux.engine.plane import Inbox
from polymux.exceptions import SessionClosed
from polymux.formats import Format, resolve
from polymux.session import NoRoomToOpen, SessionCore
from polymux.session.dispatch import Dispatcher
from polymux.session.slicing import DENSE_FLOOR, TURN, InputSlicer


__all__ = ["ChannelHandler", "ChannelProtocols", "MuxProtocol", "OfferFilter", "Session"]

_clock = time.monotonic
"""The core's and the engines' clock (RTT, window tuning, deadlines). Not ``loop.time()``:
uvloop's has millisecond resolution, which measured a loopback RTT as 0 and kept yamux
windows from ever growing."""

_perf = time.perf_counter

logger = logging.getLogger("polymux")


class ChannelProtocols:
    """Serve incoming channels with ``asyncio`` protocols instead of a handler task each.

    Pass ``handler=ChannelProtocols(factory)``: every channel the peer opens gets
    ``factory()``, connected like ``loop.create_server``'s protocols
    (``connection_made(transport)`` with the channel's
    :class:`~polymux.ChannelTransport`, then ``data_received``, ``eof_received``,
    ``connection_lost``). No reader, writer or task is made, so an idle channel costs only
    its transport and the protocol: the way to hold a very large number of mostly idle
    channels. Credit goes back as ``data_received`` returns, unless the protocol calls
    ``transport.pause_reading()``; ``transport.get_extra_info("channel_name")`` is the
    channel's name.

    omnistreams pairs its one-way streams into ``(reader, writer)`` and needs a stream
    handler: a session of that format refuses this with ``ValueError``.
    """

    __slots__ = ("factory",)

    def __init__(self, factory: Callable[[], asyncio.BaseProtocol]) -> None:
        self.factory = factory

    def __repr__(self) -> str:
        return f"ChannelProtocols({self.factory!r})"


ChannelHandler = (
    Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None] | None] | ChannelProtocols
)
"""``handler(reader, writer)``: called for each incoming channel, like the callback of
``asyncio.start_server``; or :class:`ChannelProtocols` (a protocol per channel, no task)."""


def check_handler(fmt: str, one_way: bool, handler: ChannelHandler | None) -> None:
    """Refuse :class:`ChannelProtocols` for a one-way format (``ValueError``), before any
    connection is accepted: its streams are paired into ``(reader, writer)``."""
    if isinstance(handler, ChannelProtocols) and one_way:
        raise ValueError(
            f"{fmt}: ChannelProtocols cannot serve one-way streams (they are paired into "
            "(reader, writer) for a stream handler)"
        )


OfferFilter = Callable[[str], bool]
"""``offer_filter(name) -> bool``: accept (True) or reject (False) an incoming offer."""

StreamPair = Channel  # a (reader, writer) tuple, and an async context manager that closes it


class MuxProtocol(asyncio.Protocol):
    """Runs one session core on one connection (see the module docstring)."""

    def __init__(
        self,
        protocol: str | Format,
        config: SessionConfig | None = None,
        *,
        is_client: bool = True,
        handler: ChannelHandler | None = None,
        offer_filter: OfferFilter | None = None,
        engine: Engine | None = None,
        first_frame_deadline: bool | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.config = config = config or SessionConfig()
        fmt = protocol if isinstance(protocol, Format) else resolve(protocol, config)
        self.engine = engine or fmt.make_engine(config, is_client=is_client)
        self.is_client = is_client
        self.core = SessionCore(
            self.engine,
            config,
            _clock(),
            offer_filter=offer_filter,
            has_handler=handler is not None,
            first_frame_deadline=not is_client if first_frame_deadline is None else first_frame_deadline,
            is_client=is_client,
        )
        self.core.plane.on_report = self._report_soon
        self._handler = handler
        check_handler(self.engine.format, self.engine.one_way, handler)
        self._transport: asyncio.Transport | None = None
        self._channels: dict[int, ChannelTransport] = {}
        self._offers: dict[int, asyncio.Future[None]] = {}  # our opens waiting for acceptance
        self._dispatcher = Dispatcher(self.core, self, self._channels, self._offers)
        self._incoming: deque[tuple[str, int, StreamPair]] = deque()
        self._accept_waiters: deque[tuple[str | None, asyncio.Future[StreamPair]]] = deque()
        self._open_room: deque[asyncio.Future[None]] = deque()  # opens waiting for max_unacked_opens
        self._flush_pending = False
        self._write_paused = False
        self._reading = True
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._eof_written = False
        self.direct = False
        """Writes may go to the socket at once (``SessionCore.send_now``): connected, no
        capture (it records what ``_flush`` writes), not closing."""
        # (one message a call over WebSocket: never sliced)
        self._slicer = InputSlicer(self.engine.whole_frames, never=self.engine.message_mode)
        self._slice_handle: asyncio.Handle | None = None
        self._pings: dict[int, asyncio.Future[float]] = {}
        self._capture: CaptureSink | None = None
        self._control_waiters: deque[asyncio.Future[bytes]] = deque()
        self._pairs: dict[int, asyncio.Future[tuple[ChannelStreamReader, ChannelTransport]]] = {}
        self._answers: dict[int, asyncio.Future[list[bytes]]] = {}  # requests, by channel
        self._tasks: set[asyncio.Task[None]] = set()
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self.session = Session(self)
        self.on_connection_made: Callable[[], None] | None = None
        """Called once the connection is made: servers count a session only from then on
        (a TLS handshake that fails never makes it, nor ends it)."""

    # Views of the core's state (for tests and tools).

    @property
    def peer_silent(self) -> bool:
        """Whether the peer has sent no whole frame yet (see ``SessionCore.peer_silent``)."""
        return self.core.peer_silent

    @property
    def _peer_goaway(self) -> str | None:
        return self.core.peer_goaway

    @property
    def _error(self) -> BaseException | None:
        return self.core.error

    def _closed_error(self) -> SessionClosed:
        error = SessionClosed(f"{self.engine.format}: the session is closed")
        error.__cause__ = self.core.error
        return error

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        if self.on_connection_made is not None:
            self.on_connection_made()
        if self.config.capture is not None:
            self._start_capture(self._transport)
        self.direct = self._capture is None
        self.core.connection_made(_clock())
        self.process()

    def data_received(self, data: bytes) -> None:
        # The hot path: a read of data frames for streams goes into their inboxes with no
        # event; only what changed something else makes the driver act (process()).
        core = self.core
        if core.failed:
            return
        if self._capture is not None:
            self._capture.received(data)
        start = _perf()
        slicer = self._slicer
        if start < slicer.until and slicer.holds(data, start):
            self._feed_slice()
            return
        if core.receive_data(data, _clock()):
            self.process()
        woken = core.runs.woken
        if woken:
            self._wake_readers(woken)
        elapsed = _perf() - start
        if elapsed > DENSE_FLOOR:
            slicer.worked(start, elapsed, len(data))
        if self._drain_waiters:
            self._wake()

    def _wake_readers(self, woken: list[Inbox]) -> None:
        """Wake the readers that waited for the data that just arrived."""
        for inbox in woken:
            inbox.owner.wakeup()
        woken.clear()

    def _feed_slice(self) -> None:
        """Process slices of a read held back (sliced mode) for at most ``TURN``, and the
        rest on the next loop turn; reading the socket stays paused until it is done."""
        self._slice_handle = None
        slicer = self._slicer
        core = self.core
        if self._transport is None or core.failed:
            slicer.pending = None
            return
        start = time.perf_counter()
        elapsed = 0.0
        size = 0
        while core.reading and not core.failed and elapsed < TURN:
            piece = slicer.next_slice()
            if piece is None:
                break
            core.receive_data(piece, _clock())
            size += len(piece)
            self.process()  # (schedules the next turn's slice while some are left)
            if core.runs.woken:
                self._wake_readers(core.runs.woken)
            elapsed = time.perf_counter() - start
        slicer.worked(start, elapsed, size)
        if self._drain_waiters:
            self._wake()

    def eof_received(self) -> bool:
        # The peer closed its side of the connection: the session is over.
        self.core.receive_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.direct = False
        self._slicer.pending = None
        if self._slice_handle is not None:
            self._slice_handle.cancel()
            self._slice_handle = None
        if self._capture is not None:
            capture, self._capture = self._capture, None
            capture.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        core = self.core
        core.connection_lost(exc)
        self.process()  # every channel, open, pair and request ends
        error = SessionClosed(f"{core.format}: session ended: {core.error}")
        error.__cause__ = core.error
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
        for ping in self._pings.values():
            if not ping.done():
                ping.set_exception(error)
                ping.exception()  # nobody may await it: no "never retrieved" log
        self._pings.clear()
        for control in self._control_waiters:
            if not control.done():
                control.set_exception(error)
        self._control_waiters.clear()
        self._wake_openers(everyone=True)
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        self.core.socket_paused(True, self._socket_unsent())
        self._arm_timer()

    def resume_writing(self) -> None:
        self._write_paused = False
        self.core.socket_paused(False, self._socket_unsent())
        self.want_flush()

    def _socket_unsent(self) -> int:
        """Bytes the socket transport holds unsent (0 for one that cannot say)."""
        transport = self._transport
        if transport is None:
            return 0
        try:
            return transport.get_write_buffer_size()
        except NotImplementedError:
            return 0

    def _untaken(self) -> int:
        """Bytes we wrote that the peer has not taken yet, as far as we can see: the
        transport's unsent bytes and the kernel's send queue (keepalive judges a ping only
        once it has left both)."""
        unsent = self._socket_unsent()
        transport = self._transport
        if transport is not None:
            unsent += kernel_unsent(transport.get_extra_info("socket"))
        return unsent

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Extra information of the underlying transport."""
        if self._transport is None:
            return default
        return self._transport.get_extra_info(name, default)

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

    # -- the core's events (polymux.session.dispatch calls the on_* hooks) -------------------

    def process(self) -> None:
        """Act on the core's events, then follow its reading state, output and deadline."""
        if not self._dispatcher.run():
            return  # re-entered from a hook: the outer call takes the new events
        core = self.core
        reading = core.reading
        if self._slicer.pending is not None:
            # A read held back (sliced mode): its next slice on the next loop turn; the
            # socket is not read meanwhile.
            if reading and self._slice_handle is None and not core.failed:
                self._slice_handle = self.loop.call_soon(self._feed_slice)
            reading = False
        transport = self._transport
        if reading != self._reading and transport is not None and not transport.is_closing():
            self._reading = reading
            if reading:
                transport.resume_reading()
            else:
                transport.pause_reading()
        if core.has_output and not self._write_paused:  # paused: resume_writing() flushes
            self.want_flush()
        self._arm_timer()

    def on_open_settled(self, handle: int, error: BaseException | None) -> None:
        """An open we wait for was accepted (``error`` None) or failed."""
        fut = self._offers.pop(handle)
        if not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    def on_ping_answered(self, opaque: int, rtt: float) -> None:
        """A ping of ours was answered."""
        ping = self._pings.pop(opaque, None)
        if ping is not None and not ping.done():
            ping.set_result(rtt)

    def on_control(self) -> None:
        """A control message waits: the first reader waiting gets it."""
        while self._control_waiters:
            waiter = self._control_waiters[0]
            if waiter.done():
                self._control_waiters.popleft()
                continue
            data = self.core.take_control()
            if data is None:
                return
            self._control_waiters.popleft()
            waiter.set_result(data)

    def on_room_to_open(self, error: Exception | None, everyone: bool) -> None:
        """Waiting opens may try again."""
        self._wake_openers(error=error, everyone=everyone)

    def on_ready(self) -> None:
        """The handshake is done."""
        if not self.ready.done():
            self.ready.set_result(None)

    def on_failed(self, error: BaseException) -> None:
        """The session failed: log it, and close the connection now."""
        if isinstance(error, SessionClosed) and (
            "idle_timeout" in str(error) or (not self.is_client and "handshake_timeout" in str(error))
        ):
            # A server drops these as a matter of course (scanners, floods): not a warning each.
            logger.info("%s", error)
        else:
            logger.warning("%s", error)
        self._shut()

    def _shut(self) -> None:
        """Close the connection now: send what the core queued last (a go-away naming the
        error) if the socket takes it at once, and abort (dropping unsent bytes) if it does
        not: a peer that does not read must not keep the socket, its buffers and the
        channels' memory alive."""
        transport = self._transport
        if transport is None:
            return
        out = self.core.data_to_send()
        if out and not transport.is_closing():
            if self._capture is not None:
                self._capture.sent(out)
            transport.writelines(out)
        if self._socket_unsent():
            transport.abort()
        else:
            transport.close()

    def fail(self, error: BaseException) -> None:
        """End the session because of ``error`` (the transport found a violation)."""
        self.core.fail(error)
        self.process()

    # -- the timer ---------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        """One timer, at the core's next deadline (or earlier: an early call is harmless)."""
        when = self.core.next_deadline()
        if when is None or self._transport is None:
            return
        if self._timer is not None and self._timer_at is not None and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_later(max(0.0, when - _clock()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        transport = self._transport
        if transport is None:
            return
        self.core.handle_timer(_clock(), self._untaken())
        self.process()

    # -- incoming channels -------------------------------------------------------------------

    def _stream(self, channel: ChannelTransport) -> tuple[ChannelStreamReader, ChannelStreamProtocol]:
        """Wire a stdlib reader and its protocol onto ``channel``."""
        reader = ChannelStreamReader(limit=self.config.stream_limit, loop=self.loop)
        protocol = ChannelStreamProtocol(reader, loop=self.loop)
        channel.attach(protocol, reader)
        return reader, protocol

    def on_incoming(self, handle: int, name: str) -> None:
        """The peer opened a channel: a protocol, a handler task, or the accept backlog."""
        channel = ChannelTransport(self, handle, name, local=False)
        self._channels[handle] = channel
        handler = self._handler
        if isinstance(handler, ChannelProtocols):
            self._attach_protocol(channel, handler)
            return
        reader, protocol = self._stream(channel)
        self._deliver(
            name, handle, Channel(reader, asyncio.StreamWriter(channel, protocol, reader, self.loop))
        )

    def on_incoming_pair(self, handle: int, reply: int, name: str) -> None:
        """The peer opened a stream pair (the core answered it): read ``handle``, write
        ``reply``; ``writer.close()`` ends both."""
        inbound = ChannelTransport(self, handle, name, local=False)
        self._channels[handle] = inbound
        reader, _protocol = self._stream(inbound)
        out = ChannelTransport(self, reply, self.engine.channel_name(reply), local=True)
        self._channels[reply] = out
        _out_reader, protocol = self._stream(out)
        out.partner = inbound
        self._deliver(name, handle, Channel(reader, asyncio.StreamWriter(out, protocol, reader, self.loop)))

    def _deliver(self, name: str, handle: int, pair: StreamPair) -> None:
        """An incoming ``(reader, writer)``: to the handler, or to ``accept_channel``."""
        if self._handler is not None:
            # Our own task, not StreamReaderProtocol's client_connected_cb: its done-callback
            # logs a handler cancelled at shutdown as an error (CPython 3.11).
            task = self.loop.create_task(self._run_handler(*pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._incoming.append((name, handle, pair))
        self._serve_accept_waiters()

    def on_pair_failed(self, name: str, error: Exception) -> None:
        """The peer's stream pair could not be answered (the core reset its half)."""
        logger.info("%s: cannot answer the stream pair %r: %s", self.engine.format, name, error)

    def _attach_protocol(self, channel: ChannelTransport, handler: ChannelProtocols) -> None:
        """Connect a ChannelProtocols protocol; one that fails to start resets its channel
        (the session goes on, as it does for a handler that raises)."""
        try:
            channel.attach(handler.factory())
        except Exception as exc:
            logger.error("%s: channel protocol failed on %s", self.engine.format, channel, exc_info=exc)
            channel.reset(exc)

    async def _run_handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Run the channel handler; an exception it raises resets the channel, carrying
        ``"Type: message"`` to the peer where the format can."""
        handler = self._handler
        assert handler is not None and not isinstance(handler, ChannelProtocols)
        # Counted until the handler returns, after its channel is gone too: a peer that
        # opens and resets channels at once (Rapid Reset) cannot start handlers faster
        # than they finish.
        self.core.handler_started()
        try:
            result = handler(reader, writer)
            if result is not None:
                await result
        except Exception as exc:
            transport = writer.transport
            if isinstance(exc, (SessionClosed, ConnectionError)) and self.core.lost:
                # The session ended under the handler: not the handler's failure.
                logger.info("%s: channel handler ended with the session: %s", self.engine.format, exc)
            else:
                logger.error("%s: channel handler failed on %s", self.engine.format, transport, exc_info=exc)
            if isinstance(transport, ChannelTransport):
                transport.reset(exc)
        finally:
            self.core.handler_finished()

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
                    self.core.taken(entry[1])
                    waiter.set_result(entry[2])
                    break

    async def accept(self, name: str | None) -> StreamPair:
        """Wait for an incoming channel (named ``name``, if given)."""
        for entry in self._incoming:
            if name is None or entry[0] == name:
                self._incoming.remove(entry)
                self.core.taken(entry[1])
                return entry[2]
        self.core.check_open()
        waiter: asyncio.Future[StreamPair] = self.loop.create_future()
        self._accept_waiters.append((name, waiter))
        return await waiter

    # -- control messages --------------------------------------------------------------------

    def send_control(self, data: bytes) -> None:
        """Send a control message (formats that have them: omnistreams)."""
        self.core.send_control(data)
        self.process()

    async def receive_control(self) -> bytes:
        """The next control message from the peer."""
        data = self.core.take_control()
        if data is not None:
            self.process()  # reading may resume
            return data
        if self._transport is None:
            raise self._closed_error()
        waiter: asyncio.Future[bytes] = self.loop.create_future()
        self._control_waiters.append(waiter)
        return await waiter

    # -- opening channels, pairs and requests ------------------------------------------------

    async def _open(self, open_: Callable[[], int]) -> int:
        """Call ``open_`` (a core call that opens a channel) once the handshake is done
        and there is room (``max_unacked_opens``); return its handle."""
        await self.ready
        woken = False
        if self._open_room:  # others wait for room: behind them
            await self._room_to_open()
            woken = True
        while True:
            try:
                return open_()
            except NoRoomToOpen:
                await self._room_to_open(front=woken)  # woken for a slot another took: keep our place
                woken = True

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
        core = self.core
        handle = await self._open(lambda: core.open_channel(name, metadata))
        channel = ChannelTransport(self, handle, core.engine.channel_name(handle), local=True)
        self._channels[handle] = channel
        # Attach before the acceptance: data may follow it in the same read.
        channel.attach(protocol, reader)
        if core.channels[handle].accepted:  # usable at once (mplex, yamux)
            self.process()
            return channel
        fut: asyncio.Future[None] = self.loop.create_future()
        self._offers[handle] = fut
        self.process()
        try:
            await fut
        except asyncio.CancelledError:
            self._offers.pop(handle, None)
            channel.abort()  # rescinds the offer
            raise
        return channel

    async def open_pair(self, name: str) -> StreamPair:
        """A stream pair (one-way formats): see :meth:`Session.open_pair`."""
        core = self.core
        handle = await self._open(lambda: core.open_pair(name))
        out = ChannelTransport(self, handle, core.engine.channel_name(handle), local=True)
        self._channels[handle] = out
        _out_reader, protocol = self._stream(out)
        answer: asyncio.Future[tuple[ChannelStreamReader, ChannelTransport]] = self.loop.create_future()
        self._pairs[handle] = answer
        self.process()
        try:
            reader, inbound = await answer
        except BaseException:
            self._pairs.pop(handle, None)
            out.abort()
            raise
        out.partner = inbound
        return Channel(reader, asyncio.StreamWriter(out, protocol, reader, self.loop))

    def on_pair_answered(self, handle: int, inbound: int | None, error: Exception | None) -> None:
        """Our pair got its second half (ours to read), or failed."""
        answer = self._pairs.pop(handle, None)
        if inbound is None:
            if answer is not None and not answer.done():
                answer.set_exception(error or self._closed_error())
            return
        channel = ChannelTransport(self, inbound, self.engine.channel_name(inbound), local=False)
        self._channels[inbound] = channel
        reader, _protocol = self._stream(channel)
        if answer is None or answer.done():
            channel.abort()  # an answer nobody waits for any more
        else:
            answer.set_result((reader, channel))

    async def request(self, body: bytes, name: str, limit: int | None) -> bytes:
        """A request: see :meth:`Session.request`."""
        core = self.core
        handle = await self._open(lambda: core.request(name, body, limit))
        answer: asyncio.Future[list[bytes]] = self.loop.create_future()
        self._answers[handle] = answer
        self.process()
        try:
            return b"".join(await answer)  # joined here, not in the read that completed it
        except asyncio.CancelledError:
            if self._answers.pop(handle, None) is not None:
                core.cancel_request(handle)  # cancel the request on the wire
                self.process()
            raise

    def on_answered(self, handle: int, parts: list[bytes] | None, error: Exception | None) -> None:
        """A request is over."""
        fut = self._answers.pop(handle, None)
        if fut is not None and not fut.done():
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(parts or [])

    async def _room_to_open(self, front: bool = False) -> None:
        """Wait, in order, until fewer than ``max_unacked_opens`` of our opens await the
        peer's acknowledgement (as hashicorp's ``OpenStream`` does: its peer resets SYNs
        beyond its accept backlog). Bounded: the oldest open times out within
        ``stream_open_timeout``, and a slot freed that way fails the first waiting open."""
        self.core.check_open()
        waiter: asyncio.Future[None] = self.loop.create_future()
        if front:
            self._open_room.appendleft(waiter)
        else:
            self._open_room.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter in self._open_room:
                self._open_room.remove(waiter)
            elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._wake_openers()  # we were given room and leave: pass it on
            raise
        self.core.check_open()

    def _wake_openers(self, *, error: Exception | None = None, everyone: bool = False) -> None:
        """Wake as many waiting opens as there is room for (``everyone``: all of them);
        ``error``: the first one fails with it instead."""
        if error is not None:
            while self._open_room:
                waiter = self._open_room.popleft()
                if not waiter.done():
                    waiter.set_exception(error)
                    break
        room = len(self._open_room) if everyone or self.core.lost else self.core.room_to_open
        while room > 0 and self._open_room:
            waiter = self._open_room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1

    # -- the send scheduler ------------------------------------------------------------------

    def write_now(self, out: list[BytesLike]) -> None:
        """Write a channel's frames at once (``SessionCore.send_now``; ``direct`` is true)."""
        transport = self._transport
        assert transport is not None
        transport.writelines(out)

    def want_flush(self) -> None:
        """Run the scheduler soon (once per loop iteration however often asked)."""
        if not self._flush_pending and self._transport is not None:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        transport = self._transport
        if transport is None or self._eof_written:
            return
        core = self.core
        if core.failed:
            return
        while not self._write_paused:
            if transport.is_closing():
                # The socket failed (a dead peer: EPIPE, ECONNRESET) or is closing: its
                # connection_lost is on its way. asyncio logs "socket.send() raised
                # exception." for every write from the fifth on; the core ends anyway.
                break
            out = core.data_to_send()
            if not out:
                break
            # One call per batch; uvloop sends the parts with one writev, no join.
            if self._capture is not None:
                self._capture.sent(out)
            transport.writelines(out)
        self.process()
        if not self._write_paused:
            self._wake()

    def _report_soon(self) -> None:
        """Inboxes have consumption to report (credit, budget): once the loop's current
        callbacks are done, with every other channel's (one callback per loop turn for the
        session, not one per read)."""
        self.loop.call_soon(self._report)

    def _report(self) -> None:
        self.core.report(_clock())
        self.process()

    def now(self) -> float:
        """The core's clock (``time.monotonic``)."""
        return _clock()

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

    # -- pings -------------------------------------------------------------------------------

    async def ping(self) -> float:
        """Ping the peer; return the round-trip time in seconds."""
        core = self.core
        if self._transport is None or core.failed:
            raise self._closed_error()
        opaque = core.ping(_clock())
        fut: asyncio.Future[float] = self.loop.create_future()
        self._pings[opaque] = fut
        self.process()
        try:
            async with asyncio.timeout(self.config.keepalive_timeout):
                return await asyncio.shield(fut)
        except TimeoutError:
            self._pings.pop(opaque, None)
            core.forget_ping(opaque)
            raise SessionClosed(
                f"{self.engine.format}: no answer to a ping within {self.config.keepalive_timeout:g} s"
            ) from None

    # -- ending ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Flush what channels have queued (bounded by ``close_timeout``), then close."""
        if self.closed.done():
            return
        core = self.core
        core.closing = True
        deadline = self.loop.time() + self.config.close_timeout
        if self._transport is not None:
            try:
                # asyncio.timeout, not wait_for (Python 3.11's can swallow a cancellation).
                async with asyncio.timeout(self.config.close_timeout):
                    await self._drain_channels()
            except TimeoutError:
                logger.info("%s: close_timeout expired with data unsent", self.engine.format)
            core.close()
            self._flush()
            if not self.engine.can_open and self._channels:
                # The format said goodbye (yamux GoAway): let open channels finish.
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._channels_finished()
                except TimeoutError:
                    logger.info("%s: channels still open at close_timeout", self.engine.format)
            transport = self._transport
            if transport is not None:
                # Half-close and let the peer close its side: closing at once while the
                # peer still sends (credit updates) makes the kernel reset the connection,
                # which can destroy data the peer has not read yet.
                self.direct = False
                if transport.can_write_eof():
                    try:
                        transport.write_eof()
                        self._eof_written = True
                    except OSError:  # the peer is gone already (reset): nothing to finish
                        transport.abort()
                else:
                    transport.close()
                try:
                    async with asyncio.timeout_at(deadline):
                        await asyncio.shield(self.closed)
                except TimeoutError:
                    logger.info("%s: the peer did not close within close_timeout", self.engine.format)
                    if self._transport is not None:
                        self._transport.abort()
        await asyncio.shield(self.closed)

    async def _channels_finished(self) -> None:
        while self._transport is not None and self._channels:
            await self._activity()

    async def _drain_channels(self) -> None:
        while self._transport is not None and self.core.unsent():
            # Progress needs a scheduler run, or credit from the peer (received data).
            await self._activity()
        await self.flush()

    def abort(self) -> None:
        """Close the connection at once."""
        if self._transport is not None:
            self._transport.abort()


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
        core = self._mux.core
        return core.error if core.failed else None

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
        return self._mux.engine.rtt

    async def wait_ready(self) -> None:
        """Wait for the handshake (formats that have one)."""
        await self._mux.ready

    async def open_channel(self, name: str = "") -> StreamPair:
        """Offer a channel named ``name``; return its ``(reader, writer)`` once accepted.

        ``name`` reaches the peer where the format carries names (MultiplexingStream,
        mplex, multiplex, omnistreams). yamux, smux and Streamux have none on the wire: the
        name stays on this side, and the peer's ``channel_name`` is the stream id
        (``polymux.formats.get(protocol).caps.names`` says which). Write it as the
        channel's first bytes where it must travel.

        Raises :class:`~polymux.exceptions.ChannelRejected` if the peer rejects it.
        """
        mux = self._mux
        # One-way formats (omnistreams): the opener's reader refuses reads, clearly.
        reader_class = SendOnlyStreamReader if mux.engine.one_way else ChannelStreamReader
        reader = reader_class(limit=mux.config.stream_limit, loop=mux.loop)
        protocol = ChannelStreamProtocol(reader, loop=mux.loop)
        channel = await mux.open_channel(name, protocol, reader)
        writer = asyncio.StreamWriter(channel, protocol, reader, mux.loop)
        return Channel(reader, writer)

    async def open_pair(self, name: str = "") -> StreamPair:
        """A bidirectional ``(reader, writer)`` on any format. On omnistreams, whose streams
        are one-way, this opens a stream to the peer and waits for the polymux peer to open
        one back (creation metadata ``{"pair": token}`` / ``{"replyTo": token}``); its
        handler or ``accept_channel`` gets the matching pair. ``writer.close()`` ends both
        streams. A peer that does not answer pairs (not polymux) never completes it: bound
        the wait with ``asyncio.timeout``. Other formats: the same as :meth:`open_channel`."""
        if not self._mux.engine.one_way:
            return await self.open_channel(name)
        return await self._mux.open_pair(name)

    def send_control(self, data: bytes) -> None:
        """Send a control message: session-level bytes (omnistreams)."""
        self._mux.send_control(data)

    async def receive_control(self) -> bytes:
        """Wait for the peer's next control message (omnistreams). Raises
        :class:`~polymux.exceptions.SessionClosed` when the session ends first."""
        return await self._mux.receive_control()

    async def request(self, body: bytes, name: str = "", *, limit: int | None = None) -> bytes:
        """Send ``body`` on a new channel, end it, and return everything the peer answers
        (Streamux's request/response, usable on any two-way format). ``limit`` bounds the
        answer: a longer one raises :class:`~polymux.exceptions.LimitExceeded`. Cancelling
        the call resets the channel (a Streamux cancel)."""
        return await self._mux.request(body, name, limit)

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
        ``close_timeout``), then close the connection. A format that can say goodbye
        (yamux's GoAway) lets open channels finish first, within the same
        ``close_timeout``. Channels still open then fail with
        :class:`~polymux.exceptions.SessionClosed`."""
        await self._mux.aclose()

    def abort(self) -> None:
        """Close the connection at once."""
        self._mux.abort()

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

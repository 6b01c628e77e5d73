"""anyio integration: channels as ``anyio.abc.ByteStream``, and sessions over any anyio
byte stream (so polymux runs under anyio's trio backend too).

Two pieces:

* :class:`ChannelStream` wraps the ``(reader, writer)`` of a channel of an asyncio
  :class:`polymux.Session`, so anyio-based code (on the asyncio backend) can use it.
* :func:`session` / :class:`AnyioSession` run a polymux session with the same sans-I/O
  engines over *any* anyio ``ByteStream`` (TCP, TLS, unix, a stapled memory stream), on
  either backend. Its channels are :class:`AnyioChannel`, also ``ByteStream``\\ s.

Exceptions are anyio's: ``EndOfStream`` at the peer's end of writing,
``BrokenResourceError`` when the channel or session failed (the polymux error is the
``__cause__``), ``ClosedResourceError`` after ``aclose()``. Backpressure is preserved:
``send()`` waits for the peer's credit, and credit goes back as ``receive()`` consumes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar, Unpack

from polymux._extras import require


require("anyio", "polymux.anyio")  # a one-line error naming the extra, not a bare ImportError

import anyio
from anyio.abc import ByteStream, SocketAttribute

from polymux._types import BytesLike, CaptureSink
from polymux.aio._sockinfo import kernel_unsent, tcp_keepalive
from polymux.config import SessionConfig, SessionOptions
from polymux.engine import Engine
from polymux.engine.plane import Inbox
from polymux.exceptions import ChannelClosedError, PolymuxError, SessionClosed
from polymux.formats import Format, resolve
from polymux.session import SessionCore
from polymux.session.dispatch import Dispatcher
from polymux.session.slicing import DENSE_FLOOR, TURN, InputSlicer
from polymux.session.waiters import Waiter, Waiters


logger = logging.getLogger("polymux")

_clock = time.monotonic
"""The core's clock (the asyncio driver's too)."""

__all__ = ["AnyioChannel", "AnyioPair", "AnyioSession", "ChannelAttribute", "ChannelStream", "session"]


class ChannelAttribute(anyio.TypedAttributeSet):
    """Typed attributes of polymux channels (``stream.extra(ChannelAttribute.name)``)."""

    name: str = anyio.typed_attribute()
    """The channel's name."""
    channel: str = anyio.typed_attribute()
    """The channel's wire id and origin, as in error messages."""
    protocol: str = anyio.typed_attribute()
    """The wire format."""


def _broken(exc: BaseException) -> anyio.BrokenResourceError:
    err = anyio.BrokenResourceError(str(exc))
    err.__cause__ = exc
    return err


# -- an asyncio channel as an anyio ByteStream ---------------------------------------------


class ChannelStream(ByteStream):
    """A channel of an asyncio :class:`polymux.Session` as an ``anyio.abc.ByteStream``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; ``EndOfStream`` once the peer finished writing."""
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            data = await self._reader.read(max_bytes)
        except (PolymuxError, ConnectionError) as exc:
            raise _broken(exc) from exc
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        """Send ``item``; waits while the peer's window is full (``drain()``)."""
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            self._writer.write(item)
            await self._writer.drain()
        except (PolymuxError, ConnectionError) as exc:
            raise _broken(exc) from exc

    async def send_eof(self) -> None:
        """Half-close: we will send no more."""
        if self._closed:
            raise anyio.ClosedResourceError
        self._writer.write_eof()

    async def aclose(self) -> None:
        """Close the channel (both directions)."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (PolymuxError, ConnectionError):
            pass

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        transport = self._writer.transport
        return {
            ChannelAttribute.name: lambda: transport.get_extra_info("channel_name"),
            ChannelAttribute.channel: lambda: transport.get_extra_info("channel"),
            ChannelAttribute.protocol: lambda: transport.get_extra_info("protocol_name"),
        }


# -- a session over any anyio ByteStream -----------------------------------------------------


def _wake_readers(woken: list[Inbox]) -> None:
    """Wake the channels whose ``receive()`` waited for the data that just arrived."""
    for inbox in woken:
        inbox.owner.wakeup()
    woken.clear()


class AnyioChannel(ByteStream):
    """One channel of an :class:`AnyioSession`."""

    def __init__(self, session: AnyioSession, handle: int, name: str, *, local: bool) -> None:
        self._session = session
        self._core = session.core
        self._handle = handle
        self._name = name
        self._label = session.core.engine.describe(handle)
        # What arrived: the data plane's inbox (polymux.engine.plane), read by receive().
        self._inbox: Inbox | None = self._core.stream(handle, self)
        self._readable = anyio.Event()
        self._writable = anyio.Event()
        self._writable.set()
        self._eof = False
        self._sent_eof = False
        self._closed = False
        self._done = False
        self._error: BaseException | None = None
        self._write_error: BaseException | None = None  # writing failed, reading may go on
        # One-way streams (omnistreams): the opener only writes, the acceptor only reads.
        self._refuse_read: str | None = None
        self._refuse_write: str | None = None
        engine = self._core.engine
        if engine.one_way:
            fmt = engine.format
            if local:
                self._refuse_read = (
                    f"{fmt}: {self._label} is send-only: {fmt} streams carry data from their opener "
                    "to their acceptor (open a stream the other way to read)"
                )
            else:
                self._refuse_write = (
                    f"{fmt}: {self._label} is receive-only: {fmt} streams carry data from their "
                    "opener to their acceptor (open a stream the other way to write)"
                )
        # send() returns once the scheduler took all of it (within the peer's credit), as
        # an anyio stream's send does: no write buffer beyond what is in flight.
        self._core.set_write_limits(handle, 0, 0)

    # Called by the session (polymux.session.dispatch: the core's events).

    def data(self, data: BytesLike, more: tuple[BytesLike, ...], n: int) -> None:
        """The session's hook: ``n`` bytes arrived as an event (before the channel's inbox
        was attached: into it)."""
        inbox = self._inbox
        if self._closed or inbox is None:
            self._core.consumed(self._handle, n)  # dropped: keep the peer's credit flowing
            return
        inbox.add(data, more, n)
        self._readable.set()

    def wakeup(self) -> None:
        """The data plane's wake-up: data arrived while :meth:`receive` waited."""
        self._readable.set()

    def remote_end(self) -> None:
        """The session's hook: the peer finished writing."""
        self._eof = True
        self._readable.set()

    def finished(
        self,
        error: BaseException | None,
        write_error: BaseException | None,
        *,
        drop_unread: bool = False,
        lingering: bool = False,
    ) -> None:
        """The session's hook: the channel is over (``lingering``: the core still waits for
        the peer's end of a closed channel; nothing to do here)."""
        if lingering:
            return
        self._done = True
        if write_error is not None and self._write_error is None:
            self._write_error = write_error
        if error is not None and self._error is None:
            self._error = error
        if error is None:
            self._eof = True  # a clean end: what arrived stays readable, then EndOfStream
        if drop_unread and self._inbox is not None:
            self._inbox.drop()
        self._readable.set()
        self._writable.set()

    def resume_writing_now(self) -> None:
        """The session's hook: ``send()`` may return."""
        self._writable.set()

    def writing_stopped(self, error: Exception) -> None:
        """The session's hook: the peer reads no more of the channel."""
        self._write_error = error
        self._writable.set()

    # ByteStream.

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; credit goes back to the peer as they are taken."""
        if self._closed:
            raise anyio.ClosedResourceError
        if self._refuse_read is not None:
            raise _broken(ChannelClosedError(self._refuse_read))
        inbox = self._inbox
        while inbox is None or not inbox.size:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._eof:  # the peer finished writing: that stands, whatever came after
                raise anyio.EndOfStream
            if self._error is not None:
                raise _broken(self._error)
            self._readable = anyio.Event()
            if inbox is not None:
                inbox.waits()
            await self._readable.wait()
        data = inbox.take(max_bytes)
        if self._core.plane.reports:  # credit (and the budget) are due
            self._core.report(_clock())
            self._session._process()
        return data

    async def send(self, item: bytes) -> None:
        """Send ``item``; waits while the channel's (or the session's) unsent bytes are
        above their high-water marks, i.e. while the peer cannot take more."""
        if self._closed or self._sent_eof:
            raise anyio.ClosedResourceError
        if self._refuse_write is not None:
            raise _broken(ChannelClosedError(self._refuse_write))
        if self._error is not None:
            raise _broken(self._error)
        if self._write_error is not None:
            raise _broken(self._write_error)
        if self._done:
            raise _broken(ChannelClosedError(f"{self._core.format}: {self._label} was closed by the peer"))
        if item:
            if self._core.write(self._handle, bytes(item)):
                self._writable = anyio.Event()
            self._session._process()
            if self._error is not None:  # reset: it held more than the format allows
                raise _broken(self._error)
        await self._writable.wait()
        if self._error is not None:
            raise _broken(self._error)
        if self._write_error is not None:
            raise _broken(self._write_error)

    async def send_eof(self) -> None:
        """Half-close: we will send no more."""
        if self._sent_eof or self._refuse_write is not None:
            return  # (nothing to end on the receive-only half of a one-way stream)
        self._sent_eof = True
        if not self._done:
            self._core.write_eof(self._handle)
            self._session._process()

    async def aclose(self) -> None:
        """Finish writing and stop reading (what the peer still sends is dropped)."""
        if self._closed:
            return
        self._closed = True
        self._sent_eof = True
        if not self._done:
            self._core.close_channel(self._handle)  # (drops what the inbox holds, credited)
            self._session._process()
        elif self._inbox is not None:
            self._inbox.drop()
        self._readable.set()

    async def reset(self, message: str | None = None) -> None:
        """Terminate the channel at once (``message`` to the peer where the format carries
        one); unsent data is dropped."""
        self._closed = True
        if not self._done:
            self._core.reset(self._handle, message)
            self._session._process()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return {
            ChannelAttribute.name: lambda: self._name,
            ChannelAttribute.channel: lambda: self._label,
            ChannelAttribute.protocol: lambda: self._core.format,
        }


class AnyioPair(ByteStream):
    """A stream pair of an :class:`AnyioSession` (one-way formats: omnistreams): two one-way
    streams as one two-way ``ByteStream``. ``receive()`` reads the peer's stream,
    ``send()`` writes ours; ``aclose()`` and :meth:`reset` end both."""

    def __init__(self, reader: AnyioChannel, writer: AnyioChannel) -> None:
        self.reader = reader
        """The peer's stream (we read it)."""
        self.writer = writer
        """Our stream (we write it)."""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes of the peer's stream."""
        return await self.reader.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        """Send ``item`` on our stream."""
        await self.writer.send(item)

    async def send_eof(self) -> None:
        """End our stream (the peer's goes on until it ends it)."""
        await self.writer.send_eof()

    async def aclose(self) -> None:
        """Close both streams."""
        await self.writer.aclose()
        await self.reader.aclose()

    async def reset(self, message: str | None = None) -> None:
        """Terminate both streams at once."""
        await self.writer.reset(message)
        await self.reader.reset(message)

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self.writer.extra_attributes


Incoming = AnyioChannel | AnyioPair
"""What :meth:`AnyioSession.accept_channel` returns: a channel, or (one-way formats) the
peer's stream pair."""

T = TypeVar("T")


class AnyioSession:
    """A polymux session run by anyio over any ``ByteStream``; use :func:`session`.

    The driver of :class:`~polymux.session.SessionCore` for anyio: a task reads the
    stream into the core (pausing while the core says so), a task writes the core's
    output, a task follows the core's deadlines; the core's events reach the ``on_*``
    hooks through ``polymux.session.dispatch.Dispatcher``. Channels are
    :class:`AnyioChannel` (and :class:`AnyioPair` for stream pairs)."""

    def __init__(
        self,
        stream: ByteStream,
        engine: Engine,
        config: SessionConfig,
        *,
        is_client: bool = True,
        offer_filter: Callable[[str], bool] | None = None,
        first_frame_deadline: bool | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.is_client = is_client
        self.core = SessionCore(
            engine,
            config,
            _clock(),
            offer_filter=offer_filter,
            first_frame_deadline=not is_client if first_frame_deadline is None else first_frame_deadline,
            is_client=is_client,
        )
        self._stream = stream
        self._channels: dict[int, AnyioChannel] = {}
        # What tasks wait for (polymux.session.waiters): an anyio event each.
        self.waiters: Waiters[anyio.Event, AnyioChannel, Incoming] = Waiters(self.core, anyio.Event)
        self._dispatcher = Dispatcher(self.core, self, self._channels, self.waiters)
        self._ready = anyio.Event()
        self._send_lock = anyio.Lock()
        self._output = anyio.Event()  # the core may have bytes for the writer task
        self._can_read = anyio.Event()
        self._can_read.set()
        self._deadline = anyio.Event()  # the core's next deadline may have moved
        self._timer_at: float | None = None  # the deadline _timers waits for (None: none)
        self._done = anyio.Event()
        self._capture: CaptureSink | None = None
        self._in_flight = 0  # bytes of the batch the stream is sending
        self._sending = anyio.CancelScope()  # ... and the scope of that send
        self._slicer = InputSlicer(self.engine.whole_frames, never=self.engine.message_mode)
        # Inboxes' consumption is reported by the writer task (or by receive() itself).
        self.core.plane.on_report = lambda: self._output.set()
        self.error: BaseException | None = None
        """Why the session ended abnormally, if it did."""

    def _start_capture(self) -> None:
        """``SessionConfig.capture``: the same hook as the asyncio session's."""

        def addr(attribute: Any) -> str:
            value = self._stream.extra(attribute, None)
            if isinstance(value, tuple):
                host = str(value[0])
                return f"[{host}]:{value[1]}" if ":" in host else f"{host}:{value[1]}"
            return "" if value is None else str(value)

        info = {
            "format": self.engine.format,
            "role": "client" if self.is_client else "server",
            "local": addr(SocketAttribute.local_address),
            "peer": addr(SocketAttribute.remote_address),
        }
        assert self.config.capture is not None
        try:
            self._capture = self.config.capture(info)
        except Exception:  # a broken recorder must not break the session
            logger.exception(
                "%s: the capture factory failed; this session is not recorded", self.engine.format
            )

    @property
    def protocol(self) -> str:
        """The wire format."""
        return self.engine.format

    @property
    def rtt(self) -> float | None:
        """The latest measured round-trip time (formats with pings), or None."""
        return self.engine.rtt

    async def _wait(self, waiter: Waiter[anyio.Event, T]) -> T:
        """Await one of the session's waiters; a task that stops waiting leaves."""
        try:
            await waiter.signal.wait()
        except BaseException:
            waiter.leave()
            self._process()  # (what leaving made the core do: a request cancelled)
            raise
        return waiter.result()

    # -- opening channels, pairs and requests ------------------------------------------------

    async def _open(self, open_: Callable[[], int]) -> int:
        """Call ``open_`` (a core call that opens a channel) once the handshake is done and
        there is room (``max_unacked_opens``: in order, see ``polymux.session.waiters``);
        return its handle."""
        await self._wait_ready()
        room = self.waiters.room
        got = room.attempt(open_)
        while isinstance(got, Waiter):
            await self._wait(got)
            got = room.attempt(open_, turn=True)
        return got

    async def open_channel(self, name: str = "") -> AnyioChannel:
        """Open a channel; returns once the peer accepted it (where the format asks).

        Raises :class:`~polymux.exceptions.LimitExceeded` when no more may be opened now
        (``max_unacked_opens`` opens unacknowledged for ``stream_open_timeout``, or the
        channel limits), :class:`~polymux.exceptions.SessionClosed` when the session ends.
        On one-way formats (omnistreams) the channel is ours to write only: see
        :meth:`open_pair`."""
        core = self.core
        handle = await self._open(lambda: core.open_channel(name))
        channel = AnyioChannel(self, handle, core.engine.channel_name(handle), local=True)
        self._channels[handle] = channel
        if core.channels[handle].accepted:
            self._process()
            return channel
        accepted = self.waiters.opens.wait(handle)
        self._process()
        try:
            await self._wait(accepted)
        except BaseException:
            await channel.reset()
            raise
        return channel

    async def open_pair(self, name: str = "") -> AnyioChannel | AnyioPair:
        """A two-way channel on any format. On omnistreams, whose streams are one-way, this
        opens a stream to the peer and waits for the polymux peer to open one back: an
        :class:`AnyioPair` (the peer's ``accept_channel`` gets the matching pair). A peer
        that does not answer pairs (not polymux) never completes it: bound the wait
        (``anyio.fail_after``). Other formats: the same as :meth:`open_channel`. Errors
        are polymux's, as :meth:`open_channel`'s (a refused pair: the reset of its first
        half)."""
        if not self.engine.one_way:
            return await self.open_channel(name)
        core = self.core
        handle = await self._open(lambda: core.open_pair(name))
        out = AnyioChannel(self, handle, core.engine.channel_name(handle), local=True)
        self._channels[handle] = out
        answer = self.waiters.pairs.wait(handle)
        self._process()
        try:
            inbound = await self._wait(answer)
        except BaseException:
            await out.reset()
            raise
        return AnyioPair(inbound, out)

    async def request(self, body: bytes, name: str = "", *, limit: int | None = None) -> bytes:
        """Send ``body`` on a new channel, end it, and return everything the peer answers
        (Streamux's request/response, usable on any two-way format). ``limit`` bounds the
        answer: a longer one raises :class:`~polymux.exceptions.LimitExceeded`. Cancelling
        the call resets the channel. Errors are polymux's (:class:`~polymux.exceptions.ChannelReset`,
        :class:`~polymux.exceptions.ChannelRejected`, :class:`~polymux.exceptions.SessionClosed` ...)."""
        core = self.core
        handle = await self._open(lambda: core.request(name, body, limit))
        answer = self.waiters.requests.wait(handle)  # (cancelled: reset on the wire)
        self._process()
        parts = await self._wait(answer)
        return b"".join(parts)  # joined here, not in the read that completed it

    async def accept_channel(self) -> Incoming:
        """The next channel the peer opened (on one-way formats, its stream pairs too).
        Raises :class:`~polymux.exceptions.SessionClosed` when the session ends first."""
        got = self.waiters.incoming.take()
        if isinstance(got, Waiter):
            return await self._wait(got)
        await anyio.lowlevel.checkpoint()  # (an accept loop lets the others run)
        return got

    def __aiter__(self) -> AsyncIterator[Incoming]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Incoming]:
        while True:
            try:
                yield await self.accept_channel()
            except SessionClosed:
                return

    # -- pings and control messages ----------------------------------------------------------

    async def ping(self) -> float:
        """Ping the peer; the round-trip time in seconds (formats with pings)."""
        await self._wait_ready()
        answer = self.waiters.pings.wait(self.core.ping(_clock()))
        self._process()
        try:
            with anyio.fail_after(self.config.keepalive_timeout):
                return await self._wait(answer)
        except TimeoutError:
            raise self.waiters.ping_timed_out() from None

    def send_control(self, data: bytes) -> None:
        """Send a control message: session-level bytes (omnistreams)."""
        self.core.send_control(data)
        self._process()

    async def receive_control(self) -> bytes:
        """Wait for the peer's next control message (omnistreams). Raises
        :class:`~polymux.exceptions.SessionClosed` when the session ends first."""
        control = self.waiters.control
        take = self.core.take_control
        got = control.attempt(take)
        while isinstance(got, Waiter):
            await self._wait(got)
            got = control.attempt(take, turn=True)
        self._process()  # reading may resume
        return got

    async def aclose(self) -> None:
        """Say goodbye where the format can, and close the stream."""
        with anyio.CancelScope(shield=True):
            if not self._done.is_set():
                self.core.close()
                self._process()
                # Bounded: a peer that does not read must not hold the close (nor the task
                # that is stuck sending to it, and its lock).
                with anyio.move_on_after(self.config.close_timeout):
                    try:
                        await self._send_output()
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass
                await self._stream.aclose()
                self._end(None)

    # -- the core's events (polymux.session.dispatch calls the on_* hooks) -------------------

    def _process(self) -> None:
        if not self._dispatcher.run():
            return  # re-entered from a hook: the outer call takes the new events
        core = self.core
        if core.reading:
            self._can_read.set()
        elif self._can_read.is_set():
            self._can_read = anyio.Event()
        if core.has_output:
            self._output.set()
        # Wake the timer task only for a deadline earlier than the one it waits for (once per
        # read, receive and send batch it woke for nothing): a later one it finds when it
        # wakes, and a deadline that went away costs it a wake-up for nothing.
        when = core.next_deadline()
        at = self._timer_at
        if when is not None and (at is None or when < at):
            self._deadline.set()

    def on_incoming(self, handle: int, name: str) -> None:
        """The peer opened a channel: to ``accept_channel``."""
        channel = AnyioChannel(self, handle, name, local=False)
        self._channels[handle] = channel
        self.waiters.incoming.add(name, handle, channel)

    def on_incoming_pair(self, handle: int, reply: int, name: str) -> None:
        """The peer opened a stream pair (the core answered it): to ``accept_channel``."""
        reader = self._channels[handle] = AnyioChannel(self, handle, name, local=False)
        writer = self._channels[reply] = AnyioChannel(self, reply, name, local=True)
        self.waiters.incoming.add(name, handle, AnyioPair(reader, writer))

    def on_pair_answered(self, handle: int, inbound: int) -> AnyioChannel:
        """Our pair got its second half (ours to read)."""
        channel = AnyioChannel(self, inbound, self.engine.channel_name(inbound), local=False)
        self._channels[inbound] = channel
        return channel

    def on_pair_failed(self, name: str, error: Exception) -> None:
        """The peer's stream pair could not be answered (the core reset its half)."""
        logger.info("%s: cannot answer the stream pair %r: %s", self.engine.format, name, error)

    def on_ready(self) -> None:
        """The handshake is done."""
        self._ready.set()

    def on_failed(self, error: BaseException) -> None:
        """The core ended the session: its last words go out, then the stream closes."""
        if self.error is None and self.core.failed:
            self.error = error
        if self._in_flight:
            self._sending.cancel()  # a send the peer takes none of must not hold the end
        self._output.set()
        self._deadline.set()

    # -- internals ---------------------------------------------------------------------------

    def _check(self) -> None:
        if self._done.is_set():
            raise SessionClosed(f"{self.engine.format}: the session is closed") from self.error

    async def _wait_ready(self) -> None:
        if not self._ready.is_set():
            with anyio.fail_after(self.config.handshake_timeout):
                await self._ready.wait()
        self._check()
        self.core.check_open()

    async def _send_output(self) -> None:
        async with self._send_lock:  # the writer task, and aclose()
            await self._send_batches()

    async def _send_batches(self) -> None:
        core = self.core
        if core.plane.reports:  # consumption the inboxes report (credit, the budget)
            core.report(_clock())
            self._process()
        while out := core.data_to_send():
            data = b"".join(out)
            if self._capture is not None:
                self._capture.sent((data,))
            core.socket_paused(True, len(data))  # the stream has it until send() returns
            self._in_flight = len(data)
            with anyio.CancelScope() as self._sending:
                try:
                    await self._stream.send(data)
                finally:
                    self._in_flight = 0
                    core.socket_paused(False, 0)
            if self._sending.cancelled_caught:
                return  # the session failed while the peer took none of it (on_failed)
            self._process()

    async def _write(self) -> None:
        """Send what the core queued: reading never waits for writing, so two peers that
        both write a lot cannot deadlock."""
        try:
            while not self._done.is_set():
                await self._output.wait()
                self._output = anyio.Event()
                await self._send_output()
                if self.core.failed:
                    await self._stream.aclose()
                    self._end(self.core.error)
                    return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._end(exc)

    async def _timers(self) -> None:
        """Call the core at its deadlines (keepalive, idle, handshake, stream-open ...)."""
        core = self.core
        while not self._done.is_set():
            self._deadline = anyio.Event()
            when = self._timer_at = core.next_deadline()
            if when is None:
                await self._deadline.wait()
                continue
            with anyio.move_on_after(max(0.0, when - _clock())):
                await self._deadline.wait()
            if _clock() >= when:
                core.handle_timer(_clock(), self._untaken())
                self._process()

    def _untaken(self) -> int:
        """Bytes we wrote that the peer has not taken yet, as far as we can see: the batch
        the stream is sending, and the kernel's send queue of a socket stream."""
        return self._in_flight + kernel_unsent(self._stream.extra(SocketAttribute.raw_socket, None))

    async def _run(self) -> None:
        """Read the stream into the core."""
        core = self.core
        core.connection_made(_clock())
        self._process()
        try:
            while not self._done.is_set():
                await self._can_read.wait()
                try:
                    data = await self._stream.receive()
                except anyio.EndOfStream:
                    core.receive_eof()
                    self._end(None)
                    return
                if self._capture is not None:
                    self._capture.received(data)
                start = time.perf_counter()
                slicer = self._slicer
                if slicer.holds(data, start):
                    await self._feed_sliced()
                else:
                    if core.receive_data(data, _clock()):
                        self._process()
                    if core.runs.woken:
                        _wake_readers(core.runs.woken)
                    elapsed = time.perf_counter() - start
                    if elapsed > DENSE_FLOOR:
                        slicer.worked(start, elapsed, len(data))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._end(exc)

    async def _feed_sliced(self) -> None:
        """A read held back in slices (:mod:`polymux.session.slicing`), letting other tasks
        run whenever ``TURN`` of work has passed, each slice once the core reads again."""
        core = self.core
        slicer = self._slicer
        turn = time.perf_counter()  # when this turn's work began
        work = 0.0  # seconds of work since other tasks last ran, on ``size`` bytes
        size = 0
        while (piece := slicer.next_slice()) is not None:
            if work > TURN:
                slicer.worked(turn, work, size)
                await anyio.lowlevel.checkpoint()
                turn, work, size = time.perf_counter(), 0.0, 0
            await self._can_read.wait()
            if self._done.is_set():
                slicer.pending = None
                break
            start = time.perf_counter()
            core.receive_data(piece, _clock())
            self._process()
            if core.runs.woken:
                _wake_readers(core.runs.woken)
            work += time.perf_counter() - start
            size += len(piece)
        slicer.worked(turn, work, size)

    def _end(self, exc: BaseException | None) -> None:
        if self._done.is_set():
            return
        core = self.core
        if self.error is None:
            self.error = core.error if core.failed else exc  # what broke it, as it was raised
        core.connection_lost(exc)
        self._process()  # every channel, open, pair and request ends
        self.waiters.lost()  # and every other wait
        self._ready.set()
        self._done.set()
        self._output.set()
        self._can_read.set()
        self._deadline.set()

    def _release(self) -> None:
        """Close what the session owns that has no peer to wait for."""
        if self._capture is not None:
            capture, self._capture = self._capture, None
            capture.close()

    async def wait_closed(self) -> None:
        """Wait until the session ended."""
        await self._done.wait()


@asynccontextmanager
async def session(
    stream: ByteStream,
    *,
    protocol: str | Format,
    is_client: bool = True,
    config: SessionConfig | None = None,
    offer_filter: Callable[[str], bool] | None = None,
    first_frame_deadline: bool | None = None,
    **options: Unpack[SessionOptions],
) -> AsyncIterator[AnyioSession]:
    """Run a polymux session over ``stream`` (any anyio ``ByteStream``) for the duration of
    the ``async with`` block; on either anyio backend.

    ``protocol`` is a format's name or a :class:`~polymux.formats.Format` (with its typed
    options). ``is_client`` picks the id side for formats where it matters (yamux).
    ``offer_filter(name) -> bool`` accepts or refuses the peer's offers. ``options`` are
    :class:`~polymux.SessionConfig` fields (the same limits, budgets and timeouts as the
    asyncio API: both drive one :class:`~polymux.session.SessionCore`).

    With ``is_client=False`` (a server's accepted stream) the peer must send a whole frame,
    or complete its handshake, within ``handshake_timeout``, as on polymux's own servers,
    unless a channel is opened to it first; ``first_frame_deadline=False`` lifts that for a
    trusted peer that may stay silent longer.
    """
    cfg = SessionConfig.from_options(config, **options)
    engine = resolve(protocol, cfg).make_engine(cfg, is_client=is_client)
    s = AnyioSession(
        stream,
        engine,
        cfg,
        is_client=is_client,
        offer_filter=offer_filter,
        first_frame_deadline=first_frame_deadline,
    )
    if cfg.capture is not None:
        s._start_capture()
    tcp_keepalive(stream.extra(SocketAttribute.raw_socket, None), cfg)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s._run)
            tg.start_soon(s._write)
            tg.start_soon(s._timers)
            try:
                yield s
            finally:
                await s.aclose()
                tg.cancel_scope.cancel()
    finally:
        s._release()

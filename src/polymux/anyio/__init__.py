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
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import ByteStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from polymux._types import CaptureSink
from polymux.config import SessionConfig
from polymux.engine import Engine, check_protocol, events as ev, make_engine
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


logger = logging.getLogger("polymux")

__all__ = ["AnyioChannel", "AnyioSession", "ChannelAttribute", "ChannelStream", "session"]


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


class AnyioChannel(ByteStream):
    """One channel of an :class:`AnyioSession`."""

    def __init__(self, session: AnyioSession, handle: int, name: str) -> None:
        self._session = session
        self._handle = handle
        self._name = name
        self._label = session.engine.describe(handle)
        self._buffer = bytearray()
        self._readable = anyio.Event()
        self._writable = anyio.Event()
        self._space = anyio.Event()  # set when the buffer is back under receive_window
        self._eof = False
        self._sent_eof = False
        self._closed = False
        self._error: BaseException | None = None
        self._write_error: BaseException | None = None  # writing failed, reading may go on

    # called by the session
    def _wake_reader(self) -> None:
        self._readable.set()

    def _wake_writer(self) -> None:
        self._writable.set()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wake_reader()
        self._wake_writer()
        self._space.set()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes; credit goes back to the peer as they are taken."""
        if self._closed:
            raise anyio.ClosedResourceError
        while not self._buffer:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._eof:  # the peer finished writing: that stands, whatever came after
                raise anyio.EndOfStream
            if self._error is not None:
                raise _broken(self._error)
            self._readable = anyio.Event()
            await self._readable.wait()
        data = bytes(self._buffer[:max_bytes])
        del self._buffer[:max_bytes]
        if len(self._buffer) <= self._session.config.receive_window:
            self._space.set()
        await self._session._consumed(self, len(data))
        return data

    async def send(self, item: bytes) -> None:
        """Send ``item``, waiting for the peer's credit as needed."""
        session = self._session
        engine = session.engine
        view = memoryview(item)
        while view:
            if self._closed or self._sent_eof:
                raise anyio.ClosedResourceError
            if self._error is not None:
                raise _broken(self._error)
            if self._write_error is not None:
                raise _broken(self._write_error)
            credit = engine.send_credit(self._handle)
            if credit <= 0:
                if not engine.is_live(self._handle):
                    raise _broken(
                        ChannelClosedError(f"{engine.format}: {self._label} was closed by the peer")
                    )
                self._writable = anyio.Event()
                await self._writable.wait()
                continue
            n = min(credit, len(view), session.config.batch_bytes)
            engine.send_data(self._handle, bytes(view[:n]))
            view = view[n:]
            await session._flush()

    async def send_eof(self) -> None:
        """Half-close: we will send no more."""
        if self._sent_eof or self._error is not None or not self._session.engine.is_live(self._handle):
            self._sent_eof = True
            return
        self._sent_eof = True
        if self._session.engine.end_channel(self._handle):
            self._session._forget(self)
        await self._session._flush()

    async def aclose(self) -> None:
        """Finish writing and stop reading (what the peer still sends is dropped)."""
        if self._closed:
            return
        with anyio.CancelScope(shield=True):
            await self.send_eof()
            self._closed = True
            unread = len(self._buffer)
            self._buffer.clear()
            if unread:
                await self._session._consumed(self, unread)  # the peer gets its window back
        self._wake_reader()
        self._space.set()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return {
            ChannelAttribute.name: lambda: self._name,
            ChannelAttribute.channel: lambda: self._label,
            ChannelAttribute.protocol: lambda: self._session.engine.format,
        }


class AnyioSession:
    """A polymux session run by anyio over any ``ByteStream``; use :func:`session`."""

    def __init__(self, stream: ByteStream, engine: Engine, config: SessionConfig) -> None:
        self.engine = engine
        self.config = config
        self._stream = stream
        self._channels: dict[int, AnyioChannel] = {}
        self._offers: dict[int, anyio.Event] = {}
        send, receive = anyio.create_memory_object_stream[AnyioChannel](config.accept_backlog)
        self._incoming_send: MemoryObjectSendStream[AnyioChannel] = send
        self._incoming: MemoryObjectReceiveStream[AnyioChannel] = receive
        self._send_lock = anyio.Lock()
        self._ready = anyio.Event()
        self._output = anyio.Event()  # the engine has bytes for the writer task
        self._done = anyio.Event()
        self._peer_goaway: str | None = None
        self._full: AnyioChannel | None = None  # a channel past receive_window (no flow control)
        self._capture: CaptureSink | None = None
        self.error: BaseException | None = None
        """Why the session ended abnormally, if it did."""

    def _start_capture(self, is_client: bool) -> None:
        """``SessionConfig.capture``: the same hook as the asyncio session's."""
        from anyio.abc import SocketAttribute

        def addr(attribute: Any) -> str:
            value = self._stream.extra(attribute, None)
            if isinstance(value, tuple):
                host = str(value[0])
                return f"[{host}]:{value[1]}" if ":" in host else f"{host}:{value[1]}"
            return "" if value is None else str(value)

        info = {
            "format": self.engine.format,
            "role": "client" if is_client else "server",
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

    async def open_channel(self, name: str = "") -> AnyioChannel:
        """Open a channel; returns once the peer accepted it (where the format asks)."""
        await self._wait_ready()
        self._check_open()
        if len(self._channels) >= self.config.max_channels:
            raise LimitExceeded(
                f"{self.engine.format}: max_channels={self.config.max_channels} channels are open"
            )
        try:
            handle = self.engine.open_channel(name)
        except RuntimeError as exc:
            raise LimitExceeded(str(exc)) from None
        channel = AnyioChannel(self, handle, self.engine.channel_name(handle))
        self._channels[handle] = channel
        accepted = anyio.Event()
        if self.engine.needs_acceptance:
            self._offers[handle] = accepted
        await self._flush()
        if self.engine.needs_acceptance:
            await accepted.wait()
            self._offers.pop(handle, None)
            if channel._error is not None:
                raise channel._error
        return channel

    async def accept_channel(self) -> AnyioChannel:
        """The next channel the peer opened."""
        try:
            return await self._incoming.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise SessionClosed(f"{self.engine.format}: the session is closed") from self.error

    def __aiter__(self) -> AsyncIterator[AnyioChannel]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AnyioChannel]:
        while True:
            try:
                yield await self.accept_channel()
            except SessionClosed:
                return

    async def aclose(self) -> None:
        """Say goodbye where the format can, and close the stream."""
        with anyio.CancelScope(shield=True):
            if not self._done.is_set():
                self.engine.close()
                try:
                    await self._flush()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, SessionClosed):
                    pass
                await self._stream.aclose()
                self._end(None)

    # -- internals ---------------------------------------------------------------------------

    def _check(self) -> None:
        if self._done.is_set():
            raise SessionClosed(f"{self.engine.format}: the session is closed") from self.error

    def _check_open(self) -> None:
        self._check()
        if self._peer_goaway is not None or not self.engine.can_open:
            raise SessionClosed(
                f"{self.engine.format}: no new channels: {self._peer_goaway or 'we are going away'}"
            )

    async def _wait_ready(self) -> None:
        if not self.engine.ready:
            with anyio.fail_after(self.config.handshake_timeout):
                await self._ready.wait()
        self._check()

    async def _flush(self) -> None:
        async with self._send_lock:
            while out := self.engine.data_to_send():
                self._check()
                data = b"".join(out)
                if self._capture is not None:
                    self._capture.sent((data,))
                try:
                    await self._stream.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    self._end(exc)
                    raise _broken(exc) from exc

    async def _consumed(self, channel: AnyioChannel, n: int) -> None:
        if self._done.is_set():
            return
        self.engine.ack_consumed(channel._handle, n)
        if self.engine.has_output:
            self._kick()  # the writer task sends it: a reader never waits on the socket

    def _kick(self) -> None:
        self._output.set()

    async def _write(self) -> None:
        """Send what the engine queued from the reading side (credit, replies): reading
        never waits for writing, so two peers that both write a lot cannot deadlock."""
        try:
            while not self._done.is_set():
                await self._output.wait()
                self._output = anyio.Event()
                await self._flush()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, SessionClosed):
            return

    def _forget(self, channel: AnyioChannel) -> None:
        self._channels.pop(channel._handle, None)

    async def _run(self) -> None:
        """Read the stream, feed the engine, dispatch its events."""
        engine = self.engine
        if engine.ready:
            self._ready.set()
        try:
            await self._flush()  # a handshake, where the format has one
            while True:
                try:
                    data = await self._stream.receive()
                except anyio.EndOfStream:
                    engine.receive_eof()
                    self._end(None)
                    return
                if self._capture is not None:
                    self._capture.received(data)
                for event in engine.receive_data(data):
                    await self._dispatch(event)
                full, self._full = self._full, None
                if full is not None and len(full._buffer) > self.config.receive_window and not full._closed:
                    # No credit to withhold: stop reading the connection until this
                    # channel's reader takes it below the window (the "block" slow-reader
                    # policy); only now, after this read's other events (a CreditAvailable
                    # among them may be what the reader waits for before it reads on).
                    full._space = anyio.Event()
                    await full._space.wait()
                if engine.has_output:
                    self._kick()
        except ProtocolError as exc:
            self._end(exc)
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._end(exc)

    async def _dispatch(self, event: ev.Event) -> None:
        channels = self._channels
        if isinstance(event, ev.DataReceived):
            channel = channels.get(event.channel)
            if channel is None or channel._closed:
                self.engine.ack_consumed(event.channel, event.flow_controlled_length)
                return
            channel._buffer += event.data
            for part in event.more:
                channel._buffer += part
            channel._wake_reader()
            if not self.engine.has_flow_control and len(channel._buffer) > self.config.receive_window:
                # A request whose response waits for its end (Streamux): the handler may be
                # blocked sending that response, so read on, within the engine's bounds.
                try:
                    if self.engine.may_hold(event.channel, len(channel._buffer)):
                        return
                except LimitExceeded as exc:
                    self.engine.reset_channel(event.channel, str(exc))
                    self._kick()
                    fmt = self.engine.format
                    channel._fail(
                        ChannelOverflow(
                            f"{fmt}: {channel._label} was reset: {str(exc).removeprefix(fmt + ': ')}"
                        )
                    )
                    self._forget(channel)
                    return
                self._full = channel  # _run stops reading once this read's events are done
        elif isinstance(event, ev.CreditAvailable):
            channel = channels.get(event.channel)
            if channel is not None:
                channel._wake_writer()
        elif isinstance(event, ev.ChannelOpened):
            if self._done.is_set() or len(channels) >= self.config.max_channels:
                self.engine.reject_channel(event.channel)
                return
            channel = AnyioChannel(self, event.channel, event.name)
            try:
                self._incoming_send.send_nowait(channel)
            except anyio.WouldBlock:
                self.engine.reject_channel(event.channel)  # the accept backlog is full
                return
            self.engine.accept_channel(event.channel)
            channels[event.channel] = channel
        elif isinstance(event, ev.ChannelAccepted):
            accepted = self._offers.get(event.channel)
            if accepted is not None:
                accepted.set()
        elif isinstance(event, ev.ChannelRejected):
            channel = channels.pop(event.channel, None)
            if channel is not None:
                channel._fail(ChannelRejected(self.engine.format, channel._label, channel._name))
            accepted = self._offers.get(event.channel)
            if accepted is not None:
                accepted.set()
        elif isinstance(event, ev.ChannelEnded):
            channel = channels.get(event.channel)
            if channel is not None:
                channel._eof = True
                channel._wake_reader()
        elif isinstance(event, ev.ChannelClosed):
            channel = channels.pop(event.channel, None)
            if channel is not None:
                channel._eof = True
                if not event.local_done:
                    channel._write_error = ChannelClosedError(
                        f"{self.engine.format}: {channel._label} was closed by the peer"
                    )
                channel._wake_reader()
                channel._wake_writer()
        elif isinstance(event, ev.ReadingStopped):
            channel = channels.get(event.channel)
            if channel is not None:
                channel._write_error = ChannelClosedError(
                    f"{self.engine.format}: the peer stopped reading {channel._label}"
                )
                channel._wake_writer()
        elif isinstance(event, ev.SessionClosed):
            # The peer's go-away: no new channels; with an error code it ends the session.
            self._peer_goaway = f"the peer is going away ({event.message})"
            if event.code:
                self._end(SessionClosed(f"{self.engine.format}: the peer went away with {event.message}"))
                with anyio.CancelScope(shield=True):
                    await self._stream.aclose()
        elif isinstance(event, ev.ChannelReset):
            channel = channels.pop(event.channel, None)
            if channel is not None:
                channel._fail(ChannelReset(self.engine.format, channel._label, event.message))
            accepted = self._offers.get(event.channel)
            if accepted is not None:
                accepted.set()
        elif isinstance(event, ev.SessionReady):
            self._ready.set()

    def _end(self, exc: BaseException | None) -> None:
        if self._done.is_set():
            return
        if exc is not None:
            self.error = exc
        error = SessionClosed(f"{self.engine.format}: the session ended" + (f": {exc}" if exc else ""))
        error.__cause__ = exc
        for channel in list(self._channels.values()):
            channel._fail(error)  # a reader keeps what arrived (and an EOF that came first)
        self._channels.clear()
        for accepted in self._offers.values():
            accepted.set()
        self._incoming_send.close()
        self._ready.set()
        self._done.set()
        self._output.set()

    def _release(self) -> None:
        """Close what the session owns that has no peer to wait for."""
        self._incoming.close()
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
    protocol: str,
    is_client: bool = True,
    config: SessionConfig | None = None,
    **options: Any,
) -> AsyncIterator[AnyioSession]:
    """Run a polymux session over ``stream`` (any anyio ``ByteStream``) for the duration of
    the ``async with`` block; on either anyio backend.

    ``is_client`` picks the id side for formats where it matters (yamux). ``options`` are
    :class:`~polymux.SessionConfig` fields.
    """
    check_protocol(protocol)
    cfg = SessionConfig.from_options(config, **options)
    s = AnyioSession(stream, make_engine(protocol, cfg, is_client=is_client), cfg)
    if cfg.capture is not None:
        s._start_capture(is_client)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s._run)
            tg.start_soon(s._write)
            try:
                yield s
            finally:
                await s.aclose()
                tg.cancel_scope.cancel()
    finally:
        s._release()

"""Sessions over WebSocket (the ``websockets`` library), for omnistreams above all.

omnistreams needs message boundaries from below: here one mux message is one binary
WebSocket message (no length prefix). Other formats run over WebSocket too; their bytes
go in binary messages of any size (each scheduler batch is one message).

This is the only polymux module that imports ``websockets``, and only when it is used,
so polymux works without it. :class:`_WebSocketTransport` adapts a websockets connection
to the ``asyncio.Transport`` that :class:`~polymux.aio.session.MuxProtocol` drives:

* writing: messages queue in the adapter and one task sends them in order, awaiting each
  ``send()`` (which waits for the socket to drain); above ``2 * batch_bytes`` queued
  bytes the session is paused (``pause_writing``), below a quarter of that resumed, so
  backpressure holds across the WebSocket;
* reading: one task receives messages and feeds them to the session; ``pause_reading``
  stops receiving (websockets' own ``max_queue`` then stops the socket);
* a text message is a protocol error; the WebSocket's close is the session's end.

The websockets connections themselves are polymux's subclasses, each with a
:class:`_Guard`, for the WebSocket-level bounds of SECURITY.md: a WebSocket protocol
violation (an unmasked client frame, a frame announcing more than ``max_size``, a bad close
code, a text frame ...), the end of the closing handshake (both close frames exchanged) and
a failed session end the connection at once, instead of at the library's next keepalive
ping (~20 s later) or after ``close_timeout``; a peer that does not answer our graceful
close frame is cut at ``close_timeout``; a connection stops reading while more than
:data:`UNSENT_LIMIT` bytes the library wrote on its own (pongs) wait for a peer that does
not read. ``handshake_timeout`` bounds the opening handshake (the HTTP upgrade), and a
server counts a connection against ``max_connections`` from its accept, its upgrade
included.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import types
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, cast

from polymux._extras import require
from polymux.aio.client import _ready
from polymux.aio.server import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, Server
from polymux.aio.session import ChannelHandler, MuxProtocol, OfferFilter, Session, check_handler
from polymux.config import SessionConfig
from polymux.exceptions import ProtocolError
from polymux.formats import Format, resolve
from polymux.wire import omnistreams as omni_wire


if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection
    from websockets.asyncio.connection import Connection
    from websockets.asyncio.server import ServerConnection
    from websockets.protocol import Event


__all__ = ["connect_websocket", "serve_websocket"]

SessionHandler = Callable[[Session], Awaitable[None] | None]

_SESSION_FIELDS = frozenset(f.name for f in fields(SessionConfig))


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    session = {k: v for k, v in options.items() if k in _SESSION_FIELDS}
    websocket = {k: v for k, v in options.items() if k not in _SESSION_FIELDS}
    return session, websocket


def _make_mux(
    fmt: Format,
    cfg: SessionConfig,
    *,
    is_client: bool,
    handler: ChannelHandler | None,
    offer_filter: OfferFilter | None,
) -> MuxProtocol:
    # Formats that can take one WebSocket message per frame do (omnistreams); the others
    # run as a byte stream over the messages.
    engine = fmt.make_engine(cfg, is_client=is_client, message_mode=fmt.caps.message_transport)
    return MuxProtocol(
        fmt, cfg, is_client=is_client, handler=handler, offer_filter=offer_filter, engine=engine
    )


def _ws_defaults(cfg: SessionConfig, ws_options: dict[str, Any]) -> dict[str, Any]:
    opts = dict(ws_options)
    if "create_connection" in opts:
        raise TypeError("create_connection: polymux's WebSocket sessions use their own connection class")
    opts.setdefault("compression", None)  # mux payloads are often incompressible; keep it cheap
    opts.setdefault("max_size", cfg.max_message_size or omni_wire.MAX_MESSAGE_SIZE)
    # The session's timeouts bound the WebSocket's own handshakes (the library's defaults
    # would hold whatever the session says).
    opts.setdefault("open_timeout", cfg.handshake_timeout)
    opts.setdefault("close_timeout", cfg.close_timeout)
    return opts


UNSENT_LIMIT = 4 * 1024 * 1024
"""Bytes written to a WebSocket's socket and not taken by it past which the connection stops
reading: the websockets library answers every ping with a pong of the same size on its own,
so a peer that floods pings and never reads would grow our buffer without bound. A polymux
session never gets near it (it writes one message at a time and waits for the socket)."""

# Why a guarded connection stopped reading (bits of _Guard.blocked).
_QUEUE = 1
"""The library's queue of received messages is full (``max_queue``)."""
_UNSENT = 2
"""More than UNSENT_LIMIT bytes wait for a peer that does not read."""


@functools.cache
def _ws() -> Any:
    """websockets' names that :class:`_Guard` uses on every frame and every read, imported
    once (an import statement there cost about a microsecond a call; websockets is an
    optional extra, so not at module level)."""
    from websockets.asyncio.messages import MAX_FRAGMENTS
    from websockets.frames import CloseCode, Frame, Opcode
    from websockets.protocol import State

    return types.SimpleNamespace(
        MAX_FRAGMENTS=MAX_FRAGMENTS, CloseCode=CloseCode, Frame=Frame, Opcode=Opcode, State=State
    )


class _Guard:
    """The WebSocket-level bounds of one websockets connection (client or server side),
    called from the connection subclasses of :func:`_client_class` and :func:`_server_class`."""

    __slots__ = ("blocked", "conn", "fragments", "on_text", "timer")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.blocked = 0
        self.fragments = 0  # frames of the message being received
        self.timer: asyncio.TimerHandle | None = None
        self.on_text: Callable[[], None] | None = None
        """Called when a text message arrives (the session's protocol error)."""

    def made(self) -> None:
        """The connection is made: reading pauses for the library's queue or for unsent
        replies, and resumes only when neither holds it."""
        assembler = self.conn.recv_messages
        assembler.pause = functools.partial(self.block, _QUEUE, True)
        assembler.resume = functools.partial(self.block, _QUEUE, False)

    def block(self, reason: int, on: bool) -> None:
        before = self.blocked
        after = before | reason if on else before & ~reason
        if after == before:
            return
        self.blocked = after
        transport = self.conn.transport
        if transport.is_closing():
            return
        if after and not before:
            transport.pause_reading()
        elif before and not after:
            transport.resume_reading()

    def event(self, event: object) -> bool:
        """A received event, before the library takes it. A text frame (polymux carries
        binary messages only), or a message in more than websockets' ``MAX_FRAGMENTS``
        frames, ends the connection at once (the library would find them in ``recv()`` and
        then wait close_timeout for the peer). Returns True when the event is dealt with."""
        ws = _ws()
        if not isinstance(event, ws.Frame):
            return False
        opcode = event.opcode
        if opcode is ws.Opcode.CONT:
            self.fragments += 1
            if self.fragments > ws.MAX_FRAGMENTS:
                self.refuse(ws.CloseCode.MESSAGE_TOO_BIG, f"more than {ws.MAX_FRAGMENTS} fragments")
                return True
        elif opcode is ws.Opcode.BINARY:
            self.fragments = 1
        elif opcode is ws.Opcode.TEXT:
            if self.on_text is not None:
                self.on_text()
            self.refuse(ws.CloseCode.UNSUPPORTED_DATA, "polymux takes binary messages only")
            return True
        return False

    def refuse(self, code: int, reason: str) -> None:
        """Fail the WebSocket (a close frame with ``code``) and end the connection now."""
        from websockets.protocol import State

        conn = self.conn
        if conn.protocol.state is State.OPEN:
            conn.protocol.fail(code, reason)
            conn.send_data()
        self.end()

    def end(self) -> None:
        """Close the connection now: what we wrote goes if the socket takes it at once."""
        transport = self.conn.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size():
            transport.abort()  # a peer that does not read gets no more time
        else:
            transport.close()

    def received(self) -> None:
        """After the library took received bytes: end the connection at once when the peer
        broke the WebSocket protocol, or when the closing handshake is over on our side."""
        conn = self.conn
        transport = conn.transport
        if transport.is_closing():
            return
        protocol = conn.protocol
        if protocol.state is _ws().State.CLOSING:
            if protocol.parser_exc is not None or (
                protocol.close_rcvd is not None and protocol.close_sent is not None
            ):
                # A violation (the close frame naming it is written), or both close frames
                # exchanged: nothing more to say or to hear. Not waiting for the peer's TCP
                # close, which the library does until its next keepalive ping.
                self.end()
            elif self.timer is None and conn.close_timeout is not None:
                # Our close frame awaits the peer's: at most close_timeout.
                self.timer = conn.loop.call_later(conn.close_timeout, transport.abort)
        elif transport.get_write_buffer_size() > UNSENT_LIMIT:
            self.block(_UNSENT, True)

    def writable(self) -> None:
        """The socket took our bytes down to its low-water mark."""
        self.block(_UNSENT, False)

    def lost(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _Guarded:
    """The overrides that give a websockets connection class :class:`_Guard`'s bounds
    (mixed in before the library's class: each runs the library's method, then the
    guard's)."""

    guard: _Guard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = _Guard(self)  # type: ignore[arg-type]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.guard.made()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        self.guard.received()

    def process_event(self, event: Event) -> None:
        if not self.guard.event(event):
            super().process_event(event)  # type: ignore[misc]

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self.guard.writable()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # type: ignore[misc]
        self.guard.lost()


@functools.cache
def _client_class() -> type[ClientConnection]:
    """websockets' client connection, with :class:`_Guard`'s bounds."""
    from websockets.asyncio.client import ClientConnection

    class GuardedClientConnection(_Guarded, ClientConnection):
        """A client WebSocket connection with polymux's WebSocket-level bounds."""

    return GuardedClientConnection


def _server_class(server: Server) -> type[ServerConnection]:
    """websockets' server connection, with :class:`_Guard`'s bounds, counted by ``server``
    from its accept (``polymux.aio.server._Held``: silent until its session has heard
    a whole frame)."""
    from websockets.asyncio.server import ServerConnection

    class AcceptedConnection(_Guarded, ServerConnection):
        """A server WebSocket connection with polymux's WebSocket-level bounds, counted
        against ``max_connections`` from its accept."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.mux: MuxProtocol | None = None
            self.admitted = server._admit()
            if self.admitted:
                server._hold(self)

        @property
        def session(self) -> Session | None:
            """The session, once upgraded."""
            return None if self.mux is None else self.mux.session

        @property
        def peer_silent(self) -> bool:
            """No upgrade yet, or its session has heard no whole frame."""
            return self.mux is None or self.mux.peer_silent

        def abort(self) -> None:
            """Close the connection at once."""
            self.transport.abort()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # (the guard's made() first)
            if not self.admitted:
                cast(asyncio.Transport, transport).abort()  # beyond max_connections
                return
            server._connected(self)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)  # (the guard's lost() first)
            server._release(self)

    return AcceptedConnection


class _WebSocketTransport(asyncio.Transport):
    """A websockets connection as the ``asyncio.Transport`` of a session (see the module
    docstring)."""

    def __init__(self, ws: Connection, mux: MuxProtocol) -> None:
        super().__init__()
        self._ws = ws
        self._mux = mux
        self._message_mode = mux.engine.message_mode
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._high = 2 * mux.config.batch_bytes
        self._low = self._high // 4
        self._paused = False
        self._wakeup = asyncio.Event()
        self._reading = asyncio.Event()
        self._reading.set()
        self._closing = False
        self._lost = False
        self._tasks: list[asyncio.Task[None]] = []
        guard = getattr(ws, "guard", None)
        self._guard = guard if isinstance(guard, _Guard) else None
        if self._guard is not None:
            self._guard.on_text = self._text_received

    def _text_received(self) -> None:
        self._mux.fail(ProtocolError(self._mux.engine.format, "received a text WebSocket message"))

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._receive()), loop.create_task(self._send())]

    # -- reading -----------------------------------------------------------------------------

    async def _receive(self) -> None:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        exc: Exception | None = None
        try:
            while True:
                await self._reading.wait()
                message = await self._ws.recv()
                if isinstance(message, str):  # a connection without polymux's guard
                    self._text_received()
                    break
                self._mux.data_received(message)
        except ConnectionClosedOK:
            if not self._mux.closed.done():
                self._mux.eof_received()
        except ConnectionClosed as e:
            exc = e
        except asyncio.CancelledError:
            pass
        self._lose(exc)

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_reading(self) -> bool:
        return self._reading.is_set()

    # -- writing -----------------------------------------------------------------------------

    def write(self, data: Any) -> None:
        self.writelines([data])

    def writelines(self, list_of_data: Any) -> None:
        if self._closing:
            return
        if self._message_mode:
            parts = [bytes(part) for part in list_of_data]
        else:
            parts = [b"".join(list_of_data)]
        for part in parts:
            self._queue.append(part)
            self._queued += len(part)
        self._wakeup.set()
        if not self._paused and self._queued > self._high:
            self._paused = True
            self._mux.pause_writing()

    async def _send(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                queue = self._queue
                while queue:
                    message = queue.popleft()
                    await self._ws.send(message)
                    self._queued -= len(message)
                    if self._paused and self._queued <= self._low:
                        self._paused = False
                        self._mux.resume_writing()
                if self._closing:
                    await self._ws.close()
                    return
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - whatever broke the connection ends the session
            self._lose(exc)

    def get_write_buffer_size(self) -> int:
        return self._queued

    def can_write_eof(self) -> bool:
        return False

    # -- ending ------------------------------------------------------------------------------

    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        from websockets.protocol import State

        if exc is not None or self._ws.state is State.OPEN:
            # Broken, or ended without a closing handshake (a protocol error): drop it.
            self._ws.transport.abort()
        self._mux.connection_lost(exc)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Send what is queued, then close the WebSocket (the session ends when it is closed).
        A session that failed does not wait for the peer's closing handshake: see
        :meth:`_end_now`."""
        if self._closing:
            return
        self._closing = True
        if self._mux.core.failed and self._guard is not None:
            self._end_now(self._guard)
            return
        self._wakeup.set()

    def _end_now(self, guard: _Guard) -> None:
        """The session failed (a violation, handshake_timeout, keepalive, send_timeout):
        its last words and a close frame naming the error go if the socket takes them at
        once, and the connection ends now, as on any other transport (a peer that stays
        silent must not hold it for close_timeout more)."""
        from websockets.protocol import State

        protocol = self._ws.protocol
        if protocol.state is State.OPEN:
            error = self._mux.core.error
            code = 1002 if isinstance(error, ProtocolError) else 1008  # protocol error / policy
            reason = str(error).encode()[:120].decode("utf-8", "ignore")  # a close frame: <= 125 bytes
            with contextlib.suppress(Exception):
                for message in self._queue:
                    protocol.send_binary(message)
                self._queue.clear()
                self._queued = 0
                guard.refuse(code, reason)  # the close frame naming it, and the end
        guard.end()  # (not open, or refusing failed; a no-op once ended)

    def abort(self) -> None:
        self._closing = True
        with contextlib.suppress(Exception):
            self._ws.transport.abort()
        self._lose(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "websocket":
            return self._ws
        return self._ws.transport.get_extra_info(name, default)


async def connect_websocket(
    uri: str,
    *,
    protocol: str | Format = "omnistreams",
    config: SessionConfig | None = None,
    handler: ChannelHandler | None = None,
    offer_filter: OfferFilter | None = None,
    **options: Any,
) -> Session:
    """Connect to a WebSocket server (``ws://`` or ``wss://``) and return a ready session.

    ``options`` are :class:`~polymux.SessionConfig` fields or keyword arguments of
    ``websockets.asyncio.client.connect`` (``additional_headers=``, ``ssl=`` ...);
    compression is off unless asked for, and ``max_size`` defaults to the session's
    ``max_message_size``. One mux message is one binary WebSocket message.
    """
    require("websockets", "connect_websocket (WebSocket endpoints)")
    from websockets.asyncio.client import connect as ws_connect

    session_opts, ws_opts = _split(options)
    cfg = SessionConfig.from_options(config, **session_opts)
    fmt = resolve(protocol, cfg)
    check_handler(fmt.name, fmt.caps.one_way, handler)
    ws = await ws_connect(uri, create_connection=_client_class(), **_ws_defaults(cfg, ws_opts))
    mux = _make_mux(fmt, cfg, is_client=True, handler=handler, offer_filter=offer_filter)
    transport = _WebSocketTransport(ws, mux)
    mux.connection_made(transport)
    transport._start()
    return await _ready(mux)


async def serve_websocket(
    handler: ChannelHandler | None,
    host: str | None,
    port: int,
    *,
    protocol: str | Format = "omnistreams",
    config: SessionConfig | None = None,
    session_handler: SessionHandler | None = None,
    offer_filter: OfferFilter | None = None,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    max_memory: int | None = None,
    max_connections_per_address: int | None = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    **options: Any,
) -> Server:
    """Serve sessions on WebSocket: each connection is a session whose incoming channels
    run ``handler(reader, writer)`` (see :func:`polymux.start_server`). ``options`` are
    :class:`~polymux.SessionConfig` fields or keyword arguments of
    ``websockets.asyncio.server.serve`` (``ssl=``, ``process_request=`` ...). Any path is
    accepted (the npm package connects to ``/omnistreams``).

    ``max_connections`` counts connections from their accept, before the HTTP upgrade; the
    upgrade must complete within ``handshake_timeout`` (websockets' ``open_timeout``), then
    the session's first frame is due within ``handshake_timeout`` too (see
    :func:`polymux.start_server`, as for ``max_memory`` and
    ``max_connections_per_address``)."""
    require("websockets", "serve_websocket (WebSocket endpoints)")
    from websockets.asyncio.server import serve as ws_serve

    session_opts, ws_opts = _split(options)
    cfg = SessionConfig.from_options(config, **session_opts)
    fmt = resolve(protocol, cfg)
    check_handler(fmt.name, fmt.caps.one_way, handler)

    def make() -> MuxProtocol:
        return _make_mux(fmt, cfg, is_client=False, handler=handler, offer_filter=offer_filter)

    server = Server(
        make,
        session_handler,
        max_connections,
        cfg.handshake_timeout,
        max_memory=max_memory,
        max_connections_per_address=max_connections_per_address,
    )
    connection_class = _server_class(server)

    async def on_connection(ws: ServerConnection) -> None:
        accepted = cast(Any, ws)  # an AcceptedConnection (connection_class)
        mux = make()
        accepted.mux = mux
        server._attach(mux)
        transport = _WebSocketTransport(ws, mux)
        mux.connection_made(transport)
        transport._start()
        await asyncio.shield(mux.closed)

    ws_server = await ws_serve(
        on_connection, host, port, create_connection=connection_class, **_ws_defaults(cfg, ws_opts)
    )
    server._server = cast(asyncio.Server, ws_server)
    return server

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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, cast

from polymux import formats
from polymux._extras import require
from polymux.aio.client import _ready
from polymux.aio.server import DEFAULT_MAX_CONNECTIONS, Server
from polymux.aio.session import ChannelHandler, MuxProtocol, OfferFilter, Session, check_handler
from polymux.config import SessionConfig
from polymux.engine import check_protocol
from polymux.exceptions import ProtocolError
from polymux.wire import omnistreams as omni_wire


if TYPE_CHECKING:
    from websockets.asyncio.connection import Connection


__all__ = ["connect_websocket", "serve_websocket"]

SessionHandler = Callable[[Session], Awaitable[None] | None]

_SESSION_FIELDS = frozenset(f.name for f in fields(SessionConfig))


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    session = {k: v for k, v in options.items() if k in _SESSION_FIELDS}
    websocket = {k: v for k, v in options.items() if k not in _SESSION_FIELDS}
    return session, websocket


def _make_mux(
    protocol: str,
    cfg: SessionConfig,
    *,
    is_client: bool,
    handler: ChannelHandler | None,
    offer_filter: OfferFilter | None,
) -> MuxProtocol:
    # Formats that can take one WebSocket message per frame do (omnistreams); the others
    # run as a byte stream over the messages.
    fmt = formats.get(protocol)
    engine = fmt.make_engine(cfg, is_client=is_client, message_mode=fmt.caps.message_transport)
    return MuxProtocol(
        protocol, cfg, is_client=is_client, handler=handler, offer_filter=offer_filter, engine=engine
    )


def _ws_defaults(cfg: SessionConfig, ws_options: dict[str, Any]) -> dict[str, Any]:
    opts = dict(ws_options)
    opts.setdefault("compression", None)  # mux payloads are often incompressible; keep it cheap
    opts.setdefault("max_size", cfg.max_message_size or omni_wire.MAX_MESSAGE_SIZE)
    return opts


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
                if isinstance(message, str):
                    error = ProtocolError(self._mux.engine.format, "received a text WebSocket message")
                    self._mux.fail(error)
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
        """Send what is queued, then close the WebSocket (the session ends when it is closed)."""
        if self._closing:
            return
        self._closing = True
        self._wakeup.set()

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
    protocol: str = "omnistreams",
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

    check_protocol(protocol)
    check_handler(protocol, formats.get(protocol).caps.one_way, handler)
    session_opts, ws_opts = _split(options)
    cfg = SessionConfig.from_options(config, **session_opts)
    ws = await ws_connect(uri, **_ws_defaults(cfg, ws_opts))
    mux = _make_mux(protocol, cfg, is_client=True, handler=handler, offer_filter=offer_filter)
    transport = _WebSocketTransport(ws, mux)
    mux.connection_made(transport)
    transport._start()
    return await _ready(mux)


async def serve_websocket(
    handler: ChannelHandler | None,
    host: str | None,
    port: int,
    *,
    protocol: str = "omnistreams",
    config: SessionConfig | None = None,
    session_handler: SessionHandler | None = None,
    offer_filter: OfferFilter | None = None,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    **options: Any,
) -> Server:
    """Serve sessions on WebSocket: each connection is a session whose incoming channels
    run ``handler(reader, writer)`` (see :func:`polymux.start_server`). ``options`` are
    :class:`~polymux.SessionConfig` fields or keyword arguments of
    ``websockets.asyncio.server.serve`` (``ssl=``, ``process_request=`` ...). Any path is
    accepted (the npm package connects to ``/omnistreams``)."""
    require("websockets", "serve_websocket (WebSocket endpoints)")
    from websockets.asyncio.server import serve as ws_serve

    check_protocol(protocol)
    check_handler(protocol, formats.get(protocol).caps.one_way, handler)
    session_opts, ws_opts = _split(options)
    cfg = SessionConfig.from_options(config, **session_opts)

    def make() -> MuxProtocol:
        return _make_mux(protocol, cfg, is_client=False, handler=handler, offer_filter=offer_filter)

    server = Server(make, session_handler, max_connections)

    async def on_connection(ws: Connection) -> None:
        mux = server._make()
        if not isinstance(mux, MuxProtocol):  # max_connections reached
            await ws.close(1013, "polymux: too many connections")
            return
        transport = _WebSocketTransport(ws, mux)
        mux.connection_made(transport)
        transport._start()
        await asyncio.shield(mux.closed)

    ws_server = await ws_serve(on_connection, host, port, **_ws_defaults(cfg, ws_opts))
    server._server = cast(asyncio.Server, ws_server)
    return server

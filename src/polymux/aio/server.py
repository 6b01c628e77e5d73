"""Serving sessions on TCP and unix sockets (``asyncio.start_server``'s shape)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Any, Self, cast

from polymux.aio.session import ChannelHandler, MuxProtocol, OfferFilter, Session, check_handler
from polymux.config import SessionConfig
from polymux.engine import check_protocol
from polymux.formats import get as get_format


__all__ = ["Server", "start_server", "start_unix_server"]

SessionHandler = Callable[[Session], Awaitable[None] | None]

logger = logging.getLogger("polymux")

DEFAULT_MAX_CONNECTIONS = 1024
"""Connections a server holds at once by default (``max_connections``)."""


class _Refused(asyncio.Protocol):
    """The protocol of a connection beyond ``max_connections``: dropped at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


class Server:
    """A listening server whose connections are polymux sessions.

    ``async with`` closes it (and its sessions) on exit; ``sessions`` are the live ones.
    """

    def __init__(
        self,
        factory: Callable[[], MuxProtocol],
        session_handler: SessionHandler | None,
        max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if max_connections is not None and (not isinstance(max_connections, int) or max_connections <= 0):
            raise ValueError(f"max_connections must be a positive int or None, got {max_connections!r}")
        self._factory = factory
        self._session_handler = session_handler
        self.max_connections = max_connections
        """Connections held at once (once connected: TLS handshakes in progress are bounded
        by asyncio's ``ssl_handshake_timeout``); more are dropped as they come."""
        self._refused = 0
        self._server: asyncio.Server | None = None
        self.sessions: set[Session] = set()
        """Sessions currently connected."""
        self._tasks: set[asyncio.Task[None]] = set()

    def _make(self) -> asyncio.Protocol:
        limit = self.max_connections
        if limit is not None and len(self.sessions) >= limit:
            self._refused += 1
            if self._refused & (self._refused - 1) == 0:  # 1st, 2nd, 4th, 8th ...: not a log flood
                logger.warning(
                    "polymux server: max_connections=%d reached; %d connection(s) refused so far",
                    limit,
                    self._refused,
                )
            return _Refused()
        mux = self._factory()
        session = mux.session
        # Counted from connection_made, which a failed TLS handshake never reaches (and
        # then no connection_lost follows: a session added now would stay forever).
        mux.on_connection_made = lambda: self.sessions.add(session)
        mux.closed.add_done_callback(lambda _f: self.sessions.discard(session))
        if self._session_handler is not None:
            mux.ready.add_done_callback(lambda f: self._run_handler(session, f))
        return mux

    def _run_handler(self, session: Session, ready: asyncio.Future[None]) -> None:
        if ready.cancelled() or ready.exception() is not None or self._session_handler is None:
            return
        res = self._session_handler(session)
        if asyncio.iscoroutine(res):
            task = asyncio.ensure_future(res)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @property
    def sockets(self) -> tuple[Any, ...]:
        """The listening sockets."""
        return tuple(self._server.sockets) if self._server else ()

    @property
    def port(self) -> int:
        """The TCP port of the first listening socket (handy with ``port=0``)."""
        return int(self.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop listening and abort every live session."""
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            session.abort()

    async def aclose(self) -> None:
        """Stop listening, close every session gracefully, and wait."""
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(s.aclose() for s in list(self.sessions)), return_exceptions=True)
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait until the listener and all sessions are closed."""
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.gather(*(s.wait_closed() for s in list(self.sessions)), return_exceptions=True)

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        assert self._server is not None
        await self._server.serve_forever()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _server(
    protocol: str,
    handler: ChannelHandler | None,
    config: SessionConfig | None,
    session_handler: SessionHandler | None,
    offer_filter: OfferFilter | None,
    max_connections: int | None,
    options: dict[str, Any],
) -> Server:
    check_protocol(protocol)
    check_handler(protocol, get_format(protocol).caps.one_way, handler)
    cfg = SessionConfig.from_options(config, **options)

    def make() -> MuxProtocol:
        return MuxProtocol(protocol, cfg, is_client=False, handler=handler, offer_filter=offer_filter)

    return Server(make, session_handler, max_connections)


async def start_server(
    handler: ChannelHandler | None,
    host: str | None,
    port: int,
    *,
    protocol: str,
    config: SessionConfig | None = None,
    session_handler: SessionHandler | None = None,
    offer_filter: OfferFilter | None = None,
    ssl: Any = None,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    **options: Any,
) -> Server:
    """Listen on TCP; each connection is a session, each incoming channel runs
    ``handler(reader, writer)`` (like ``asyncio.start_server``). ``session_handler(session)``
    runs once per session when its handshake is done. ``options`` are
    :class:`SessionConfig` fields. At most ``max_connections`` connections are held at
    once (``None``: no limit); further ones are dropped as they arrive."""
    server = _server(protocol, handler, config, session_handler, offer_filter, max_connections, options)
    loop = asyncio.get_running_loop()
    server._server = await loop.create_server(server._make, host, port, ssl=ssl)
    return server


async def start_unix_server(
    handler: ChannelHandler | None,
    path: str | os.PathLike[str],
    *,
    protocol: str,
    config: SessionConfig | None = None,
    session_handler: SessionHandler | None = None,
    offer_filter: OfferFilter | None = None,
    ssl: Any = None,
    mode: int | None = 0o600,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    **options: Any,
) -> Server:
    """Listen on a unix socket (see :func:`start_server`).

    The socket file gets permissions ``mode`` (default ``0o600``: only this user may
    connect) before the server listens, so no other user can connect in between;
    ``None`` leaves them to the umask. A stale socket file at ``path`` is replaced.
    """
    server = _server(protocol, handler, config, session_handler, offer_filter, max_connections, options)
    loop = asyncio.get_running_loop()
    name = os.fspath(path)
    if mode is None:
        server._server = await loop.create_unix_server(server._make, name, ssl=ssl)
        return server
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(name).st_mode):
            os.remove(name)  # a stale socket, as asyncio.start_unix_server does
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound = False
    try:
        sock.bind(name)
        bound = True
        os.chmod(name, mode)
        server._server = await loop.create_unix_server(server._make, sock=sock, ssl=ssl)
    except BaseException:
        sock.close()
        if bound:
            with contextlib.suppress(OSError):
                os.remove(name)
        raise
    return server

"""Serving sessions on TCP and unix sockets (``asyncio.start_server``'s shape)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, Self, Unpack, cast

from polymux.aio._sockinfo import tcp_keepalive
from polymux.aio.session import ChannelHandler, MuxProtocol, OfferFilter, Session, check_handler
from polymux.config import SessionConfig, SessionOptions
from polymux.formats import Format, resolve
from polymux.session.budget import MemoryAccount


__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_ADDRESS",
    "Server",
    "start_server",
    "start_unix_server",
]

SessionHandler = Callable[[Session], Awaitable[None] | None]

logger = logging.getLogger("polymux")

DEFAULT_MAX_CONNECTIONS = 1024
"""Connections a server holds at once by default (``max_connections``)."""

DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 256
"""Connections one peer address may hold at once by default (``max_connections_per_address``):
a quarter of the default slots, far more than an honest client opens."""

MEMORY_REFUSAL = 1.25
"""New connections are refused while the sessions hold this many times ``max_memory``
(the memory account holds the heaviest back near the limit: past it, something the account
does not bound holds the memory, and new sessions would only add to it)."""


class _Refused(asyncio.Protocol):
    """The protocol of a connection beyond ``max_connections``: dropped at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


class _Held(Protocol):
    """A connection a :class:`Server` holds: a session's :class:`MuxProtocol`, or a
    WebSocket connection (its upgrade, then its session)."""

    @property
    def session(self) -> Session | None:
        """Its session (a WebSocket has none before its upgrade)."""

    @property
    def peer_silent(self) -> bool:
        """Whether the peer has sent nothing yet (no whole frame, no completed handshake)."""

    def abort(self) -> None:
        """Close the connection at once."""


_TLS_GRACE = 1.0
"""Seconds past ``handshake_timeout`` after which a connection accepted but never made (a
TLS handshake the loop gave up on, where polymux does not run it: ``serve_websocket(ssl=)``)
stops counting."""


class _TLSGate(asyncio.Protocol):
    """A TLS server's connection until its TLS handshake is done (``start_server(ssl=)``):
    the server runs the handshake itself (``loop.start_tls``) rather than asking the loop to,
    so the connection is held, counted and can be shed from its accept, and a handshake that
    fails or times out gives its slot back at once. Then its session takes the TLS transport."""

    def __init__(self, server: Server, mux: MuxProtocol, ssl: Any) -> None:
        self.server = server
        self.mux = mux
        self.ssl = ssl
        self.raw: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def session(self) -> Session:
        """Its session."""
        return self.mux.session

    @property
    def peer_silent(self) -> bool:
        """No TLS handshake yet, or its session has heard no whole frame."""
        return self.mux.peer_silent

    def abort(self) -> None:
        """Close the connection at once (the TLS transport above goes with it)."""
        if self.raw is not None:
            self.raw.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = raw = cast(asyncio.Transport, transport)
        raw.pause_reading()  # the TLS protocol reads, once start_tls has put it in place
        self.server._connected(self)
        self.task = asyncio.get_running_loop().create_task(self._handshake(raw))
        self.server._tasks.add(self.task)
        self.task.add_done_callback(self.server._tasks.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        return  # during the handshake: start_tls fails, and _handshake gives the slot back

    async def _handshake(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                raw,
                self.mux,
                self.ssl,
                server_side=True,
                ssl_handshake_timeout=self.server._handshake_timeout,
            )
        except Exception as exc:  # noqa: BLE001 - any failed handshake: the connection is over
            logger.debug("polymux server: TLS handshake failed: %r", exc)
            raw.abort()
            self.server._release(self)
            return
        if tls is None:  # pragma: no cover - the loop gave no transport (cancelled meanwhile)
            raw.abort()
            self.server._release(self)
            return
        self.mux.closed.add_done_callback(lambda _f: self.server._release(self))
        self.mux.connection_made(tls)


class Server:
    """A listening server whose connections are polymux sessions.

    ``async with`` closes it (and its sessions) on exit; ``sessions`` are the live ones.

    Connections are counted from the moment they are accepted (before any byte is read, a
    TLS or WebSocket handshake included), so a burst of connects cannot hold more than
    ``max_connections``. When it is reached, the oldest connection whose peer has sent
    nothing yet (no whole frame, no completed handshake) is closed to make room; only when
    there is none is the new connection dropped.
    """

    def __init__(
        self,
        factory: Callable[[], MuxProtocol],
        session_handler: SessionHandler | None,
        max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
        handshake_timeout: float = 10.0,
        *,
        max_memory: int | None = None,
        max_connections_per_address: int | None = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    ) -> None:
        if max_connections is not None and (not isinstance(max_connections, int) or max_connections <= 0):
            raise ValueError(f"max_connections must be a positive int or None, got {max_connections!r}")
        per_address = max_connections_per_address
        if per_address is not None and (not isinstance(per_address, int) or per_address <= 0):
            raise ValueError(
                f"max_connections_per_address must be a positive int or None, got {per_address!r}"
            )
        self.memory = None if max_memory is None else MemoryAccount(max_memory)
        """The sessions' shared memory budget (``max_memory``), or None."""
        self.max_connections_per_address = per_address
        """Connections one peer address may hold at once; more are refused."""
        self._addresses: dict[str, int] = {}  # connections held per peer address
        self._address_of: dict[_Held, str] = {}
        self._refused_address = 0
        self._refused_memory = 0
        self._factory = factory
        self._session_handler = session_handler
        self.max_connections = max_connections
        """Connections held at once, counted from their accept; when it is reached, one
        whose peer has sent nothing yet is closed to make room, or else the new one is
        dropped."""
        self._handshake_timeout = handshake_timeout
        self._ssl: Any = None  # start_server(ssl=) on asyncio's loop: TLS runs in _TLSGate
        self._refused = 0
        self._shed = 0
        self._server: asyncio.Server | None = None
        self.sessions: set[Session] = set()
        """Sessions currently connected."""
        self._tasks: set[asyncio.Task[None]] = set()
        # What counts towards max_connections: accepted and not yet connected (a TLS
        # handshake under way: since when), and connected. _quiet: the connected ones
        # whose peer had sent nothing when last looked at, oldest first (checked lazily).
        self._pending: dict[_Held, float] = {}
        self._live: set[_Held] = set()
        self._quiet: dict[_Held, None] = {}

    @property
    def connections(self) -> int:
        """Connections held now (what ``max_connections`` bounds), handshakes under way
        included."""
        return len(self._pending) + len(self._live)

    # -- counting connections (at accept) ------------------------------------------------------

    def _full(self) -> bool:
        """At ``max_connections``, and no connection that never spoke to close for room."""
        limit = self.max_connections
        return limit is not None and self.connections >= limit and not self._make_room()

    def _admit(self) -> bool:
        """A connection was just accepted: may it be held? (It then counts as pending.)"""
        limit = self.max_connections
        memory = self.memory
        if memory is not None and memory.held > memory.limit * MEMORY_REFUSAL:
            self._refused_memory += 1
            if self._refused_memory & (self._refused_memory - 1) == 0:
                logger.warning(
                    "polymux server: max_memory=%d reached (the sessions hold %d bytes); %d new "
                    "connection(s) refused so far",
                    memory.limit,
                    memory.held,
                    self._refused_memory,
                )
            return False
        if self._full():
            self._refused += 1
            if self._refused & (self._refused - 1) == 0:  # 1st, 2nd, 4th, 8th ...: not a log flood
                logger.warning(
                    "polymux server: max_connections=%d reached; %d connection(s) refused so far",
                    limit,
                    self._refused,
                )
            return False
        return True

    def _make_room(self) -> bool:
        """Free one slot, if one may be: a connection that never got made, or else the
        oldest one whose peer has sent nothing. Amortised O(1): each entry is looked at
        once."""
        now = asyncio.get_running_loop().time()
        pending = self._pending
        if pending:
            held, since = next(iter(pending.items()))
            if now - since > self._handshake_timeout + _TLS_GRACE:
                del pending[held]  # its (TLS) handshake was given up long ago
                return True
        quiet = self._quiet
        while quiet:
            held = next(iter(quiet))
            del quiet[held]
            if held.peer_silent and held in self._live:
                self._release(held)
                if held.session is not None:
                    self.sessions.discard(held.session)  # gone now, not at its connection_lost
                held.abort()
                self._shed += 1
                if self._shed & (self._shed - 1) == 0:
                    logger.warning(
                        "polymux server: max_connections=%s reached; %d connection(s) that had sent "
                        "nothing closed to make room so far",
                        self.max_connections,
                        self._shed,
                    )
                return True
        return False

    def _hold(self, held: _Held) -> None:
        """Count ``held`` from now (accepted, not connected yet)."""
        self._pending[held] = asyncio.get_running_loop().time()

    def _connected(self, held: _Held) -> None:
        """``held``'s connection is made (its TLS handshake, if any, is done)."""
        # Counted out as a handshake given up, yet it completed: count it again if it fits.
        if self._pending.pop(held, None) is None and self._full():
            held.abort()
            return
        address = _address(held)
        per_address = self.max_connections_per_address
        if address is not None and per_address is not None:
            count = self._addresses.get(address, 0)
            if count >= per_address:
                self._refused_address += 1
                if self._refused_address & (self._refused_address - 1) == 0:
                    logger.warning(
                        "polymux server: %s holds max_connections_per_address=%d connections; "
                        "%d connection(s) refused so far",
                        address,
                        per_address,
                        self._refused_address,
                    )
                held.abort()
                return
            self._addresses[address] = count + 1
            self._address_of[held] = address
        self._live.add(held)
        if held.peer_silent:
            self._quiet[held] = None

    def _release(self, held: _Held) -> None:
        """``held``'s connection is gone."""
        self._pending.pop(held, None)
        self._live.discard(held)
        self._quiet.pop(held, None)
        address = self._address_of.pop(held, None)
        if address is not None:
            left = self._addresses[address] - 1
            if left:
                self._addresses[address] = left
            else:
                del self._addresses[address]

    def _make(self) -> asyncio.Protocol:
        """The protocol factory: count the connection at once (a burst of accepts runs every
        factory before any connection_made)."""
        if not self._admit():
            return _Refused()
        mux = self._factory()
        if self._ssl is not None:
            gate = _TLSGate(self, mux, self._ssl)
            self._hold(gate)
            mux.on_connection_made = lambda: self._attach(mux)
            return gate
        self._hold(mux)

        def made() -> None:
            self._connected(mux)
            self._attach(mux)

        # The session counts as connected from connection_made, which a failed TLS
        # handshake never reaches (and then no connection_lost follows: _make_room ends
        # its count once asyncio has given up on it).
        mux.on_connection_made = made
        mux.closed.add_done_callback(lambda _f: self._release(mux))
        return mux

    def _attach(self, mux: MuxProtocol) -> None:
        """``mux``'s session is connected: one of ``sessions`` until it closes; the session
        handler runs once its handshake is done."""
        session = mux.session
        tcp_keepalive(mux.get_extra_info("socket"), mux.config)
        self.sessions.add(session)
        mux.closed.add_done_callback(lambda _f: self.sessions.discard(session))
        if self.memory is not None:
            budget = mux.core.budget
            budget.join(self.memory)
            mux.closed.add_done_callback(lambda _f: budget.leave())
        if self._session_handler is not None:
            mux.ready.add_done_callback(lambda f: self._run_handler(session, f))

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
        """Stop listening and abort every live session (and connection still in its
        handshake)."""
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            session.abort()
        for held in list(self._live):
            held.abort()

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


def _address(held: _Held) -> str | None:
    """The peer's address (host) of a held connection; None on a unix socket."""
    for source in (held, getattr(held, "transport", None), getattr(held, "raw", None)):
        get = getattr(source, "get_extra_info", None)
        if get is not None:
            peer = get("peername")
            if isinstance(peer, tuple) and peer:
                return str(peer[0])
    return None


def _server(
    protocol: str | Format,
    handler: ChannelHandler | None,
    config: SessionConfig | None,
    session_handler: SessionHandler | None,
    offer_filter: OfferFilter | None,
    max_connections: int | None,
    options: SessionOptions,
    max_memory: int | None = None,
    max_connections_per_address: int | None = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
) -> Server:
    cfg = SessionConfig.from_options(config, **options)
    fmt = resolve(protocol, cfg)
    check_handler(fmt.name, fmt.caps.one_way, handler)

    def make() -> MuxProtocol:
        return MuxProtocol(fmt, cfg, is_client=False, handler=handler, offer_filter=offer_filter)

    return Server(
        make,
        session_handler,
        max_connections,
        cfg.handshake_timeout,
        max_memory=max_memory,
        max_connections_per_address=max_connections_per_address,
    )


async def start_server(
    handler: ChannelHandler | None,
    host: str | None,
    port: int,
    *,
    protocol: str | Format,
    config: SessionConfig | None = None,
    session_handler: SessionHandler | None = None,
    offer_filter: OfferFilter | None = None,
    ssl: Any = None,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    max_memory: int | None = None,
    max_connections_per_address: int | None = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    **options: Unpack[SessionOptions],
) -> Server:
    """Listen on TCP; each connection is a session, each incoming channel runs
    ``handler(reader, writer)`` (like ``asyncio.start_server``). ``session_handler(session)``
    runs once per session when its handshake is done. ``protocol``: a format's name or a
    :class:`~polymux.formats.Format` (see :func:`polymux.connect`). ``options`` are
    :class:`SessionConfig` fields. At most ``max_connections`` connections are held at
    once, counted from their accept (``None``: no limit); when it is reached, the oldest
    one whose peer has sent nothing yet is closed to make room, or else the new one is
    dropped. One peer address holds at most ``max_connections_per_address`` of them
    (``None``: no limit); more are refused (and logged). A peer must send its handshake,
    or on formats without one a whole frame, within ``handshake_timeout`` (which bounds
    the TLS handshake too), unless a channel is opened to it first.

    ``max_memory`` (bytes; ``None``: no limit) bounds what all the sessions hold together
    in buffers (each still within its ``max_session_memory``): past it, the sessions
    holding the most stop reading from their peers until the sum is down to three
    quarters (:class:`~polymux.session.MemoryAccount`), while the others, a new client's
    among them, are read on; new connections are refused (and logged) only while the
    sessions hold more than 1.25 times it."""
    server = _server(
        protocol,
        handler,
        config,
        session_handler,
        offer_filter,
        max_connections,
        options,
        max_memory,
        max_connections_per_address,
    )
    loop = asyncio.get_running_loop()
    server._server = await loop.create_server(server._make, host, port, **_tls(server, ssl, loop))
    return server


def _tls(server: Server, ssl: Any, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """How a TLS server runs its handshakes. On asyncio's own loops, in :class:`_TLSGate`
    (counted and sheddable from the accept). Other loops (uvloop) read a connection's first
    bytes before its protocol can pause it, which the gate cannot hand to the TLS layer:
    there the loop runs the handshake, within ``handshake_timeout`` too, and the connection
    counts from its accept (until the loop gives up on it) but cannot be shed meanwhile."""
    if ssl is None:
        return {}
    if isinstance(loop, asyncio.BaseEventLoop):
        server._ssl = ssl
        return {}
    return {"ssl": ssl, "ssl_handshake_timeout": server._handshake_timeout}


async def start_unix_server(
    handler: ChannelHandler | None,
    path: str | os.PathLike[str],
    *,
    protocol: str | Format,
    config: SessionConfig | None = None,
    session_handler: SessionHandler | None = None,
    offer_filter: OfferFilter | None = None,
    ssl: Any = None,
    mode: int | None = 0o600,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    max_memory: int | None = None,
    max_connections_per_address: int | None = None,
    **options: Unpack[SessionOptions],
) -> Server:
    """Listen on a unix socket (see :func:`start_server`; ``max_memory`` too;
    ``max_connections_per_address`` is taken and ignored: a unix socket's peers have no
    address to count).

    The socket file gets permissions ``mode`` (default ``0o600``: only this user may
    connect) before the server listens, so no other user can connect in between;
    ``None`` leaves them to the umask. A stale socket file at ``path`` is replaced.
    """
    server = _server(
        protocol, handler, config, session_handler, offer_filter, max_connections, options, max_memory
    )
    loop = asyncio.get_running_loop()
    name = os.fspath(path)
    tls = _tls(server, ssl, loop)
    if mode is None:
        server._server = await loop.create_unix_server(server._make, name, **tls)
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
        server._server = await loop.create_unix_server(server._make, sock=sock, **tls)
    except BaseException:
        sock.close()
        if bound:
            with contextlib.suppress(OSError):
                os.remove(name)
        raise
    return server

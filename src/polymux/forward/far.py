"""The far end of a forward: a polymux server whose channels become TCP connections to
targets (``--to``, or those ``--allow`` lets a request name), and which listens for
``-R`` when the near end asks and ``--reverse`` allows it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any, Self

from polymux import formats
from polymux.aio import Server, Session
from polymux.aio.server import DEFAULT_MAX_CONNECTIONS
from polymux.bridging import Endpoint, _reset, listen_endpoint
from polymux.config import SessionConfig
from polymux.exceptions import PolymuxError
from polymux.forward.common import (
    BACKLOG,
    ForwardStats,
    StreamPair,
    Tracker,
    describe,
    local_of,
    logger,
    peer_of,
    read_line,
    relay,
    spawn,
    stop_listening,
)
from polymux.forward.request import (
    MARK,
    ForwardError,
    Reply,
    Request,
    code_for,
    control_line,
    format_reply,
    parse_control,
    parse_reply,
    parse_request,
)
from polymux.forward.spec import AllowList, HostPort, parse_host_port


__all__ = ["MAX_REVERSE", "REVERSE_MODES", "FarEnd", "start_far_end"]

MAX_REVERSE = 64
"""``-R`` listeners one session may hold at once on a far end, by default
(``max_reverse=``, ``--max-reverse``)."""
REVERSE_MODES = ("off", "loopback", "any")
"""What ``reverse=`` allows: no ``-R``, ``-R`` on loopback addresses only, on any address."""


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def where_of(session: Session) -> str:
    """A session's peer, for log lines."""
    peer = peer_of(session)
    return str(peer) if peer is not None else "unix"


class FarEnd:
    """A running far end (see :func:`start_far_end`). ``async with`` closes it on exit."""

    def __init__(
        self,
        listen: Endpoint,
        *,
        to: HostPort | None,
        allow: AllowList,
        reverse: str,
        max_reverse: int,
        max_connections: int | None,
        connect_timeout: float,
        request_timeout: float,
        config: SessionConfig,
        ssl: Any,
    ) -> None:
        self.endpoint = listen
        """Where it listens (the real port once listening on port 0)."""
        self.to = to
        """Where bare channels go, or None."""
        self.allow = allow
        """The targets requests may name."""
        self.reverse = reverse
        """``-R`` allowed: one of :data:`REVERSE_MODES`."""
        self.max_reverse = max_reverse
        """``-R`` listeners one session may hold at once."""
        self.config = config
        """The sessions' configuration."""
        self.connect_timeout = connect_timeout
        """Seconds a connection to a target may take."""
        self.request_timeout = request_timeout
        """Seconds a channel may take to send its request line (and the near end to answer
        an ``-R`` connection)."""
        self.stats = ForwardStats()
        """What it has carried so far."""
        self.server: Server | None = None
        """The polymux server."""
        self._ssl = ssl
        self._max_connections = max_connections
        self._tracker = Tracker(self.stats, max_connections)
        self._names = formats.resolve(listen.protocol, config).caps.names
        self._reverse: set[asyncio.Server] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # the -R connections' handlers
        self._controlled: set[Session] = set()  # sessions with their control channel open
        self._closing = False

    @property
    def address(self) -> str:
        """Where it listens, as the ``listening`` line says it: ``127.0.0.1:4000``,
        ``unix:/path``, ``ws://127.0.0.1:4000/path``."""
        endpoint = self.endpoint
        if endpoint.transport == "tcp":
            assert endpoint.host is not None
            return str(HostPort(endpoint.host, endpoint.port))
        return endpoint.where

    @property
    def connections(self) -> int:
        """Forwarded connections open now."""
        return len(self._tracker.live)

    async def _start(self) -> None:
        self.server, self.endpoint = await listen_endpoint(
            self.endpoint,
            self._channel,
            config=self.config,
            session_handler=self._session_ready,
            max_connections=self._max_connections,
            ssl=self._ssl,
        )

    # -- sessions and channels -------------------------------------------------------------

    def _session_ready(self, session: Session) -> None:
        where = where_of(session)
        logger.info("session from %s (%s)", where, session.protocol)

        def ended(_future: object) -> None:
            error = session.exception
            logger.info("session from %s ended%s", where, f": {error}" if error else "")

        session.mux.closed.add_done_callback(ended)

    async def _channel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session: Session = writer.get_extra_info("session")
        where = where_of(session)
        name = str(writer.get_extra_info("channel_name") or "")
        # A request is named MARK where names exist; without names, every channel is one
        # unless --to makes every channel bare (there is nothing else to tell them apart by).
        request = name == MARK if self._names else self.to is None
        if not request:
            await self._bare(reader, writer, where, name)
            return
        try:
            line = await read_line(reader, self.request_timeout, "forward request")
            req = parse_request(line)
        except ForwardError as exc:
            hint = ""
            if not self._names and self.to is None:
                hint = " (a bare channel? start the far end with --to to serve them)"
            logger.warning("channel from %s: %s%s", where, exc, hint)
            self.stats.total += 1
            self.stats.refused += 1
            await _refuse(writer, exc.code, str(exc))
            return
        if req.verb == "CONNECT":
            assert req.target is not None
            await self._connect(reader, writer, req.target, where)
        elif req.verb == "CONTROL":
            if session in self._controlled:
                logger.warning("channel from %s: a second control channel refused", where)
                await _refuse(writer, Reply.GENERAL_FAILURE, "one control channel per session")
                return
            self._controlled.add(session)
            try:
                await self._control(reader, writer, session, where)
            finally:
                self._controlled.discard(session)
        else:
            logger.warning("channel from %s: %s is not a request to the far end", where, req.verb)
            await _refuse(writer, Reply.COMMAND_NOT_SUPPORTED, f"{req.verb} is not a request to the far end")

    async def _bare(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str, name: str
    ) -> None:
        label = f"{where} -> {self.to} (bare)"
        if self.to is None:
            self.stats.total += 1
            self.stats.refused += 1
            logger.warning(
                "channel %r from %s: refused: a bare channel, and the far end has no --to target", name, where
            )
            _reset(writer, "polymux forward: no --to target for bare channels")
            return
        conn = self._tracker.admit(label)
        if conn is None:
            _reset(writer, f"polymux forward: max_connections={self._max_connections} are open")
            return
        outcome, refused = "stopped", False
        try:
            try:
                target = await self._open(self.to, checked=True)
            except Exception as exc:  # noqa: BLE001 - any failure to connect: the channel learns it
                _reset(writer, f"polymux forward: {self.to}: {describe(exc)}")
                outcome, refused = f"refused: {describe(exc)}", True
                return
            outcome = await relay(conn, target, (reader, writer), target=True)
        finally:
            self._tracker.done(conn, outcome, refused=refused)

    async def _connect(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: HostPort, where: str
    ) -> None:
        label = f"{where} -> {target}"
        conn = self._tracker.admit(label)
        if conn is None:
            await _refuse(
                writer,
                Reply.GENERAL_FAILURE,
                f"too many connections (max_connections={self._max_connections})",
            )
            return
        outcome, refused = "stopped", False
        try:
            try:
                sock = await self._open(target)
            except Exception as exc:  # noqa: BLE001 - any failure to connect: the near end learns it
                code = code_for(exc)
                text = describe(exc) if code != Reply.NOT_ALLOWED else str(exc)
                outcome, refused = f"refused: {text} (reply {int(code)}: {code.text})", True
                await _refuse(writer, code, text)
                return
            writer.write(format_reply(Reply.SUCCEEDED, where=local_of(sock[1])))
            outcome = await relay(conn, sock, (reader, writer), target=True)
        finally:
            self._tracker.done(conn, outcome, refused=refused)

    async def _open(self, target: HostPort, *, checked: bool = False) -> StreamPair:
        """A TCP connection to ``target``, if the rules allow it (``checked``: --to), within
        ``connect_timeout``; a name resolved for network rules is connected to only at
        the addresses the rules allow."""
        addresses: list[str] | None = None
        if not checked and not self.allow.by_name(target.host, target.port):
            if not self.allow.needs_addresses(target.host, target.port):
                raise ForwardError(f"{target} is not allowed by the far end's rules", Reply.NOT_ALLOWED)
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.connect_timeout):
                infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            addresses = [
                str(info[4][0]) for info in infos if self.allow.by_address(str(info[4][0]), target.port)
            ]
            if not addresses:
                raise ForwardError(f"{target} is not allowed by the far end's rules", Reply.NOT_ALLOWED)
        async with asyncio.timeout(self.connect_timeout):
            if addresses is None:
                return await asyncio.open_connection(target.host, target.port)
            error: BaseException = OSError(f"cannot connect to {target}")
            for address in dict.fromkeys(addresses):
                try:
                    return await asyncio.open_connection(address, target.port)
                except OSError as exc:
                    error = exc
            raise error

    # -- -R: the control channel and its listeners ----------------------------------------

    async def _control(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: Session, where: str
    ) -> None:
        listeners: dict[int, asyncio.Server] = {}
        try:
            writer.write(format_reply(Reply.SUCCEEDED))
            await writer.drain()
            while True:
                try:
                    line = await read_line(reader, None, "control line")
                except ForwardError:
                    return  # the control channel ended: the near end is gone or closing
                try:
                    verb, args = parse_control(line)
                except ForwardError as exc:
                    logger.warning("control channel from %s: %s", where, exc)
                    return
                if verb == "LISTEN":
                    number = int(args[0])
                    answer = await self._listen(session, where, listeners, number, args[1], args[2])
                    writer.write(answer)
                    await writer.drain()  # a near end that does not read stops getting answers
                elif verb == "UNLISTEN":
                    server = listeners.pop(int(args[0]), None)
                    if server is not None:
                        server.close()
                        self._reverse.discard(server)
                else:
                    logger.warning("control channel from %s: %s is not for the far end", where, verb)
                    return
        except (PolymuxError, OSError):
            return  # the session ended
        finally:
            for server in listeners.values():
                server.close()
                self._reverse.discard(server)
            if listeners:
                logger.info("session from %s: %d -R listener(s) closed", where, len(listeners))
            writer.close()

    async def _listen(
        self,
        session: Session,
        where: str,
        listeners: dict[int, asyncio.Server],
        number: int,
        host: str,
        port_text: str,
    ) -> bytes:
        """Start an ``-R`` listener if allowed; the control line that answers."""
        try:
            bind = parse_host_port(
                f"[{host}]:{port_text}" if ":" in host else f"{host}:{port_text}", "-R", zero=True
            )
        except ValueError as exc:
            return control_line("REFUSED", number, int(Reply.ADDRESS_TYPE_NOT_SUPPORTED), str(exc))
        refusal: tuple[Reply, str] | None = None
        if self.reverse == "off" or self._closing:
            refusal = Reply.NOT_ALLOWED, "-R is off on the far end (start it with --reverse)"
        elif self.reverse == "loopback" and not _loopback(bind.host):
            refusal = (
                Reply.NOT_ALLOWED,
                f"-R on {bind.host}: only loopback addresses (--reverse any allows others)",
            )
        elif number in listeners:
            refusal = Reply.GENERAL_FAILURE, f"-R listener {number} exists already"
        elif len(listeners) >= self.max_reverse:
            refusal = Reply.GENERAL_FAILURE, f"at most {self.max_reverse} -R listeners per session"
        if refusal is not None:
            logger.warning("session from %s: -R %s refused: %s", where, bind, refusal[1])
            return control_line("REFUSED", number, int(refusal[0]), refusal[1])
        handler = functools.partial(self._accepted, session, where, number, bind)
        try:
            server = await asyncio.start_server(
                functools.partial(spawn, self._tasks, handler), bind.host, bind.port, backlog=BACKLOG
            )
        except OSError as exc:
            logger.warning("session from %s: -R %s refused: %s", where, bind, describe(exc))
            return control_line(
                "REFUSED", number, int(code_for(exc)), f"cannot listen on {bind}: {describe(exc)}"
            )
        listeners[number] = server
        self._reverse.add(server)
        real = server.sockets[0].getsockname()
        bound = HostPort(str(real[0]), int(real[1]))
        logger.info("session from %s: listening -R %s", where, bound)
        return control_line("LISTENING", number, bound.host, bound.port)

    async def _accepted(
        self,
        session: Session,
        where: str,
        number: int,
        bind: HostPort,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A connection to an ``-R`` listener: carried back to the near end, which connects."""
        peer = peer_of(writer) or HostPort("unknown", 0)
        label = f"-R {local_of(writer) or bind} from {peer} (session from {where})"
        if self._closing or session.is_closed:
            writer.transport.abort()
            return
        conn = self._tracker.admit(label)
        if conn is None:
            writer.transport.abort()
            return
        outcome, refused = "stopped", False
        channel: StreamPair | None = None
        try:
            try:
                async with asyncio.timeout(self.request_timeout):
                    channel = await session.open_pair(MARK)
                channel[1].write(Request("ACCEPTED", peer, number).encode())
                parse_reply(await read_line(channel[0], self.request_timeout, "reply to ACCEPTED"))
            except (ForwardError, PolymuxError, OSError, TimeoutError) as exc:
                outcome, refused = f"refused by the near end: {describe(exc)}", True
                writer.close()
                if channel is not None:
                    channel[1].close()
                return
            outcome = await relay(conn, (reader, writer), channel)
        finally:
            self._tracker.done(conn, outcome, refused=refused)

    # -- closing ----------------------------------------------------------------------------

    def _stop_accepting(self) -> None:
        self._closing = True
        stop_listening(self.server)
        for server in list(self._reverse):
            server.close()

    def close(self) -> None:
        """Stop listening and cut everything at once: connections, ``-R`` listeners and
        sessions."""
        self._stop_accepting()
        self._tracker.abort_all()
        for task in self._tasks:
            task.cancel()
        if self.server is not None:
            self.server.close()

    async def aclose(self) -> None:
        """Stop accepting (sessions, ``-R`` connections), wait until every connection in
        flight has ended, then close the sessions gracefully. Bound it with a timeout and
        call :meth:`close` after it for a grace period (``polymux forward --grace``)."""
        self._stop_accepting()
        await self._tracker.idle.wait()
        if self.server is not None:
            await self.server.aclose()

    async def wait_closed(self) -> None:
        """Wait until the listener and every session are closed."""
        if self.server is not None:
            await self.server.wait_closed()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        assert self.server is not None
        await self.server.serve_forever()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
        await self.wait_closed()


async def _refuse(writer: asyncio.StreamWriter, code: Reply, text: str) -> None:
    """Answer a request with ``ERR code text`` and end the channel."""
    with contextlib.suppress(PolymuxError, OSError):
        writer.write(format_reply(code, text))
        writer.close()
        await writer.wait_closed()


def _reverse_mode(reverse: bool | str) -> str:
    if reverse is True:
        return "loopback"
    if reverse is False or reverse is None:
        return "off"
    if reverse not in REVERSE_MODES:
        raise ValueError(f"reverse must be one of {', '.join(REVERSE_MODES)} (or a bool), got {reverse!r}")
    return reverse


async def start_far_end(
    listen: str | Endpoint,
    *,
    to: str | HostPort | None = None,
    allow: Iterable[str] | AllowList = (),
    reverse: bool | str = False,
    max_reverse: int = MAX_REVERSE,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    connect_timeout: float = 10.0,
    request_timeout: float | None = None,
    ssl: Any = None,
    config: SessionConfig | None = None,
    **options: Any,
) -> FarEnd:
    """Listen on ``listen`` as the far end of forwards: each channel a near end opens
    becomes a TCP connection to a target, with bytes copied both ways (half-closes
    carried, backpressure end to end).

    Args:
        listen: ``FORMAT:tcp:HOST:PORT``, ``FORMAT:unix:PATH`` or
            ``FORMAT:ws://HOST:PORT/PATH`` (as :class:`polymux.Endpoint`); port 0 picks a
            free port (:attr:`FarEnd.endpoint` has the real one).
        to: where bare channels go (``HOST:PORT``): a channel without a request, as a Go
            yamux or smux client opens them (kcptun's way). On formats without channel
            names (yamux, smux, Streamux) every channel is then bare.
        allow: the targets a request may name (:class:`~polymux.forward.AllowList` rules:
            ``HOST:PORT``, ``HOST:*``, ``*:PORT``, ``CIDR:PORT``, ``*``). None: every
            request is refused.
        reverse: allow ``-R`` listeners: ``True`` or ``"loopback"`` (loopback addresses
            only), ``"any"``, or ``False`` / ``"off"``.
        max_reverse: ``-R`` listeners one session may hold at once (more are refused).
        max_connections: forwarded connections at once (more are refused, the near end
            told why), and sessions at once (as :func:`polymux.start_server`'s).
        connect_timeout: seconds a connection to a target may take.
        request_timeout: seconds a channel may take to send its request line (default:
            the configuration's ``handshake_timeout``).
        ssl: a server ``ssl.SSLContext``: TLS on any transport (``wss://`` for WebSocket).
        config: the sessions' :class:`~polymux.SessionConfig` (the bounds of
            :func:`polymux.start_server` apply: ``max_session_memory``,
            ``handshake_timeout`` ...).
        **options: :class:`~polymux.SessionConfig` fields on top of ``config``.

    Raises:
        ValueError: a malformed endpoint, target or rule; ``to`` together with ``allow`` or
            ``reverse`` on a format without channel names.
        OSError: it cannot listen there.
    """
    endpoint = listen if isinstance(listen, Endpoint) else Endpoint.parse(listen)
    if endpoint.transport == "ws" and endpoint.uri is not None and endpoint.uri.startswith("wss:"):
        raise ValueError(f"far end {endpoint}: listen on ws:// and give ssl= to serve wss://")
    target = parse_host_port(to, "to") if isinstance(to, str) else to
    rules = allow if isinstance(allow, AllowList) else AllowList.parse(tuple(allow))
    mode = _reverse_mode(reverse)
    if max_reverse < 0:
        raise ValueError(f"max_reverse must be 0 or more, got {max_reverse}")
    cfg = SessionConfig.from_options(config, **options)
    fmt = formats.resolve(endpoint.protocol, cfg)
    if fmt.caps.conversation_option is not None:
        # Request/response formats (Streamux): bytes must flow back before a request ends.
        cfg = SessionConfig.from_options(cfg, **{fmt.caps.conversation_option: True})
    if target is not None and not fmt.caps.names and (rules or mode != "off"):
        raise ValueError(
            f"far end on {fmt.name}: its channels carry no names, so with a --to target every "
            "channel is bare and requests (--allow targets, -R) cannot be told apart from them; "
            "use a format with names (mstream-v3, mplex ...) or run two far ends"
        )
    far = FarEnd(
        endpoint,
        to=target,
        allow=rules,
        reverse=mode,
        max_reverse=max_reverse,
        max_connections=max_connections,
        connect_timeout=connect_timeout,
        request_timeout=cfg.handshake_timeout if request_timeout is None else request_timeout,
        config=cfg,
        ssl=ssl,
    )
    await far._start()
    return far

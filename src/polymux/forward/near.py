"""The near end of a forward: local listeners (``-L``, ``-D``) whose connections become
channels on one session with the far end, ``-R`` listeners on the far end whose
connections come back as channels, and the session itself, reconnected with a jittered,
capped backoff when it is lost."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self

from polymux import formats
from polymux.aio import Session
from polymux.aio.server import DEFAULT_MAX_CONNECTIONS
from polymux.aio.session import ChannelHandler
from polymux.bridging import Endpoint, _reset, connect_endpoint
from polymux.config import SessionConfig
from polymux.exceptions import LimitExceeded, PolymuxError
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
from polymux.forward.socks import SocksRefused, read_request, send_reply
from polymux.forward.spec import Backoff, Forward, HostPort


__all__ = ["NearEnd", "NotAForwarder", "SessionFactory", "start_near_end"]

SessionFactory = Callable[[ChannelHandler], Awaitable[Session]]
"""Opens the session to the far end; it must run the given handler for the channels the
far end opens (``polymux.connect(..., handler=handler)``)."""


class NotAForwarder(ForwardError):
    """The far end does not answer forward requests: it is not a polymux far end (maybe not
    even of this format), or one started with ``--to`` on a format without channel names
    (every channel bare)."""

    def __init__(self, message: str, session: Session | None = None) -> None:
        super().__init__(message)
        self.session = session
        """The session that got no answer (closed now), to diagnose its peer."""


class _Control:
    """The session's control channel: asks for the ``-R`` listeners, gets their answers."""

    def __init__(self, pair: StreamPair) -> None:
        self.reader, self.writer = pair
        self.answers: dict[int, asyncio.Future[HostPort]] = {}
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Read the far end's answers until the channel ends."""
        try:
            while True:
                verb, args = parse_control(await read_line(self.reader, None, "control line"))
                future = self.answers.pop(int(args[0]), None)
                if future is None or future.done():
                    continue
                if verb == "LISTENING":
                    future.set_result(HostPort(args[1], int(args[2])))
                elif verb == "REFUSED":
                    try:
                        code = Reply(int(args[1]))
                    except ValueError:
                        code = Reply.GENERAL_FAILURE
                    future.set_exception(ForwardError(args[2], code))
        except (ForwardError, PolymuxError, OSError) as exc:
            for future in self.answers.values():
                if not future.done():
                    future.set_exception(ForwardError(f"the control channel ended: {describe(exc)}"))

    async def listen(self, number: int, bind: HostPort, timeout: float) -> HostPort:  # noqa: ASYNC109
        """Ask for ``-R`` listener ``number`` on ``bind``; the address it got."""
        future: asyncio.Future[HostPort] = asyncio.get_running_loop().create_future()
        self.answers[number] = future
        self.writer.write(control_line("LISTEN", number, bind.host, bind.port))
        await self.writer.drain()
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise ForwardError(f"no answer to -R {bind} within {timeout:g} s", Reply.TTL_EXPIRED) from None


class NearEnd:
    """A running near end (see :func:`start_near_end`). ``async with`` closes it on exit."""

    def __init__(
        self,
        factory: SessionFactory,
        forwards: list[Forward],
        *,
        max_connections: int | None,
        backoff: Backoff,
        session_wait: float,
        request_timeout: float,
        rng: random.Random | None,
    ) -> None:
        self.forwards = forwards
        """The forwards, with the ports their listeners really got (``-R``: on the far
        end's host, as the far end said; port 0 until the first session has it)."""
        self.stats = ForwardStats()
        """What it has carried so far."""
        self.session: Session | None = None
        """The session with the far end, while there is one."""
        self.sessions = 0
        """Sessions made so far (1 + the reconnections)."""
        self.backoff = backoff
        """How it waits between attempts to reconnect."""
        self.session_wait = session_wait
        """Seconds a new local connection waits for a session (while reconnecting)."""
        self.request_timeout = request_timeout
        """Seconds the far end may take to answer a request (its connection to the target
        included)."""
        self._factory = factory
        self._tracker = Tracker(self.stats, max_connections)
        self._max_connections = max_connections
        self._rng = rng
        self._ready = asyncio.Event()
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()  # the local connections' handlers
        self._supervisor: asyncio.Task[None] | None = None
        self._control: _Control | None = None
        self._closing = False
        self._names = False
        self._remote = {i: fwd for i, fwd in enumerate(forwards) if fwd.kind == "R"}

    @property
    def connected(self) -> bool:
        """Whether a session with the far end is up."""
        return self._ready.is_set()

    @property
    def connections(self) -> int:
        """Forwarded connections open now."""
        return len(self._tracker.live)

    def _needs_control(self) -> bool:
        # Only ends that make requests speak to the far end beyond bare channels: a near end
        # of bare -L alone works against any yamux or smux server.
        return any(fwd.kind != "L" or fwd.target is not None for fwd in self.forwards)

    # -- the session -----------------------------------------------------------------------

    async def _connect(self) -> Session:
        """A new session (its control channel open and its -R listeners asked for)."""
        session = await self._factory(self._incoming)
        try:
            self._names = formats.get(session.protocol).caps.names
            if self._needs_control():
                await self._open_control(session)
        except BaseException:
            session.abort()
            raise
        self.session = session
        self.sessions += 1
        self._ready.set()
        return session

    async def _open_control(self, session: Session) -> None:
        try:
            async with asyncio.timeout(self.request_timeout):
                pair = await session.open_pair(MARK if self._names else "")
                pair[1].write(Request("CONTROL").encode())
                parse_reply(await read_line(pair[0], None, "answer to the control request"))
        except (ForwardError, TimeoutError, PolymuxError, OSError) as exc:
            why = "no answer" if isinstance(exc, TimeoutError) else describe(exc)
            session.abort()
            raise NotAForwarder(
                f"the far end does not answer forward requests ({why}): is it a polymux forward "
                f"far end of {session.protocol}? One started with --to on a format without channel "
                "names takes every channel as bare: use only bare -L PORT with it",
                session,
            ) from None
        control = self._control = _Control(pair)
        control.task = asyncio.ensure_future(control.run())
        control.task.add_done_callback(lambda _t: session.abort() if not self._closing else None)
        for number, fwd in self._remote.items():
            try:
                bound = await control.listen(number, fwd.bind, self.request_timeout)
            except ForwardError as exc:
                if not self.sessions:
                    raise ForwardError(f"-R {fwd.bind}: the far end refused it: {exc}", exc.code) from None
                # Reconnected: the other forwards go on; this one waits for the next session.
                logger.warning("-R %s: the far end refused it: %s", fwd.bind, exc)
                continue
            self.forwards[number] = fwd.with_port(bound.port)
            if self.sessions:
                logger.warning("listening %s", self.forwards[number].describe())

    async def _supervise(self, session: Session) -> None:
        """Wait for the session's end; reconnect (with backoff) until closed."""
        while not self._closing:
            await session.wait_closed()
            self._ready.clear()
            self.session = None
            if self._closing:
                return
            why = describe(session.exception) if session.exception else "closed by the far end"
            # A session the far end closed cleanly with nothing in flight (its idle_timeout,
            # on formats without pings) lost nothing: said at INFO, not as a warning.
            quiet = session.exception is None and not self._tracker.live
            attempt = 0
            while not self._closing:
                attempt += 1
                delay = self.backoff.delay(attempt, self._rng)
                logger.log(
                    logging.INFO if quiet and attempt == 1 else logging.WARNING,
                    "the session with the far end ended (%s); reconnecting in %.1f s (attempt %d)",
                    why,
                    delay,
                    attempt,
                )
                await asyncio.sleep(delay)
                try:
                    session = await self._connect()
                except (OSError, PolymuxError, ForwardError, TimeoutError) as exc:
                    why = describe(exc)
                    continue
                except Exception as exc:  # noqa: BLE001 - whatever a factory raises: try again later
                    why = describe(exc)
                    continue
                logger.log(
                    logging.INFO if quiet and attempt == 1 else logging.WARNING,
                    "reconnected to the far end (attempt %d)",
                    attempt,
                )
                break

    async def _session(self) -> Session:
        """The session, waiting for a reconnection up to ``session_wait``."""
        if not self._ready.is_set():
            try:
                async with asyncio.timeout(self.session_wait):
                    await self._ready.wait()
            except TimeoutError:
                raise ForwardError(
                    f"no session with the far end (reconnecting) within {self.session_wait:g} s"
                ) from None
        assert self.session is not None
        return self.session

    # -- local connections -------------------------------------------------------------------

    async def _start_listeners(self) -> None:
        for index, fwd in enumerate(self.forwards):
            if fwd.kind == "R":
                continue
            handler = functools.partial(self._socks if fwd.kind == "D" else self._local, index)
            server = await asyncio.start_server(
                functools.partial(spawn, self._tasks, handler), fwd.bind.host, fwd.bind.port, backlog=BACKLOG
            )
            self._servers.append(server)
            self.forwards[index] = fwd.with_port(int(server.sockets[0].getsockname()[1]))

    async def _open(self, target: HostPort | None) -> tuple[StreamPair, HostPort | None]:
        """A channel to ``target`` (None: bare), with the far end's answer."""
        session = await self._session()
        name = MARK if target is not None and self._names else ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.session_wait
        while True:
            try:
                async with asyncio.timeout(self.request_timeout):
                    channel = await session.open_pair(name)
                break
            except TimeoutError:
                raise ForwardError(f"the far end took no channel within {self.request_timeout:g} s") from None
            except LimitExceeded as exc:
                # The session's channels are all in use (max_outbound_channels, a format's id
                # space): wait for one of ours to end, for session_wait at most.
                if loop.time() >= deadline or len(self._tracker.live) <= 1:
                    raise ForwardError(f"no channel free within {self.session_wait:g} s: {exc}") from None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(deadline):
                        await self._tracker.one_ends()
        if target is None:
            return channel, None
        try:
            channel[1].write(Request("CONNECT", target).encode())
            line = await read_line(channel[0], self.request_timeout, "answer from the far end")
            return channel, parse_reply(line)
        except BaseException:
            _reset(channel[1], None)
            raise

    async def _local(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fwd = self.forwards[index]
        target = str(fwd.target) if fwd.target is not None else "--to (bare)"
        label = f"-L {fwd.bind} -> {target} from {peer_of(writer)}"
        conn = self._tracker.admit(label)
        if conn is None:
            writer.close()
            return
        outcome, refused = "stopped", False
        try:
            try:
                channel, _bound = await self._open(fwd.target)
            except (ForwardError, PolymuxError, OSError) as exc:
                outcome, refused = f"refused: {_why(exc)}", True
                writer.close()
                return
            outcome = await relay(conn, (reader, writer), channel)
        finally:
            self._tracker.done(conn, outcome, refused=refused)

    async def _socks(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fwd = self.forwards[index]
        label = f"-D {fwd.bind} from {peer_of(writer)}"
        conn = self._tracker.admit(label)
        if conn is None:
            # Refused politely: the client hears "general failure" to its request.
            with contextlib.suppress(SocksRefused, asyncio.IncompleteReadError, TimeoutError, OSError):
                async with asyncio.timeout(self.request_timeout):
                    await read_request(reader, writer)
                    send_reply(writer, Reply.GENERAL_FAILURE)
                    await writer.drain()
            writer.close()
            return
        outcome, refused = "stopped", False
        try:
            try:
                async with asyncio.timeout(self.request_timeout):
                    target = await read_request(reader, writer)
            except (SocksRefused, asyncio.IncompleteReadError, TimeoutError, OSError) as exc:
                outcome, refused = f"refused: {describe(exc)}", True
                writer.close()
                return
            conn.label = f"-D {fwd.bind} -> {target} from {peer_of(writer)}"
            try:
                channel, bound = await self._open(target)
            except (ForwardError, PolymuxError, OSError) as exc:
                code = code_for(exc) if not isinstance(exc, PolymuxError) else Reply.GENERAL_FAILURE
                send_reply(writer, code)
                outcome, refused = f"refused: {_why(exc)}", True
                writer.close()
                return
            send_reply(writer, Reply.SUCCEEDED, bound)
            outcome = await relay(conn, (reader, writer), channel)
        finally:
            self._tracker.done(conn, outcome, refused=refused)

    async def _incoming(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A channel the far end opened: a connection to an ``-R`` listener."""
        name = str(writer.get_extra_info("channel_name") or "")
        if self._names and name != MARK:
            _reset(writer, "polymux forward: the near end takes only -R connections")
            return
        try:
            req = parse_request(await read_line(reader, self.request_timeout, "request from the far end"))
            if req.verb != "ACCEPTED" or req.listener not in self._remote:
                raise ForwardError(
                    f"not an -R connection: {req.verb} {req.listener}", Reply.COMMAND_NOT_SUPPORTED
                )
        except ForwardError as exc:
            logger.warning("channel from the far end: %s", exc)
            writer.write(format_reply(exc.code, str(exc)))
            writer.close()
            return
        fwd = self.forwards[req.listener]
        assert fwd.target is not None
        label = f"-R {fwd.bind} -> {fwd.target} from {req.target}"
        conn = self._tracker.admit(label)
        if conn is None:
            writer.write(format_reply(Reply.GENERAL_FAILURE, "too many connections on the near end"))
            writer.close()
            return
        outcome, refused = "stopped", False
        try:
            try:
                async with asyncio.timeout(self.request_timeout):
                    sock = await asyncio.open_connection(fwd.target.host, fwd.target.port)
            except Exception as exc:  # noqa: BLE001 - any failure to connect: the far end learns it
                code = code_for(exc)
                outcome, refused = f"refused: {describe(exc)} (reply {int(code)}: {code.text})", True
                writer.write(format_reply(code, describe(exc)))
                writer.close()
                return
            writer.write(format_reply(Reply.SUCCEEDED, where=local_of(sock[1])))
            outcome = await relay(conn, sock, (reader, writer), target=True)
        finally:
            self._tracker.done(conn, outcome, refused=refused)

    # -- closing ----------------------------------------------------------------------------

    def _stop_accepting(self) -> None:
        self._closing = True
        for server in self._servers:
            stop_listening(server)
        if self._control is not None:
            # The far end closes our -R listeners when the control channel ends.
            with contextlib.suppress(PolymuxError, OSError):
                self._control.writer.write_eof()
        if self._supervisor is not None:
            self._supervisor.cancel()

    def close(self) -> None:
        """Stop listening and cut everything at once: connections and the session."""
        self._stop_accepting()
        self._tracker.abort_all()
        for task in self._tasks:
            task.cancel()
        if self.session is not None:
            self.session.abort()

    async def aclose(self) -> None:
        """Stop accepting (local listeners, ``-R`` listeners), wait until every connection
        in flight has ended, then close the session gracefully. Bound it with a timeout
        and call :meth:`close` after it for a grace period (``polymux forward --grace``)."""
        self._stop_accepting()
        await self._tracker.idle.wait()
        if self.session is not None:
            await self.session.aclose()

    async def wait_closed(self) -> None:
        """Wait until the listeners and the session are closed."""
        for server in self._servers:
            await server.wait_closed()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
        await self.wait_closed()


def _why(error: BaseException) -> str:
    if isinstance(error, ForwardError) and error.code != Reply.GENERAL_FAILURE:
        return f"{error} (reply {int(error.code)}: {error.code.text})"
    return describe(error)


def _forwards(kind: str, specs: Iterable[str | Forward]) -> list[Forward]:
    out = []
    for spec in specs:
        fwd = spec if isinstance(spec, Forward) else Forward.parse(kind, spec)
        if fwd.kind != kind:
            raise ValueError(f"{fwd} given as a -{kind} forward")
        out.append(fwd)
    return out


async def start_near_end(
    connect: str | Endpoint | SessionFactory,
    *,
    local: Iterable[str | Forward] = (),
    remote: Iterable[str | Forward] = (),
    socks: Iterable[str | Forward] = (),
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    backoff: Backoff | None = None,
    session_wait: float = 10.0,
    request_timeout: float = 30.0,
    ssl: Any = None,
    server_hostname: str | None = None,
    config: SessionConfig | None = None,
    rng: random.Random | None = None,
    **options: Any,
) -> NearEnd:
    """Connect to a far end (:func:`start_far_end`) and start the forwards.

    Args:
        connect: the far end: ``FORMAT:tcp:HOST:PORT``, ``FORMAT:unix:PATH``,
            ``FORMAT:ws://...`` or ``wss://...`` (as :class:`polymux.Endpoint`), or a
            :data:`SessionFactory` that opens the session (used again to reconnect).
        local: ``-L`` specs: ``[BIND:]PORT:HOST:HOSTPORT`` (the far end connects each
            connection to HOST:HOSTPORT) or ``[BIND:]PORT`` (a bare channel: the far end's
            ``to``; works against any yamux or smux server that maps streams to a target).
        remote: ``-R`` specs ``[BIND:]PORT:HOST:HOSTPORT``: the far end listens on
            BIND:PORT (it must allow it: ``reverse=``), this end connects to HOST:HOSTPORT.
        socks: ``-D`` specs ``[BIND:]PORT``: SOCKS5 servers (CONNECT, no authentication).
            BIND defaults to 127.0.0.1 everywhere; port 0 picks a free port
            (:attr:`NearEnd.forwards` has the real ones).
        max_connections: forwarded connections at once (more are closed at once, a SOCKS
            client told "general failure").
        backoff: waits between attempts to reconnect (default :class:`Backoff`).
        session_wait: seconds a new connection waits for the session while reconnecting;
            then it is closed.
        request_timeout: seconds the far end may take to answer a request.
        ssl: a client ``ssl.SSLContext`` for TLS.
        server_hostname: the name the server's certificate must have (default the host).
        config: the session's :class:`~polymux.SessionConfig`.
        rng: the jitter's random source (tests).
        **options: :class:`~polymux.SessionConfig` fields on top of ``config``.

    Raises:
        ValueError: a malformed spec or endpoint.
        OSError: no connection to the far end, or a local listener cannot listen.
        polymux.exceptions.PolymuxError: the session failed (its handshake, another format).
        NotAForwarder: the far end does not answer forward requests.
        polymux.forward.ForwardError: the far end refused an ``-R`` listener.
    """
    forwards = [*_forwards("L", local), *_forwards("R", remote), *_forwards("D", socks)]
    if not forwards:
        raise ValueError("start_near_end: no forward (give local=, remote= or socks=)")
    if callable(connect):
        factory: SessionFactory = connect
    else:
        endpoint = connect if isinstance(connect, Endpoint) else Endpoint.parse(connect)
        cfg = SessionConfig.from_options(config, **options)
        option = formats.resolve(endpoint.protocol, cfg).caps.conversation_option
        if option is not None:
            # Request/response formats (Streamux): bytes must flow back before a request ends.
            cfg = SessionConfig.from_options(cfg, **{option: True})

        async def factory(handler: ChannelHandler) -> Session:
            async with asyncio.timeout(cfg.handshake_timeout):
                return await connect_endpoint(
                    endpoint, config=cfg, handler=handler, ssl=ssl, server_hostname=server_hostname
                )

    near = NearEnd(
        factory,
        forwards,
        max_connections=max_connections,
        backoff=backoff or Backoff(),
        session_wait=session_wait,
        request_timeout=request_timeout,
        rng=rng,
    )
    session = await near._connect()
    try:
        await near._start_listeners()
    except BaseException:
        near.close()
        raise
    near._supervisor = asyncio.ensure_future(near._supervise(session))
    return near

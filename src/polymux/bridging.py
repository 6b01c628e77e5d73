"""Bridging two wire formats: :func:`bridge` listens in one format and carries every session
it accepts, channel by channel, to a session of another format that it opens.

Endpoints are ``FORMAT:TRANSPORT`` (see :class:`Endpoint`): ``mplex:tcp:127.0.0.1:4001``,
``yamux:unix:/run/svc.sock``, ``omnistreams:ws://127.0.0.1:8080/omnistreams``.

What crosses, per accepted session (the *listening* side) and the one session the bridge
opens for it (the *connecting* side):

* **Channels.** A channel opened on either side is opened on the other, and bytes are
  copied both ways. Its name crosses where both formats carry names; where only one does,
  ``names`` decides: ``"drop"`` (the default) drops it going to a nameless format and opens
  the channel with an empty name (the format's default) going to a named one; ``"line"``
  writes ``<name>\\n`` as the first bytes going to a nameless format and, coming from one,
  reads the first line as the name (the convention of polymux's interop peers).
* **Ends.** A half-close (end of writing) is carried as a half-close; a reset as a reset,
  with the peer's error text where the source carries one, else the text of the error that
  ended the channel ("yamux: stream 3 (theirs) was reset by the peer"), wherever the
  target carries text (MultiplexingStream v2/v3, multiplex). A channel that cannot be
  opened on the other side (rejected, over a limit, no session) is reset with the reason.
  The bridge accepts offers as they arrive (the listening side's limits apply), so a
  rejection by the far peer reaches the opener as a reset after acceptance.
* **Backpressure.** Each direction is one loop of bounded reads (at most
  :data:`COPY_CHUNK` bytes) and ``await writer.drain()``. Credit goes back to the sending
  peer only as the bridge reads, and the bridge reads only while the other side takes
  what it writes, so a slow reader behind the bridge stalls the writer in front of it
  through the formats' own credit. Per channel the bridge holds at most the receive
  window of the side it reads (``receive_window``; yamux windows grow up to
  ``max_receive_window``), one read, and ``write_buffer_high`` unsent bytes towards the
  other side; per bridged pair (the accepted session and the one opened for it) at most
  ``max_session_memory`` (each session gets a third: see :func:`pair_share`). Formats without credit on the
  wire (mplex, multiplex, mstream-v1, Streamux, smux v1) apply their ``slow_reader``
  policy on the side they are read from: ``"block"`` (the default) stops reading that
  connection while a channel has ``receive_window`` unread bytes, ``"reset"`` resets the
  channel after ``slow_reader_timeout``.
* **Sessions.** The connecting session is opened when the listening one is ready (within
  ``handshake_timeout``); when either ends, the other is closed gracefully (queued data
  flushed, bounded by ``close_timeout``). If it cannot be opened, the listening session's
  channels are reset with the reason and the session is closed.

omnistreams streams are one-way: the bridge opens a stream pair (:meth:`Session.open_pair`)
when it opens a channel on an omnistreams side, and takes pairs opened by a polymux peer as
two-way channels; data coming back for a plain one-way stream cannot be carried, and resets
the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Self, cast
from urllib.parse import urlsplit

from polymux import formats
from polymux._extras import require
from polymux.aio import (
    ChannelTransport,
    Server,
    Session,
    connect as connect_tcp,
    connect_unix,
    connect_websocket,
    serve_websocket,
    start_server,
    start_unix_server,
)
from polymux.aio.server import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, SessionHandler
from polymux.aio.session import ChannelHandler
from polymux.config import COMPATIBILITY_FIELDS, SessionConfig
from polymux.exceptions import ChannelReset, PolymuxError


__all__ = ["COPY_CHUNK", "NAME_POLICIES", "Bridge", "BridgeStats", "Endpoint", "bridge", "pair_share"]

logger = logging.getLogger("polymux.bridge")

COPY_CHUNK = 256 * 1024
"""Largest read of one copy step (bytes): what one channel direction holds in hand."""

NAME_POLICIES = ("drop", "line")
"""How a channel name crosses between a format with names and one without (``names=``)."""

_TRANSPORTS = "FORMAT:tcp:HOST:PORT, FORMAT:unix:PATH or FORMAT:ws://HOST:PORT/PATH"

StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One side of a bridge: a wire format and where it listens or connects.

    Written ``FORMAT:tcp:HOST:PORT`` (an IPv6 host in brackets), ``FORMAT:unix:PATH``, or
    ``FORMAT:ws://HOST:PORT/PATH`` (``wss://`` to connect with TLS); FORMAT is any of
    :data:`polymux.PROTOCOLS`. Over WebSocket, omnistreams sends one message per frame and
    other formats a byte stream; a listening WebSocket side accepts any path.
    """

    protocol: str
    """The wire format (``protocol=``)."""
    transport: str
    """``"tcp"``, ``"unix"`` or ``"ws"`` (WebSocket, ``ws://`` or ``wss://``)."""
    host: str | None = None
    """TCP or WebSocket host."""
    port: int = 0
    """TCP or WebSocket port (0 when listening: any free port)."""
    path: str | None = None
    """The unix socket path."""
    uri: str | None = None
    """The WebSocket URI."""

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """The endpoint ``text`` names.

        Raises:
            ValueError: naming the text and what is wrong with it (the format, the
                transport, the port).
        """
        protocol, sep, rest = text.partition(":")
        if not sep or not rest:
            raise ValueError(f"bridge endpoint {text!r}: expected {_TRANSPORTS}")
        if protocol not in formats.PROTOCOLS:
            raise ValueError(
                f"bridge endpoint {text!r}: unknown format {protocol!r}; polymux speaks: "
                f"{', '.join(formats.PROTOCOLS)}"
            )
        if rest.startswith(("ws://", "wss://")):
            try:
                parts = urlsplit(rest)
                port = parts.port
            except ValueError as exc:
                raise ValueError(f"bridge endpoint {text!r}: not a WebSocket URI: {exc}") from None
            if not parts.hostname:
                raise ValueError(f"bridge endpoint {text!r}: the WebSocket URI has no host")
            default = 443 if parts.scheme == "wss" else 80
            return cls(protocol, "ws", host=parts.hostname, port=default if port is None else port, uri=rest)
        kind, sep, where = rest.partition(":")
        if kind == "unix" and sep:
            if not where or "\0" in where:
                raise ValueError(f"bridge endpoint {text!r}: not a usable socket path: {where!r}")
            if len(os.fsencode(where)) > 107:
                raise ValueError(f"bridge endpoint {text!r}: unix socket paths are limited to 107 bytes")
            return cls(protocol, "unix", path=where)
        if kind == "tcp" and sep:
            host, sep, port_text = where.rpartition(":")
            if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
                raise ValueError(f"bridge endpoint {text!r}: expected tcp:HOST:PORT with a port in 0..65535")
            return cls(protocol, "tcp", host=host.strip("[]") or "127.0.0.1", port=int(port_text))
        raise ValueError(f"bridge endpoint {text!r}: unknown transport {kind!r}; expected {_TRANSPORTS}")

    @property
    def where(self) -> str:
        """The address part (``tcp:127.0.0.1:4001``, ``unix:/path``, the URI)."""
        if self.transport == "unix":
            return f"unix:{self.path}"
        if self.transport == "ws":
            return str(self.uri)
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.protocol}:{self.where}"


@dataclass
class BridgeStats:
    """What a :class:`Bridge` has carried so far."""

    sessions: int = 0
    """Sessions accepted on the listening side."""
    connect_failures: int = 0
    """Of those, how many got no session on the connecting side."""
    channels: int = 0
    """Channels carried (opened on either side)."""
    failed: int = 0
    """Of those, how many ended with a reset or an error (either side)."""
    bytes_forward: int = 0
    """Bytes copied from the listening side to the connecting side."""
    bytes_back: int = 0
    """Bytes copied from the connecting side to the listening side."""


class _Failed(Exception):
    """One side of a carried channel failed: ``side`` is ``"src"`` (the side that opened
    it) or ``"dst"`` (the side the bridge opened it on)."""

    def __init__(self, side: str, error: BaseException) -> None:
        super().__init__(str(error))
        self.side = side
        self.error = error


def _text(error: BaseException) -> str:
    """The text a reset carries for ``error``: the peer's own text if it sent one, else what
    ended the channel, said by the bridge."""
    if isinstance(error, ChannelReset) and error.message:
        return error.message
    text = str(error) or type(error).__name__
    return text if text.startswith("polymux bridge:") else f"polymux bridge: {text}"


_LINGER = 2.0
"""Seconds a session whose CONNECT side could not be opened is kept for its first channels
(each is then reset with the reason), at most ``close_timeout``."""


def _reset(writer: asyncio.StreamWriter, text: str | None) -> None:
    """Reset a channel (and the other half of a stream pair), telling the peer ``text``
    where its format carries one."""
    transport = writer.transport
    if isinstance(transport, ChannelTransport):
        partner = transport.partner
        transport.reset(text)
        if partner is not None:
            partner.reset(text)
    else:
        transport.abort()


class _Link:
    """One accepted session and the session the bridge opened for it."""

    def __init__(self, owner: Bridge, near: Session) -> None:
        self.owner = owner
        self.near = near
        self.far: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        self.far.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen: no log
        self.waiting: set[asyncio.Task[Any]] = set()  # near channels' tasks waiting for ``far``
        self.arrived = asyncio.Event()  # the near side opened a channel
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        owner = self.owner
        near = self.near
        peer = _peer(near)
        try:
            far = await owner._open_far(self)
        except Exception as exc:  # noqa: BLE001 - whatever stopped it, the near session ends
            owner.stats.connect_failures += 1
            if isinstance(exc, TimeoutError):
                why = f"no connection and handshake within handshake_timeout={owner.connect_config.handshake_timeout:g} s"
            else:
                why = str(exc) or type(exc).__name__
            error = PolymuxError(f"polymux bridge: no session with {owner.connect}: {why}")
            logger.warning("session from %s (%s): %s", peer, owner.listen.protocol, error)
            self.far.set_exception(error)
            # A client opens its channels right after connecting, often after the bridge
            # learnt that CONNECT is down (a refused connection takes a millisecond): wait a
            # little for them, so that each is reset with the reason (its text where the
            # format carries one) instead of meeting a closed connection.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(owner.listen_config.close_timeout, _LINGER)):
                    await self.arrived.wait()
            for _ in range(3):  # the rest of that burst: their handlers are scheduled already
                await asyncio.sleep(0)
            if self.waiting:
                # Let the channels that waited reset with the reason before the session
                # closes (closing first lost the resets: the client saw only the close).
                await asyncio.wait(set(self.waiting), timeout=owner.listen_config.close_timeout)
            await near.aclose()
            return
        except BaseException:
            # Cancelled (the bridge is closing): the channels waiting for it learn why.
            self.far.set_exception(PolymuxError("polymux bridge: the bridge is closing"))
            raise
        self.far.set_result(far)
        logger.info("session from %s (%s) -> %s", peer, owner.listen.protocol, owner.connect)
        ends = [asyncio.ensure_future(near.wait_closed()), asyncio.ensure_future(far.wait_closed())]
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for end in ends:
                end.cancel()
            # Whichever ended first, the other is closed gracefully (queued data goes out).
            await asyncio.gather(near.aclose(), far.aclose(), return_exceptions=True)
        logger.info("session from %s ended", peer)

    def abort(self) -> None:
        self.task.cancel()
        self.near.abort()
        if self.far.done() and not self.far.cancelled() and self.far.exception() is None:
            self.far.result().abort()


def _peer(session: Session) -> str:
    peer = session.get_extra_info("peername")
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "unix"


class Bridge:
    """A running bridge (see :func:`bridge`). ``async with`` closes it on exit."""

    def __init__(
        self,
        listen: Endpoint,
        connect: Endpoint,
        names: str,
        listen_config: SessionConfig,
        connect_config: SessionConfig,
    ) -> None:
        self.listen = listen
        """The listening endpoint (with the real port once listening on port 0)."""
        self.connect = connect
        """The endpoint each accepted session is carried to."""
        self.names = names
        """The name policy (:data:`NAME_POLICIES`)."""
        self.listen_config = listen_config
        """The configuration of the accepted sessions."""
        self.connect_config = connect_config
        """The configuration of the sessions the bridge opens."""
        self.stats = BridgeStats()
        """What it has carried so far."""
        self.server: Server | None = None
        """The listening server."""
        self._links: dict[Session, _Link] = {}
        self._far = formats.resolve(connect.protocol, connect_config)
        self._near = formats.resolve(listen.protocol, listen_config)
        self._far_caps = self._far.caps
        self._near_caps = self._near.caps

    # -- sessions ------------------------------------------------------------------------------

    def _link(self, session: Session) -> _Link:
        link = self._links.get(session)
        if link is None:
            self.stats.sessions += 1
            link = self._links[session] = _Link(self, session)
            link.task.add_done_callback(lambda _t: self._links.pop(session, None))
        return link

    def _session_ready(self, session: Session) -> None:
        self._link(session)

    async def _open_far(self, link: _Link) -> Session:
        """The connecting side's session for ``link`` (within ``handshake_timeout``, TCP
        connection included); its incoming channels are carried back to ``link.near``."""
        endpoint = self.connect
        cfg = self.connect_config

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._carry(link, reader, writer, from_far=True)

        async with asyncio.timeout(cfg.handshake_timeout):
            far = await connect_endpoint(endpoint, protocol=self._far, config=cfg, handler=handler)
        memory = self.server.memory if self.server is not None else None
        if memory is not None:  # max_memory: the pair's both sessions count
            budget = far.mux.core.budget
            budget.join(memory)
            far.mux.closed.add_done_callback(lambda _f: budget.leave())
        return far

    async def _near_channel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = cast(Session, writer.get_extra_info("session"))
        link = self._links.get(session)
        if link is None and session.is_closed:
            writer.transport.abort()  # its link is gone: nothing to carry it to
            return
        link = link or self._link(session)
        link.arrived.set()
        await self._carry(link, reader, writer, from_far=False)

    # -- channels ------------------------------------------------------------------------------

    async def _carry(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_far: bool
    ) -> None:
        """Carry one channel opened on one side (``from_far``: the connecting side) to the
        other side, until both directions ended or one side failed."""
        stats = self.stats
        stats.channels += 1
        start = time.monotonic()
        label = str(writer.get_extra_info("channel") or "a channel")
        counts = [0, 0]  # bytes from the opener's side, bytes back to it
        outcome = "stopped"
        try:
            try:
                dst_reader, dst_writer, prefix = await self._open_other(link, reader, writer, from_far, label)
            except _Failed as failed:
                # Nothing was opened on the other side: the opener learns why.
                _reset(writer, _text(failed.error))
                outcome = f"failed: {failed.error}"
                stats.failed += 1
                return
            try:
                if prefix:
                    dst_writer.write(prefix)
                await copy_both(reader, writer, dst_reader, dst_writer, counts)
            except _Failed as failed:
                # The side that failed is gone; the other one is reset with its reason.
                gone, other = (writer, dst_writer) if failed.side == "src" else (dst_writer, writer)
                _reset(other, _text(failed.error))
                _reset(gone, None)
                outcome = f"failed: {failed.error}"
                stats.failed += 1
                return
            except BaseException:
                _reset(dst_writer, "polymux bridge: stopped")
                raise
            outcome = "ok"
            for w in (writer, dst_writer):
                w.close()
            for w in (writer, dst_writer):
                with contextlib.suppress(PolymuxError, OSError):
                    await w.wait_closed()
        except BaseException:
            _reset(writer, "polymux bridge: stopped")
            raise
        finally:
            across, back = counts
            if from_far:
                across, back = back, across
            stats.bytes_forward += across
            stats.bytes_back += back
            logger.info(
                "%s %s: %d bytes across, %d bytes back, %.3f s, %s",
                "connecting side" if from_far else "listening side",
                label,
                counts[0],
                counts[1],
                time.monotonic() - start,
                outcome,
            )

    async def _open_other(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        from_far: bool,
        label: str,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """Open the channel on the other side, its name mapped by the name policy; return
        its reader and writer, and the name line to write first (``b""``: none)."""
        src_caps, dst_caps = (
            (self._far_caps, self._near_caps) if from_far else (self._near_caps, self._far_caps)
        )
        if from_far:
            dst = link.near
        else:
            task = asyncio.current_task()
            if task is not None and not link.far.done():
                link.waiting.add(task)
            try:
                dst = await asyncio.shield(link.far)
            except PolymuxError as exc:
                raise _Failed("dst", exc) from None
            finally:
                if task is not None:
                    link.waiting.discard(task)
        name = str(writer.get_extra_info("channel_name") or "")
        prefix = b""
        dst_name = name if src_caps.names and dst_caps.names else ""
        if self.names == "line" and src_caps.names and not dst_caps.names:
            if "\n" in name:
                raise _Failed(
                    "src", PolymuxError(f"polymux bridge: {label}: a name line cannot hold a newline")
                )
            prefix = name.encode("utf-8", "surrogatepass") + b"\n"
        elif self.names == "line" and dst_caps.names and not src_caps.names:
            dst_name = await self._name_line(reader, label, dst.config.max_name_bytes)
        try:
            async with asyncio.timeout(dst.config.stream_open_timeout):
                dst_reader, dst_writer = await dst.open_pair(dst_name)
        except TimeoutError:
            raise _Failed(
                "dst",
                PolymuxError(
                    f"polymux bridge: {dst.protocol} did not accept the channel within "
                    f"stream_open_timeout={dst.config.stream_open_timeout:g} s"
                ),
            ) from None
        except (PolymuxError, OSError) as exc:
            raise _Failed(
                "dst", PolymuxError(f"polymux bridge: cannot open the channel on {dst.protocol}: {exc}")
            ) from None
        return dst_reader, dst_writer, prefix

    async def _name_line(self, reader: asyncio.StreamReader, label: str, limit: int) -> str:
        """The channel's first line, as its name (``names="line"``, from a nameless format)."""
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            raise _Failed(
                "src", PolymuxError(f"polymux bridge: {label} ended before its name line")
            ) from None
        except asyncio.LimitOverrunError:
            line = b""
        except (PolymuxError, OSError) as exc:
            raise _Failed("src", exc) from None
        if not line or len(line) - 1 > limit:
            raise _Failed(
                "src", PolymuxError(f"polymux bridge: {label}: no name line within max_name_bytes={limit}")
            )
        try:
            return line[:-1].decode()
        except UnicodeDecodeError:
            raise _Failed(
                "src", PolymuxError(f"polymux bridge: {label}: the name line is not UTF-8")
            ) from None

    # -- the server ------------------------------------------------------------------------------

    async def _start(self, max_connections: int | None, limits: dict[str, Any] | None = None) -> None:
        endpoint = self.listen
        if endpoint.transport == "ws" and endpoint.uri is not None and endpoint.uri.startswith("wss:"):
            raise ValueError(
                f"bridge endpoint {endpoint}: the bridge listens on ws:// only (put a TLS proxy in front)"
            )
        self.server, self.listen = await listen_endpoint(
            self.listen,
            self._near_channel,
            protocol=self._near,
            config=self.listen_config,
            session_handler=self._session_ready,
            max_connections=max_connections,
            **(limits or {}),
        )

    @property
    def sessions(self) -> int:
        """Accepted sessions currently carried."""
        return len(self._links)

    def close(self) -> None:
        """Stop listening and abort every session at once (both sides)."""
        if self.server is not None:
            self.server.close()
        for link in list(self._links.values()):
            link.abort()

    async def aclose(self) -> None:
        """Stop listening and close every session gracefully (both sides), then wait; a
        unix socket file is removed."""
        if self.server is not None:
            await self.server.aclose()
        links = list(self._links.values())
        await asyncio.gather(*(link.task for link in links), return_exceptions=True)
        if self.listen.transport == "unix" and self.listen.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.listen.path)

    async def wait_closed(self) -> None:
        """Wait until the listener and every carried session are closed."""
        if self.server is not None:
            await self.server.wait_closed()
        await asyncio.gather(*(link.task for link in list(self._links.values())), return_exceptions=True)

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        assert self.server is not None
        await self.server.serve_forever()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _copy(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    counts: list[int],
    index: int,
) -> None:
    """Copy ``reader`` to ``writer`` until its end, then half-close ``writer``: bounded
    reads, and the next read only once ``writer`` has taken the last one (``drain()``)."""
    while True:
        try:
            data = await reader.read(COPY_CHUNK)
        except (PolymuxError, OSError) as exc:
            raise _Failed("src" if index == 0 else "dst", exc) from None
        try:
            if not data:
                writer.write_eof()
                return
            writer.write(data)
            counts[index] += len(data)
            # Not held while drain() waits: the writer keeps what it has not sent (counted
            # in the budget); a copy kept here would hold up to a read per channel besides.
            del data
            await writer.drain()
        except (PolymuxError, OSError) as exc:
            raise _Failed("dst" if index == 0 else "src", exc) from None


async def copy_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    dst_reader: asyncio.StreamReader,
    dst_writer: asyncio.StreamWriter,
    counts: list[int],
) -> None:
    """Copy ``reader`` to ``dst_writer`` and ``dst_reader`` to ``writer`` until both ended
    (each end of writing carried as a half-close); ``counts`` gets the bytes each way
    (``[0]`` from ``reader``, ``[1]`` back to ``writer``). The first failure cancels the
    other direction and is raised as :class:`_Failed` naming the side: ``"src"``
    (``reader``/``writer``) or ``"dst"``. Used by the bridge and by :mod:`polymux.forward`."""
    tasks = [
        asyncio.ensure_future(_copy(reader, dst_writer, counts, 0)),
        asyncio.ensure_future(_copy(dst_reader, writer, counts, 1)),
    ]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    raise cast(BaseException, task.exception())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def connect_endpoint(
    endpoint: Endpoint,
    *,
    protocol: str | formats.Format | None = None,
    config: SessionConfig | None = None,
    handler: ChannelHandler | None = None,
    ssl: Any = None,
    server_hostname: str | None = None,
) -> Session:
    """A session to ``endpoint`` (TCP, unix socket or WebSocket), in its format unless
    ``protocol`` gives a :class:`~polymux.formats.Format` for it; ``ssl``: a client
    ``ssl.SSLContext`` for TLS over TCP or a unix socket, or for a ``wss://`` URI (which
    gets the default context without one)."""
    fmt = endpoint.protocol if protocol is None else protocol
    tls: dict[str, Any] = {}
    if ssl is not None:
        tls["ssl"] = ssl
        if server_hostname is not None:
            tls["server_hostname"] = server_hostname
        elif endpoint.transport == "unix":
            tls["server_hostname"] = "localhost"  # a unix socket has no host name to check
    if endpoint.transport == "unix":
        assert endpoint.path is not None
        return await connect_unix(endpoint.path, protocol=fmt, config=config, handler=handler, **tls)
    if endpoint.transport == "ws":
        assert endpoint.uri is not None
        return await connect_websocket(endpoint.uri, protocol=fmt, config=config, handler=handler, **tls)
    assert endpoint.host is not None
    return await connect_tcp(
        endpoint.host, endpoint.port, protocol=fmt, config=config, handler=handler, **tls
    )


async def listen_endpoint(
    endpoint: Endpoint,
    handler: ChannelHandler | None,
    *,
    protocol: str | formats.Format | None = None,
    config: SessionConfig | None = None,
    session_handler: SessionHandler | None = None,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    ssl: Any = None,
    max_memory: int | None = None,
    max_connections_per_address: int | None = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
) -> tuple[Server, Endpoint]:
    """A server on ``endpoint`` (TCP, unix socket or WebSocket) whose incoming channels run
    ``handler``; returns it with the endpoint it really listens on (the port chosen for
    port 0; a WebSocket URI with that port, ``wss://`` with ``ssl``). ``ssl``: a server
    ``ssl.SSLContext`` (TLS on any transport); ``max_memory`` and
    ``max_connections_per_address``: see :func:`polymux.start_server`."""
    fmt = endpoint.protocol if protocol is None else protocol
    common: dict[str, Any] = {
        "protocol": fmt,
        "config": config,
        "session_handler": session_handler,
        "max_connections": max_connections,
        "max_memory": max_memory,
        "max_connections_per_address": max_connections_per_address,
    }
    if ssl is not None:
        common["ssl"] = ssl
    if endpoint.transport == "unix":
        assert endpoint.path is not None
        return await start_unix_server(handler, endpoint.path, **common), endpoint
    if endpoint.transport == "ws":
        server = await serve_websocket(handler, endpoint.host, endpoint.port, **common)
        uri = urlsplit(endpoint.uri or f"ws://{endpoint.host}:{endpoint.port}/")
        host = f"[{uri.hostname}]" if uri.hostname and ":" in uri.hostname else uri.hostname
        scheme = "wss" if ssl is not None else "ws"
        real = uri._replace(scheme=scheme, netloc=f"{host}:{server.port}").geturl()
        return server, Endpoint(endpoint.protocol, "ws", host=endpoint.host, port=server.port, uri=real)
    server = await start_server(handler, endpoint.host, endpoint.port, **common)
    return server, Endpoint(endpoint.protocol, "tcp", host=endpoint.host, port=server.port)


def pair_share(budget: int) -> int:
    """The ``max_session_memory`` each session of a bridged pair gets from the pair's
    ``budget``: a third of it (at least 64 KiB). A session holds at most 1.5 times its own
    (see :attr:`SessionConfig.max_session_memory <polymux.SessionConfig.max_session_memory>`),
    so the pair holds at most the budget."""
    return max(64 * 1024, budget // 3)


def _for_side(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without the compatibility keywords of other formats than ``protocol``'s."""
    own = formats.get(protocol).options.legacy
    return {k: v for k, v in options.items() if k not in COMPATIBILITY_FIELDS or k in own}


async def bridge(
    listen: str | Endpoint,
    connect: str | Endpoint,
    *,
    names: str = "drop",
    config: SessionConfig | None = None,
    listen_config: SessionConfig | None = None,
    connect_config: SessionConfig | None = None,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    max_memory: int | None = None,
    max_connections_per_address: int | None = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    **options: Any,
) -> Bridge:
    """Listen on ``listen`` and carry every session accepted there to a new session on
    ``connect``, channel by channel (see the module docstring for what crosses).

    Args:
        listen: where to listen, e.g. ``"mplex:tcp:127.0.0.1:4001"`` (port 0: any free
            port; :attr:`Bridge.listen` then has the real one).
        connect: where to carry each session, e.g. ``"yamux:tcp:10.0.0.5:4002"``.
        names: how names cross between a format with names and one without:
            ``"drop"`` or ``"line"`` (:data:`NAME_POLICIES`).
        config: the sessions' configuration, both sides (default: the defaults).
        listen_config: the accepted sessions' configuration instead of ``config``.
        connect_config: the opened sessions' configuration instead of ``config``.
        max_connections: sessions accepted at once (``None``: no limit); more are dropped
            as they arrive. Each holds one session on the connecting side.
        max_memory: what all the sessions, both sides, may hold together in buffers
            (``None``: no limit; see :func:`polymux.start_server`).
        max_connections_per_address: accepted sessions one peer address may hold
            (``None``: no limit; see :func:`polymux.start_server`).
        **options: :class:`~polymux.SessionConfig` fields applied to both sides on top
            (``max_session_memory=``, ``idle_timeout=``, ``capture=`` ...).
            ``max_session_memory`` is the budget of a bridged *pair*: each of its two
            sessions gets a third of it (:func:`pair_share`; :attr:`Bridge.listen_config`
            and :attr:`Bridge.connect_config` show the shares).

    Returns:
        The running :class:`Bridge` (already listening).

    Raises:
        ValueError: a malformed endpoint, an unknown name policy or option value.
        TypeError: an unknown option.
        OSError: the bridge cannot listen there.
        ModuleNotFoundError: a ``ws://`` endpoint without the websockets extra
            (``polymux._extras.MissingExtra``, whose message says what to install).
    """
    near = listen if isinstance(listen, Endpoint) else Endpoint.parse(listen)
    far = connect if isinstance(connect, Endpoint) else Endpoint.parse(connect)
    if "ws" in (near.transport, far.transport):  # at once, not when the first session arrives
        require("websockets", "a bridge with a ws:// endpoint")
    if names not in NAME_POLICIES:
        raise ValueError(f"bridge: names must be one of {', '.join(NAME_POLICIES)}, got {names!r}")
    if far.transport in ("tcp", "ws") and far.port == 0:
        raise ValueError(f"bridge endpoint {far}: a port is needed to connect")
    # Options go to both sides; a format's own option given by its compatibility keyword
    # (max_receive_window for yamux) only to a side of that format: another refuses it.
    near_cfg = SessionConfig.from_options(listen_config or config, **_for_side(near.protocol, options))
    far_cfg = SessionConfig.from_options(connect_config or config, **_for_side(far.protocol, options))
    # One budget for a bridged pair, end to end: what the bridge holds for one client is
    # the two sessions' together. A session holds up to its max_session_memory unread (and
    # unsent while its socket takes nothing), and half of it more unsent while it waits
    # for credit: a third of the pair's budget each keeps the two within it.
    near_cfg = replace(near_cfg, max_session_memory=pair_share(near_cfg.max_session_memory))
    far_cfg = replace(far_cfg, max_session_memory=pair_share(far_cfg.max_session_memory))
    result = Bridge(near, far, names, near_cfg, far_cfg)
    limits = {"max_memory": max_memory, "max_connections_per_address": max_connections_per_address}
    await result._start(max_connections, limits)
    return result

"""Opening sessions: over TCP, a unix socket, or an existing stream pair."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl as ssl_module
from collections.abc import Mapping
from typing import Any, Unpack

from polymux.aio._sockinfo import tcp_keepalive
from polymux.aio.session import ChannelHandler, MuxProtocol, OfferFilter, Session
from polymux.config import SessionConfig, SessionOptions
from polymux.formats import Format, resolve
from polymux.session.diagnosis import handshake_timed_out


__all__ = ["ConnectOptions", "UnixConnectOptions", "connect", "connect_unix", "over"]


class UnixConnectOptions(SessionOptions, total=False):
    """:func:`connect_unix`'s keyword options: the :class:`~polymux.SessionConfig` fields,
    and those of ``loop.create_unix_connection``."""

    ssl: bool | ssl_module.SSLContext | None
    sock: socket.socket | None
    server_hostname: str | None
    ssl_handshake_timeout: float | None
    ssl_shutdown_timeout: float | None


class ConnectOptions(UnixConnectOptions, total=False):
    """:func:`connect`'s keyword options: the :class:`~polymux.SessionConfig` fields, and
    those of ``loop.create_connection``."""

    family: int
    proto: int
    flags: int
    local_addr: tuple[str, int] | None
    happy_eyeballs_delay: float | None
    interleave: int | None


def _factory(
    protocol: str | Format,
    config: SessionConfig | None,
    options: dict[str, Any],
    *,
    is_client: bool,
    handler: ChannelHandler | None,
    offer_filter: OfferFilter | None,
) -> tuple[SessionConfig, Any]:
    cfg = SessionConfig.from_options(config, **options)
    fmt = resolve(protocol, cfg)

    def make() -> MuxProtocol:
        return MuxProtocol(fmt, cfg, is_client=is_client, handler=handler, offer_filter=offer_filter)

    return cfg, make


async def _ready(mux: MuxProtocol) -> Session:
    """Wait for the handshake; on failure or timeout close the connection and raise."""
    try:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
        # that arrives as the handshake completes (Ctrl-C lost: the transfer went on).
        async with asyncio.timeout(mux.config.handshake_timeout):
            await asyncio.shield(mux.ready)
    except TimeoutError:
        error = handshake_timed_out(mux.core, mux.config.handshake_timeout)  # what the peer sent, if anything
        _give_up(mux)
        raise error from None
    except BaseException:  # the handshake failed, or the caller gave up (cancelled, timed out)
        _give_up(mux)
        raise
    return mux.session


def _give_up(mux: MuxProtocol) -> None:
    """Abort a session nobody waits for any more. Its handshake future fails later (with
    the connection): mark that failure seen, so asyncio logs no "Future exception was never
    retrieved" for it."""
    mux.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
    mux.session.abort()


async def connect(
    host: str,
    port: int,
    *,
    protocol: str | Format,
    config: SessionConfig | None = None,
    handler: ChannelHandler | None = None,
    offer_filter: OfferFilter | None = None,
    **options: Unpack[ConnectOptions],
) -> Session:
    """Connect over TCP and return a ready :class:`Session`.

    ``protocol`` is a format's name (:data:`polymux.PROTOCOLS`) or a
    :class:`~polymux.formats.Format` (with its typed options:
    ``polymux.formats.get("yamux").configure(max_receive_window=...)``). ``options`` are
    :class:`SessionConfig` fields (``receive_window=...``) or keyword arguments of
    ``loop.create_connection`` (``ssl=``, ``local_addr=`` ...).
    ``handler(reader, writer)`` runs for each channel the peer opens; without it, take
    them with ``session.accept_channel()`` or ``async for``.
    """
    session_opts, conn_opts = _split_options(options)
    _cfg, make = _factory(
        protocol, config, session_opts, is_client=True, handler=handler, offer_filter=offer_filter
    )
    loop = asyncio.get_running_loop()
    transport, mux = await loop.create_connection(make, host, port, **conn_opts)
    tcp_keepalive(transport.get_extra_info("socket"), mux.config)
    return await _ready(mux)


async def connect_unix(
    path: str | os.PathLike[str] | None,
    *,
    protocol: str | Format,
    config: SessionConfig | None = None,
    handler: ChannelHandler | None = None,
    offer_filter: OfferFilter | None = None,
    **options: Unpack[UnixConnectOptions],
) -> Session:
    """Connect over a unix socket and return a ready :class:`Session` (see :func:`connect`).
    ``path`` is None when ``sock=`` gives a connected socket."""
    session_opts, conn_opts = _split_options(options)
    _cfg, make = _factory(
        protocol, config, session_opts, is_client=True, handler=handler, offer_filter=offer_filter
    )
    loop = asyncio.get_running_loop()
    where = None if path is None else os.fspath(path)
    _transport, mux = await loop.create_unix_connection(make, where, **conn_opts)
    return await _ready(mux)


async def over(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    protocol: str | Format,
    is_client: bool = True,
    config: SessionConfig | None = None,
    handler: ChannelHandler | None = None,
    offer_filter: OfferFilter | None = None,
    first_frame_deadline: bool | None = None,
    **options: Unpack[SessionOptions],
) -> Session:
    """Run a session over an existing ``(reader, writer)`` pair, e.g. a subprocess's
    stdout and stdin (``asyncio.create_subprocess_exec``) or a connection opened by other
    code. ``is_client`` picks the id side for formats where it matters.

    With ``is_client=False`` the peer must send a whole frame (or complete its handshake)
    within ``handshake_timeout``, as on a server's connections, unless a channel is opened
    to it first; ``first_frame_deadline=False`` waits for it as long as ``idle_timeout``
    allows (a trusted peer that may stay silent)."""
    cfg = SessionConfig.from_options(config, **options)
    mux = MuxProtocol(
        resolve(protocol, cfg),
        cfg,
        is_client=is_client,
        handler=handler,
        offer_filter=offer_filter,
        first_frame_deadline=first_frame_deadline,
    )
    transport = _StreamPairTransport(reader, writer, mux)
    mux.connection_made(transport)
    transport._start()
    return await _ready(mux)


_CONNECTION_OPTIONS = frozenset(
    {
        "ssl",
        "family",
        "proto",
        "flags",
        "sock",
        "local_addr",
        "server_hostname",
        "ssl_handshake_timeout",
        "ssl_shutdown_timeout",
        "happy_eyeballs_delay",
        "interleave",
    }
)


def _split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    conn = {k: v for k, v in options.items() if k in _CONNECTION_OPTIONS}
    session = {k: v for k, v in options.items() if k not in _CONNECTION_OPTIONS}
    return session, conn


class _StreamPairTransport(asyncio.Transport):
    """Adapts a ``StreamReader``/``StreamWriter`` pair to the transport a MuxProtocol needs.

    A pump task feeds what the reader yields to the protocol (paused by
    ``pause_reading``); writes go to the writer, whose buffer above its high-water mark
    pauses the protocol until ``drain()`` returns.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mux: MuxProtocol) -> None:
        super().__init__()
        self._reader = reader
        self._writer = writer
        self._mux = mux
        self._reading = asyncio.Event()
        self._reading.set()
        self._closing = False
        self._pump: asyncio.Task[None] | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._lost = False

    def _start(self) -> None:
        self._pump = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        exc: BaseException | None = None
        try:
            while True:
                await self._reading.wait()
                data = await self._reader.read(256 * 1024)
                if not data:
                    break
                self._mux.data_received(data)
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001 - whatever broke the pipe ends the session
            exc = e
        self._lose(exc)

    def _lose(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        with contextlib.suppress(Exception):
            self._writer.close()
        self._mux.connection_lost(exc if isinstance(exc, Exception) or exc is None else None)
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()

    def get_write_buffer_size(self) -> int:
        return self._writer.transport.get_write_buffer_size()

    def write(self, data: Any) -> None:
        if self._closing:
            return
        self._writer.write(data)
        if self._drainer is None and self._writer.transport.get_write_buffer_size() > 64 * 1024:
            self._mux.pause_writing()
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self._writer.drain()
        except Exception as exc:  # noqa: BLE001 - whatever broke the pipe ends the session
            self._lose(exc)
            return
        finally:
            self._drainer = None
        self._mux.resume_writing()

    def can_write_eof(self) -> bool:
        return self._writer.can_write_eof()

    def write_eof(self) -> None:
        if not self._closing:
            self._writer.write_eof()

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_reading(self) -> bool:
        return self._reading.is_set()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._writer.get_extra_info(name, default)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(Exception):
            if self._writer.can_write_eof():
                self._writer.write_eof()
        self._lose(None)

    def abort(self) -> None:
        self._closing = True
        with contextlib.suppress(Exception):
            self._writer.transport.abort()
        self._lose(None)

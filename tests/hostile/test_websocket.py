"""Hostile peers at the WebSocket level, under the mux: frames that break RFC 6455, closing
handshakes left unfinished, upgrades that never complete, connections that never upgrade,
and pings whose pongs are never read. ``serve_websocket`` is what the web chat and
``polymux bridge`` with a ``ws://`` LISTEN run; ``connect_websocket`` is the bridge's and
the clients' side.

The bounds (SECURITY.md): a violation ends the connection at once (not at the library's
next keepalive ping, ~20 s later), the upgrade is bounded by ``handshake_timeout``, a
server counts connections from their accept, and unread pongs cannot grow the server's
memory without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator

import pytest

import polymux

from .peer import until
from .raw import MIB, RssSampler, ServerProcess
from .ws import BINARY, CLOSE, CONT, PING, TEXT, RawWebSocket, accept_key, frame


pytestmark = pytest.mark.timeout(120)

FAST = 2.0
"""Seconds within which a violation must end the connection (the library's own deadline
came with its next keepalive ping: 20 s)."""


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def _served(**options: object) -> AsyncIterator[polymux.Server]:
    server = await polymux.serve_websocket(None, "127.0.0.1", 0, protocol="mplex", **options)
    try:
        yield server
    finally:
        server.close()
        async with asyncio.timeout(10):
            await server.wait_closed()


VIOLATIONS = {
    "a frame announcing 2**63 - 1 bytes": frame(BINARY, length=2**63 - 1),
    "an unmasked client frame": frame(BINARY, b"mux bytes", mask=False),
    "a reserved opcode": frame(0x3, b""),
    "reserved bits set": bytes([0x80 | 0x40 | BINARY]) + frame(BINARY, b"x")[1:],
    "a fragmented ping": frame(PING, b"", fin=False),
    "a ping of 126 bytes": frame(PING, bytes(126)),
    "a close code that does not exist": frame(CLOSE, struct.pack("!H", 999)),
    "a text frame that is not UTF-8": frame(TEXT, b"\xff\xfe"),
    "a text frame (polymux takes binary messages only)": frame(TEXT, b"hello"),
    "a message in 4,097 fragments": frame(BINARY, b"", fin=False) + frame(CONT, b"", fin=False) * 4096,
    "a close frame, then nothing (the peer never closes)": frame(CLOSE, struct.pack("!H", 1000)),
    "a mux frame that breaks the format (mplex flag 7)": frame(BINARY, bytes([0x0F, 0x00])),
}


@pytest.mark.parametrize("violation", VIOLATIONS)
async def test_a_websocket_violation_ends_the_connection_at_once(violation: str) -> None:
    """After the upgrade, one frame that breaks the WebSocket protocol (or a close frame the
    peer never follows with its own TCP close, or a message that breaks the mux format): the
    server's session ends and its socket is gone within FAST seconds, although the peer never
    closes its side."""
    async with _served() as server:
        ws = await RawWebSocket.open(server.port)
        try:
            await until(lambda: len(server.sessions) == 1)
            (session,) = server.sessions
            start = time.monotonic()
            await ws.send(VIOLATIONS[violation])
            dropped = await ws.dropped(timeout=30)
            async with asyncio.timeout(5):
                await session.wait_closed()
            ended = time.monotonic() - start
            print(f"{violation}: socket gone after {dropped:.2f} s, session ended after {ended:.2f} s")
            assert dropped < FAST and ended < FAST, (dropped, ended)
        finally:
            ws.close()


@pytest.mark.parametrize("sends", ("nothing", "half a request"))
async def test_the_upgrade_is_bounded_by_handshake_timeout(sends: str) -> None:
    """A connection that never completes its HTTP upgrade is dropped at handshake_timeout
    (the library's own open_timeout, 10 s, held whatever the option said)."""
    async with _served(handshake_timeout=0.5) as server:
        ws = await RawWebSocket.connect(server.port)
        try:
            if sends == "half a request":
                await ws.send(ws.request(server.port)[:40])
            took = await ws.closed(timeout=30)
            print(f"{sends}: dropped after {took:.2f} s")
            assert took < 0.5 + FAST
        finally:
            ws.close()


async def test_an_upgraded_connection_that_sends_nothing_is_dropped() -> None:
    """Upgraded, then not one mux frame: the session's first-frame deadline applies over
    WebSocket too (handshake_timeout), and the failed session does not wait for the peer's
    closing handshake (close_timeout, 10 s) either: the connection is gone at once."""
    async with _served(handshake_timeout=0.5) as server:
        ws = await RawWebSocket.open(server.port)
        try:
            took = await ws.closed(timeout=30)
            print(f"upgraded, then silent: closed after {took:.2f} s")
            assert took < 0.5 + FAST
        finally:
            ws.close()


async def test_connections_count_from_their_accept() -> None:
    """max_connections counts connections before their upgrade: 12 connections that never
    upgrade against max_connections=4 hold 4 slots (the 8 oldest are closed as the newer
    come, since they sent nothing), and a legitimate client is then served (one more silent
    one is closed for it)."""
    async with _served(max_connections=4) as server:
        socks = [await RawWebSocket.connect(server.port) for _ in range(12)]
        try:
            for ws in socks[:8]:
                assert await ws.closed(timeout=5) < FAST
            assert server.connections == 4 and server._shed == 8
            async with asyncio.timeout(10):
                session = await polymux.connect_websocket(f"ws://127.0.0.1:{server.port}/", protocol="mplex")
            async with session:
                await session.open_channel("legit")
                assert server.connections == 4 and server._shed == 9
        finally:
            for ws in socks:
                ws.close()


async def test_unread_pongs_do_not_grow_the_server() -> None:
    """A peer floods pings (125-byte payloads, each answered with a pong of the same size by
    the WebSocket library itself) and never reads: the server stops reading once
    UNSENT_LIMIT (4 MiB) bytes wait, so its memory stays bounded: RSS growth under 24 MiB
    (it grew as fast as the flood came before, +63 MiB in these 3 s)."""
    async with ServerProcess("mplex", "echo", websocket=True) as server:
        ws = await RawWebSocket.open(server.port)
        try:
            ping = frame(PING, bytes(125)) * 512
            sampler = RssSampler(server.proc.pid)  # type: ignore[union-attr]
            sent = 0
            deadline = time.monotonic() + 3
            with contextlib.suppress(TimeoutError, ConnectionError):
                async with asyncio.timeout(3):
                    while time.monotonic() < deadline:
                        await ws.send(ping)
                        sent += len(ping)
            await sampler.stop()
            print(
                f"ping flood: sent {sent / MIB:.1f} MiB, server RSS {sampler.baseline / MIB:.1f} -> "
                f"{sampler.peak / MIB:.1f} MiB (+{sampler.growth / MIB:.1f} MiB)"
            )
            assert sampler.growth < 24 * MIB
        finally:
            ws.close()


# -- the client side: a hostile WebSocket server ------------------------------------------------


@pytest.mark.parametrize(
    "violation",
    ("a masked server frame", "a frame announcing 2**63 - 1 bytes", "a close frame, then nothing"),
)
async def test_a_client_ends_at_once_on_a_server_violation(violation: str) -> None:
    """connect_websocket (the bridge's CONNECT side, the clients): a server that breaks the
    protocol, or closes and then keeps its TCP connection open, ends the session at once."""
    bad = {
        "a masked server frame": frame(BINARY, b"x", mask=True),
        "a frame announcing 2**63 - 1 bytes": frame(BINARY, length=2**63 - 1, mask=False),
        "a close frame, then nothing": frame(CLOSE, struct.pack("!H", 1000), mask=False),
    }[violation]
    held: list[asyncio.StreamWriter] = []

    async def hostile(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept_key(key) + b"\r\n\r\n" + bad
        )
        held.append(writer)  # never closed by us: the client must not wait for it
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass

    raw = await asyncio.start_server(hostile, "127.0.0.1", 0)
    port = raw.sockets[0].getsockname()[1]
    try:
        start = time.monotonic()
        with contextlib.suppress(polymux.PolymuxError, ConnectionError, OSError):
            async with asyncio.timeout(10):
                session = await polymux.connect_websocket(f"ws://127.0.0.1:{port}/", protocol="mplex")
                await session.wait_closed()
        took = time.monotonic() - start
        print(f"{violation}: the client's session ended after {took:.2f} s")
        assert took < FAST
    finally:
        for w in held:
            w.transport.abort()
        raw.close()

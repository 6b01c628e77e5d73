"""The diagnosis of a peer that did not speak our format: what it sent, how sure, what to
try. A format is named only at NAME_CONFIDENCE or above, and never wrongly (every pair of
formats, for real, over loopback); HTTP, TLS and SSH peers are named; the Python API says
the peer probably speaks something else. (The command against an HTTP server, as a
subprocess: tests/cli/test_first_hour.py.)"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import polymux
from polymux import formats
from polymux.apps.common import Address, NoSession, connect, peer_mismatch
from polymux.tracing import NAME_CONFIDENCE, diagnose


# -- diagnose() on bytes -------------------------------------------------------------------


def test_nothing_received() -> None:
    closed = diagnose("yamux", b"", closed=True, peer_role="server")
    assert closed is not None and closed.peer is None
    assert str(closed).startswith("the server closed the connection without sending a byte; check that it")
    silent = diagnose("yamux", b"", closed=False, waited=5)
    assert silent is not None and str(silent).startswith(
        "the peer sent nothing in 5 s; check that it speaks yamux"
    )


def test_http_tls_ssh_are_named() -> None:
    http = diagnose("mplex", b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert http is not None and http.peer == "HTTP" and http.confidence >= 0.99
    assert str(http).startswith(
        'the peer speaks HTTP, not mplex (certain: it sent an HTTP response "HTTP/1.1 400 Bad Request", so '
        "it is an HTTP server); point it at a polymux peer's port"
    )
    tls = diagnose("yamux", bytes.fromhex("15030300020232"))
    assert tls is not None and tls.peer == "TLS" and "connect with TLS" in tls.advice
    ssh = diagnose("yamux", b"SSH-2.0-OpenSSH_9.2\r\n")
    assert ssh is not None and ssh.peer == "SSH"


def test_text_is_not_taken_for_a_format() -> None:
    found = diagnose("mplex", b"220 mail.example.com ESMTP ready\r\n")
    assert found is not None and found.peer is None
    assert str(found).startswith(
        'the peer answered with text, "220 mail.example.com ESMTP ready", which is not mplex'
    )


def test_bytes_of_our_own_format_are_no_diagnosis() -> None:
    ping = bytes.fromhex("000200010000000000000001")  # what a yamux server sends first
    assert diagnose("yamux", ping) is None
    named = diagnose("yamux", ping, mismatch=True)  # the session found them wrong itself
    assert named is not None and named.peer is None


def test_a_yamux_ping_is_named_with_confidence() -> None:
    found = diagnose("mplex", bytes.fromhex("000200010000000000000001"))
    assert found is not None and found.peer == "yamux" and found.confidence >= NAME_CONFIDENCE
    assert str(found).endswith("run both sides with the same format (--protocol yamux)")


def test_a_guess_below_the_bar_is_not_named() -> None:
    # One yamux data frame on a stream: 1 frame, confidence 0.5.
    data = bytes.fromhex("000000010000000100000003") + b"abc"
    found = diagnose("mstream-v2", data)
    assert found is not None and found.peer is None and found.confidence == 0
    assert "not mstream-v2" in found.seen
    assert re.search(rf"at best yamux, confidence 0\.\d+, below {NAME_CONFIDENCE}\)", found.advice)


def test_mplex_and_multiplex_are_named_together() -> None:
    # Three NewStreams with names that say nothing of the dialect: one wire, two names.
    data = b"".join(bytes([i << 3, 1]) + b"x" for i in range(3))
    found = diagnose("yamux", data)
    assert found is not None and found.peer == "mplex or multiplex"
    assert found.advice.endswith("(--protocol mplex or --protocol multiplex)")


# -- every pair of formats, for real ---------------------------------------------------------


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, polymux.PolymuxError):
        writer.transport.abort()
        return
    writer.close()


async def _client_says(port: int, client: str) -> str:
    """What a client of ``client`` says against the server on ``port``: the diagnosis, or
    'ok' if it had a session (never with another format)."""
    try:
        session = await connect(
            Address("127.0.0.1", port), client, timeout=3, handshake_timeout=2, keepalive_interval=None
        )
    except NoSession as exc:
        return str(exc)
    failed = False
    try:
        async with asyncio.timeout(3):
            reader, writer = await session.open_pair("x")
            writer.write(b"hello" * 1000)
            writer.write_eof()
            await reader.read()
    except (TimeoutError, ConnectionError, polymux.PolymuxError):
        failed = True
    if not failed:
        return "ok"
    session.abort()
    return peer_mismatch(session) or "no diagnosis"


NAMED = {"yamux", "mstream-v1", "mstream-v2", "streamux"}  # servers that speak first, unmistakably


async def test_every_pair_of_formats() -> None:
    """Each format's client against each other format's server: the diagnosis never names a
    format the server does not speak, and names the server's format where its first bytes
    tell it for sure. All pairs at once (each bounded by its timeouts)."""
    servers = {}
    for protocol in polymux.PROTOCOLS:
        servers[protocol] = await polymux.start_server(
            _echo, "127.0.0.1", 0, protocol=protocol, handshake_timeout=2, keepalive_interval=None
        )
    pairs = [
        (s, c)
        for s, c in itertools.product(polymux.PROTOCOLS, repeat=2)
        if formats.get(s).family != formats.get(c).family
    ]
    try:
        async with asyncio.timeout(60):
            said = await asyncio.gather(*(_client_says(servers[s].port, c) for s, c in pairs))
    finally:
        for server in servers.values():
            server.close()
    wrong = []
    for (server, client), text in zip(pairs, said, strict=True):
        assert text != "ok", (server, client)
        if "the peer speaks " in text:
            named = text.split("the peer speaks ", 1)[1].split(", not ")[0]
            if server not in named.split(" or "):
                wrong.append((server, client, text))
        elif server in NAMED and client != server:
            wrong.append((server, client, f"not named: {text}"))
    assert not wrong, "\n".join(map(str, wrong))


# -- HTTP servers, the race, and the API ------------------------------------------------------


@asynccontextmanager
async def http_server(answer: bytes, read_first: int = 1) -> AsyncIterator[int]:
    """A TCP server that reads a little, answers ``answer`` and closes with our bytes unread
    (the kernel then resets the connection: our next write fails)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(read_first)
        writer.write(answer)
        await writer.drain()
        writer.transport.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request"


async def test_the_api_says_the_peer_speaks_something_else() -> None:
    async with http_server(BAD_REQUEST, read_first=4) as port:
        session = await polymux.connect("127.0.0.1", port, protocol="mplex")
        reader, writer = await session.open_channel("x")
        writer.write(b"hello")
        with pytest.raises(polymux.SessionClosed) as info:
            await asyncio.wait_for(reader.read(), 10)
    assert "the peer speaks HTTP, not mplex: it sent an HTTP response" in str(info.value)
    assert isinstance(info.value.__cause__, polymux.FormatMismatch)
    assert info.value.__cause__.foreign == "HTTP" and info.value.__cause__.first_bytes.startswith(b"HTTP/1.1")
    assert "which the peer already has open" not in str(info.value).split("(as mplex:")[0]


async def test_the_api_on_a_peer_of_another_format() -> None:
    async with await polymux.start_server(_echo, "127.0.0.1", 0, protocol="yamux") as server:
        session = await polymux.connect("127.0.0.1", server.port, protocol="mplex")
        reader, writer = await session.open_channel("x")
        writer.write(b"hello")
        with pytest.raises(polymux.SessionClosed) as info:
            await asyncio.wait_for(reader.read(), 10)
    assert (
        "the peer speaks yamux, not mplex (confidence 0.95: 1 yamux frame, the first: ping on stream 0 "
        "(a yamux ping: 8 of its 12 bytes are fixed)); run both sides with the same format (protocol='yamux') "
        "(it sent 00 02 00 01"
    ) in str(info.value)
    assert info.value.ending == polymux.SessionClosed.VIOLATION and info.value.diagnosis is not None
    assert info.value.first_bytes.startswith(bytes.fromhex("00020001"))


async def test_a_peer_that_stays_silent() -> None:
    """The handshake times out: 'sent nothing in N s', not 'closed'."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(NoSession) as info:
            await connect(Address("127.0.0.1", port), "mstream-v2", timeout=0.5)
    finally:
        server.close()
    assert "within 0.5 s: the server sent nothing in 0.5 s; check that it speaks mstream-v2" in str(
        info.value
    )

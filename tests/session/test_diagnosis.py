"""The library's own errors say why there is no session (issue 40 item 7), without the
command line: a client of each format against a polymux server of every other format (both
smux versions included), and against servers that close, reset or stay silent. The
:class:`~polymux.SessionClosed` a session ends with says how the connection ended
(``ending``: closed, reset, vanished, violation, local), what the peer sent
(``first_bytes``) and, when the peer never spoke the format, why (``diagnosis``, in the
message too): the format it speaks when its bytes tell, or that it closed without a word,
which a peer of another format or of another version of this one does. A peer that spoke the
format gets no diagnosis. The asyncio and the anyio drivers say the same (one core)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest

import polymux
import polymux.anyio as pmanyio
from polymux import SessionClosed, formats


pytestmark = pytest.mark.timeout(120)

SPEAK_FIRST = {"mstream-v1", "mstream-v2", "yamux", "streamux", "smux", "smux-v2"}
"""Servers whose first bytes (a handshake, a ping, a NOP) name them for sure."""

WITHOUT_A_WORD = {"mstream-v3", "mplex", "multiplex", "omnistreams", "omnistreams-legacy"}
"""Servers that say nothing until spoken to in their format: facing a client of another
format they mostly close (their first-frame deadline, or the violation) without a byte, and
the error says so; where they answer (omnistreams-legacy to an omnistreams client), the
error shows the bytes."""


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, polymux.PolymuxError):
        writer.transport.abort()
        return
    writer.close()


async def _client_error(port: int, client: str) -> SessionClosed:
    """The error a ``client`` session to the server on ``port`` ends with: at connect, or
    on the first channel (opened, written to, half-closed, read to the end). A server that
    stays silent is given 10 s, then the session is aborted: what waits then fails too."""
    session = await_session = None
    try:
        session = await polymux.connect(
            "127.0.0.1", port, protocol=client, handshake_timeout=2, keepalive_interval=None
        )

        async def exchange(session: polymux.Session) -> None:
            reader, writer = await session.open_pair("x")
            writer.write(b"hello" * 1000)
            writer.write_eof()
            await reader.read()

        await_session = asyncio.ensure_future(exchange(session))
        done, _pending = await asyncio.wait({await_session}, timeout=10)
        if not done:
            session.abort()
        await await_session
    except SessionClosed as exc:
        return exc
    finally:
        if session is not None:
            session.abort()
    raise AssertionError(f"{client} on port {port}: a session, and an echo")


async def test_every_pair_of_formats() -> None:
    """Each format's client against each other format's server (smux against smux-v2 and
    back among them), through the library: the error is a SessionClosed with a diagnosis,
    in its message; the format it names is the server's, and it is named whenever the
    server speaks first; a server that speaks only when spoken to in its format is said to
    have closed (or, facing a stream the other numbering leaves unanswered, to have said
    nothing) without a byte, with the other versions of the client's format named."""
    servers = {
        protocol: await polymux.start_server(
            _echo, "127.0.0.1", 0, protocol=protocol, handshake_timeout=2, keepalive_interval=None
        )
        for protocol in polymux.PROTOCOLS
    }
    pairs = [
        (s, c)
        for s, c in itertools.product(polymux.PROTOCOLS, repeat=2)
        if formats.get(s).family != formats.get(c).family
    ]
    assert ("smux", "smux-v2") in pairs and ("smux-v2", "smux") in pairs
    try:
        async with asyncio.timeout(90):
            errors = await asyncio.gather(*(_client_error(servers[s].port, c) for s, c in pairs))
    finally:
        for server in servers.values():
            server.close()
    wrong = []
    for (server, client), error in zip(pairs, errors, strict=True):
        text, why = str(error), error.diagnosis
        if why is None or why not in text:
            wrong.append((server, client, f"no diagnosis: {text}"))
            continue
        if error.ending not in (
            SessionClosed.CLOSED,
            SessionClosed.RESET,
            SessionClosed.VIOLATION,
            SessionClosed.VANISHED,  # a handshake the server never sends
            SessionClosed.LOCAL,  # the pair that stays unanswered, aborted after 10 s
        ):
            wrong.append((server, client, f"ending {error.ending}: {text}"))
        if "the peer speaks " in why:
            named = why.split("the peer speaks ", 1)[1].split(", not ")[0]
            if server not in named.split(" or "):
                wrong.append((server, client, f"wrong name: {text}"))
            elif not error.first_bytes:
                wrong.append((server, client, f"no first bytes: {text}"))
        elif server in SPEAK_FIRST:
            wrong.append((server, client, f"not named: {text}"))
        elif not error.first_bytes and "without sending a byte" not in why and "sent nothing" not in why:
            wrong.append((server, client, f"not said to be silent: {text}"))
        elif error.first_bytes and "first bytes" not in why:
            wrong.append((server, client, f"its bytes not shown: {text}"))
        versions = formats.get(client).versions
        if (
            "without sending a byte" in why
            and versions
            and f"another version of it ({', '.join(versions)})" not in why
        ):
            wrong.append((server, client, f"the other versions not named: {text}"))
    assert not wrong, "\n".join(map(str, wrong))


@contextlib.asynccontextmanager
async def raw_server(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[int]:
    """A plain TCP server on a free port of 127.0.0.1 (not polymux); its port."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _read_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """What xtaci/smux does with a frame of the other version: read it, close, say nothing."""
    await reader.readexactly(8)
    writer.close()


@pytest.mark.parametrize(("ours", "theirs"), [("smux-v2", "smux"), ("smux", "smux-v2")])
async def test_a_server_of_the_other_smux_version_closes_without_a_word(ours: str, theirs: str) -> None:
    """The issue's case: smux-v2 against a version-1 server said only "the session's
    connection was closed"."""
    async with raw_server(_read_and_close) as port:
        session = await polymux.connect("127.0.0.1", port, protocol=ours, keepalive_interval=None)
        reader, writer = await session.open_channel()
        writer.write(b"hello")
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(reader.read(), 30)
    error = info.value
    assert error.ending == SessionClosed.CLOSED and error.first_bytes == b""
    assert error.diagnosis == (
        f"the server closed the connection without sending a byte; check that it speaks {ours} (a peer of "
        f"another format or of another version of it ({theirs}), or one that refuses us, often closes "
        "without a word)"
    )
    assert str(error) == f"{ours}: the session's connection was closed: {error.diagnosis}"


async def test_a_reset_says_so() -> None:
    """A server that closes with our bytes unread: the kernel resets the connection. The
    issue's case: 'yamux: connection lost: [Errno 104] Connection reset by peer' alone."""

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        writer.transport.abort()

    async with raw_server(reset) as port:
        session = await polymux.connect("127.0.0.1", port, protocol="yamux", keepalive_interval=None)
        reader, writer = await session.open_channel()
        writer.write(b"x" * 100_000)
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(reader.read(), 30)
    error = info.value
    assert error.ending == SessionClosed.RESET
    assert error.diagnosis is not None
    assert error.diagnosis.startswith("the server reset the connection without sending a byte; check that it")
    assert str(error).startswith("yamux: connection lost: ") and error.diagnosis in str(error)


async def test_a_silent_server_vanishes() -> None:
    """The handshake never comes: the error says the server sent nothing in that time."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    async with raw_server(hold) as port:
        with pytest.raises(SessionClosed) as info:
            await polymux.connect("127.0.0.1", port, protocol="mstream-v2", handshake_timeout=0.5)
    error = info.value
    assert error.ending == SessionClosed.VANISHED and error.first_bytes == b""
    assert error.diagnosis is not None and error.diagnosis.startswith(
        "the server sent nothing in 0.5 s; check that it speaks mstream-v2 (a peer of another format or of "
        "another version of it (mstream-v1, mstream-v3) may wait for bytes it understands)"
    )
    assert str(error).startswith("mstream-v2: no handshake from the peer within 0.5 s")


async def test_a_keepalive_that_fails_on_a_silent_peer() -> None:
    """yamux pings at once: a server that never answers has vanished, and never spoke."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    async with raw_server(hold) as port:
        session = await polymux.connect(
            "127.0.0.1", port, protocol="yamux", keepalive_interval=0.1, keepalive_timeout=0.2
        )
        reader, _writer = await session.open_channel()
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(reader.read(), 30)
    error = info.value
    assert error.ending == SessionClosed.VANISHED and "keepalive failed" in str(error)
    assert error.diagnosis is not None and error.diagnosis.startswith("the server sent nothing;")


async def test_a_peer_that_spoke_gets_no_diagnosis() -> None:
    """A session that worked and then lost its peer: how it ended, no word on formats."""
    async with await polymux.start_server(_echo, "127.0.0.1", 0, protocol="yamux") as server:
        session = await polymux.connect("127.0.0.1", server.port, protocol="yamux")
        reader, writer = await session.open_channel()
        writer.write(b"hi")
        assert await reader.readexactly(2) == b"hi"
        server.close()  # aborts its sessions
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(reader.read(), 30)
    error = info.value
    assert error.ending in (SessionClosed.CLOSED, SessionClosed.RESET)
    assert error.diagnosis is None and error.first_bytes.startswith(bytes.fromhex("0002"))  # its pong
    assert "check that it speaks" not in str(error)


async def test_our_own_close_is_local() -> None:
    async with await polymux.start_server(_echo, "127.0.0.1", 0, protocol="mstream-v3") as server:
        session = await polymux.connect("127.0.0.1", server.port, protocol="mstream-v3")
        reader, writer = await session.open_channel()
        writer.write(b"hi")
        assert await reader.readexactly(2) == b"hi"
        session.abort()
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(reader.read(), 30)
    assert info.value.ending == SessionClosed.LOCAL and info.value.diagnosis is None


async def test_the_anyio_driver_says_the_same() -> None:
    """One core: the anyio session's errors carry the same diagnosis."""
    async with await polymux.start_server(_echo, "127.0.0.1", 0, protocol="smux") as server:
        stream = await anyio.connect_tcp("127.0.0.1", server.port)
        with pytest.raises(Exception) as info:  # anyio may wrap it: looked for below
            async with pmanyio.session(stream, protocol="yamux", keepalive_interval=None) as session:
                channel = await session.open_channel("x")
                await channel.send(b"hello")
                with anyio.fail_after(30):
                    await channel.receive()
    error: BaseException | None = info.value
    while error is not None and not isinstance(error, SessionClosed):
        error = error.__cause__ or (error.exceptions[0] if isinstance(error, BaseExceptionGroup) else None)
    assert isinstance(error, SessionClosed), info.value
    assert error.ending == SessionClosed.VIOLATION and error.diagnosis is not None
    assert error.diagnosis.startswith("the peer speaks smux, not yamux")

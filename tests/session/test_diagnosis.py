"""The library's own errors say why there is no session (issue 40 item 7), without the
command line: a client of each format against a polymux server of every other format (both
smux versions included), and against servers that close, reset or stay silent. The
:class:`~polymux.SessionClosed` a session ends with says how the connection ended
(``ending``: closed, reset, vanished, violation, local), what the peer sent
(``first_bytes``) and, when the peer never spoke the format, why (``diagnosis``, in the
message too): the format it speaks when its bytes tell, or that it closed without a word,
which a peer of another format or of another version of this one does. A peer that spoke the
format gets no diagnosis. The asyncio and the anyio drivers say the same (one core). The
last tests drive the core alone with the peer's bytes: HTTP and text named as such, mplex
and multiplex named together, a guess below the bar shown but not named, and the errors of a
driver's handshake wait."""

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
from polymux.config import SessionConfig
from polymux.exceptions import FormatMismatch, ProtocolError
from polymux.formats import make_engine
from polymux.session import SessionCore, events as ce
from polymux.session.diagnosis import handshake_timed_out


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


# -- the core alone, sans I/O: what the peer's bytes say when the session ends ---------------


def _client(fmt: str) -> SessionCore:
    """A client's core (``is_client=True``, as the drivers make it: the errors say "the
    server", and the detector runs), its own first bytes taken."""
    config = SessionConfig(keepalive_interval=None)
    core = SessionCore(make_engine(fmt, config, is_client=True), config, 0.0, is_client=True)
    core.connection_made(0.0)
    core.data_to_send()
    return core


RESET = ConnectionResetError(104, "Connection reset by peer")


def test_an_http_server_that_resets_is_named() -> None:
    """An HTTP server's answer to an mplex client, then a reset (it closed with our bytes
    unread). To mplex, "HT" is the header of a 84-byte NewStream, still incomplete: no
    violation, so the end of the connection diagnoses the bytes, and names HTTP."""
    core = _client("mplex")
    handle = core.open_channel("x")
    answer = b"HTTP/1.1 400 Bad Request\r\n\r\n"
    core.receive_data(answer, 0.0)
    assert core.error is None
    core.connection_lost(RESET)
    error = core.error
    assert isinstance(error, SessionClosed)
    assert error.ending == SessionClosed.RESET and error.first_bytes == answer
    assert error.diagnosis == (
        'the peer speaks HTTP, not mplex (certain: it sent an HTTP response "HTTP/1.1 400 Bad Request", so it '
        "is an HTTP server); point it at a polymux peer's port (a WebSocket endpoint takes a ws:// URL: "
        "polymux.connect_websocket)"
    )
    assert str(error) == f"mplex: connection lost: [Errno 104] Connection reset by peer: {error.diagnosis}"
    assert ce.Finished(handle, error) in core.events()  # what the channel's reader gets


def test_a_text_answer_that_resets_is_text() -> None:
    """A mail server's greeting, then a reset: text, which no multiplexing format is, so
    no format is named, and the advice is to look at what listens there."""
    core = _client("mplex")
    greeting = b"220 mail.example.com ESMTP ready\r\n"
    core.receive_data(greeting, 0.0)
    core.connection_lost(RESET)
    error = core.error
    assert isinstance(error, SessionClosed)
    assert error.ending == SessionClosed.RESET and error.first_bytes == greeting
    assert error.diagnosis == (
        'the server answered with text, "220 mail.example.com ESMTP ready", which is not mplex (nor any '
        "multiplexing format: they are binary); check what listens there"
    )
    assert str(error) == f"mplex: connection lost: [Errno 104] Connection reset by peer: {error.diagnosis}"


def test_mplex_and_multiplex_are_named_together() -> None:
    """Three NewStreams from a server of mplex or multiplex (one wire, nothing in them
    tells the two apart) to an smux client: its FormatMismatch names both, and advises
    both."""
    core = _client("smux")
    opens = b"".join(bytes([i << 3, 1]) + b"x" for i in range(3))  # NewStream i, named "x"
    core.receive_data(opens, 0.0)
    error = core.error
    assert isinstance(error, FormatMismatch) and error.first_bytes == opens and error.foreign is None
    assert str(error) == (
        "smux: the peer speaks mplex or multiplex, not smux (confidence 0.88: 3 mplex/multiplex frames, the "
        "first a NewStream; nothing in the first bytes tells the two apart); run both sides with the same "
        "format (protocol='mplex' or protocol='multiplex') (it sent 00 01 78 08 01 78 10 01 78; as smux: "
        "frame header version is 0, expected 1 (both ends must be configured with the same smux protocol "
        "version))"
    )
    assert error.diagnosis == error.detail


def test_a_guess_below_the_bar_is_shown_not_named() -> None:
    """One yamux data frame (a stream opened with data at once) to a Streamux client: its
    negotiation fails on the first byte (version 0), a precise error that stays what it
    is, and the bytes fit yamux, but one frame is not enough to say so (confidence 0.40):
    the diagnosis shows the bytes, the violation and the guess with its confidence, and
    names no format."""
    core = _client("streamux")
    frame = bytes.fromhex("000000010000000200000003") + b"abc"  # Data, SYN, stream 2, 3 bytes
    core.receive_data(frame, 0.0)
    core.receive_eof()
    core.connection_lost(None)
    error = core.error
    assert isinstance(error, ProtocolError) and not isinstance(error, FormatMismatch)
    assert error.diagnosis == (
        "the server's first bytes (00 00 00 01 00 00 00 02 00 00 00 03 61 62 63) are not streamux (streamux: "
        "negotiation failed: protocol version 0 is out of range); they fit no format polymux can name with "
        "confidence (at best yamux, confidence 0.40, below 0.85); check which format it speaks"
    )
    assert str(error) == (
        f"streamux: negotiation failed: protocol version 0 is out of range; {error.diagnosis}"
    )
    assert error.first_bytes == frame


def _handshake_of_a_server(fmt: str) -> bytes:
    """What a server of ``fmt`` sends first (its handshake)."""
    config = SessionConfig(keepalive_interval=None)
    server = SessionCore(make_engine(fmt, config, is_client=False), config, 0.0, is_client=False)
    server.connection_made(0.0)
    return b"".join(bytes(p) for p in server.data_to_send())


def test_a_handshake_wait_that_ends_as_the_handshake_arrives() -> None:
    """The driver's handshake wait can end in the same turn of its loop as the read that
    brought the server's handshake: the server spoke the format, so the timeout's error
    says nothing of formats (no diagnosis), only the wait, with the bytes it got. A
    silent server's gets the diagnosis (the contrast)."""
    handshake = _handshake_of_a_server("mstream-v2")
    core = _client("mstream-v2")
    core.receive_data(handshake, 0.0)
    error = handshake_timed_out(core, 2)
    assert str(error) == "mstream-v2: no handshake from the peer within 2 s"
    assert error.ending == SessionClosed.VANISHED and error.first_bytes == handshake
    assert error.diagnosis is None
    silent = handshake_timed_out(_client("mstream-v2"), 2)
    assert silent.first_bytes == b"" and silent.diagnosis is not None
    assert str(silent) == f"mstream-v2: no handshake from the peer within 2 s: {silent.diagnosis}"


def test_an_error_that_already_says_why_keeps_its_words() -> None:
    """A driver that ends the session with its own error, one that already says what the
    peer sent and why (its handshake wait's, :func:`handshake_timed_out`: "sent nothing in
    2 s"): the end of the connection overwrites none of it (the core's own diagnosis of
    that end, "sent nothing", lacks the wait) and does not say it twice."""
    core = _client("mstream-v2")
    error = handshake_timed_out(core, 2)
    said, diagnosis = str(error), error.diagnosis
    assert diagnosis is not None and diagnosis.startswith(
        "the server sent nothing in 2 s; check that it speaks"
    )
    core.fail(error)
    core.connection_lost(None)
    assert core.error is error
    assert str(error) == said and str(error).count("check that it speaks") == 1
    assert error.diagnosis == diagnosis and error.first_bytes == b""
    assert error.ending == SessionClosed.VANISHED


def test_a_drivers_own_account_of_the_peer_is_kept() -> None:
    """A layer in front of the core (a WebSocket client whose upgrade the server refused)
    ends the session with what it got: the peer's first bytes are those, not the core's
    (none reached it), and its diagnosis stays."""
    core = _client("mplex")
    refused = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    error = SessionClosed(
        "mplex: the WebSocket upgrade was refused (404 Not Found)",
        ending=SessionClosed.CLOSED,
        first_bytes=refused,
        diagnosis="the server has no WebSocket endpoint at that path",
    )
    core.fail(error)
    core.connection_lost(None)
    assert core.error is error
    assert error.first_bytes == refused
    assert error.diagnosis == "the server has no WebSocket endpoint at that path"
    assert str(error) == "mplex: the WebSocket upgrade was refused (404 Not Found)"
    assert error.ending == SessionClosed.CLOSED

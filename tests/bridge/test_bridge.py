"""``polymux.bridge`` with polymux peers on both sides: channels opened on either side are
carried to the other, byte-exact both ways; names cross (kept, dropped, or as a first
line), half-closes and resets cross (with their text where the target format has one);
a refused or impossible channel reaches its opener as a reset saying why; sessions end
together; the bounds and captures of each side apply."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import polymux
from polymux import formats

from .helpers import until


pytestmark = pytest.mark.timeout(60)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def pattern(index: int, size: int) -> bytes:
    block = bytes((j * 31 + index * 7) & 0xFF for j in range(251))
    return (block * (size // 251 + 1))[:size]


RESETS: list[polymux.ChannelReset] = []
"""What ``sink/`` channels were reset with (the current test's)."""


@pytest.fixture(autouse=True)
def _clear_resets() -> None:
    RESETS.clear()


async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
    """The far peer: reacts to the channel's name (``echo/``, ``name/``, ``halfclose/``,
    ``reset/<text>``: resets with that text; ``sink/``: reads until the channel fails and
    records its reset in :data:`RESETS`)."""
    if name.startswith("sink/"):
        try:
            await reader.read()
        except polymux.ChannelReset as exc:
            RESETS.append(exc)
        return
    if name.startswith("echo/"):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    elif name.startswith("name/"):
        writer.write(name.encode())
        await reader.read()
    elif name.startswith("halfclose/"):
        total = 0
        while data := await reader.read(65536):
            total += len(data)
        writer.write(str(total).encode())
    elif name.startswith("reset/"):
        assert isinstance(writer.transport, polymux.ChannelTransport)
        writer.transport.reset(name[len("reset/") :])
        return
    writer.write_eof()
    await writer.drain()
    writer.close()
    with contextlib.suppress(polymux.PolymuxError, ConnectionError):
        await writer.wait_closed()


def named_responder(line: bool) -> Handler:
    """A responder that takes the name from the channel (``line``: from its first line)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if line:
            name = (await reader.readline()).decode().rstrip("\n")
        else:
            name = writer.get_extra_info("channel_name")
        await respond(reader, writer, name)

    return handler


@contextlib.asynccontextmanager
async def far_server(
    protocol: str,
    handler: Handler | None = None,
    *,
    tmp: Path | None = None,
    ws: bool = False,
    **options: Any,
) -> AsyncIterator[tuple[polymux.Server, str]]:
    """A polymux server of ``protocol``; yields it and its bridge endpoint text."""
    if ws:
        server = await polymux.serve_websocket(handler, "127.0.0.1", 0, protocol=protocol, **options)
        where = f"ws://127.0.0.1:{server.port}/svc"
    elif tmp is not None:
        path = str(tmp / "far.sock")
        server = await polymux.start_unix_server(handler, path, protocol=protocol, **options)
        where = f"unix:{path}"
    else:
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol=protocol, **options)
        where = f"tcp:127.0.0.1:{server.port}"
    try:
        yield server, f"{protocol}:{where}"
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)


@contextlib.asynccontextmanager
async def running(listen: str, connect: str, **kwargs: Any) -> AsyncIterator[polymux.Bridge]:
    bridge = await polymux.bridge(listen, connect, **kwargs)
    try:
        yield bridge
    finally:
        bridge.close()
        await asyncio.wait_for(bridge.wait_closed(), 10)


async def near_session(bridge: polymux.Bridge, **options: Any) -> polymux.Session:
    endpoint = bridge.listen
    if endpoint.transport == "unix":
        assert endpoint.path is not None
        return await polymux.connect_unix(endpoint.path, protocol=endpoint.protocol, **options)
    if endpoint.transport == "ws":
        assert endpoint.uri is not None
        return await polymux.connect_websocket(endpoint.uri, protocol=endpoint.protocol, **options)
    return await polymux.connect("127.0.0.1", endpoint.port, protocol=endpoint.protocol, **options)


async def open_named(
    session: polymux.Session, name: str, line: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await session.open_pair(name)
    if line:
        writer.write(name.encode() + b"\n")
    return reader, writer


async def echo(session: polymux.Session, index: int, size: int, line: bool = False) -> None:
    reader, writer = await open_named(session, f"echo/{index}", line)
    data = pattern(index, size)

    async def send() -> None:
        view = memoryview(data)
        for off in range(0, size, 65536):
            writer.write(view[off : off + 65536])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.ensure_future(send())
    got = await reader.read()
    await sender
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), f"echo/{index}: {len(got)} bytes"
    writer.close()


# (near, far): every pair of credit kinds, named and nameless, both ways.
PAIRS = [
    ("mstream-v3", "yamux"),
    ("yamux", "mplex"),
    ("mplex", "mstream-v2"),
    ("smux-v2", "mstream-v3"),
    ("multiplex", "smux"),
    ("mstream-v1", "yamux"),
]


@pytest.mark.parametrize(("near", "far"), PAIRS)
async def test_channels_cross_byte_exact_with_half_close(near: str, far: str) -> None:
    """8 channels x 1 MiB echoed through the bridge byte for byte; a half-close crosses
    (the far side counts until the end and answers after it); names cross where both
    formats carry them, as a first line with ``names="line"`` where one does not."""
    near_names, far_names = formats.get(near).caps.names, formats.get(far).caps.names
    async with (
        far_server(far, named_responder(line=not far_names)) as (_server, endpoint),
        running(f"{near}:tcp:127.0.0.1:0", endpoint, names="line") as bridge,
    ):
        session = await near_session(bridge)
        nameless = not near_names
        await asyncio.gather(*(echo(session, i, 1 << 20, line=nameless) for i in range(8)))
        reader, writer = await open_named(session, "halfclose/x", nameless)
        writer.write(b"z" * 300_000)
        writer.write_eof()
        assert await reader.read() == b"300000"
        writer.close()
        reader, writer = await open_named(session, "name/héllo wörld", nameless)
        writer.write_eof()
        assert (await reader.read()).decode() == "name/héllo wörld"
        writer.close()
        await session.aclose()
    assert bridge.stats.channels == 10 and bridge.stats.failed == 0
    assert bridge.stats.bytes_forward >= 8 << 20 and bridge.stats.bytes_back >= 8 << 20


async def test_names_dropped_by_default() -> None:
    """``names="drop"``: nothing is added to the bytes; a named target gets the format's
    default name (here mstream's empty name)."""
    seen: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("channel_name"))
        writer.write(await reader.read())
        writer.close()

    async with (
        far_server("mstream-v3", handler) as (_s, endpoint),
        running("yamux:tcp:127.0.0.1:0", endpoint) as bridge,
        await near_session(bridge) as session,
    ):
        reader, writer = await session.open_channel()
        writer.write(b"as is\n")
        writer.write_eof()
        assert await reader.read() == b"as is\n"
    assert seen == [""]


async def test_line_names_from_a_nameless_side_and_their_limits() -> None:
    """``names="line"`` from yamux to mstream: the first line is the name and is not
    carried as data; a channel that ends before its line, or whose line is longer than
    the target's ``max_name_bytes``, is reset saying so."""
    names: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        names.append(writer.get_extra_info("channel_name"))
        writer.write(await reader.read())
        writer.close()

    async with (
        far_server("mstream-v3", handler) as (_s, endpoint),
        running("yamux:tcp:127.0.0.1:0", endpoint, names="line", max_name_bytes=64) as bridge,
        await near_session(bridge) as session,
    ):
        reader, writer = await session.open_channel()
        writer.write(b"files/1\npayload")
        writer.write_eof()
        assert await reader.read() == b"payload"
        reader, writer = await session.open_channel()
        writer.write(b"no newline")
        writer.write_eof()
        with pytest.raises(polymux.ChannelReset):
            await reader.read()
        reader, writer = await session.open_channel()
        writer.write(b"x" * 100 + b"\n")
        with pytest.raises(polymux.ChannelReset):
            await reader.read()
    assert names == ["files/1"]
    assert bridge.stats.failed == 2


async def test_reset_text_crosses_where_the_target_can_say_it(caplog: pytest.LogCaptureFixture) -> None:
    """mstream-v3 <-> multiplex both carry reset text: it crosses verbatim, both ways.
    From yamux (no text) to mstream, the reset still arrives as an error, naming what
    reset it."""
    async with (
        far_server("multiplex", named_responder(line=False)) as (_far, endpoint),
        running("mstream-v3:tcp:127.0.0.1:0", endpoint) as bridge,
        await near_session(bridge) as session,
    ):
        # far -> near: the far peer resets with text.
        reader, writer = await session.open_channel("reset/boom from far")
        with pytest.raises(polymux.ChannelReset) as info:
            await reader.read()
        assert info.value.message == "boom from far"
        # near -> far: we reset with text; the far peer reads it.
        reader, writer = await session.open_channel("sink/1")
        writer.write(b"some bytes")
        await writer.drain()
        assert isinstance(writer.transport, polymux.ChannelTransport)
        writer.transport.reset("boom from near")
        await until(lambda: bool(RESETS))
        assert RESETS[0].message == "boom from near"

    async with (
        far_server("yamux", named_responder(line=True)) as (_far, endpoint),
        running("mstream-v3:tcp:127.0.0.1:0", endpoint, names="line") as bridge,
        await near_session(bridge) as session,
    ):
        reader, _writer = await session.open_channel("reset/ignored: yamux has no text")
        with pytest.raises(polymux.ChannelReset) as info:
            await reader.read()
        assert info.value.message is not None
        assert (
            info.value.message.startswith("polymux bridge: yamux: ")
            and "reset by the peer" in info.value.message
        )


async def test_a_refused_channel_is_reset_with_the_reason() -> None:
    """The far peer rejects the offer (mstream): the near opener's channel, already
    accepted by the bridge, is reset with text saying so."""
    async with (
        far_server("mstream-v3", named_responder(False), offer_filter=lambda n: not n.startswith("no/")) as (
            _s,
            endpoint,
        ),
        running("mstream-v2:tcp:127.0.0.1:0", endpoint) as bridge,
        await near_session(bridge) as session,
    ):
        reader, _writer = await session.open_channel("no/thanks")
        with pytest.raises(polymux.ChannelReset) as info:
            await reader.read()
        assert "polymux bridge: cannot open the channel on mstream-v3" in str(info.value.message)
        assert "rejected" in str(info.value.message)
        await echo(session, 1, 1000)  # the session goes on
    assert bridge.stats.failed == 1


async def test_channels_opened_by_the_far_side_cross_back() -> None:
    """The far peer opens channels too (a server push): they are opened on the near side,
    with their names, and carried the same way."""
    pushed: list[bytes] = []

    async def far_session_ready(session: polymux.Session) -> None:
        reader, writer = await session.open_channel("push/1")
        writer.write(b"from the far side")
        writer.write_eof()
        pushed.append(await reader.read())
        writer.close()

    async with (
        far_server("mstream-v3", None, session_handler=far_session_ready) as (_s, endpoint),
        running("multiplex:tcp:127.0.0.1:0", endpoint) as bridge,
        await near_session(bridge) as session,
    ):
        reader, writer = await asyncio.wait_for(session.accept_channel(), 10)
        assert writer.get_extra_info("channel_name") == "push/1"
        assert await reader.read() == b"from the far side"
        writer.write(b"answer")
        writer.write_eof()
        await until(lambda: bool(pushed))
    assert pushed == [b"answer"]


async def test_no_session_on_the_far_side(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens on CONNECT: the near session's channels are reset with the reason
    and the near session is closed; the bridge counts it and goes on."""
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with caplog.at_level(logging.WARNING, logger="polymux.bridge"):
        async with running("yamux:tcp:127.0.0.1:0", f"mstream-v3:tcp:127.0.0.1:{port}") as bridge:
            session = await near_session(bridge)
            reader, _writer = await session.open_channel()
            with pytest.raises(polymux.ChannelReset) as info:
                await reader.read()
            await asyncio.wait_for(session.wait_closed(), 10)
            assert bridge.stats.connect_failures == 1
    assert f"no session with mstream-v3:tcp:127.0.0.1:{port}" in caplog.text
    assert info.value.message is None  # yamux carries no text; the log has it


async def test_sessions_end_together(tmp_path: Path) -> None:
    """The near session ends: the far one is closed. The far one ends: the near one is
    closed. Unix sockets on both sides; the bridge's socket file goes with it."""
    far_ended = asyncio.Event()

    async def far_ready(session: polymux.Session) -> None:
        await session.wait_closed()
        far_ended.set()

    async with far_server("yamux", named_responder(True), tmp=tmp_path, session_handler=far_ready) as (
        far,
        endpoint,
    ):
        path = tmp_path / "near.sock"
        bridge = await polymux.bridge(f"mplex:unix:{path}", endpoint, names="line")
        try:
            session = await near_session(bridge)
            await echo(session, 0, 100_000)
            await session.aclose()
            await asyncio.wait_for(far_ended.wait(), 10)
            # And the other way round.
            session = await near_session(bridge)
            await echo(session, 1, 1000)
            far.close()  # the far side goes away
            await asyncio.wait_for(session.wait_closed(), 10)
        finally:
            await asyncio.wait_for(bridge.aclose(), 10)
    assert not path.exists()
    assert bridge.stats.sessions == 2


@pytest.mark.parametrize("side", ["near", "far"])
async def test_omnistreams_over_websocket(side: str) -> None:
    """omnistreams (one-way streams) on either side, over WebSocket: the bridge opens
    stream pairs and takes the pairs a polymux peer opens, so channels are two-way."""
    if side == "near":
        async with (
            far_server("yamux", named_responder(True)) as (_s, endpoint),
            running("omnistreams:ws://127.0.0.1:0/omni", endpoint, names="line") as bridge,
        ):
            assert bridge.listen.uri is not None and bridge.listen.uri.endswith(f":{bridge.listen.port}/omni")
            async with await near_session(bridge) as session:
                await asyncio.gather(*(echo(session, i, 300_000) for i in range(4)))
    else:
        async with (
            far_server("omnistreams", named_responder(False), ws=True) as (_s, endpoint),
            running("mstream-v3:tcp:127.0.0.1:0", endpoint) as bridge,
            await near_session(bridge) as session,
        ):
            await asyncio.gather(*(echo(session, i, 300_000) for i in range(4)))
    assert bridge.stats.failed == 0


async def test_data_back_on_a_one_way_stream_resets_it() -> None:
    """A plain one-way omnistreams stream (not a pair) cannot carry data back: the far
    side's answer resets the channel, with the reason."""
    async with (
        far_server("mstream-v3", named_responder(False)) as (_s, endpoint),
        running("omnistreams:tcp:127.0.0.1:0", endpoint) as bridge,
        await near_session(bridge) as session,
    ):
        _reader, writer = await session.open_channel("echo/1")
        writer.write(b"x" * 1000)
        await writer.drain()
        await until(lambda: bridge.stats.failed == 1)


async def test_limits_and_captures_of_each_side(tmp_path: Path) -> None:
    """``max_connections`` bounds the accepted sessions; the configurations of the two
    sides are their own (here: a capture on each); ``idle_timeout`` closes an idle session
    on both sides."""
    from polymux.tracing import CaptureRecorder, read_capture

    near_rec, far_rec = CaptureRecorder(tmp_path / "near"), CaptureRecorder(tmp_path / "far")
    near_cfg = polymux.SessionConfig(capture=near_rec, idle_timeout=0.5)
    far_cfg = polymux.SessionConfig(capture=far_rec, idle_timeout=0.5)
    async with (
        far_server("yamux", named_responder(False)) as (_s, endpoint),
        running(
            "mplex:tcp:127.0.0.1:0",
            endpoint,
            listen_config=near_cfg,
            connect_config=far_cfg,
            max_connections=1,
        ) as bridge,
    ):
        session = await near_session(bridge)
        reader, writer = await session.open_channel()
        writer.write(b"recorded")
        writer.write_eof()
        await reader.read()
        writer.close()
        # A second connection is dropped as it arrives.
        r2, w2 = await asyncio.open_connection("127.0.0.1", bridge.listen.port)
        assert await asyncio.wait_for(r2.read(), 10) == b""
        w2.close()
        # No channel left: both sides close after idle_timeout.
        await asyncio.wait_for(session.wait_closed(), 10)
        await until(lambda: bridge.sessions == 0)
    near_rec.close()
    far_rec.close()
    near_caps = [read_capture(p) for p in near_rec.paths]
    far_caps = [read_capture(p) for p in far_rec.paths]
    assert {(c.role, c.format) for c in near_caps} == {("server", "mplex")}
    assert {(c.role, c.format) for c in far_caps} == {("client", "yamux")}
    assert b"recorded" in b"".join(bytes(chunk[2]) for c in far_caps for chunk in c.chunks)


async def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="names must be one of drop, line"):
        await polymux.bridge("yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", names="keep")
    with pytest.raises(ValueError, match="a port is needed to connect"):
        await polymux.bridge("yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:0")
    with pytest.raises(TypeError, match="unknown session option"):
        await polymux.bridge("yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", windw=1)
    with pytest.raises(ValueError, match="listens on ws:// only"):
        await polymux.bridge("omnistreams:wss://127.0.0.1:0/", "mplex:tcp:127.0.0.1:1")


async def test_far_handshake_timeout_and_closing_while_connecting(caplog: pytest.LogCaptureFixture) -> None:
    """A CONNECT side that accepts the connection and never answers the handshake: after
    ``handshake_timeout`` the near session's channels are reset and the session closed.
    A bridge closed while it connects ends at once, its waiting channels too."""
    held: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(lambda _r, w: held.append(w), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.WARNING, logger="polymux.bridge"):
            async with running(
                "mplex:tcp:127.0.0.1:0", f"mstream-v2:tcp:127.0.0.1:{port}", handshake_timeout=0.3
            ) as bridge:
                session = await near_session(bridge)
                reader, _writer = await session.open_channel("waits")
                with pytest.raises(polymux.ChannelReset):
                    await asyncio.wait_for(reader.read(), 10)
                await asyncio.wait_for(session.wait_closed(), 10)
        assert "within handshake_timeout=0.3 s" in caplog.text
        bridge = await polymux.bridge("mplex:tcp:127.0.0.1:0", f"mstream-v2:tcp:127.0.0.1:{port}")
        session = await near_session(bridge)
        reader, _writer = await session.open_channel("waits")
        await until(lambda: bridge.sessions == 1)
        bridge.close()
        await asyncio.wait_for(bridge.wait_closed(), 10)
        with pytest.raises((polymux.ChannelReset, polymux.SessionClosed)):
            await asyncio.wait_for(reader.read(), 10)
    finally:
        silent.close()
        for writer in held:
            writer.close()

"""Channel types without traps (issue 40 item 10): ``polymux.reset(writer, reason)``, the
typed way to terminate a channel; ``polymux.Channel``, the ``(reader, writer)`` pair as an
async context manager; and a channel's ``get_extra_info("socket")``, which is not the
session's shared socket."""

from __future__ import annotations

import asyncio
import socket

import pytest

import polymux


pytestmark = pytest.mark.timeout(60)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, polymux.PolymuxError):
        return
    writer.close()


async def test_reset_carries_the_reason() -> None:
    seen: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def reader_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()
        except polymux.ChannelReset as exc:
            seen.set_result(exc)

    async with (
        await polymux.start_server(reader_side, "127.0.0.1", 0, protocol="mstream-v3") as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mstream-v3") as session,
    ):
        _reader, writer = await session.open_channel("doomed")
        writer.write(b"some")
        await writer.drain()
        polymux.reset(writer, "gave up")
        error = await asyncio.wait_for(seen, 30)
    assert isinstance(error, polymux.ChannelReset) and error.message == "gave up"


async def test_reset_refuses_a_writer_that_is_not_a_channels() -> None:
    async def nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(nothing, "127.0.0.1", 0)
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    with pytest.raises(TypeError, match="not a polymux channel's writer"):
        polymux.reset(writer, "x")
    writer.close()
    server.close()


async def test_a_channel_closes_at_the_end_of_async_with() -> None:
    async with (
        await polymux.start_server(_echo, "127.0.0.1", 0, protocol="yamux") as server,
        await polymux.connect("127.0.0.1", server.port, protocol="yamux") as session,
    ):
        channel = await session.open_channel("x")
        reader, writer = channel  # it is the pair, too
        assert channel.reader is reader and channel.writer is writer
        async with channel as (r, w):
            assert (r, w) == (reader, writer)
            w.write(b"hello")
            assert await r.readexactly(5) == b"hello"
        assert writer.is_closing()
        assert await asyncio.wait_for(reader.read(), 30) == b""  # the echo ended: the peer saw our end


async def test_an_exception_in_async_with_resets_the_channel() -> None:
    got: asyncio.Future[BaseException | bytes] = asyncio.get_running_loop().create_future()

    async def reader_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            got.set_result(await reader.read())
        except (ConnectionError, polymux.PolymuxError) as exc:
            got.set_result(exc)

    async with (
        await polymux.start_server(reader_side, "127.0.0.1", 0, protocol="mstream-v3") as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mstream-v3") as session,
    ):
        with pytest.raises(RuntimeError, match="boom"):
            async with await session.open_channel("x") as (_reader, writer):
                writer.write(b"partial")
                await writer.drain()
                raise RuntimeError("boom")
        outcome = await asyncio.wait_for(got, 30)
    assert isinstance(outcome, polymux.ChannelReset), outcome


async def test_accepted_channels_are_channels_too() -> None:
    async with (
        await polymux.start_server(None, "127.0.0.1", 0, protocol="mplex") as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mplex") as session,
    ):
        _r, w = await session.open_channel("x")
        w.write(b"hi")
        (served,) = server.sessions
        accepted = await asyncio.wait_for(served.accept_channel(), 30)
        assert isinstance(accepted, polymux.Channel)
        async with accepted as (reader, _writer):
            assert await reader.readexactly(2) == b"hi"


async def test_a_channel_has_no_socket_of_its_own() -> None:
    """Generic code that sets socket options on what it is given must not change every
    channel's: a channel's ``socket`` is None, the shared one is ``session_socket``."""
    async with (
        await polymux.start_server(_echo, "127.0.0.1", 0, protocol="yamux") as server,
        await polymux.connect("127.0.0.1", server.port, protocol="yamux") as session,
    ):
        _reader, writer = await session.open_channel("x")
        assert writer.get_extra_info("socket") is None
        assert writer.get_extra_info("socket", "none") == "none"
        shared = writer.get_extra_info("session_socket")
        assert shared is not None and shared.family == socket.AF_INET
        assert shared.fileno() == session.get_extra_info("socket").fileno()
        assert writer.get_extra_info("peername") == session.get_extra_info("peername")

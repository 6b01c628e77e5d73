"""Cancellation and closing, as docs/closing.md states them (issue 40 item 11): a timeout
on read or drain leaves the channel usable, a cancelled open leaves the session usable,
close() with unsent data makes wait_closed() wait for close_timeout and then resets the
channel, and Server.close() aborts the sessions (unlike asyncio.Server.close), while
aclose() closes them gracefully."""

from __future__ import annotations

import asyncio

import pytest

import polymux


pytestmark = pytest.mark.timeout(60)


async def test_a_read_that_times_out_takes_nothing() -> None:
    speak = asyncio.Event()

    async def later(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await speak.wait()
        writer.write(b"late")
        await writer.drain()
        writer.close()

    async with (
        await polymux.start_server(later, "127.0.0.1", 0, protocol="mplex") as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mplex") as session,
    ):
        reader, writer = await session.open_channel("x")
        writer.write(b"hi")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):  # the peer says nothing until told
                await reader.read(100)
        speak.set()
        assert await asyncio.wait_for(reader.read(), 30) == b"late"


async def test_a_drain_that_times_out_leaves_the_bytes_queued() -> None:
    read = asyncio.Event()
    received = bytearray()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read.wait()
        while data := await reader.read(65536):
            received.extend(data)
        writer.close()

    async with (
        await polymux.start_server(
            slow, "127.0.0.1", 0, protocol="mstream-v3", receive_window=64 * 1024
        ) as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mstream-v3") as session,
    ):
        reader, writer = await session.open_channel("x")
        payload = bytes(range(256)) * 4096  # 1 MiB: far more than the 64 KiB window
        writer.write(payload)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):  # the peer reads nothing until told
                await writer.drain()
        read.set()
        await asyncio.wait_for(writer.drain(), 30)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 30) == b""
    assert bytes(received) == payload


async def test_a_cancelled_open_leaves_the_session_usable() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())
        writer.close()

    async with (
        await polymux.start_server(echo, "127.0.0.1", 0, protocol="mstream-v3") as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mstream-v3") as session,
    ):
        opening = asyncio.ensure_future(session.open_channel("first"))
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        reader, writer = await session.open_channel("second")
        writer.write(b"still here")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 30) == b"still here"


async def test_close_with_unsent_data_waits_for_close_timeout_then_resets() -> None:
    outcome: asyncio.Future[BaseException | bytes] = asyncio.get_running_loop().create_future()
    read = asyncio.Event()

    async def stalled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read.wait()
        try:
            outcome.set_result(await reader.read())
        except (ConnectionError, polymux.PolymuxError) as exc:
            outcome.set_result(exc)

    async with (
        await polymux.start_server(
            stalled, "127.0.0.1", 0, protocol="mstream-v3", receive_window=64 * 1024
        ) as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mstream-v3", close_timeout=1.0) as session,
    ):
        _reader, writer = await session.open_channel("x")
        writer.write(bytes(1 << 20))
        writer.close()
        closed = asyncio.ensure_future(writer.wait_closed())
        done, _ = await asyncio.wait({closed}, timeout=0.3)
        assert not done  # the bytes cannot go out: it waits
        await asyncio.wait_for(closed, 30)  # ... for close_timeout (1 s), not for ever
        read.set()
        result = await asyncio.wait_for(outcome, 30)
    assert isinstance(result, polymux.ChannelReset), result


async def test_server_close_aborts_the_sessions_and_aclose_closes_them_gracefully() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, polymux.PolymuxError):
            return
        writer.close()

    server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux")
    session = await polymux.connect("127.0.0.1", server.port, protocol="yamux")
    reader, writer = await session.open_channel("x")
    writer.write(b"hi")
    assert await reader.readexactly(2) == b"hi"
    server.close()  # asyncio.Server.close() would leave this connection alone
    with pytest.raises(polymux.SessionClosed):
        await asyncio.wait_for(reader.read(), 30)
    await asyncio.wait_for(server.wait_closed(), 30)
    assert not server.sessions

    # (close_timeout: how long aclose() lets the open channel finish)
    server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux", close_timeout=1.0)
    session = await polymux.connect("127.0.0.1", server.port, protocol="yamux")
    reader, writer = await session.open_channel("y")
    writer.write(b"ho")
    assert await reader.readexactly(2) == b"ho"
    await asyncio.wait_for(server.aclose(), 30)  # a GoAway: the session ends cleanly
    assert not server.sessions
    await asyncio.wait_for(session.wait_closed(), 30)
    assert session.is_closed

"""omnistreams sessions over TCP, unix sockets and WebSocket: one-way channels, credit,
cancel, control messages, stream pairs."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import polymux
from polymux.aio.channel import ChannelTransport
from polymux.engine.omnistreams import OmnistreamsEngine

from .helpers import until


Connector = Callable[..., Awaitable[tuple[polymux.Server, polymux.Session]]]


@pytest.fixture
async def connect_pair(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """``await connect_pair(kind, handler, **options)`` -> (server, client session) over
    ``tcp``, ``unix`` or ``ws``; everything is closed after the test."""
    opened: list[tuple[polymux.Server, polymux.Session]] = []

    async def make(kind: str, handler: Any, **options: Any) -> tuple[polymux.Server, polymux.Session]:
        protocol = options.pop("protocol", "omnistreams")
        if kind == "tcp":
            server = await polymux.start_server(handler, "127.0.0.1", 0, protocol=protocol, **options)
            session = await polymux.connect("127.0.0.1", server.port, protocol=protocol, **options)
        elif kind == "unix":
            path = tmp_path / "omni.sock"
            server = await polymux.start_unix_server(handler, path, protocol=protocol, **options)
            session = await polymux.connect_unix(path, protocol=protocol, **options)
        else:
            server = await polymux.serve_websocket(handler, "127.0.0.1", 0, protocol=protocol, **options)
            session = await polymux.connect_websocket(
                f"ws://127.0.0.1:{server.port}/omnistreams", protocol=protocol, **options
            )
        opened.append((server, session))
        return server, session

    yield make
    for server, session in opened:
        session.abort()
        server.close()
    for server, session in opened:
        await asyncio.wait_for(session.wait_closed(), 5)
        await asyncio.wait_for(server.wait_closed(), 5)


KINDS = ["tcp", "unix", "ws"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("protocol", ["omnistreams", "omnistreams-legacy"])
async def test_concurrent_streams_with_metadata(connect_pair: Any, kind: str, protocol: str) -> None:
    received: dict[str, tuple[str, bytes]] = {}
    done = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        transport = writer.transport
        received[transport.get_extra_info("channel_name")] = (
            hashlib.sha256(data).hexdigest(),
            transport.get_extra_info("metadata"),
        )
        writer.close()
        if len(received) == 16:
            done.set()

    async with asyncio.timeout(30):
        _server, session = await connect_pair(kind, handler, protocol=protocol)
        assert session.protocol == protocol
        blobs = {f"f{i}": os.urandom(256 * 1024 + i) for i in range(16)}

        async def send(name: str) -> None:
            _reader, writer = await session.open_channel(name)
            writer.write(blobs[name])
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        await asyncio.gather(*(send(name) for name in blobs))
        await done.wait()
    for name, blob in blobs.items():
        digest, metadata = received[name]
        assert digest == hashlib.sha256(blob).hexdigest()
        assert metadata == f'{{"name":"{name}","chunkSize":65536}}'.encode()


@pytest.mark.parametrize("kind", KINDS)
async def test_empty_streams_are_delivered(connect_pair: Any, kind: str) -> None:
    """CREATE and END in one read: the handler still gets the (empty) stream."""
    seen: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await seen.put((writer.transport.get_extra_info("channel_name"), await reader.read()))
        writer.close()

    async with asyncio.timeout(10):
        _server, session = await connect_pair(kind, handler)
        for i in range(20):
            _reader, writer = await session.open_channel(f"empty/{i}")
            writer.close()
        got = sorted([await seen.get() for _ in range(20)])
    assert got == sorted((f"empty/{i}", b"") for i in range(20))


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_unusable_halves_fail_clearly(connect_pair: Any, kind: str) -> None:
    errors: asyncio.Queue[BaseException | None] = asyncio.Queue()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"nope")
        except polymux.ChannelClosedError as exc:
            await errors.put(exc)
        else:
            await errors.put(None)
        writer.write_eof()  # nothing to end on a receive-only half: a no-op
        await errors.put(None if await reader.read() == b"data" else AssertionError("data lost"))
        writer.close()

    async with asyncio.timeout(10):
        _server, session = await connect_pair(kind, handler)
        reader, writer = await session.open_channel("one-way")
        for read in (reader.read(), reader.readexactly(1), reader.readline(), reader.readuntil(b"x")):
            with pytest.raises(polymux.ChannelClosedError, match="'one-way'.* is send-only"):
                await read
        writer.write(b"data")
        writer.close()
        await writer.wait_closed()
        with pytest.raises(polymux.ChannelClosedError, match="is send-only"):
            await reader.read()  # still refused after the end, never a silent EOF
        refused = await errors.get()
        assert isinstance(refused, polymux.ChannelClosedError)
        assert "is receive-only: omnistreams streams carry data from their opener" in str(refused)
        assert await errors.get() is None


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_credit_exhaustion_blocks_drain(connect_pair: Any, kind: str) -> None:
    readers: asyncio.Queue[tuple[asyncio.StreamReader, Any]] = asyncio.Queue()
    finished = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await readers.put((reader, writer.transport))
        await finished.wait()
        writer.close()

    # The reader grants 4 messages of 1 KiB; the writer's buffer pauses above 8 KiB.
    options = {"send_frame": 1024, "receive_window": 4096, "write_buffer_high": 8192}
    async with asyncio.timeout(10):
        _server, session = await connect_pair(kind, handler, **options)
        _reader, writer = await session.open_channel("slow")
        channel = writer.transport
        assert isinstance(channel, ChannelTransport)
        engine = session.engine
        assert isinstance(engine, OmnistreamsEngine)
        peer_reader, peer_channel = await readers.get()
        writer.write(b"a" * 64 * 1024)
        drain = asyncio.ensure_future(writer.drain())
        # The 4 granted messages went out; nothing more may: credit 0, drain blocked.
        await until(
            lambda: channel.get_write_buffer_size() == 60 * 1024 and engine.send_credit(channel.handle) == 0
        )
        assert not drain.done()
        # The receiving side gets exactly the 4 messages it granted, and holds them unread.
        peer_engine = peer_channel.get_extra_info("session").engine
        recv = peer_engine._record(peer_channel.handle).recv
        await until(lambda: recv.outstanding == 4)
        assert recv.pending == 0
        assert not drain.done()
        assert channel.get_write_buffer_size() == 60 * 1024
        got = await peer_reader.readexactly(64 * 1024)  # consuming returns credit
        assert got == b"a" * 64 * 1024
        await drain
        finished.set()


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_reader_cancel_reaches_writer(connect_pair: Any, kind: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(10)
        writer.close()  # stop reading early: CANCEL_SEND

    async with asyncio.timeout(10):
        _server, session = await connect_pair(kind, handler, send_frame=1024, receive_window=4096)
        _reader, writer = await session.open_channel("cancelled")
        with pytest.raises(polymux.ChannelReset, match="cancelled by the receiver"):
            while True:
                writer.write(b"z" * 1024)
                await writer.drain()
        with pytest.raises(polymux.ChannelReset):
            writer.write(b"more")


async def test_writer_cancel_reaches_reader(connect_pair: Any) -> None:
    errors: asyncio.Queue[BaseException] = asyncio.Queue()
    started = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(7) == b"partial"
        started.set()
        try:
            await reader.read()
        except polymux.ChannelReset as exc:
            await errors.put(exc)

    async with asyncio.timeout(10):
        _server, session = await connect_pair("tcp", handler)
        _reader, writer = await session.open_channel("abandoned")
        writer.write(b"partial")
        await writer.drain()
        await started.wait()
        writer.transport.abort()
        error = await errors.get()
    assert "cancelled by the sender" in str(error)


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_control_messages(connect_pair: Any, kind: str) -> None:
    async with asyncio.timeout(10):
        server, client = await connect_pair(kind, None)
        await until(lambda: bool(server.sessions))
        [serving] = list(server.sessions)
        client.send_control(b"hello")
        client.send_control(b"")
        assert await serving.receive_control() == b"hello"
        assert await serving.receive_control() == b""
        serving.send_control(b"\x00\xff")
        assert await client.receive_control() == b"\x00\xff"
        pending = asyncio.ensure_future(client.receive_control())
        client.abort()
        with pytest.raises(polymux.SessionClosed):
            await pending


async def test_control_messages_need_the_format(serve: Any) -> None:
    server = await serve(None, protocol="yamux")
    async with asyncio.timeout(10):
        session = await polymux.connect("127.0.0.1", server.port, protocol="yamux")
        with pytest.raises(polymux.PolymuxError, match="yamux has no control messages"):
            session.send_control(b"x")
        session.abort()


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_open_pair_echo(connect_pair: Any, kind: str) -> None:
    async def upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()

    async with asyncio.timeout(10):
        _server, session = await connect_pair(kind, upper)
        reader, writer = await session.open_pair("chat")
        assert writer.transport.get_extra_info("channel_name") == "chat"
        for word in (b"hello\n", b"world\n"):
            writer.write(word)
            await writer.drain()
            assert await reader.readline() == word.upper()
        writer.write_eof()  # half-close: our stream ends, theirs goes on until they end it
        assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()
        await until(lambda: session.engine.channel_count == 0)


async def test_open_pair_without_handler_and_other_formats(connect_pair: Any, serve: Any, echo: Any) -> None:
    async with asyncio.timeout(10):
        server, session = await connect_pair("tcp", None)
        pair = asyncio.ensure_future(session.open_pair("p"))
        await until(lambda: bool(server.sessions))
        [serving] = list(server.sessions)
        their_reader, their_writer = await serving.accept_channel("p")
        reader, writer = await pair
        their_writer.write(b"to client")
        writer.write(b"to server")
        assert await reader.readexactly(9) == b"to client"
        assert await their_reader.readexactly(9) == b"to server"
        # A bidirectional format: open_pair is open_channel.
        yamux = await serve(echo, protocol="yamux")
        other = await polymux.connect("127.0.0.1", yamux.port, protocol="yamux")
        r, w = await other.open_pair("e")
        w.write(b"x")
        assert await r.readexactly(1) == b"x"
        other.abort()


async def test_257th_concurrent_stream_fails_clearly(connect_pair: Any) -> None:
    gate = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await gate.wait()
        writer.close()

    async with asyncio.timeout(20):
        _server, session = await connect_pair("tcp", handler)
        writers = [(await session.open_channel(str(i)))[1] for i in range(256)]
        with pytest.raises(polymux.LimitExceeded, match="all 256 stream ids are in use"):
            await session.open_channel("257")
        writers[0].close()
        await writers[0].wait_closed()
        _r, again = await session.open_channel("reused")  # the freed id serves again
        gate.set()
        for w in (*writers[1:], again):
            w.close()


async def test_over_stream_pair_and_protocol_error() -> None:
    """``over()`` works with the length prefix; a message over the limit ends the session."""
    async with asyncio.timeout(10):
        server_side: asyncio.Future[polymux.Session] = asyncio.get_running_loop().create_future()

        async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            session = await polymux.over(reader, writer, protocol="omnistreams", is_client=False)
            server_side.set_result(session)

        tcp = await asyncio.start_server(on_conn, "127.0.0.1", 0)
        port = tcp.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        session = await polymux.over(reader, writer, protocol="omnistreams")
        peer = await server_side
        session.send_control(b"over")
        assert await peer.receive_control() == b"over"
        writer.write(b"\xff\xff\xff\xff")  # a length prefix far above max_message_size
        await peer.wait_closed()
        assert isinstance(peer.exception, polymux.ProtocolError)
        assert "length prefix 4294967295 > max_message_size" in str(peer.exception)
        session.abort()
        tcp.close()
        with contextlib.suppress(Exception):
            await tcp.wait_closed()


async def test_websocket_text_message_is_a_protocol_error() -> None:
    from websockets.asyncio.client import connect

    errors: list[BaseException | None] = []

    async def session_handler(session: polymux.Session) -> None:
        await session.wait_closed()
        errors.append(session.exception)

    async with asyncio.timeout(10):
        server = await polymux.serve_websocket(None, "127.0.0.1", 0, session_handler=session_handler)
        async with connect(f"ws://127.0.0.1:{server.port}/") as ws:
            await ws.send("text")
            await until(lambda: bool(errors))
        await server.aclose()
    assert isinstance(errors[0], polymux.ProtocolError)
    assert "received a text WebSocket message" in str(errors[0])


async def test_polymux_works_without_websockets() -> None:
    """``websockets`` is imported only by connect_websocket/serve_websocket."""
    code = (
        "import sys, asyncio\n"
        "sys.modules['websockets'] = None  # as if it were not installed\n"
        "import polymux\n"
        "async def main():\n"
        "    got = asyncio.get_running_loop().create_future()\n"
        "    async def handler(reader, writer):\n"
        "        got.set_result(await reader.read())\n"
        "    server = await polymux.start_server(handler, '127.0.0.1', 0, protocol='omnistreams')\n"
        "    session = await polymux.connect('127.0.0.1', server.port, protocol='omnistreams')\n"
        "    _r, w = await session.open_channel('x')\n"
        "    w.write(b'ok'); w.close()\n"
        "    assert await got == b'ok'\n"
        "    try:\n"
        "        await polymux.connect_websocket('ws://127.0.0.1:1/')\n"
        "    except ImportError as exc:\n"
        "        print('ImportError', exc.name.split('.')[0])\n"
        "    session.abort(); server.close()\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.decode().split() == ["ImportError", "websockets"]


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_ids_recycled_over_1000_sequential_streams(connect_pair: Any, kind: str) -> None:
    bodies: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await bodies.put(await reader.read())
        writer.close()

    async with asyncio.timeout(60):
        server, session = await connect_pair(kind, handler)
        engine = session.engine
        assert isinstance(engine, OmnistreamsEngine)
        ids: set[int] = set()
        for i in range(1000):
            _reader, writer = await session.open_channel(f"seq/{i}")
            ids.add(engine._record(writer.transport.handle).wire_id)  # type: ignore[attr-defined]
            writer.write(str(i).encode())
            writer.close()
            assert await bodies.get() == str(i).encode()
        assert ids == set(range(256))
        await until(lambda: engine.free_ids == 256 and engine.channel_count == 0)
        [serving] = list(server.sessions)
        assert serving.engine.channel_count == 0


async def test_websocket_backpressure_pauses_the_session() -> None:
    """A WebSocket peer that stops reading pauses the session: the adapter's queue and
    the channel's buffer stay bounded and ``drain()`` blocks until the peer reads again.
    (mplex over WebSocket: no credit on the wire, so only the transport can push back.)"""
    from websockets.asyncio.server import ServerConnection, serve

    reading = asyncio.Event()
    received = 0

    async def slow_peer(ws: ServerConnection) -> None:
        nonlocal received
        await reading.wait()
        async for message in ws:
            received += len(message)

    async with asyncio.timeout(30):
        ws_server = await serve(slow_peer, "127.0.0.1", 0, compression=None, max_queue=1, max_size=None)
        port = next(iter(ws_server.sockets)).getsockname()[1]
        session = await polymux.connect_websocket(f"ws://127.0.0.1:{port}/", protocol="mplex")
        _reader, writer = await session.open_channel("bulk")
        total = 64 * 1024 * 1024

        async def write_all() -> None:
            block = bytes(1024 * 1024)
            for _ in range(total // len(block)):
                writer.write(block)
                await writer.drain()

        task = asyncio.ensure_future(write_all())
        mux = session.mux
        adapter = mux._transport
        assert adapter is not None
        await until(lambda: mux._write_paused)
        queued = adapter.get_write_buffer_size()
        # Paused until the queue is down to the low mark; never above the high mark
        # (2 x batch_bytes) plus the one batch that crossed it.
        assert session.config.batch_bytes // 2 < queued <= 3 * session.config.batch_bytes + 64 * 1024 + 64
        await until(lambda: writer.transport.get_write_buffer_size() > session.config.write_buffer_high)
        assert not task.done()
        reading.set()
        await task
        writer.close()
        await until(lambda: received >= total)
        session.abort()
        ws_server.close()
        await ws_server.wait_closed()


async def test_whole_messages_are_never_sliced(connect_pair: Any) -> None:
    """Over WebSocket each call of the session brings one whole message: sliced mode (dense
    input, see polymux.session.slicing) must not cut it into slices (each was read as a
    message: 'unknown message type 96')."""
    got: asyncio.Queue[bytes] = asyncio.Queue()
    armed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host = writer.transport._host  # type: ignore[attr-defined]
        host._slicer.until = float("inf")  # sliced mode from now on
        armed.set()
        await got.put(await reader.read())
        writer.close()

    async with asyncio.timeout(10):
        _server, session = await connect_pair("ws", handler)
        blob = os.urandom(200_000)  # messages of 64 KiB: larger than a slice
        _reader, writer = await session.open_channel("big")
        await armed.wait()  # the handler runs once the stream is created
        writer.write(blob)
        writer.close()
        assert await got.get() == blob

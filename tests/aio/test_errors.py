"""Bad input and failures over real loopback sockets.

A :class:`RawPeer` is a hand-driven MultiplexingStream peer on a plain asyncio stream: it
writes exactly the bytes a test crafts (with the codec's own encoders) and decodes what
polymux answers. It talks to a polymux server; a few tests use a raw server that a polymux
client connects to instead.

What every protocol violation must do: end the session, leave ``session.exception`` a
:class:`polymux.ProtocolError` naming the format and the problem, make every pending or
later read, write, drain, ``accept_channel`` and ``open_channel`` of that session raise
(never hang, never a silent EOF), and leave the server serving other sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgpack
import pytest

import polymux
from polymux.wire import mstream as wire
from polymux.wire.mstream import MAX_PAYLOAD, ControlCode as C


T = TypeVar("T")

ALL = ["mstream-v1", "mstream-v2", "mstream-v3"]
FLOW = ["mstream-v2", "mstream-v3"]
HANDSHAKE = ["mstream-v1", "mstream-v2"]


async def wait(aw: Awaitable[T], timeout: float = 5) -> T:  # noqa: ASYNC109
    """Await ``aw``, failing the test instead of hanging."""
    return await asyncio.wait_for(aw, timeout)


class RawPeer:
    """One end of a MultiplexingStream connection driven byte by byte by the test."""

    RANDOM = b"\xff" * 16
    """Handshake random bytes: greater than polymux's, so we are the odd party (ids 1, 3 ...)."""

    def __init__(self, protocol: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.version = int(protocol[-1])
        self.reader = reader
        self.writer = writer
        self.window: int | None = None
        """The receive window polymux advertised in its last OfferAccepted."""
        self._decoder = wire.Decoder(self.version)
        self._items: deque[wire.Frame | wire.Handshake] = deque()
        self._next_id = 1

    @classmethod
    async def connect(cls, protocol: str, port: int) -> RawPeer:
        reader, writer = await wait(asyncio.open_connection("127.0.0.1", port))
        return cls(protocol, reader, writer)

    async def receive(self) -> wire.Frame | wire.Handshake:
        while not self._items:
            data = await wait(self.reader.read(64 * 1024))
            if not data:
                raise EOFError("polymux closed the connection")
            self._items.extend(self._decoder.feed(data))
        return self._items.popleft()

    async def expect(self, code: int, channel_id: int) -> wire.Frame:
        """Skip frames until one with ``code`` for ``channel_id`` arrives."""
        while True:
            item = await self.receive()
            if isinstance(item, wire.Frame) and item.code == code and item.channel_id == channel_id:
                return item

    async def read_handshake(self) -> wire.Handshake:
        item = await self.receive()
        assert isinstance(item, wire.Handshake)
        return item

    async def handshake(self) -> None:
        """v1/v2: read polymux's handshake and answer it (v3 has none)."""
        if self.version != 3:
            await self.read_handshake()
            self.send(wire.encode_handshake(self.version, self.RANDOM))

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def frame(self, code: int, channel_id: int, payload: bytes = b"") -> bytes:
        """A frame about a channel *we* opened (v3 source "local", sender's view)."""
        source = wire.ChannelSource.LOCAL if self.version == 3 else None
        return wire.encode_frame(self.version, wire.Frame(code, channel_id, payload, source))

    async def offer(self, name: str, window: int | None = None) -> int:
        """Offer a channel and wait for polymux to accept it; return its id."""
        cid = self._next_id
        self._next_id += 1 if self.version == 3 else 2
        self.send(self.frame(C.OFFER, cid, wire.encode_offer(self.version, name, window)))
        accepted = await self.expect(C.OFFER_ACCEPTED, cid)
        self.window = wire.decode_offer_accepted(self.version, accepted.payload)
        return cid

    def abort(self) -> None:
        self.writer.transport.abort()


def only_session(server: polymux.Server) -> polymux.Session:
    (session,) = [s for s in server.sessions if not s.is_closed]
    return session


async def assert_server_still_serves(server: polymux.Server, protocol: str) -> None:
    """A second, well-behaved session on ``server`` opens a channel and echoes on it."""
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        reader, writer = await wait(client.open_channel("echo"))
        peer = only_session(server)
        peer_reader, peer_writer = await wait(peer.accept_channel("echo"))
        writer.write(b"ping")
        peer_writer.write(await wait(peer_reader.readexactly(4)))
        assert await wait(reader.readexactly(4)) == b"ping"
        writer.write_eof()
        assert await wait(peer_reader.read()) == b""
        peer_writer.close()
        assert await wait(reader.read()) == b""
        assert client.exception is None
        assert peer.exception is None


async def assert_session_dead(
    session: polymux.Session,
    cause: BaseException | None,
    pending: list[asyncio.Task[Any]],
    reader: asyncio.StreamReader | None = None,
    writer: asyncio.StreamWriter | None = None,
) -> None:
    """Everything pending on ``session`` and everything tried later raises SessionClosed."""

    def check(exc: BaseException) -> None:
        assert isinstance(exc, polymux.SessionClosed)
        assert isinstance(exc, ConnectionError)
        if cause is not None:
            assert exc.__cause__ is cause

    for task in pending:
        with pytest.raises(polymux.SessionClosed) as info:
            await wait(task)
        check(info.value)
    if reader is not None:
        with pytest.raises(polymux.SessionClosed) as info:
            await wait(reader.read())  # again: an error, never a silent EOF
        check(info.value)
    if writer is not None:
        with pytest.raises(polymux.SessionClosed) as info:
            writer.write(b"more")
        check(info.value)
        with pytest.raises(polymux.SessionClosed):
            await wait(writer.drain())
    with pytest.raises(polymux.SessionClosed):
        await wait(session.open_channel("late"))
    with pytest.raises(polymux.SessionClosed):
        await wait(session.accept_channel("never-offered"))
    assert session.is_closed


# -- garbage handshakes --------------------------------------------------------------------

HANDSHAKE_GARBAGE = [
    pytest.param(
        "mstream-v1",
        b"\x00\x01\x02\x03" + bytes(16),
        "handshake magic is 00010203, expected 2fdf1d50",
        id="v1-bad-magic",
    ),
    pytest.param(
        "mstream-v2",
        b"GET / HTTP/1.1\r\nHost: example\r\n\r\n",
        "handshake must be a 2-element msgpack array, got type byte 0x47",
        id="v2-not-msgpack",
    ),
    pytest.param(
        "mstream-v2",
        msgpack.packb([[3, 0], bytes(range(16))], use_bin_type=True),
        "handshake field version is 3.0, expected 2.x",
        id="v2-major-3",
    ),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("protocol", "garbage", "problem"), HANDSHAKE_GARBAGE)
async def test_garbage_handshake_ends_the_server_session(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str, garbage: bytes, problem: str
) -> None:
    server = await serve(protocol=protocol)
    raw = await RawPeer.connect(protocol, server.port)
    try:
        await raw.read_handshake()  # polymux speaks first: its session exists now
        session = only_session(server)
        accepting = asyncio.create_task(session.accept_channel())
        raw.send(garbage)
        await wait(session.wait_closed())
        exc = session.exception
        assert isinstance(exc, polymux.ProtocolError)
        assert exc.format == protocol
        assert str(exc).startswith(f"{protocol}: ")
        assert problem in str(exc)
        await assert_session_dead(session, exc, [accepting])
        # polymux hung up on the raw peer.
        assert await wait(raw.reader.read()) == b""
    finally:
        raw.abort()
    await assert_server_still_serves(server, protocol)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("protocol", "garbage", "problem"), HANDSHAKE_GARBAGE)
async def test_garbage_handshake_from_a_server_fails_connect(
    protocol: str, garbage: bytes, problem: str
) -> None:
    hung_up = asyncio.Event()

    async def liar(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(garbage)
        with contextlib.suppress(ConnectionError):
            await reader.read()
        hung_up.set()
        writer.close()

    raw_server = await asyncio.start_server(liar, "127.0.0.1", 0)
    async with raw_server:
        port = raw_server.sockets[0].getsockname()[1]
        with pytest.raises(polymux.SessionClosed) as info:
            await wait(polymux.connect("127.0.0.1", port, protocol=protocol))
        cause = info.value.__cause__
        assert isinstance(cause, polymux.ProtocolError)
        assert str(cause).startswith(f"{protocol}: ")
        assert problem in str(cause)
        assert problem in str(info.value)
        await wait(hung_up.wait())  # the client closed the connection


# -- protocol violations on an established session ------------------------------------------


def oversize_header(raw: RawPeer, cid: int) -> bytes:
    # encode_header refuses > MAX_PAYLOAD: encode the maximum and patch the length, which
    # is the last two bytes in every version (v1 u16, v2/v3 msgpack bin16).
    header = wire.encode_header(
        raw.version, C.CONTENT, cid, MAX_PAYLOAD, wire.ChannelSource.LOCAL if raw.version == 3 else None
    )
    return header[:-2] + (MAX_PAYLOAD + 1).to_bytes(2, "big")


def never_opened(raw: RawPeer, cid: int) -> bytes:
    return raw.frame(C.CONTENT, 99, b"who am I?")


def window_overrun(raw: RawPeer, cid: int) -> bytes:
    assert raw.window is not None
    left = raw.window + 1
    out = []
    while left:
        n = min(left, MAX_PAYLOAD)
        out.append(raw.frame(C.CONTENT, cid, b"o" * n))
        left -= n
    return b"".join(out)


def content_processed(raw: RawPeer, cid: int) -> bytes:
    return raw.frame(C.CONTENT_PROCESSED, cid, wire.encode_content_processed(10))


VIOLATIONS = [
    *(
        pytest.param(p, oversize_header, ("frame payload length 20481 exceeds the 20480-byte maximum",))
        for p in ALL
    ),
    *(
        pytest.param(p, never_opened, ("Content frame for channel 99", "the peer's side never opened"))
        for p in ALL
    ),
    *(pytest.param(p, window_overrun, ("'idle'", "overran its receive window")) for p in FLOW),
    pytest.param(
        "mstream-v1", content_processed, ("ContentProcessed for channel 3", "v1 has no flow control")
    ),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("protocol", "hostile", "problems"), VIOLATIONS)
async def test_protocol_violation_ends_the_session(
    serve: Callable[..., Awaitable[polymux.Server]],
    protocol: str,
    hostile: Callable[[RawPeer, int], bytes],
    problems: tuple[str, ...],
) -> None:
    server = await serve(protocol=protocol)
    raw = await RawPeer.connect(protocol, server.port)
    try:
        await raw.handshake()
        await raw.offer("victim", window=1024)
        idle = await raw.offer("idle")
        session = only_session(server)
        if raw.version >= 2:
            assert raw.window == session.config.receive_window
        reader, writer = await wait(session.accept_channel("victim"))
        pending = [
            asyncio.create_task(reader.read()),
            asyncio.create_task(session.accept_channel("never-offered")),
        ]
        if raw.version >= 2:
            # Past the peer's 1 KiB window and our high-water mark: drain() blocks.
            writer.write(b"w" * (session.config.write_buffer_high + 1024 + 1))
            pending.append(asyncio.create_task(writer.drain()))

        raw.send(hostile(raw, idle))
        await wait(session.wait_closed())

        exc = session.exception
        assert isinstance(exc, polymux.ProtocolError)
        if hostile is window_overrun:
            assert isinstance(exc, polymux.FlowControlError)
        assert exc.format == protocol
        assert str(exc).startswith(f"{protocol}: ")
        for problem in problems:
            assert problem in str(exc)
        await assert_session_dead(session, exc, pending, reader, writer)
        # A channel that was waiting in the backlog fails too when it is taken.
        idle_reader, _idle_writer = await wait(session.accept_channel("idle"))
        with pytest.raises(polymux.SessionClosed):
            await wait(idle_reader.read())
    finally:
        raw.abort()
    await assert_server_still_serves(server, protocol)


async def _truncate_then_eof(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str
) -> tuple[polymux.Server, polymux.Session, list[asyncio.Task[Any]], Any, Any]:
    server = await serve(protocol=protocol)
    raw = await RawPeer.connect(protocol, server.port)
    try:
        await raw.handshake()
        cid = await raw.offer("victim")
        session = only_session(server)
        reader, writer = await wait(session.accept_channel("victim"))
        pending = [
            asyncio.create_task(reader.read()),
            asyncio.create_task(session.accept_channel("never-offered")),
        ]
        frame = raw.frame(C.CONTENT, cid, b"t" * 100)
        raw.send(raw.frame(C.CONTENT, cid, b"complete"))
        raw.send(frame[: len(frame) // 2])
        raw.writer.write_eof()
        await wait(session.wait_closed())
    finally:
        raw.abort()
    return server, session, pending, reader, writer


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_truncated_frame_then_eof_fails_pending_operations(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str
) -> None:
    server, session, pending, reader, writer = await _truncate_then_eof(serve, protocol)
    await assert_session_dead(session, None, pending, reader, writer)
    await assert_server_still_serves(server, protocol)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_truncated_frame_then_eof_is_a_protocol_error(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str
) -> None:
    _server, session, pending, _reader, _writer = await _truncate_then_eof(serve, protocol)
    for task in pending:
        with contextlib.suppress(polymux.SessionClosed):
            await wait(task)
    exc = session.exception
    assert isinstance(exc, polymux.ProtocolError)
    assert str(exc).startswith(f"{protocol}: ")


# -- connection loss and resets ----------------------------------------------------------------


@pytest.mark.timeout(15)
@pytest.mark.parametrize("protocol", ALL)
async def test_connection_loss_fails_every_pending_read_and_drain(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str
) -> None:
    server = await serve(protocol=protocol, receive_window=16 * 1024)
    client = await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol))
    try:
        pairs = [await wait(client.open_channel(f"ch{i}")) for i in range(3)]
        peer = only_session(server)
        # The peer takes the channels but never reads them.
        peer_pairs = [await wait(peer.accept_channel(f"ch{i}")) for i in range(3)]
        assert len(peer_pairs) == 3
        reads = [asyncio.create_task(reader.read(100)) for reader, _ in pairs]
        writer0 = pairs[0][1]
        # v2/v3: past the 16 KiB window plus the high-water mark. v1 has no window: fill the
        # peer's (paused) socket and the kernel's buffers.
        bulk = (
            32 * 1024 * 1024 if protocol == "mstream-v1" else 16 * 1024 + client.config.write_buffer_high + 1
        )
        writer0.write(b"b" * bulk)
        draining = asyncio.create_task(writer0.drain())

        peer.abort()
        await wait(client.wait_closed())

        for task in [*reads, draining]:
            with pytest.raises(polymux.SessionClosed) as info:
                await wait(task)
            assert isinstance(info.value, ConnectionError)
            assert protocol in str(info.value)
        for reader, writer in pairs:
            with pytest.raises(polymux.SessionClosed):
                writer.write(b"after")
            with pytest.raises(polymux.SessionClosed):
                await wait(reader.read())
        with pytest.raises(polymux.SessionClosed):
            await wait(client.open_channel("after"))
    finally:
        client.abort()


async def reset_or_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    if writer.get_extra_info("channel_name") == "doomed":
        await reader.readexactly(5)
        writer.transport.reset("boom: disk full")  # type: ignore[attr-defined]
        return
    with contextlib.suppress(ConnectionError):  # the client's session goes away first
        while data := await reader.read(1024):
            writer.write(data)
        writer.close()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_peer_reset_reaches_the_reader_and_spares_other_channels(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str
) -> None:
    server = await serve(reset_or_echo, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        fine_reader, fine_writer = await wait(client.open_channel("fine"))
        reader, writer = await wait(client.open_channel("doomed"))
        reading = asyncio.create_task(reader.read())
        writer.write(b"hello")
        with pytest.raises(polymux.ChannelReset) as info:
            await wait(reading)
        exc = info.value
        assert isinstance(exc, ConnectionResetError)
        assert isinstance(exc, polymux.ChannelError)
        assert exc.format == protocol
        assert str(exc).startswith(f"{protocol}: ")
        if protocol == "mstream-v1":
            assert exc.message is None  # v1's ChannelTerminated carries no text
        else:
            assert exc.message == "boom: disk full"
            assert "boom: disk full" in str(exc)
        with pytest.raises(polymux.ChannelReset):
            await wait(reader.read())
        with pytest.raises(polymux.ChannelReset):
            writer.write(b"more")

        fine_writer.write(b"still here")
        assert await wait(fine_reader.readexactly(10)) == b"still here"
        again_reader, again_writer = await wait(client.open_channel("again"))
        again_writer.write(b"x")
        assert await wait(again_reader.readexactly(1)) == b"x"
        assert client.exception is None
        assert not client.is_closed


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_peer_reset_names_the_channel(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str
) -> None:
    server = await serve(reset_or_echo, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        reader, writer = await wait(client.open_channel("doomed"))
        writer.write(b"hello")
        with pytest.raises(polymux.ChannelReset) as info:
            await wait(reader.read())
        assert "'doomed'" in str(info.value)
        assert "channel channel" not in str(info.value)


# -- timeouts and limits --------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", HANDSHAKE)
async def test_handshake_timeout(protocol: str) -> None:
    hung_up = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        hung_up.set()
        writer.close()

    raw_server = await asyncio.start_server(silent, "127.0.0.1", 0)
    async with raw_server:
        port = raw_server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(polymux.SessionClosed, match=f"^{protocol}: no handshake") as info:
            await wait(polymux.connect("127.0.0.1", port, protocol=protocol, handshake_timeout=0.3))
        elapsed = loop.time() - started
        assert isinstance(info.value, ConnectionError)
        assert 0.25 <= elapsed < 1.0
        await wait(hung_up.wait())  # the client closed the connection


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_rejected_offer(
    serve: Callable[..., Awaitable[polymux.Server]], echo: Any, protocol: str
) -> None:
    server = await serve(echo, protocol=protocol, offer_filter=lambda name: name != "no")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        with pytest.raises(polymux.ChannelRejected) as info:
            await wait(client.open_channel("no"))
        exc = info.value
        assert isinstance(exc, ConnectionRefusedError)
        assert exc.name == "no"
        assert exc.format == protocol
        assert "'no'" in str(exc)
        assert str(exc).startswith(f"{protocol}: ")
        reader, writer = await wait(client.open_channel("yes"))
        writer.write(b"after")
        assert await wait(reader.readexactly(5)) == b"after"
        assert client.exception is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_accept_backlog(serve: Callable[..., Awaitable[polymux.Server]], protocol: str) -> None:
    server = await serve(protocol=protocol, accept_backlog=2)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        a = await wait(client.open_channel("a"))
        b = await wait(client.open_channel("b"))  # (a dropped StreamWriter closes its channel)
        with pytest.raises(polymux.ChannelRejected) as info:
            await wait(client.open_channel("c"))
        assert info.value.name == "c"
        peer = only_session(server)
        peer_reader, peer_writer = await wait(peer.accept_channel())
        assert peer_writer.get_extra_info("channel_name") == "a"
        d_reader, _d_writer = await wait(client.open_channel("d"))  # room again
        with pytest.raises(polymux.ChannelRejected):
            await wait(client.open_channel("e"))  # b and d wait: full again
        # The accepted channels carry data.
        a[1].write(b"to a")
        assert await wait(peer_reader.readexactly(4)) == b"to a"
        _, peer_d_writer = await wait(peer.accept_channel("d"))
        peer_d_writer.write(b"from d")
        assert await wait(d_reader.readexactly(6)) == b"from d"
        assert b[1].get_extra_info("channel_name") == "b"
        assert client.exception is None
        assert peer.exception is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_max_channels_locally(
    serve: Callable[..., Awaitable[polymux.Server]], echo: Any, protocol: str
) -> None:
    server = await serve(echo, protocol=protocol)
    async with await wait(
        polymux.connect("127.0.0.1", server.port, protocol=protocol, max_channels=2)
    ) as client:
        first_reader, first_writer = await wait(client.open_channel("1"))
        second = await wait(client.open_channel("2"))
        with pytest.raises(polymux.LimitExceeded, match=f"^{protocol}: max_channels=2"):
            await wait(client.open_channel("3"))
        # Once a channel ended on both sides its slot is free again.
        first_writer.write_eof()
        assert await wait(first_reader.read()) == b""
        reader, writer = await wait(client.open_channel("3"))
        writer.write(b"ok")
        assert await wait(reader.readexactly(2)) == b"ok"
        assert second[1].get_extra_info("channel_name") == "2"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_max_channels_of_the_peer(
    serve: Callable[..., Awaitable[polymux.Server]], echo: Any, protocol: str
) -> None:
    server = await serve(echo, protocol=protocol, max_channels=2)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        first = await wait(client.open_channel("1"))
        reader, writer = await wait(client.open_channel("2"))
        with pytest.raises(polymux.ChannelRejected) as info:
            await wait(client.open_channel("3"))
        assert info.value.name == "3"
        writer.write(b"fine")
        assert await wait(reader.readexactly(4)) == b"fine"
        first[1].write(b"also")
        assert await wait(first[0].readexactly(4)) == b"also"
        assert client.exception is None


# -- memory bound --------------------------------------------------------------------------------


@pytest.mark.timeout(15)
@pytest.mark.parametrize("protocol", ALL)
async def test_peer_that_never_reads_cannot_grow_our_buffers(
    serve: Callable[..., Awaitable[polymux.Server]], protocol: str
) -> None:
    server = await serve(protocol=protocol)
    raw = await RawPeer.connect(protocol, server.port)
    try:
        await raw.handshake()
        await raw.offer("sink", window=4096)
        session = only_session(server)
        _reader, writer = await wait(session.accept_channel("sink"))
        # From here on the raw peer reads nothing at all, not even its socket.
        transport = writer.transport
        _low, high = transport.get_write_buffer_limits()
        chunk = b"m" * 16 * 1024
        total = 256 * 1024 * 1024  # more than every buffer between here and the peer
        peak = 0
        written = 0

        async def pump() -> None:
            nonlocal peak, written
            while written < total:
                writer.write(chunk)
                written += len(chunk)
                peak = max(peak, transport.get_write_buffer_size())
                await writer.drain()

        task = asyncio.create_task(pump())
        # Asserting that nothing happens needs a time bound.
        done, _ = await asyncio.wait({task}, timeout=0.5)
        assert not done, "drain() did not block although the peer reads nothing"
        assert written < total
        assert 0 < peak <= high + len(chunk)
        assert transport.get_write_buffer_size() <= high + len(chunk)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        raw.abort()


@pytest.mark.timeout(10)
async def test_a_cancellation_as_the_handshake_completes_is_not_lost() -> None:
    """Ctrl-C (the main task cancelled) at the moment the handshake completes must cancel
    connect(): Python 3.11's asyncio.wait_for returned the result and swallowed the
    cancellation, so `polymux connect` went on transferring after Ctrl-C (1 run in 2 of
    the CLI test on a loaded machine)."""
    from types import SimpleNamespace

    from polymux.aio.client import _ready

    loop = asyncio.get_running_loop()
    aborted: list[bool] = []
    mux = SimpleNamespace(
        ready=loop.create_future(),
        config=SimpleNamespace(handshake_timeout=5.0),
        session=SimpleNamespace(abort=lambda: aborted.append(True)),
        engine=SimpleNamespace(format="yamux"),
    )
    task = asyncio.ensure_future(_ready(mux))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # it waits for the handshake
    mux.ready.set_result(None)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert aborted == [True]  # and the half-made session is not left behind

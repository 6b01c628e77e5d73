"""smux (protocol versions 1 and 2) between polymux sessions over loopback sockets, and
against a hand-driven raw smux peer.

* Many streams each way carry their bytes whole, both versions.
* A half-close keeps unread data: after our FIN and the peer's FIN (the stream is gone from
  the engine) every byte the peer sent is still read (issue 25 item 4: xtaci/smux v1.5.54+
  drops it).
* Version 2: a stream whose reader does not read blocks its writer once the window is used;
  the receiver holds at most its window; other streams keep flowing.
* Keepalive: nothing answers a NOP, so the peer's own frames prove it alive: two idle
  polymux sessions, and a peer that only sends its NOPs more slowly than our
  ``keepalive_timeout``, stay up; a silent peer fails the session.
* smux has no reset: aborting a channel ends it with a FIN (the peer reads EOF).
* Bad input (another protocol version, UPD in version 1, a body on SYN) ends the session with
  a ProtocolError; frames that xtaci itself sends in races (data after FIN, a second FIN, data
  for a stream that is gone) are dropped and the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Self, TypeVar

import pytest

import polymux
from polymux._types import BytesLike
from polymux.aio.channel import ChannelTransport
from polymux.wire.smux import Cmd, Decoder, Frame, encode_header, encode_upd

from .helpers import until


T = TypeVar("T")
Serve = Callable[..., Awaitable[polymux.Server]]

KiB = 1024
MiB = 1024 * KiB
VERSIONS = [pytest.param("smux", id="v1"), pytest.param("smux-v2", id="v2")]


async def wait(aw: Awaitable[T], timeout: float = 10) -> T:  # noqa: ASYNC109
    """Await ``aw``, failing the test instead of hanging."""
    return await asyncio.wait_for(aw, timeout)


def pattern(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo until the peer's end-of-writing, then close."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(64 * KiB):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()


async def round_trip(session: polymux.Session, payload: bytes) -> None:
    """Open a stream to an echoing peer, send ``payload`` and half-close while reading the
    echo; the echo must be exact."""
    reader, writer = await wait(session.open_channel())

    async def send() -> None:
        view = memoryview(payload)
        for off in range(0, len(payload), 256 * KiB):
            writer.write(view[off : off + 256 * KiB])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.create_task(send())
    echoed = await wait(reader.read(), 60)
    await wait(sender)
    assert echoed == payload
    writer.close()


def server_channel(server: polymux.Server, name: str) -> ChannelTransport:
    (session,) = server.sessions
    for channel in session.mux._channels.values():
        if channel.name == name:
            return channel
    raise AssertionError(f"no channel {name!r}")


def held(channel: ChannelTransport) -> int:
    """Bytes a channel holds received and unread."""
    assert channel._reader is not None
    return len(channel._reader._buffer) + (channel._inbox.size if channel._inbox is not None else 0)


# -- 1. data both ways ---------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_many_streams_both_ways(serve: Serve, protocol: str) -> None:
    server = await serve(echo, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as session:
        sizes = [0, 1, 65535, 65536, 300 * KiB, 3 * MiB]
        await wait(asyncio.gather(*(round_trip(session, pattern(n, i)) for i, n in enumerate(sizes))), 60)
        # The server opens one to the client too (even id), and the client echoes it.
        (server_session,) = server.sessions
        s_reader, s_writer = await wait(server_session.open_channel())
        assert s_writer.get_extra_info("channel_name") == "2"
        c_reader, c_writer = await wait(session.accept_channel())
        assert c_writer.get_extra_info("channel_name") == "2"
        echoing = asyncio.create_task(echo(c_reader, c_writer))
        payload = pattern(2 * MiB, 99)
        s_writer.write(payload)
        s_writer.write_eof()
        assert await wait(s_reader.read(), 30) == payload
        await wait(echoing)
        assert session.exception is None and server_session.exception is None


# -- 2. half-close keeps unread data -------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_half_close_keeps_unread_data(serve: Serve, protocol: str) -> None:
    """We write, half-close, and read nothing until the peer has answered 900 KiB in many
    frames AND ended its side, so the stream is gone from the engine; then every byte is
    still there (xtaci/smux v1.5.54+ drops unread bytes at that point)."""
    reply = pattern(900 * KiB, 5)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.read()
        writer.write(hashlib.sha256(request).digest() + reply)
        await writer.drain()
        writer.close()

    server = await serve(answer, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as session:
        reader, writer = await wait(session.open_channel())
        handle = writer.transport.handle  # type: ignore[attr-defined]
        request = pattern(100 * KiB, 6)
        writer.write(request)
        writer.write_eof()
        await until(lambda: not session.engine.is_live(handle))  # both FINs are through
        assert await wait(reader.read()) == hashlib.sha256(request).digest() + reply
        assert session.exception is None


# -- 3. version 2: the window bounds a stream that is not read -------------------------------


@pytest.mark.timeout(60)
async def test_v2_drain_blocks_at_the_window_while_another_stream_flows(serve: Serve) -> None:
    release = asyncio.Event()
    counts: dict[str, int] = {}

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = writer.get_extra_info("channel_name")
        if name != "3":
            await echo(reader, writer)
            return
        await release.wait()
        digest = hashlib.sha256()
        counts[name] = 0
        while data := await reader.read(256 * KiB):
            counts[name] += len(data)
            digest.update(data)
        writer.write(digest.hexdigest().encode())
        writer.close()

    server = await serve(handler, protocol="smux-v2")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="smux-v2")) as session:
        reader, writer = await wait(session.open_channel())
        assert writer.get_extra_info("channel_name") == "3"
        handle = writer.transport.handle  # type: ignore[attr-defined]
        chunk = pattern(32 * KiB, 2)
        sent = hashlib.sha256()
        written = 0

        async def write_all() -> None:
            nonlocal written
            while written < 6 * MiB:
                writer.write(chunk)
                sent.update(chunk)
                written += len(chunk)
                await writer.drain()

        task = asyncio.create_task(write_all())
        await until(lambda: session.engine.send_credit(handle) == 0)
        channel = server_channel(server, "3")
        (server_session,) = server.sessions
        window = server_session.engine._channels[channel.handle].recv.window  # type: ignore[union-attr]
        assert window == MiB  # receive_window, announced at accept
        await until(lambda: held(channel) == window)
        await round_trip(session, pattern(3 * MiB, 3))  # another stream flows meanwhile
        assert not task.done() and held(channel) == window
        release.set()
        await wait(task, 30)
        writer.write_eof()
        assert await wait(reader.read(), 30) == sent.hexdigest().encode()
        assert counts["3"] == written == 6 * MiB


@pytest.mark.timeout(60)
async def test_v1_slow_reader_gets_every_byte(serve: Serve) -> None:
    """Version 1 has no window: the session stops reading the connection for a slow reader
    (the slow-reader policy) and nothing is lost."""

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        digest = hashlib.sha256()
        while data := await reader.read(16 * KiB):
            digest.update(data)
            await asyncio.sleep(0)
        writer.write(digest.hexdigest().encode())
        writer.close()

    server = await serve(slow, protocol="smux", receive_window=256 * KiB)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="smux")) as session:
        reader, writer = await wait(session.open_channel())
        payload = pattern(8 * MiB, 4)
        writer.write(payload)
        await wait(writer.drain(), 30)
        writer.write_eof()
        assert await wait(reader.read(), 30) == hashlib.sha256(payload).hexdigest().encode()


# -- 4. keepalive --------------------------------------------------------------------------


class NopCounter:
    """A capture sink that counts the NOPs a session receives."""

    def __init__(self, version: int) -> None:
        self.decoder = Decoder(version)
        self.nops = 0

    def __call__(self, info: Mapping[str, str]) -> NopCounter:
        return self

    def received(self, data: BytesLike) -> None:
        self.nops += sum(1 for f in self.decoder.feed(bytes(data)) if f.cmd == Cmd.NOP)

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        return

    def close(self) -> None:
        return


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_idle_polymux_sessions_keep_each_other_alive(serve: Serve, protocol: str) -> None:
    """Nothing answers a NOP: each side's ping waits for the other's next NOP, which comes
    about one keepalive interval later, after keepalive_timeout (as long as an interval
    here) has passed, but within interval + timeout, so neither side gives up."""
    options = {"keepalive_interval": 0.1, "keepalive_timeout": 0.1}
    server = await serve(echo, protocol=protocol, **options)
    counter = NopCounter(1 if protocol == "smux" else 2)
    async with await wait(
        polymux.connect("127.0.0.1", server.port, protocol=protocol, capture=counter, **options)
    ) as session:
        await until(lambda: counter.nops >= 15)
        assert not session.is_closed and session.exception is None
        (server_session,) = server.sessions
        assert not server_session.is_closed
        with pytest.raises(polymux.PolymuxError, match="has no ping"):
            await session.ping()
        await round_trip(session, b"still here")


class RawServer:
    """A raw TCP server speaking smux by hand: it records what it receives and, every
    ``nop_every`` seconds (if given), sends a NOP of ``version``."""

    def __init__(self, version: int = 1, nop_every: float | None = None) -> None:
        self.version = version
        self.nop_every = nop_every
        self.received = bytearray()
        self.eof = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.close()
        await wait(self.server.wait_closed())

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ticker = None
        if self.nop_every is not None:
            ticker = asyncio.create_task(self._tick(writer, self.nop_every))
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(64 * KiB):
                self.received += data
        self.eof.set()
        if ticker is not None:
            ticker.cancel()
        writer.close()

    async def _tick(self, writer: asyncio.StreamWriter, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            writer.write(encode_header(self.version, Cmd.NOP, 0))

    def frames(self) -> list[Frame]:
        return Decoder(self.version).feed(bytes(self.received))


@pytest.mark.timeout(20)
async def test_silent_peer_fails_the_session() -> None:
    async with RawServer() as peer:
        started = time.monotonic()
        session = await wait(
            polymux.connect(
                "127.0.0.1", peer.port, protocol="smux", keepalive_interval=0.2, keepalive_timeout=0.3
            )
        )
        reader, _writer = await wait(session.open_channel())
        with pytest.raises(polymux.SessionClosed) as info:
            await wait(reader.read(), 10)
        elapsed = time.monotonic() - started
        assert "keepalive" in str(info.value) and "smux" in str(info.value)
        # interval + (interval + timeout): one keepalive interval more than formats whose
        # pings are answered
        assert 0.65 <= elapsed < 4.0, elapsed
        await wait(peer.eof.wait())
        nops = [f for f in peer.frames() if f.cmd == Cmd.NOP]
        assert len(nops) >= 2 and all(f.stream_id == 0 for f in nops)


@pytest.mark.timeout(20)
async def test_a_peer_whose_nops_are_slower_than_our_timeout_stays_alive() -> None:
    """xtaci's rule: any frame proves the peer alive. Its NOP every 0.15 s comes later than
    our keepalive_timeout of 0.05 s after our ping (twice that: the keepalive waits longer
    while its own ping is unsent), but within one keepalive interval (0.2 s) more."""
    async with RawServer(nop_every=0.15) as peer:
        session = await wait(
            polymux.connect(
                "127.0.0.1", peer.port, protocol="smux", keepalive_interval=0.2, keepalive_timeout=0.05
            )
        )
        await until(lambda: sum(1 for f in peer.frames() if f.cmd == Cmd.NOP) >= 8)
        assert not session.is_closed and session.exception is None
        await wait(session.aclose())


# -- 5. abort is a FIN ---------------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_abort_ends_the_peers_reading_with_eof(serve: Serve, protocol: str) -> None:
    ended: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if writer.get_extra_info("channel_name") != "3":
            await echo(reader, writer)
            return
        data = await reader.read()  # smux has no reset: the abort reads as the end
        writer.write(b"into the void" * 1000)
        await writer.drain()
        ended.set_result(data)
        writer.close()

    server = await serve(handler, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as session:
        _reader, writer = await wait(session.open_channel())
        writer.write(b"partial")
        await wait(writer.drain())
        writer.transport.abort()
        assert await wait(ended) == b"partial"
        await round_trip(session, b"the session goes on")  # what followed the abort was dropped
        assert session.exception is None


# -- 6. a raw peer: bad input, and xtaci's races -------------------------------------------


class RawSmux:
    """The client end of an smux connection, driven frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        self._decoder = Decoder(version)
        self._frames: deque[Frame] = deque()

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    async def receive(self) -> Frame:
        while not self._frames:
            data = await wait(self.reader.read(64 * KiB))
            if not data:
                raise EOFError("polymux closed the connection")
            for frame in self._decoder.feed(data):
                self._frames.append(frame._replace(body=bytes(frame.body)))
        return self._frames.popleft()

    async def stream(self, sid: int) -> tuple[bytes, bool]:
        """The data polymux sends on ``sid`` up to its FIN."""
        data = b""
        while True:
            frame = await self.receive()
            if frame.stream_id != sid:
                continue
            if frame.cmd == Cmd.PSH:
                data += bytes(frame.body)
            if frame.cmd == Cmd.FIN:
                return data, True

    def close(self) -> None:
        self.writer.close()


def f(version: int, cmd: int, sid: int, body: bytes = b"") -> bytes:
    return encode_header(version, cmd, sid, len(body)) + body


async def raw_session(server: polymux.Server, version: int) -> tuple[RawSmux, polymux.Session]:
    reader, writer = await wait(asyncio.open_connection("127.0.0.1", server.port))
    raw = RawSmux(reader, writer, version)
    sockname = writer.get_extra_info("sockname")

    def find() -> polymux.Session | None:
        return next((s for s in server.sessions if s.get_extra_info("peername") == sockname), None)

    await until(lambda: find() is not None)
    session = find()
    assert session is not None
    return raw, session


async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read nothing until the session ends."""
    await writer.get_extra_info("session").wait_closed()


BAD = [
    pytest.param("smux-v2", [f(1, Cmd.SYN, 3)], "version is 1, expected 2", id="v1-frame-to-v2"),
    pytest.param("smux", [f(2, Cmd.SYN, 3)], "version is 2, expected 1", id="v2-frame-to-v1"),
    pytest.param(
        "smux", [f(1, Cmd.SYN, 3), f(1, Cmd.UPD, 3, bytes(8))], "UPD (cmd 4) on stream 3", id="upd-in-v1"
    ),
    pytest.param("smux", [f(1, Cmd.SYN, 3, b"x")], "SYN frame length is 1", id="syn-with-body"),
    pytest.param("smux", [f(1, Cmd.SYN, 2)], "SYN for stream 2, an id of our parity", id="wrong-parity"),
    pytest.param(
        "smux",
        [f(1, Cmd.SYN, 3), f(1, Cmd.SYN, 3)],
        "SYN for stream 3, which is already open",
        id="syn-twice",
    ),
    pytest.param("smux", [f(1, Cmd.PSH, 9, b"x")], "stream 9, which was never opened", id="never-opened"),
    pytest.param(
        "smux-v2",
        [f(2, Cmd.SYN, 3), f(2, Cmd.PSH, 3, b"h" * 40_000) * 7],
        "overran its receive window",
        id="window-overrun",
    ),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("protocol", "frames", "problem"), BAD)
async def test_bad_input_ends_the_session(
    serve: Serve, protocol: str, frames: list[bytes], problem: str
) -> None:
    server = await serve(hold, protocol=protocol, receive_window=256 * KiB)
    version = 1 if protocol == "smux" else 2
    raw, session = await raw_session(server, version)
    raw.send(*frames)
    await wait(session.wait_closed())
    exc = session.exception
    assert isinstance(exc, polymux.ProtocolError)
    assert exc.format == protocol and str(exc).startswith(protocol + ": ")
    assert problem in str(exc)
    raw.close()
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        _reader, writer = await wait(client.open_channel())  # the server goes on serving
        assert client.exception is None
        writer.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_what_xtaci_sends_in_races_is_dropped(serve: Serve, protocol: str) -> None:
    """Data after a FIN, a second FIN, data and a UPD for a stream that is gone: dropped,
    and the session goes on (xtaci's writers send such frames when a stream is closed during
    a write, and ``Close()`` after ``CloseWrite()`` sends a second FIN)."""
    version = 1 if protocol == "smux" else 2
    server = await serve(echo, protocol=protocol)
    raw, session = await raw_session(server, version)
    raw.send(f(version, Cmd.SYN, 3), f(version, Cmd.PSH, 3, b"echo me"), f(version, Cmd.FIN, 3))
    raw.send(f(version, Cmd.PSH, 3, b"late"), f(version, Cmd.FIN, 3), f(version, Cmd.NOP, 0))
    assert await wait(raw.stream(3)) == (b"echo me", True)
    # stream 3 is gone both ways now
    late = [f(version, Cmd.PSH, 3, b"gone"), f(version, Cmd.FIN, 3)]
    if version == 2:
        late.append(encode_upd(2, 3, 0, 1 << 20))
    raw.send(*late, f(version, Cmd.SYN, 5), f(version, Cmd.PSH, 5, b"next"), f(version, Cmd.FIN, 5))
    assert await wait(raw.stream(5)) == (b"next", True)
    assert not session.is_closed and session.exception is None
    raw.close()

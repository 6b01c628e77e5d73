"""yamux over real loopback sockets: flow control, window auto-tuning, pings and
keepalive, GoAway, the stream-open timeout, bad input and the accept backlog.

* A stream whose reader does not read blocks its writer once the peer's 256 KiB window
  is used; the receiver holds at most that window; other streams keep flowing.
* A reader that keeps up makes the window grow (up to ``max_receive_window``); a slow
  one keeps it at 256 KiB.
* A peer that never answers pings fails the session after ``keepalive_timeout``.
* GoAway (``aclose()``) refuses new streams but lets open ones finish, both ways.
* A stream the peer never acknowledges is reset after ``stream_open_timeout``.
* Protocol violations end the session with a GoAway(protocol error) and a
  :class:`polymux.ProtocolError`; the server goes on serving other sessions.

A :class:`RawYamux` is a hand-driven yamux peer on a plain asyncio stream: it writes
exactly the frames a test crafts (with the codec's own ``encode_header``) and decodes what
polymux sends with the codec's own ``Decoder``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Self, TypeVar

import pytest

import polymux
from polymux.aio.channel import ChannelTransport
from polymux.aio.session import MuxProtocol
from polymux.engine.yamux import YamuxEngine
from polymux.wire.yamux import HEADER, Decoder, Flag, Frame, GoAwayCode, Type, encode_header

from .helpers import until


T = TypeVar("T")
Serve = Callable[..., Awaitable[polymux.Server]]

KiB = 1024
MiB = 1024 * KiB
WINDOW = 256 * KiB
"""yamux's initial window, each way, of every stream."""


# -- helpers -------------------------------------------------------------------------------


async def wait(aw: Awaitable[T], timeout: float = 5) -> T:  # noqa: ASYNC109
    """Await ``aw``, failing the test instead of hanging."""
    return await asyncio.wait_for(aw, timeout)


def pattern(size: int, seed: int = 1) -> bytes:
    """``size`` reproducible pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest().encode()


def client_handle(writer: asyncio.StreamWriter) -> int:
    transport = writer.transport
    assert isinstance(transport, ChannelTransport)
    return transport.handle


def server_channel(session: polymux.Session, name: str) -> ChannelTransport:
    """The transport of the live channel named ``name`` (yamux: the stream id) of ``session``."""
    for channel in session.mux._channels.values():
        if channel.name == name:
            return channel
    raise AssertionError(f"no channel {name!r}")


def held(channel: ChannelTransport) -> int:
    """Bytes a channel holds received and unread: its reader's buffer plus its backlog."""
    assert channel._reader is not None
    return len(channel._reader._buffer) + (channel._inbox.size if channel._inbox is not None else 0)


def track_held(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Record, per server-side channel name, the most bytes it ever held unread."""
    peaks: dict[str, int] = {}
    original = MuxProtocol.data_received

    def received(self: MuxProtocol, data: bytes) -> None:
        original(self, data)  # (data frames go straight into the channels' inboxes)
        if self.is_client:
            return
        for channel in self._channels.values():
            if channel._reader is not None and not channel._done:
                peaks[channel.name] = max(peaks.get(channel.name, 0), held(channel))

    monkeypatch.setattr(MuxProtocol, "data_received", received)
    return peaks


def track_windows(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Record, per stream id, the largest receive window a *server* engine ever had for it
    (windows only change in ``ack_consumed``)."""
    peaks: dict[int, int] = {}
    original = YamuxEngine.ack_consumed

    def ack_consumed(self: YamuxEngine, channel: int, n: int) -> None:
        original(self, channel, n)
        record = self._channels.get(channel)
        if not self.is_client and record is not None and record.recv is not None:
            peaks[record.wire_id] = max(peaks.get(record.wire_id, 0), record.recv.window)

    monkeypatch.setattr(YamuxEngine, "ack_consumed", ack_consumed)
    return peaks


async def write_all(writer: asyncio.StreamWriter, data: bytes, progress: list[int] | None = None) -> None:
    """Write ``data`` in 1 MiB pieces, draining after each."""
    view = memoryview(data)
    for off in range(0, len(data), MiB):
        piece = view[off : off + MiB]
        writer.write(piece)
        await writer.drain()
        if progress is not None:
            progress[0] += len(piece)


async def read_all(reader: asyncio.StreamReader, into: bytearray) -> bytes:
    """Read to EOF into ``into`` (so a test can watch the progress); return it all."""
    while data := await reader.read(256 * KiB):
        into += data
    return bytes(into)


async def echo_round_trip(session: polymux.Session, payload: bytes) -> None:
    """Open a stream to an echoing peer, send ``payload``, read it back whole, then EOF."""
    reader, writer = await wait(session.open_channel())
    sender = asyncio.create_task(write_all(writer, payload))
    echoed = await wait(reader.readexactly(len(payload)), 30)
    await wait(sender)
    writer.write_eof()
    assert echoed == payload
    assert await wait(reader.read()) == b""
    writer.close()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo until the peer's end-of-writing, then close."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(64 * KiB):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()


# -- 1. backpressure -----------------------------------------------------------------------


class Peer:
    """Server side: streams named in ``slow`` (yamux names a stream by its id) are not
    read until ``release`` is set, then hashed: the SHA-256 hex digest of what they read
    is the answer. Every other stream echoes."""

    def __init__(self, *slow: str) -> None:
        self.slow = set(slow)
        self.release = asyncio.Event()
        self.counts: dict[str, int] = {}

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = writer.get_extra_info("channel_name")
        self.counts[name] = 0
        if name not in self.slow:
            await echo(reader, writer)
            return
        await self.release.wait()
        digest = hashlib.sha256()
        while data := await reader.read(256 * KiB):
            self.counts[name] += len(data)
            digest.update(data)
        writer.write(digest.hexdigest().encode())
        writer.close()


@pytest.mark.timeout(60)
async def test_drain_blocks_at_the_window_while_another_stream_flows(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    peaks = track_held(monkeypatch)
    peer = Peer("1")
    server = await serve(peer, protocol="yamux")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as session:
        reader, writer = await wait(session.open_channel())
        assert writer.get_extra_info("channel_name") == "1"
        handle = client_handle(writer)
        transport = writer.transport
        low, high = transport.get_write_buffer_limits()
        chunk = pattern(32 * KiB, seed=2)
        sent = hashlib.sha256()
        written = 0

        async def write_forever() -> None:
            nonlocal written
            while written < 8 * MiB:
                writer.write(chunk)
                sent.update(chunk)
                written += len(chunk)
                await writer.drain()

        task = asyncio.create_task(write_forever())
        # Blocked: no credit left, and the buffer stays above the low-water mark.
        await until(
            lambda: session.engine.send_credit(handle) == 0 and transport.get_write_buffer_size() > low
        )
        assert not task.done()
        assert written <= WINDOW + high + len(chunk)
        (server_session,) = server.sessions
        channel = server_channel(server_session, "1")
        # The receiver got the whole window, and holds no more than it.
        await until(lambda: held(channel) == WINDOW)
        record = server_session.engine._channels[channel.handle]
        assert record.recv is not None
        assert record.recv.window == WINDOW  # no growth: the reader does not keep up

        # Meanwhile a second stream moves 4 MiB both ways.
        await echo_round_trip(session, pattern(4 * MiB, seed=3))
        assert not task.done()
        assert session.engine.send_credit(handle) == 0
        assert held(channel) == WINDOW
        assert peaks["1"] == WINDOW
        assert record.recv.window == WINDOW
        assert session.engine._channels[handle].send.available == 0

        # Release the reader: the writer completes and every byte arrives intact.
        peer.release.set()
        await wait(task, 30)
        writer.write_eof()
        assert await wait(reader.read(), 30) == sent.hexdigest().encode()
        assert peer.counts["1"] == written == 8 * MiB
        writer.close()
        assert session.exception is None
        assert server_session.exception is None


# -- 2. window auto-tuning, rtt ------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("max_window", [4 * MiB, 3 * WINDOW], ids=["4MiB", "768KiB"])
async def test_window_grows_for_a_fast_reader_up_to_max_receive_window(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, max_window: int
) -> None:
    """768 KiB is not a doubling of 256 KiB: the last step is clamped to the maximum."""
    windows = track_windows(monkeypatch)
    received = [0]

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        digest = hashlib.sha256()
        while data := await reader.read(256 * KiB):
            received[0] += len(data)
            digest.update(data)
        writer.write(digest.hexdigest().encode())
        writer.close()

    server = await serve(sink, protocol="yamux", max_receive_window=max_window)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as session:
        payload = pattern(64 * MiB, seed=4)
        reader, writer = await wait(session.open_channel())
        handle = client_handle(writer)
        await wait(write_all(writer, payload), 30)
        await until(lambda: received[0] == len(payload), timeout=30)
        # The stream is still open (no FIN yet): both ends' records are live.
        (server_session,) = server.sessions
        recv = server_session.engine._channels[server_channel(server_session, "1").handle].recv
        assert recv is not None
        send = session.engine._channels[handle].send
        print(f"yamux window after 64 MiB: {recv.window} (peak {windows[1]}, max {max_window})")
        assert WINDOW < recv.window <= max_window
        assert WINDOW < windows[1] <= max_window
        # The sender sees every increment: its credit is the receiver's window less what
        # the receiver holds unacknowledged. (``send.window`` counts every increment ever
        # granted, credit returns included, so it is not the receive window itself.)
        await until(lambda: send.available == recv.window - recv.outstanding)
        assert WINDOW < send.available <= max_window
        writer.write_eof()
        assert await wait(reader.read(), 30) == sha(payload)
        writer.close()


@pytest.mark.timeout(60)
def test_rtt_and_window_growth_under_uvloop() -> None:
    """uvloop's ``loop.time()`` has millisecond resolution: the engines' clock must not be it,
    or a loopback RTT measures 0 and the window never grows (a 256 KiB window halved yamux's
    bulk throughput)."""
    import uvloop  # the dev extra has it

    sizes: list[int] = []

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        assert isinstance(transport, ChannelTransport)
        n = 0
        while data := await reader.read(256 * KiB):
            n += len(data)
        recv = transport._core.engine._channels[transport.handle].recv
        assert recv is not None
        sizes.append(recv.window)
        writer.write(str(n).encode())
        writer.close()

    async def main() -> None:
        server = await polymux.start_server(sink, "127.0.0.1", 0, protocol="yamux")
        try:
            async with await polymux.connect("127.0.0.1", server.port, protocol="yamux") as session:
                await until(lambda: session.rtt is not None)
                rtts = [session.rtt, await session.ping(), await session.ping()]
                # Sub-millisecond figures: a millisecond clock gives 0.0 or 0.001 exactly.
                assert all(r is not None and r > 0 and r * 1000 % 1 != 0 for r in rtts), rtts
                reader, writer = await session.open_channel()
                chunk = bytes(64 * KiB)
                for _ in range(512):  # 32 MiB
                    writer.write(chunk)
                    await writer.drain()
                writer.write_eof()
                assert await reader.read() == str(32 * MiB).encode()
                writer.close()
        finally:
            server.close()
            await server.wait_closed()

    uvloop.run(asyncio.wait_for(main(), 50))
    assert sizes and sizes[0] > WINDOW, sizes  # the reader kept up: the window grew


@pytest.mark.timeout(60)
async def test_window_stays_at_256k_for_a_slow_reader(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader takes one small piece each time the test opens its gate; the test opens it
    only once more than 4 RTTs have passed since the reader last returned credit, so the
    reader is slow by the auto-tuning's own measure."""
    windows = track_windows(monkeypatch)
    gate = asyncio.Event()
    parked = asyncio.Event()
    readers: list[asyncio.StreamReader] = []
    finished = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        readers.append(reader)
        digest = hashlib.sha256()
        while True:
            parked.set()
            await gate.wait()
            gate.clear()
            data = await reader.read(32 * KiB)
            if not data:
                break
            digest.update(data)
        finished.set()
        parked.set()
        writer.write(digest.hexdigest().encode())
        writer.close()

    server = await serve(slow, protocol="yamux", max_receive_window=4 * MiB)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as session:
        payload = pattern(2 * MiB, seed=5)
        reader, writer = await wait(session.open_channel())
        handle = client_handle(writer)

        async def send() -> None:
            await write_all(writer, payload)
            writer.write_eof()

        sender = asyncio.create_task(send())
        await until(lambda: bool(readers))
        (server_session,) = server.sessions
        engine = server_session.engine
        assert isinstance(engine, YamuxEngine)
        record = engine._channels[server_channel(server_session, "1").handle]
        loop = asyncio.get_running_loop()

        def slow_enough() -> bool:
            epoch = record.epoch
            assert isinstance(epoch, (int, float))
            return engine.rtt is not None and loop.time() - epoch > 4 * engine.rtt

        async def pace() -> None:
            while True:
                await parked.wait()
                parked.clear()
                if finished.is_set():
                    return
                await until(slow_enough)
                assert record.recv is not None
                assert record.recv.window == WINDOW
                assert session.engine._channels[handle].send.available <= WINDOW
                gate.set()

        # (gather: a failed check in pace() ends the test at once instead of stalling it)
        _, answer, _ = await wait(asyncio.gather(sender, reader.read(), pace()), 30)
        assert answer == sha(payload)
        assert windows[1] == WINDOW
        writer.close()


@pytest.mark.timeout(10)
async def test_ping_measures_the_rtt(serve: Serve) -> None:
    server = await serve(echo, protocol="yamux")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as session:
        rtt = await wait(session.ping())
        assert isinstance(rtt, float)
        assert rtt > 0
        assert isinstance(session.rtt, float)
        assert session.rtt > 0
        # The server measures its own (it pings when the connection is made).
        (server_session,) = server.sessions
        assert await wait(server_session.ping()) > 0
        assert isinstance(server_session.rtt, float)


# -- 3. keepalive --------------------------------------------------------------------------


class SilentServer:
    """A raw TCP server that reads everything and never answers."""

    def __init__(self) -> None:
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
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(64 * KiB):
                self.received += data
        self.eof.set()
        writer.close()

    def frames(self) -> list[Frame]:
        return Decoder(16 * MiB).feed(bytes(self.received))


async def keepalive_failure() -> tuple[polymux.Session, polymux.SessionClosed, float]:
    """Against a silent peer: the session fails, a pending read raises; returns the
    session, the read's error and the seconds it took."""
    async with SilentServer() as peer:
        started = time.monotonic()
        session = await wait(
            polymux.connect(
                "127.0.0.1", peer.port, protocol="yamux", keepalive_interval=0.2, keepalive_timeout=0.3
            )
        )
        reader, _writer = await wait(session.open_channel())
        with pytest.raises(polymux.SessionClosed) as info:
            await wait(reader.read(), 5)
        elapsed = time.monotonic() - started
        await wait(session.wait_closed())
        await wait(peer.eof.wait())  # polymux closed the connection
        pings = [f for f in peer.frames() if f.type == Type.PING and f.flags & Flag.SYN]
        assert len(pings) >= 2  # the RTT ping at once, then a keepalive ping
        return session, info.value, elapsed


@pytest.mark.timeout(10)
async def test_keepalive_fails_the_session_when_the_peer_never_answers() -> None:
    session, exc, elapsed = await keepalive_failure()
    assert "keepalive" in str(exc)
    assert "yamux" in str(exc)
    assert 0.45 <= elapsed < 2.0, elapsed  # interval + timeout, then at once
    assert session.is_closed
    with pytest.raises(polymux.SessionClosed):
        await wait(session.open_channel())


@pytest.mark.timeout(10)
async def test_keepalive_failure_is_the_session_exception() -> None:
    session, exc, _elapsed = await keepalive_failure()
    assert session.exception is not None
    assert session.exception in (exc, exc.__cause__)
    assert "keepalive" in str(session.exception)


@pytest.mark.timeout(10)
async def test_ping_to_a_dead_peer_raises_after_keepalive_timeout() -> None:
    async with SilentServer() as peer:
        session = await wait(
            polymux.connect(
                "127.0.0.1", peer.port, protocol="yamux", keepalive_interval=None, keepalive_timeout=0.3
            )
        )
        started = time.monotonic()
        with pytest.raises(polymux.SessionClosed) as info:
            await wait(session.ping())
        elapsed = time.monotonic() - started
        assert 0.3 <= elapsed < 2.0, elapsed
        assert "yamux" in str(info.value)
        assert "ping" in str(info.value)
        await wait(session.aclose())


# -- 4. GoAway -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_server_goaway_mid_transfer_loses_nothing(serve: Serve) -> None:
    go = asyncio.Event()
    server_sessions: list[polymux.Session] = []

    async def leave_when_told(session: polymux.Session) -> None:
        server_sessions.append(session)
        await go.wait()
        await session.aclose()

    server = await serve(echo, protocol="yamux", session_handler=leave_when_told)
    session = await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux"))
    payload = pattern(16 * MiB, seed=6)
    half = len(payload) // 2
    reader, writer = await wait(session.open_channel())
    resume = asyncio.Event()

    async def send() -> None:
        await write_all(writer, payload[:half])
        await resume.wait()
        await write_all(writer, payload[half:])
        writer.write_eof()

    echoed = bytearray()
    sender = asyncio.create_task(send())
    receiver = asyncio.create_task(read_all(reader, echoed))
    await until(lambda: len(echoed) >= 4 * MiB, timeout=20)
    go.set()  # the server says GoAway now, mid-transfer
    await until(lambda: session.mux._peer_goaway is not None)
    with pytest.raises(polymux.SessionClosed, match="going away"):
        await wait(session.open_channel())
    assert len(echoed) < len(payload)
    resume.set()  # the open stream goes on, both ways
    await wait(sender, 30)
    assert await wait(receiver, 30) == payload
    # Then the session ends cleanly.
    await wait(session.wait_closed(), 15)
    assert session.exception is None
    (server_session,) = server_sessions
    await wait(server_session.wait_closed())
    assert server_session.exception is None
    await until(lambda: not server.sessions)


@pytest.mark.timeout(60)
async def test_client_aclose_with_open_streams_sends_goaway_and_lets_them_finish(serve: Serve) -> None:
    server_sessions: list[polymux.Session] = []
    server = await serve(echo, protocol="yamux", session_handler=server_sessions.append)
    session = await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux"))
    payloads = [pattern(2 * MiB, seed=10 + i) for i in range(3)]
    resume = asyncio.Event()
    echoed = [bytearray() for _ in payloads]

    async def stream(payload: bytes, into: bytearray) -> bytes:
        reader, writer = await session.open_channel()
        receiver = asyncio.create_task(read_all(reader, into))
        await write_all(writer, payload[: MiB // 2])
        await resume.wait()
        await write_all(writer, payload[MiB // 2 :])
        writer.write_eof()
        return await receiver

    tasks = [asyncio.create_task(stream(p, e)) for p, e in zip(payloads, echoed, strict=True)]
    await until(lambda: all(len(e) > 0 for e in echoed))
    closer = asyncio.create_task(session.aclose())
    (server_session,) = server_sessions
    await until(lambda: server_session.mux._peer_goaway is not None)
    assert server_session.engine.remote_goaway == GoAwayCode.NORMAL  # type: ignore[attr-defined]
    with pytest.raises(polymux.SessionClosed, match="going away"):
        await wait(server_session.open_channel())
    with pytest.raises(polymux.SessionClosed):
        await wait(session.open_channel())  # we are closing
    assert not closer.done()  # aclose waits for the open streams
    resume.set()
    results = await wait(asyncio.gather(*tasks), 30)
    assert results == payloads
    await wait(closer, 15)
    assert session.is_closed
    assert session.exception is None
    await wait(server_session.wait_closed())
    assert server_session.exception is None


@pytest.mark.timeout(30)
async def test_ping_still_works_after_the_peers_goaway(serve: Serve) -> None:
    go = asyncio.Event()

    async def leave_when_told(session: polymux.Session) -> None:
        await go.wait()
        await session.aclose()

    server = await serve(echo, protocol="yamux", session_handler=leave_when_told)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as session:
        reader, writer = await wait(session.open_channel())
        writer.write(b"x")
        assert await wait(reader.readexactly(1)) == b"x"
        go.set()
        await until(lambda: session.mux._peer_goaway is not None)
        try:
            assert await wait(session.ping()) > 0  # the stream is open: so is the session
        finally:
            writer.write_eof()
            assert await wait(reader.read()) == b""
            await wait(session.wait_closed())


@pytest.mark.timeout(30)
async def test_aclose_after_the_peers_goaway_lets_open_streams_finish(serve: Serve) -> None:
    server_sessions: list[polymux.Session] = []
    server = await serve(echo, protocol="yamux", session_handler=server_sessions.append)
    session = await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux"))
    payload = pattern(2 * MiB, seed=20)
    reader, writer = await wait(session.open_channel())
    echoed = bytearray()
    receiver = asyncio.create_task(read_all(reader, echoed))
    tasks = [receiver]
    try:
        await wait(write_all(writer, payload[:MiB]))
        await until(lambda: len(echoed) > 0)
        tasks.append(asyncio.create_task(session.aclose()))  # GoAway from the client
        (server_session,) = server_sessions
        await until(lambda: server_session.mux._peer_goaway is not None)
        tasks.append(asyncio.create_task(server_session.aclose()))  # and then from the server
        # Both sides are closing gracefully: the open stream may still finish.
        await wait(write_all(writer, payload[MiB:]))
        writer.write_eof()
        assert await wait(receiver, 30) == payload
        await wait(asyncio.gather(*tasks[1:]), 15)
        assert session.exception is None
        assert server_session.exception is None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        session.abort()


@pytest.mark.timeout(10)
async def test_peers_goaway_with_protocol_error_is_reported() -> None:
    async def complain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(header(Type.GO_AWAY, 0, 0, GoAwayCode.PROTOCOL_ERROR))
        writer.write_eof()
        with contextlib.suppress(ConnectionError):
            while await reader.read(64 * KiB):
                pass
        writer.close()

    raw = await asyncio.start_server(complain, "127.0.0.1", 0)
    async with raw:
        port = raw.sockets[0].getsockname()[1]
        session = await wait(polymux.connect("127.0.0.1", port, protocol="yamux", keepalive_interval=None))
        await wait(session.wait_closed())
        assert session.exception is not None
        assert "protocol error" in str(session.exception)


# -- 5. stream-open timeout ----------------------------------------------------------------


@pytest.mark.timeout(10)
async def test_unacknowledged_stream_is_reset_after_stream_open_timeout() -> None:
    async with SilentServer() as peer:
        session = await wait(
            polymux.connect(
                "127.0.0.1", peer.port, protocol="yamux", stream_open_timeout=0.3, keepalive_interval=None
            )
        )
        started = time.monotonic()
        reader, writer = await wait(session.open_channel(), 0.2)  # at once: no ACK needed
        writer.write(b"before the ACK")
        await wait(writer.drain())

        def stream_frames() -> list[Frame]:
            return [f for f in peer.frames() if f.stream_id == 1]

        # Data flows before the ACK.
        await until(lambda: any(f.type == Type.DATA for f in stream_frames()))
        opening, first_data = stream_frames()[:2]
        assert opening.type == Type.WINDOW_UPDATE and opening.flags & Flag.SYN
        assert bytes(first_data.body) == b"before the ACK"
        assert time.monotonic() - started < 0.3
        with pytest.raises(polymux.ChannelReset, match="stream_open_timeout") as info:
            await wait(reader.read(), 3)
        elapsed = time.monotonic() - started
        assert 0.3 <= elapsed < 2.0, elapsed
        assert "yamux" in str(info.value)
        # The peer is told: RST on the stream.
        await until(lambda: any(f.flags & Flag.RST for f in stream_frames()))
        with pytest.raises(polymux.ChannelReset):
            writer.write(b"more")
        # Only the stream failed, not the session.
        assert not session.is_closed
        reader2, _writer2 = await wait(session.open_channel(), 0.2)
        with pytest.raises(polymux.ChannelReset, match="stream_open_timeout"):
            await wait(reader2.read(), 3)
        await wait(session.aclose())


@pytest.mark.timeout(10)
async def test_acknowledged_stream_is_not_reset_by_stream_open_timeout(serve: Serve) -> None:
    server = await serve(echo, protocol="yamux")
    async with await wait(
        polymux.connect("127.0.0.1", server.port, protocol="yamux", stream_open_timeout=0.3)
    ) as session:
        loop = asyncio.get_running_loop()
        reader, writer = await wait(session.open_channel())
        opened = loop.time()
        writer.write(b"hello")
        assert await wait(reader.readexactly(5)) == b"hello"
        assert not session.mux.core.offers.pending  # the ACK settled it
        await until(lambda: loop.time() > opened + 0.5)  # past the timeout: still fine
        writer.write(b"again")
        assert await wait(reader.readexactly(5)) == b"again"
        writer.write_eof()
        assert await wait(reader.read()) == b""
        writer.close()


# -- 6. bad input --------------------------------------------------------------------------


class RawYamux:
    """One end of a yamux connection driven frame by frame by the test (the client side:
    odd stream ids)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoder = Decoder(16 * MiB)
        self._frames: deque[Frame] = deque()

    @classmethod
    async def connect(cls, port: int) -> RawYamux:
        reader, writer = await wait(asyncio.open_connection("127.0.0.1", port))
        return cls(reader, writer)

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

    async def until_eof(self) -> list[Frame]:
        """Every frame polymux sends until it closes the connection."""
        frames: list[Frame] = []
        with contextlib.suppress(EOFError):
            while True:
                frames.append(await self.receive())
        return frames

    async def expect(self, predicate: Callable[[Frame], bool]) -> Frame:
        while True:
            frame = await self.receive()
            if predicate(frame):
                return frame

    def close(self) -> None:
        self.writer.close()


def header(type_: int, flags: int, stream_id: int, length: int) -> bytes:
    return encode_header(type_, flags, stream_id, length)


def data(stream_id: int, body: bytes, flags: int = 0) -> bytes:
    return header(Type.DATA, flags, stream_id, len(body)) + body


def syn(stream_id: int) -> bytes:
    return header(Type.WINDOW_UPDATE, Flag.SYN, stream_id, 0)


def fin(stream_id: int) -> bytes:
    return header(Type.WINDOW_UPDATE, Flag.FIN, stream_id, 0)


async def hold_or_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A stream whose first byte is ``h`` is held (never read again) until its session
    ends; any other stream is echoed, that byte included."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        first = await reader.readexactly(1)
        if first == b"h":
            session = writer.get_extra_info("session")
            await session.wait_closed()
            return
        writer.write(first)
        await echo(reader, writer)


async def raw_session(server: polymux.Server) -> tuple[RawYamux, polymux.Session]:
    """Connect a raw peer to ``server``; return it and its polymux session."""
    raw = await RawYamux.connect(server.port)
    sockname = raw.writer.get_extra_info("sockname")

    def find() -> polymux.Session | None:
        for session in server.sessions:
            if session.get_extra_info("peername") == sockname:
                return session
        return None

    await until(lambda: find() is not None)
    session = find()
    assert session is not None
    return raw, session


async def assert_server_still_serves(server: polymux.Server) -> None:
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as client:
        await echo_round_trip(client, b"e" + pattern(300 * KiB, seed=7))
        assert client.exception is None


def version_1() -> bytes:
    return HEADER.pack(1, Type.WINDOW_UPDATE, Flag.SYN, 1, 0)


BAD_INPUT = [
    pytest.param([version_1()], "frame header version is 1, expected 0", id="version-1"),
    pytest.param([header(5, 0, 1, 0)], "unknown type 5", id="unknown-type-5"),
    pytest.param(
        [syn(1), data(1, b"h"), data(1, bytes(WINDOW - 1)), data(1, b"!")],
        "overran its receive window",
        id="window-overrun",
    ),
    pytest.param(
        [header(Type.PING, Flag.ACK, 0, 0xDEAD)],
        f"ping ACK with opaque value {0xDEAD}, which we never sent",
        id="unrequested-ping-ack",
    ),
    pytest.param(
        [syn(1), data(1, b"h"), fin(1), data(1, b"late")],
        "data for stream 1 after its FIN",
        id="data-after-fin",
    ),
    pytest.param(
        [syn(1), data(1, b"h"), syn(1)],
        "SYN for stream 1, which is already open",
        id="syn-twice",
    ),
    pytest.param([syn(2)], "SYN for stream 2, an id of our parity", id="syn-wrong-parity"),
    pytest.param([data(0, b"x")], "frame for stream 0", id="data-on-stream-0"),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("frames", "problem"), BAD_INPUT)
async def test_bad_input_ends_the_session_with_goaway_protocol_error(
    serve: Serve, frames: list[bytes], problem: str
) -> None:
    server = await serve(hold_or_echo, protocol="yamux")
    raw, session = await raw_session(server)
    raw.send(*frames)
    received = await wait(raw.until_eof())
    goaways = [f for f in received if f.type == Type.GO_AWAY]
    assert [f.length for f in goaways] == [GoAwayCode.PROTOCOL_ERROR]
    assert received[-1].type == Type.GO_AWAY  # the last word before the close
    await wait(session.wait_closed())
    exc = session.exception
    assert isinstance(exc, polymux.ProtocolError)
    assert exc.format == "yamux"
    assert str(exc).startswith("yamux: ")
    assert problem in str(exc)
    raw.close()
    await assert_server_still_serves(server)


@pytest.mark.timeout(20)
async def test_window_overrun_is_a_flow_control_error(serve: Serve) -> None:
    server = await serve(hold_or_echo, protocol="yamux")
    raw, session = await raw_session(server)
    raw.send(syn(1), data(1, b"h" + bytes(WINDOW)))  # one byte too many, in one frame
    received = await wait(raw.until_eof())
    assert [f.length for f in received if f.type == Type.GO_AWAY] == [GoAwayCode.PROTOCOL_ERROR]
    await wait(session.wait_closed())
    assert isinstance(session.exception, polymux.FlowControlError)
    assert f"window {WINDOW}" in str(session.exception)
    raw.close()


@pytest.mark.timeout(20)
async def test_data_for_an_unknown_stream_is_ignored(serve: Serve) -> None:
    server = await serve(hold_or_echo, protocol="yamux")
    raw, session = await raw_session(server)
    raw.send(
        data(99, b"nobody opened this"),
        data(4, b"nor this"),
        header(Type.WINDOW_UPDATE, 0, 7, 1024),
        header(Type.WINDOW_UPDATE, Flag.FIN, 9, 0),
    )
    # Then a valid stream works: SYN, data, FIN; polymux ACKs, echoes and FINs.
    raw.send(syn(1), data(1, b"echo me"), fin(1))
    ack = await raw.expect(lambda f: f.stream_id == 1)
    assert ack.flags & Flag.ACK
    echoed = b""
    while True:
        frame = await raw.expect(lambda f: f.stream_id == 1)
        if frame.type == Type.DATA:
            echoed += bytes(frame.body)
        if frame.flags & Flag.FIN:
            break
    assert echoed == b"echo me"
    assert not session.is_closed
    assert session.exception is None
    # Pings still answered.
    raw.send(header(Type.PING, Flag.SYN, 0, 77))
    pong = await raw.expect(lambda f: f.type == Type.PING and bool(f.flags & Flag.ACK))
    assert pong.length == 77
    raw.close()
    await wait(session.wait_closed())
    await assert_server_still_serves(server)


# -- 7. accept backlog ---------------------------------------------------------------------


@pytest.mark.timeout(10)
async def test_streams_beyond_the_accept_backlog_are_reset(serve: Serve) -> None:
    server = await serve(None, protocol="yamux", accept_backlog=2)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as session:
        streams = [await wait(session.open_channel()) for _ in range(3)]
        for _reader, writer in streams:
            writer.write(b"hi")
        with pytest.raises(polymux.ChannelReset):
            await wait(streams[2][0].read())
        (server_session,) = server.sessions
        # The first two wait in the backlog, with their data.
        r1, w1 = await wait(server_session.accept_channel())
        assert w1.get_extra_info("channel_name") == "1"
        assert await wait(r1.readexactly(2)) == b"hi"
        # There is room again: a 4th stream is accepted.
        r4, w4 = await wait(session.open_channel())
        w4.write(b"4th")
        r2, w2 = await wait(server_session.accept_channel())
        assert w2.get_extra_info("channel_name") == "3"
        assert await wait(r2.readexactly(2)) == b"hi"
        peer4, pw4 = await wait(server_session.accept_channel())
        assert pw4.get_extra_info("channel_name") == "7"
        assert await wait(peer4.readexactly(3)) == b"4th"
        pw4.write(b"ok")
        assert await wait(r4.readexactly(2)) == b"ok"
        assert not streams[0][0].exception()
        assert session.exception is None
        for writer in (w1, w2, pw4, streams[0][1], streams[1][1], w4):
            writer.close()

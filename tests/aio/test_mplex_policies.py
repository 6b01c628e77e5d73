"""Policies of the formats without flow control on the wire (mplex, multiplex), over real
loopback sockets.

* ``slow_reader="block"``: a channel holding ``receive_window`` unread bytes stops the
  reading of the whole connection; memory stays bounded, the writer blocks in ``drain()``,
  the other channels of the session wait too (head-of-line blocking, the documented
  price), and nothing is lost.
* ``slow_reader="reset"``: the same, for at most ``slow_reader_timeout`` seconds (0: not at
  all); then that channel alone is reset and the session goes on.
* A reader that keeps up never triggers either.
* Channel limits (outbound, inbound, inbound open rate) and frame sizes (the largest
  accepted, the largest sent).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import time
from typing import Any

import pytest

import polymux
from polymux.aio.channel import ChannelTransport
from polymux.aio.session import MuxProtocol
from polymux.engine.mplex import HEARTBEAT_STREAM
from polymux.exceptions import ChannelOverflow
from polymux.session import CoreChannel
from polymux.session.lifecycle import Lifecycle
from polymux.wire.mplex import Decoder, Flag, encode_header

from .helpers import until


PROTOCOLS = ["mplex", "multiplex"]
KiB = 1024
MiB = 1024 * KiB
WINDOW = 256 * KiB
SOCKET_READ = 256 * KiB
"""Largest ``data_received`` of asyncio's selector transports."""


def pattern(size: int, seed: int = 1) -> bytes:
    """``size`` reproducible pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


class Peer:
    """Server-side channel handler: ``slow/`` channels are not read until ``release`` is
    set, then hashed; ``sink/`` channels are hashed; ``echo/`` channels echo. A hashed
    channel answers with the SHA-256 hex digest of what it read, then closes. Errors of a
    channel are recorded in ``errors``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.readers: dict[str, asyncio.StreamReader] = {}
        self.counts: dict[str, int] = {}
        self.errors: dict[str, BaseException] = {}

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = writer.get_extra_info("channel_name")
        self.readers[name] = reader
        self.counts[name] = 0
        digest = hashlib.sha256()
        try:
            if name.startswith("slow/"):
                await self.release.wait()
            while data := await reader.read(256 * KiB):
                self.counts[name] += len(data)
                if name.startswith("echo/"):
                    writer.write(data)
                    await writer.drain()
                else:
                    digest.update(data)
            if not name.startswith("echo/"):
                writer.write(digest.hexdigest().encode())
            writer.close()
            await writer.wait_closed()
        except ConnectionError as exc:  # ChannelOverflow, ChannelReset, SessionClosed
            self.errors[name] = exc


def server_channel(server: polymux.Server, name: str) -> ChannelTransport:
    """The server-side transport of the channel named ``name`` (one session)."""
    (session,) = server.sessions
    for channel in session.mux._channels.values():
        if channel.name == name:
            return channel
    raise AssertionError(f"no server channel {name!r}")


def track_held(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Record, per server-side channel name, the most bytes it ever held unread after
    receiving (reader buffer + backlog)."""
    peaks: dict[str, int] = {}
    original = MuxProtocol.data_received

    def received(self: MuxProtocol, data: bytes) -> None:
        original(self, data)
        if self.is_client:
            return
        for channel in self._channels.values():
            reader, inbox = channel._reader, channel._inbox
            if reader is not None and inbox is not None and not channel._done:
                held = len(reader._buffer) + inbox.size
                assert held == inbox.unconsumed
                peaks[channel.name] = max(peaks.get(channel.name, 0), held)

    monkeypatch.setattr(MuxProtocol, "data_received", received)
    return peaks


async def echo_round_trip(session: polymux.Session, name: str, payload: bytes) -> None:
    """Send ``payload`` on a new channel to an echoing peer, read it back whole."""
    reader, writer = await asyncio.wait_for(session.open_channel(name), 5)

    async def send() -> None:
        writer.write(payload)
        writer.write_eof()
        await writer.drain()

    sender = asyncio.create_task(send())
    echoed = await asyncio.wait_for(reader.readexactly(len(payload)), 30)
    await asyncio.wait_for(sender, 30)
    assert echoed == payload
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def write_all(writer: asyncio.StreamWriter, data: bytes, progress: list[int]) -> None:
    """Write ``data`` in 1 MiB pieces, draining after each; ``progress[0]`` counts."""
    view = memoryview(data)
    for off in range(0, len(data), MiB):
        writer.write(view[off : off + MiB])
        progress[0] += len(view[off : off + MiB])
        await writer.drain()


# -- slow_reader="block" -------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_block_pauses_connection_bounds_memory_and_loses_nothing(
    protocol: str, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    peaks = track_held(monkeypatch)
    peer = Peer()
    server = await serve(peer, protocol=protocol, receive_window=WINDOW)
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol), 5)
    async with session:
        payload = pattern(64 * MiB)
        reader, writer = await asyncio.wait_for(session.open_channel("slow/1"), 5)
        written = [0]
        task = asyncio.create_task(write_all(writer, payload, written))
        try:
            await until(lambda: "slow/1" in peer.readers)
            channel = server_channel(server, "slow/1")
            (server_session,) = server.sessions
            socket_transport = server_session.mux._transport
            assert socket_transport is not None
            # Past the window the channel stops the reading of the whole connection.
            await until(lambda: not channel.is_reading())
            assert not socket_transport.is_reading()
            # Then the sender's socket fills and its writer blocks in drain().
            low, _high = writer.transport.get_write_buffer_limits()
            await until(lambda: session.mux._write_paused and writer.transport.get_write_buffer_size() > low)
            assert not task.done()

            # Head-of-line blocking: another channel of the session makes no progress.
            r2, w2 = await asyncio.wait_for(session.open_channel("echo/2"), 5)
            w2.write(b"m" * KiB)
            echo = asyncio.create_task(r2.readexactly(KiB))
            done, _pending = await asyncio.wait({echo}, timeout=0.5)
            assert not done, "another channel made progress while the connection is blocked"
            assert peer.counts.get("echo/2", 0) == 0

            # Still blocked, memory still bounded.
            assert not task.done()
            assert not channel.is_reading()
            assert not socket_transport.is_reading()
            assert writer.transport.get_write_buffer_size() > low
            assert written[0] < 32 * MiB, written[0]
            slow_reader = peer.readers["slow/1"]
            held = len(slow_reader._buffer) + (channel._inbox.size if channel._inbox is not None else 0)
            assert WINDOW < held <= WINDOW + SOCKET_READ, held
            print(f"{protocol}: held {held}, peak {peaks['slow/1']}, written {written[0]}")
            assert WINDOW < peaks["slow/1"] <= WINDOW + SOCKET_READ, peaks

            # Released: everything arrives, intact, and the other channel goes on.
            peer.release.set()
            await asyncio.wait_for(task, 60)
            writer.write_eof()
            digest = await asyncio.wait_for(reader.read(), 30)
            assert digest == hashlib.sha256(payload).hexdigest().encode()
            assert peer.counts["slow/1"] == len(payload)
            assert await asyncio.wait_for(echo, 10) == b"m" * KiB
            w2.write_eof()
            assert await asyncio.wait_for(r2.read(), 10) == b""
            assert peaks["slow/1"] <= WINDOW + SOCKET_READ, peaks
            assert "slow/1" not in peer.errors
            assert not session.is_closed and session.exception is None
            assert server_session.exception is None
        finally:
            peer.release.set()
            task.cancel()
        writer.close()


# -- slow_reader="reset" -------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_reset_after_timeout_drops_only_the_stalled_channel(protocol: str, serve: Any) -> None:
    peer = Peer()
    server = await serve(
        peer, protocol=protocol, receive_window=WINDOW, slow_reader="reset", slow_reader_timeout=0.3
    )
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol), 5)
    async with session:
        reader, writer = await asyncio.wait_for(session.open_channel("slow/1"), 5)
        written = [0]
        task = asyncio.create_task(write_all(writer, pattern(64 * MiB), written))
        try:
            await until(lambda: "slow/1" in peer.readers)
            channel = server_channel(server, "slow/1")
            (server_session,) = server.sessions
            await until(lambda: not channel.is_reading())
            paused_at = time.monotonic()
            # Meanwhile another channel is opened: it waits for the reset, then flows.
            payload = pattern(8 * MiB, seed=2)
            other = asyncio.create_task(echo_round_trip(session, "echo/2", payload))

            # The client sees the reset: its writer fails, and so does its reader.
            with pytest.raises(polymux.ChannelReset) as writer_failure:
                await asyncio.wait_for(task, 10)
            assert time.monotonic() - paused_at >= 0.2
            with pytest.raises(polymux.ChannelReset) as client_failure:
                await asyncio.wait_for(reader.read(), 5)
            reset = client_failure.value
            assert isinstance(reset, ConnectionResetError)
            assert reset.format == protocol
            if protocol == "multiplex":
                assert reset.message is not None
                assert "slow_reader='reset'" in reset.message
                assert "receive_window=262144" in reset.message
                assert reset.message in str(reset)
            else:
                assert reset.message is None
            assert writer_failure.value.format == protocol
            with pytest.raises(polymux.ChannelReset):
                writer.write(b"more")

            # The server-side reader got ChannelOverflow, naming format, channel and policy.
            peer.release.set()
            await until(lambda: "slow/1" in peer.errors)
            overflow = peer.errors["slow/1"]
            assert isinstance(overflow, ChannelOverflow)
            assert isinstance(overflow, ConnectionResetError)
            assert isinstance(overflow, polymux.ChannelError)
            text = str(overflow)
            assert text.startswith(f"{protocol}: ")
            assert "'slow/1'" in text
            assert "slow_reader" in text
            assert "for 0.3 s" in text
            assert peer.counts["slow/1"] == 0

            # The other channel moved 8 MiB both ways; the session is still open.
            await asyncio.wait_for(other, 30)
            await echo_round_trip(session, "echo/3", pattern(MiB, seed=3))
            assert not session.is_closed and session.exception is None
            assert not server_session.is_closed and server_session.exception is None
            assert server_session.mux._transport is not None
            assert server_session.mux._transport.is_reading()
        finally:
            peer.release.set()
            task.cancel()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_reset_at_once_with_zero_timeout(protocol: str, serve: Any) -> None:
    peer = Peer()
    server = await serve(
        peer, protocol=protocol, receive_window=WINDOW, slow_reader="reset", slow_reader_timeout=0
    )
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol), 5)
    async with session:
        # Another channel is busy the whole time.
        other = asyncio.create_task(echo_round_trip(session, "echo/1", pattern(4 * MiB, seed=2)))
        reader, writer = await asyncio.wait_for(session.open_channel("slow/2"), 5)
        written = [0]
        task = asyncio.create_task(write_all(writer, pattern(64 * MiB), written))
        try:
            with pytest.raises(polymux.ChannelReset):
                await asyncio.wait_for(task, 20)
            with pytest.raises(polymux.ChannelReset) as client_failure:
                await asyncio.wait_for(reader.read(), 5)
            if protocol == "multiplex":
                assert "slow_reader='reset'" in (client_failure.value.message or "")
            else:
                assert client_failure.value.message is None
            # Reset as soon as the window was exceeded: never more than one read beyond it.
            peer.release.set()
            await until(lambda: "slow/2" in peer.errors)
            overflow = peer.errors["slow/2"]
            assert isinstance(overflow, ChannelOverflow)
            text = str(overflow)
            assert text.startswith(f"{protocol}: ") and "'slow/2'" in text and "slow_reader" in text
            assert " for " not in text  # no timeout waited
            match = re.search(r"(\d+) bytes unread", text)
            assert match is not None, text
            assert WINDOW < int(match.group(1)) <= WINDOW + SOCKET_READ, text
            # Nobody else noticed.
            await asyncio.wait_for(other, 30)
            await echo_round_trip(session, "echo/3", pattern(2 * MiB, seed=3))
            (server_session,) = server.sessions
            assert not session.is_closed and session.exception is None
            assert not server_session.is_closed and server_session.exception is None
            assert set(peer.errors) == {"slow/2"}
        finally:
            peer.release.set()
            task.cancel()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_fast_readers_never_trigger_the_policy(
    protocol: str, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    overflows: list[CoreChannel] = []
    original = Lifecycle._overflow

    def overflow(self: Lifecycle, channel: CoreChannel) -> None:
        overflows.append(channel)
        original(self, channel)

    monkeypatch.setattr(Lifecycle, "_overflow", overflow)
    opts = {"receive_window": WINDOW, "slow_reader": "reset", "slow_reader_timeout": 0.2}
    peer = Peer()
    server = await serve(peer, protocol=protocol, **opts)
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol, **opts), 5)
    async with session:
        payloads = [pattern(MiB, seed=i) for i in range(32)]
        await asyncio.wait_for(
            asyncio.gather(*(echo_round_trip(session, f"echo/{i}", p) for i, p in enumerate(payloads))),
            50,
        )
        assert overflows == []
        assert peer.errors == {}
        assert all(peer.counts[f"echo/{i}"] == MiB for i in range(32))
        (server_session,) = server.sessions
        assert not session.is_closed and session.exception is None
        assert server_session.exception is None


# -- limits --------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_max_outbound_channels(protocol: str, serve: Any, echo: Any) -> None:
    server = await serve(echo, protocol=protocol)
    session = await asyncio.wait_for(
        polymux.connect("127.0.0.1", server.port, protocol=protocol, max_outbound_channels=3), 5
    )
    async with session:
        pairs = [await asyncio.wait_for(session.open_channel(f"c/{i}"), 5) for i in range(3)]
        with pytest.raises(polymux.LimitExceeded, match="max_outbound_channels=3") as info:
            await asyncio.wait_for(session.open_channel("c/3"), 5)
        assert str(info.value).startswith(f"{protocol}: ")
        # Close one, both sides: once the echo ended it, a channel can be opened again.
        reader, writer = pairs[0]
        writer.write(b"bye")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b"bye"
        await until(lambda: len(session.mux._channels) == 2)
        r3, w3 = await asyncio.wait_for(session.open_channel("c/3"), 5)
        w3.write(b"again")
        w3.write_eof()
        assert await asyncio.wait_for(r3.read(), 5) == b"again"
        # The others were never disturbed.
        for reader, writer in pairs[1:]:
            writer.write(b"still here")
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 5) == b"still here"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_max_inbound_channels_resets_the_excess(protocol: str, serve: Any, echo: Any) -> None:
    server = await serve(echo, protocol=protocol, max_inbound_channels=2)
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol), 5)
    async with session:
        pairs = [await asyncio.wait_for(session.open_channel(f"c/{i}"), 5) for i in range(3)]
        reader, writer = pairs[2]
        writer.write(b"x")
        with pytest.raises(polymux.ChannelReset) as info:
            await asyncio.wait_for(reader.read(), 5)
        assert info.value.format == protocol
        if protocol == "multiplex":
            assert info.value.message == "stream refused"
        else:
            assert info.value.message is None
        with pytest.raises(polymux.ChannelReset):
            writer.write(b"y")
        for i, (reader, writer) in enumerate(pairs[:2]):
            data = f"channel {i}".encode() * 1000
            writer.write(data)
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 5) == data
        assert not session.is_closed and session.exception is None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_inbound_channel_rate_ends_an_abusive_session(protocol: str, serve: Any, echo: Any) -> None:
    server_sessions: list[polymux.Session] = []
    server = await serve(
        echo, protocol=protocol, inbound_channel_rate=5, session_handler=server_sessions.append
    )
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol), 5)
    async with session:
        # 50 opens in one burst (no acceptance in mplex: they all go out at once).
        pairs = await asyncio.wait_for(
            asyncio.gather(*(session.open_channel(f"c/{i}") for i in range(50))), 5
        )
        reads = [asyncio.create_task(reader.read()) for reader, _writer in pairs]
        await asyncio.wait_for(session.wait_closed(), 10)
        assert session.is_closed
        results = await asyncio.wait_for(asyncio.gather(*reads, return_exceptions=True), 5)
        assert all(isinstance(r, polymux.SessionClosed) for r in results), results
        with pytest.raises(polymux.SessionClosed):
            await asyncio.wait_for(session.open_channel("late"), 5)
    (abused,) = server_sessions
    await asyncio.wait_for(abused.wait_closed(), 5)
    error = abused.exception
    assert isinstance(error, polymux.ProtocolError), error
    assert error.format == protocol
    assert "faster than 5 per second" in str(error)

    # Another client, within the rate, is served.
    second = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol), 5)
    async with second:
        await asyncio.wait_for(
            asyncio.gather(*(echo_round_trip(second, f"ok/{i}", pattern(64 * KiB, i)) for i in range(3))),
            10,
        )
        assert not second.is_closed and second.exception is None
    assert server_sessions[1].exception is None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_inbound_channel_rate_below_one_allows_a_first_channel(
    protocol: str, serve: Any, echo: Any
) -> None:
    server = await serve(echo, protocol=protocol, inbound_channel_rate=0.5)
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol), 5)
    async with session:
        await echo_round_trip(session, "first", b"one channel every two seconds")


# -- frame sizes ---------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_oversized_frame_ends_the_session(protocol: str, serve: Any) -> None:
    server_sessions: list[polymux.Session] = []
    peer = Peer()
    server = await serve(
        peer, protocol=protocol, max_message_size=MiB, session_handler=server_sessions.append
    )
    raw_reader, raw_writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.port), 5)
    try:
        # NewStream 0, then a frame of exactly max_message_size: accepted.
        name = b"sink/raw"
        raw_writer.write(encode_header(0, Flag.NEW_STREAM, len(name)) + name)
        body = pattern(MiB)
        raw_writer.write(encode_header(0, Flag.MESSAGE_INITIATOR, len(body)) + body)
        await asyncio.wait_for(raw_writer.drain(), 5)
        await until(lambda: peer.counts.get("sink/raw") == MiB)
        (session,) = server_sessions
        assert not session.is_closed
        # A frame whose length says 2 MiB: a protocol error, before its body arrives.
        raw_writer.write(encode_header(0, Flag.MESSAGE_INITIATOR, 2 * MiB) + b"x" * 100)
        await asyncio.wait_for(raw_writer.drain(), 5)
        await asyncio.wait_for(session.wait_closed(), 5)
        error = session.exception
        assert isinstance(error, polymux.ProtocolError), error
        assert error.format == protocol
        assert "2097152" in str(error) and "1048576" in str(error)
        # The channel failed with the session; the raw peer sees the connection end.
        await until(lambda: "sink/raw" in peer.errors)
        assert isinstance(peer.errors["sink/raw"], polymux.SessionClosed)
        try:
            rest = await asyncio.wait_for(raw_reader.read(), 5)
        except ConnectionResetError:
            rest = b""
        heartbeat = encode_header(HEARTBEAT_STREAM, Flag.RESET_INITIATOR, 0)  # sent once we spoke
        assert rest in (b"", heartbeat), rest
    finally:
        raw_writer.close()


class RawSink:
    """A raw TCP server reading mplex frames until stream 0's Close."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.frames: list[tuple[int, int, bytes]] = []
        self.done = asyncio.Event()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = Decoder(64 * MiB, self.protocol)
        try:
            while not self.done.is_set() and (data := await reader.read(256 * KiB)):
                for stream_id, flag, body in decoder.feed(data):
                    if (stream_id, flag) == (HEARTBEAT_STREAM, Flag.RESET_INITIATOR):
                        continue  # the session's heartbeat (tests/engine/test_heartbeats.py)
                    self.frames.append((stream_id, flag, bytes(body)))
                    if stream_id == 0 and flag == Flag.CLOSE_INITIATOR:
                        self.done.set()
            self.done.set()
            await reader.read()  # until the session closes
        finally:
            writer.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("send_frame", "max_message_size"),
    [(64 * KiB, MiB), (100_000, MiB), (4 * MiB, MiB)],
    ids=["default", "odd-frame", "capped-by-max-message-size"],
)
async def test_large_write_is_split_into_frames(
    protocol: str, send_frame: int, max_message_size: int, serve: Any
) -> None:
    limit = min(send_frame, max_message_size)
    payload = pattern(5 * MiB)
    # A batch larger than the frames, so that only the frame limit cuts them.
    opts = {"send_frame": send_frame, "max_message_size": max_message_size, "batch_bytes": 8 * MiB}

    # On the wire, seen by a raw peer.
    sink = RawSink(protocol)
    raw_server = await asyncio.start_server(sink, "127.0.0.1", 0)
    async with raw_server:
        port = raw_server.sockets[0].getsockname()[1]
        session = await asyncio.wait_for(polymux.connect("127.0.0.1", port, protocol=protocol, **opts), 5)
        async with session:
            _reader, writer = await asyncio.wait_for(session.open_channel("bulk"), 5)
            writer.write(payload)
            writer.write_eof()
            await asyncio.wait_for(writer.drain(), 10)
            await asyncio.wait_for(sink.done.wait(), 10)
        frames = sink.frames
        assert frames[0] == (0, Flag.NEW_STREAM, b"bulk")
        assert frames[-1] == (0, Flag.CLOSE_INITIATOR, b"")
        messages = frames[1:-1]
        assert all(f[:2] == (0, Flag.MESSAGE_INITIATOR) for f in messages)
        sizes = [len(f[2]) for f in messages]
        # Every frame within the limit, the limit used (the scheduler may cut a turn's
        # share short of a full frame, so there can be more frames than the minimum).
        assert max(sizes) == limit, sizes
        assert min(sizes) > 0
        assert b"".join(f[2] for f in messages) == payload

    # Whole at a polymux peer.
    peer = Peer()
    server = await serve(peer, protocol=protocol, **opts)
    session = await asyncio.wait_for(polymux.connect("127.0.0.1", server.port, protocol=protocol, **opts), 5)
    async with session:
        reader, writer = await asyncio.wait_for(session.open_channel("sink/bulk"), 5)
        writer.write(payload)
        writer.write_eof()
        digest = await asyncio.wait_for(reader.read(), 10)
        assert digest == hashlib.sha256(payload).hexdigest().encode()
        assert peer.counts["sink/bulk"] == len(payload)
        assert session.exception is None


# -- exports -------------------------------------------------------------------------------


def test_channel_overflow_is_exported() -> None:
    assert polymux.ChannelOverflow is ChannelOverflow  # type: ignore[attr-defined]
    assert "ChannelOverflow" in polymux.__all__

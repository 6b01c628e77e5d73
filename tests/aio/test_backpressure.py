"""Backpressure and fairness over real loopback sockets.

* A writer to a channel whose reader does not read blocks in ``drain()`` once the peer's
  window is used, while other channels of the same session keep flowing; the receiver
  buffers at most its window plus one frame for that channel.
* A 1 KiB message on one channel gets through while another channel moves 64 MiB: the
  scheduler interleaves frames, so there is no head-of-line blocking inside polymux.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import polymux
from polymux.wire.mstream import MAX_PAYLOAD

from .helpers import until


WINDOW = 128 * 1024
HIGH = 64 * 1024


class Peer:
    """Server side: ``slow/`` channels are not read until ``release`` is set; ``echo/``
    channels echo; ``sink/`` channels count what they read."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.readers: dict[str, asyncio.StreamReader] = {}
        self.counts: dict[str, int] = {}
        self.first_seen: dict[str, int] = {}  # sink bytes counted when a channel's data arrived

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = writer.get_extra_info("channel_name")
        self.readers[name] = reader
        self.counts[name] = 0
        if name.startswith("slow/"):
            await self.release.wait()
        while data := await reader.read(256 * 1024):
            if name not in self.first_seen:
                self.first_seen[name] = sum(v for k, v in self.counts.items() if k.startswith("sink/"))
            self.counts[name] += len(data)
            if name.startswith("echo/"):
                writer.write(data)
                await writer.drain()
        writer.write(str(self.counts[name]).encode())
        writer.write_eof()
        writer.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("version", [2, 3])
async def test_drain_blocks_at_window_while_other_channels_flow(version: int) -> None:
    protocol = f"mstream-v{version}"
    peer = Peer()
    opts = {"receive_window": WINDOW, "write_buffer_high": HIGH}
    async with (
        await polymux.start_server(peer, "127.0.0.1", 0, protocol=protocol, **opts) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=protocol, **opts) as session,
    ):
        reader, writer = await session.open_channel("slow/1")
        chunk = bytes(range(256)) * 128  # 32 KiB
        # (readexactly below asks for more than a window: the reader credits what it
        # holds while it waits, so this cannot deadlock.)
        written = 0

        async def write_forever() -> None:
            nonlocal written
            while written < 16 * 1024 * 1024:
                writer.write(chunk)
                written += len(chunk)
                await writer.drain()

        task = asyncio.create_task(write_forever())
        transport = writer.transport
        assert isinstance(transport, polymux.ChannelTransport)
        handle = transport.handle
        low, _high = transport.get_write_buffer_limits()
        # Blocked: no credit left, and the channel's buffer stays above its low-water
        # mark (the writer was paused above the high mark and is not resumed).
        await until(
            lambda: session.engine.send_credit(handle) == 0 and transport.get_write_buffer_size() > low
        )
        assert not task.done()
        assert written <= WINDOW + HIGH + len(chunk)
        # The receiver holds at most its window (plus one frame) for the channel.
        await until(lambda: "slow/1" in peer.readers)
        server_session = next(iter(server.sessions))
        slow_reader = peer.readers["slow/1"]
        assert len(slow_reader._buffer) <= WINDOW + MAX_PAYLOAD  # type: ignore[attr-defined]
        # Still blocked after other traffic: another channel moves 4 MiB both ways.
        r2, w2 = await session.open_channel("echo/2")
        payload = bytes(range(251)) * (4 * 1024 * 1024 // 251)
        w2.write(payload)
        w2.write_eof()
        echoed = await asyncio.wait_for(r2.readexactly(len(payload)), 10)
        assert echoed == payload
        assert await r2.read() == str(len(payload)).encode()
        assert not task.done()
        assert session.engine.send_credit(handle) == 0
        assert len(slow_reader._buffer) <= WINDOW + MAX_PAYLOAD  # type: ignore[attr-defined]
        assert server_session.engine.channel_count >= 1
        # Release the reader: the writer completes and every byte arrives.
        peer.release.set()
        await asyncio.wait_for(task, 20)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 10) == str(written).encode()
        writer.close()
        w2.close()


@pytest.mark.timeout(30)
async def test_v1_slow_reader_pauses_connection_with_bounded_memory() -> None:
    """v1 has no flow control on the wire: a channel holding ``receive_window`` unread
    bytes pauses the whole connection (as the reference does), so memory stays bounded
    and the writer blocks in drain."""
    peer = Peer()
    window = 256 * 1024
    async with (
        await polymux.start_server(
            peer, "127.0.0.1", 0, protocol="mstream-v1", receive_window=window
        ) as server,
        await polymux.connect("127.0.0.1", server.port, protocol="mstream-v1") as session,
    ):
        reader, writer = await session.open_channel("slow/1")
        chunk = b"x" * 32 * 1024
        written = 0

        async def write_forever() -> None:
            nonlocal written
            while written < 256 * 1024 * 1024:
                writer.write(chunk)
                written += len(chunk)
                await writer.drain()

        task = asyncio.create_task(write_forever())
        await until(lambda: "slow/1" in peer.readers)
        slow_reader = peer.readers["slow/1"]
        channel = slow_reader._transport  # type: ignore[attr-defined]
        assert isinstance(channel, polymux.ChannelTransport)
        # Past the window the channel pauses the connection; then the sender's socket fills.
        await until(lambda: not channel.is_reading())
        low, _high = writer.transport.get_write_buffer_limits()
        await until(lambda: writer.transport.get_write_buffer_size() > low)
        assert not task.done()
        # Bounded: the receiver holds at most the window plus one socket read.
        assert len(slow_reader._buffer) <= window + 256 * 1024  # type: ignore[attr-defined]
        assert written < 64 * 1024 * 1024  # kernel buffers + channel buffer, nowhere near all
        peer.release.set()
        await asyncio.wait_for(task, 60)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 30) == str(written).encode()
        writer.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_small_message_is_not_stuck_behind_bulk_transfer(version: int) -> None:
    protocol = f"mstream-v{version}"
    peer = Peer()
    bulk_size = 64 * 1024 * 1024
    async with (
        await polymux.start_server(peer, "127.0.0.1", 0, protocol=protocol) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=protocol) as session,
    ):
        bulk_reader, bulk_writer = await session.open_channel("sink/bulk")
        small_reader, small_writer = await session.open_channel("echo/small")
        bulk = memoryview(bytes(bulk_size))

        async def send_bulk() -> None:
            # Queue it all at once: the worst case for head-of-line blocking.
            bulk_writer.write(bulk)
            bulk_writer.write_eof()
            await bulk_writer.drain()

        bulk_task = asyncio.create_task(send_bulk())
        await until(lambda: peer.counts.get("sink/bulk", 0) >= 4 * 1024 * 1024, timeout=20)
        sent_at = peer.counts["sink/bulk"]
        started = time.perf_counter()
        small_writer.write(b"m" * 1024)
        echoed = await asyncio.wait_for(small_reader.readexactly(1024), 20)
        latency = time.perf_counter() - started
        arrived_at = peer.first_seen["echo/small"]
        await asyncio.wait_for(bulk_task, 40)
        bulk_writer_done = await asyncio.wait_for(bulk_reader.read(), 40)
        assert echoed == b"m" * 1024
        assert bulk_writer_done == str(bulk_size).encode()
        # The small frame overtook nearly all of the queued bulk data: only what was
        # already in flight (socket buffers, one scheduler batch) went before it.
        overtaken_by = arrived_at - sent_at
        print(f"{protocol}: 1 KiB round trip {latency * 1000:.1f} ms, behind {overtaken_by} bulk bytes")
        assert overtaken_by < 16 * 1024 * 1024, overtaken_by
        assert arrived_at < bulk_size // 2
        small_writer.close()
        bulk_writer.close()

"""What a reader sees when data outruns it: everything that arrived, in order, then the
end or the error (never an error that swallows data that had arrived, never a silent EOF)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

import polymux


WINDOW = 1024 * 1024


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", ["mstream-v1", "mstream-v2", "mstream-v3"])
async def test_reader_gets_all_data_then_the_reset(protocol: str) -> None:
    payload = bytes(range(256)) * (WINDOW // 256)  # exactly one window: no credit needed
    sent = asyncio.Event()

    async def send_then_reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.set_write_buffer_limits(high=0)  # drain() waits until all is sent
        writer.write(payload)
        await writer.drain()
        transport = writer.transport
        assert isinstance(transport, polymux.ChannelTransport)
        transport.reset("gave up")
        sent.set()

    async with (
        await polymux.start_server(send_then_reset, "127.0.0.1", 0, protocol=protocol) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=protocol, receive_window=WINDOW) as session,
    ):
        reader, writer = await session.open_channel("doomed")
        await asyncio.wait_for(sent.wait(), 10)
        # The reset has arrived by the time a full window of data sits unread here.
        received = await asyncio.wait_for(reader.readexactly(len(payload)), 10)
        assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
        with pytest.raises(polymux.ChannelReset) as info:
            await asyncio.wait_for(reader.read(), 10)
        if protocol != "mstream-v1":
            assert info.value.message == "gave up"
        writer.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", ["mstream-v1", "mstream-v3"])
async def test_slow_reader_small_reads_get_every_byte_in_order(protocol: str) -> None:
    payload = bytes(range(251)) * 40_000  # ~10 MB, not a multiple of any frame or read size

    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        writer.write_eof()
        await writer.drain()
        await reader.read()

    async with (
        await polymux.start_server(send, "127.0.0.1", 0, protocol=protocol) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=protocol) as session,
    ):
        reader, writer = await session.open_channel("bulk")
        parts = []
        while chunk := await asyncio.wait_for(reader.read(7_777), 10):
            parts.append(chunk)
        assert b"".join(parts) == payload
        writer.write_eof()
        writer.close()

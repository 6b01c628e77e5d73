"""No write to a connection that failed (issue 40 item 8): once a send fails (the peer is
gone: EPIPE, ECONNRESET), the session stops writing to the transport, whose
connection_lost is on its way. asyncio logs "socket.send() raised exception." for every
write to a lost connection from the fifth on; a dead peer produced 3 to 27 such lines."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

import polymux


pytestmark = pytest.mark.timeout(60)


async def _hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()


@pytest.mark.parametrize("protocol", ["mplex", "yamux", "mstream-v3", "smux"])
async def test_no_write_after_a_send_failed(protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    """8 channels with 1 MiB each queued when the socket's sends start to fail (its write
    side shut down here, so the next send raises EPIPE as towards a vanished peer): the
    session ends, and asyncio has nothing to warn about."""
    caplog.set_level(logging.WARNING, logger="asyncio")
    async with await polymux.start_server(_hold, "127.0.0.1", 0, protocol=protocol) as server:
        session = await polymux.connect("127.0.0.1", server.port, protocol=protocol, keepalive_interval=None)
        channels = [await session.open_channel(f"c{i}") for i in range(8)]
        session.get_extra_info("socket").shutdown(socket.SHUT_WR)
        for _reader, writer in channels:
            writer.write(b"x" * (1 << 20))
        for _reader, writer in channels:
            with pytest.raises((ConnectionError, polymux.PolymuxError)):
                await asyncio.wait_for(writer.drain(), 30)
        await asyncio.wait_for(session.wait_closed(), 30)
    sends = [r for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
    assert sends == [], f"{len(sends)} warnings"
    assert session.exception is not None or session.is_closed

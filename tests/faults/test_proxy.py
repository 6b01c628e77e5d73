"""The fault proxy itself: a silently cut link lets go of both sockets once both sides
have closed, also when they sent bytes after the cut (which hide a FIN from ``MSG_PEEK``:
the soak's client process piled up sockets in CLOSE-WAIT before), and also when each side
closed behind full buffers (after ``SILENT_DRAIN_AFTER``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from . import warp
from .proxy import SILENT_DRAIN_AFTER, FaultProxy, Plan


pytestmark = pytest.mark.timeout(30)


async def _until(condition: Callable[[], object], bound: float = 10.0) -> None:
    async with asyncio.timeout(bound):
        while not condition():  # noqa: ASYNC110 - the proxy looks at a silent side every 0.25 s
            await asyncio.sleep(0.05)


@asynccontextmanager
async def _silent_link() -> AsyncIterator[tuple[FaultProxy, asyncio.StreamWriter, asyncio.StreamWriter]]:
    """A proxy with one link, silently cut: the proxy, the client's end, the server's end."""
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def on_server(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)

    server = await asyncio.start_server(on_server, "127.0.0.1", 0)
    proxy = FaultProxy(server.sockets[0].getsockname()[1], 1, plan=lambda _i, _rng: Plan("clean"))
    port = await proxy.start()
    try:
        _reader, client = await asyncio.open_connection("127.0.0.1", port)
        server_side = await asyncio.wait_for(accepted.get(), 10)
        await _until(lambda: proxy.links)
        assert proxy.cut_all("silent") == 1
        yield proxy, client, server_side
    finally:
        await proxy.aclose()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("talk_after_cut", [False, True])
async def test_a_silent_link_lets_go_once_both_sides_closed(talk_after_cut: bool) -> None:
    async with _silent_link() as (proxy, client, server_side):
        if talk_after_cut:
            client.write(b"c" * 1000)
            server_side.write(b"s" * 1000)
            await client.drain()
            await server_side.drain()
        client.close()
        server_side.close()
        await _until(lambda: not proxy.links and not proxy.writers)


def test_a_silent_link_with_full_buffers_lets_go_after_its_drain_time() -> None:
    """Each side wrote more than the buffers hold and closed: its FIN waits behind a zero
    window until the proxy drops what it sent (SILENT_DRAIN_AFTER, in the loop's time)."""

    async def main() -> None:
        async with _silent_link() as (proxy, client, server_side):
            for side in (client, server_side):
                side.write(b"x" * (16 << 20))  # far past the socket buffers: never all taken
                side.transport.abort()  # what an application that gives up does: its socket goes
            await _until(lambda: not proxy.links and not proxy.writers, bound=SILENT_DRAIN_AFTER + 30)

    warp.run(main())

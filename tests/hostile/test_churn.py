"""Churn: many channels opened, used and closed on ONE session, with flat memory.

CI runs ``POLYMUX_CHURN`` (default 20,000) channels per format; the 100,000 run is
``POLYMUX_CHURN=100000`` (result in SECURITY.md). Python memory still held (tracemalloc,
after a garbage collection) is sampled at 10 %, 50 % and 100 % of the run, on both ends
of the session (they share this process); growth between the first and the last sample
must stay under CHURN_GROWTH from the middle sample on (tracing starts at the first): nothing
per channel is kept after it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import tracemalloc

import pytest

import polymux

from .peer import until


CHURN = int(os.environ.get("POLYMUX_CHURN", "20000"))
LIMIT = max(280, CHURN // 40)  # seconds for the whole run (a loaded machine does ~500 channels/s)

pytestmark = pytest.mark.timeout(LIMIT + 20)
CONCURRENT = 100
CHURN_GROWTH = 256 * 1024


async def _respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        data = await reader.read()
        writer.write(data)
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("fmt", ["mplex", "yamux"])
async def test_channel_churn_has_flat_memory(fmt: str) -> None:
    server = await polymux.start_server(_respond, "127.0.0.1", 0, protocol=fmt)
    samples: list[tuple[int, int]] = []
    marks = {CHURN // 10, CHURN // 2, CHURN}
    try:
        session = await polymux.connect("127.0.0.1", server.port, protocol=fmt)
        async with session:

            async def one(i: int) -> None:
                reader, writer = await session.open_channel("c")
                writer.write(b"%d" % i)
                writer.write_eof()
                assert await reader.read() == b"%d" % i
                writer.close()
                await writer.wait_closed()

            done = 0
            async with asyncio.timeout(LIMIT):
                while done < CHURN:
                    n = min(CONCURRENT, CHURN - done)
                    await asyncio.gather(*(one(done + k) for k in range(n)))
                    done += n
                    if done in marks:
                        await _quiet(session, server)
                        gc.collect()
                        if not tracemalloc.is_tracing():
                            tracemalloc.start()  # from the first sample on: what stays behind
                        samples.append((done, tracemalloc.get_traced_memory()[0]))
        print(f"churn {fmt}: retained bytes at channels done: {samples}")
        # Tracing starts at the first sample; the first interval also fills fixed-size caches
        # (free lists, interned names), so flatness is judged from the middle sample on.
        growth = samples[-1][1] - samples[1][1]
        assert growth < CHURN_GROWTH, (
            f"{fmt}: {growth} bytes kept over {samples[-1][0] - samples[1][0]} channels"
        )
        assert samples[1][1] < 4 * CHURN_GROWTH, samples
        assert session.engine.channel_count == 0
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        server.close()
        await server.wait_closed()


async def _quiet(session: polymux.Session, server: polymux.Server) -> None:
    """Wait until both ends have forgotten every finished channel."""
    await until(
        lambda: not session.engine.channel_count and not any(s.engine.channel_count for s in server.sessions)
    )

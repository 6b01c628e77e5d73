"""A hostile peer: a raw socket that speaks a format's bytes, crafted with polymux's own
sans-I/O engine and codecs, and then bends the rules (floods, overruns, stalls, lies)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
from collections.abc import Callable, Iterator

from polymux.config import SessionConfig
from polymux.engine import Engine, events as ev
from polymux.exceptions import ProtocolError
from polymux.formats import make_engine


class HostilePeer:
    """One connection to a polymux server, driven by an engine of the same format (our
    side of the wire is the client)."""

    def __init__(self, fmt: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.format = fmt
        self.reader = reader
        self.writer = writer
        self.engine: Engine = make_engine(fmt, SessionConfig(), is_client=True)
        self.events: list[ev.Event] = []
        self.received = 0
        self.eof = False

    @classmethod
    async def connect(cls, port: int, fmt: str) -> HostilePeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(fmt, reader, writer)

    def take(self) -> bytes:
        """What the engine queued, as one ``bytes``."""
        return b"".join(bytes(c) for c in self.engine.data_to_send())

    async def send(self, data: bytes | None = None) -> None:
        """Write ``data`` (default: what the engine queued) in 64 KiB pieces."""
        if data is None:
            data = self.take()
        view = memoryview(data)
        for off in range(0, len(view), 64 * 1024):
            self.writer.write(view[off : off + 64 * 1024])
            await self.writer.drain()

    async def read_some(self) -> bool:
        """Read once and feed the engine (ignoring its complaints); False at EOF."""
        data = await self.reader.read(256 * 1024)
        if not data:
            self.eof = True
            return False
        self.received += len(data)
        with contextlib.suppress(ProtocolError):
            self.events.extend(self.engine.receive_data(data))
        return True

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Read (and reply to nothing) until ``predicate()`` holds."""
        async with asyncio.timeout(timeout):
            while not predicate():
                if not await self.read_some():
                    raise ConnectionResetError(f"{self.format}: the server closed while we waited")

    async def handshake(self) -> None:
        await self.send()
        await self.until(lambda: self.engine.ready)
        await self.send()

    async def open(self, name: str = "h") -> int:
        """Open a channel properly and wait until the server accepted it."""
        handle = self.engine.open_channel(name)
        if self.format == "streamux":
            self.engine.send_data(handle, b"o")  # a request exists once its first chunk is sent
        await self.send()
        if self.engine.needs_acceptance:
            await self.until(
                lambda: any(isinstance(e, ev.ChannelAccepted) and e.channel == handle for e in self.events)
            )
        return handle

    async def closed_by_server(self, timeout: float) -> None:  # noqa: ASYNC109
        """Read (discarding) until the server closes the connection, within ``timeout``."""
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionResetError):  # an abort is a close too
                while await self.read_some():
                    pass

    def close(self) -> None:
        self.writer.transport.abort()


@contextlib.contextmanager
def peak_memory() -> Iterator[list[int]]:
    """``with peak_memory() as peak:`` ... ``peak[0]``: the tracemalloc peak, in bytes, of
    Python allocations made inside the block (the polymux server runs in this process)."""
    tracemalloc.start()
    out: list[int] = []
    try:
        yield out
    finally:
        out.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """Wait until ``predicate()`` holds (polling the loop), or fail after ``timeout``
    (the same helper as tests/aio/helpers.py)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)

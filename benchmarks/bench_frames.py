"""The per-frame cost of polymux without sockets: codec + engine + session core + asyncio
driver, on the sending side and on the receiving side, in microseconds per data frame.

Both sides are real :class:`polymux.aio.session.MuxProtocol` objects on in-memory
transports (no socket, no kernel, no second process), so the figures are polymux's own
Python work:

* a client writes ``--mib`` MiB on one channel (``write`` of 256 KiB or 64 bytes, then
  ``await drain()``) to a server whose application reads it all (``read(256 KiB)``); the
  bytes move between them in memory, a loop turn later, credit included;
* **receive** is the time spent in the server's ``data_received`` and in the reads of its
  application that find data waiting; **send** is the rest (the client's writes, its
  scheduler and framing, the credit it takes in, and the event loop's turns).

Frames are the client's data frames, counted by polymux's trace decoder outside the
clock (CPU time: ``time.process_time``). Two shapes: bulk (256 KiB writes: frames of the format's largest size) and
64-byte messages, one per loop turn (``write``, ``drain``, a loop turn: one frame each, as
a request/response application makes them). The performance issue's
target is 2 us or less per frame on each side. Every figure is the median of ``--repeat``
runs. ::

    .venv/bin/python benchmarks/bench_frames.py
    .venv/bin/python benchmarks/bench_frames.py --formats yamux --shapes 64B --profile
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import statistics
import time
from typing import Any

import polymux
from polymux.aio.session import MuxProtocol
from polymux.tracing import decode_chunks


MIB = 1 << 20
READ = 256 * 1024
OPTIONS: dict[str, Any] = {"keepalive_interval": None}
"""Defaults but the keepalive (no timer fires within a run anyway)."""
SHAPES = {"bulk": 256 * 1024, "64B": 64}

_clock = time.process_time
"""The process's CPU time, not the wall clock: both sides run in this one thread, and the
figures stay put on a machine busy with other work (the wall clock counts the time the
process waited for a CPU)."""


class MemoryTransport(asyncio.Transport):
    """A transport that takes every byte at once: it hands them to ``peer`` (a protocol) on
    the next loop turn, as a socket pair would, and appends them to ``record`` (a capture's
    chunks, in order) when given one. Its own protocol's ``pause_reading()`` holds what
    its peer's transport delivers until ``resume_reading()``, in order, as a socket does
    (sliced mode pauses reading while the rest of a read waits)."""

    def __init__(self, record: list[tuple[int, str, bytes]] | None, direction: str) -> None:
        super().__init__()
        self.record = record
        self.direction = direction
        self.peer: MuxProtocol | None = None
        self.peer_transport: MemoryTransport | None = None
        self.closing = False
        self.paused = False
        self.held: list[bytes] = []  # delivered while paused (or behind what was)
        self._loop = asyncio.get_running_loop()
        self._protocol: MuxProtocol | None = None

    def write(self, data: Any) -> None:
        self.writelines([data])

    def writelines(self, list_of_data: Any) -> None:
        data = b"".join(list_of_data)
        if self.record is not None:
            self.record.append((len(self.record), self.direction, data))
        if self.peer is not None and data:
            if self.peer_transport is not None:
                self._loop.call_soon(self.peer_transport.deliver, data)
            else:
                self._loop.call_soon(self.peer.data_received, data)

    def deliver(self, data: bytes) -> None:
        """Bytes from the peer, for this transport's protocol (held while paused)."""
        if self.paused or self.held:
            self.held.append(data)
            return
        assert self._protocol is not None
        self._protocol.data_received(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        while self.held and not self.paused:
            assert self._protocol is not None
            self._protocol.data_received(self.held.pop(0))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Side:
    """One end: a protocol on a memory transport; incoming channels are queued."""

    def __init__(self, fmt: str, *, client: bool, record: list[tuple[int, str, bytes]] | None = None) -> None:
        self.incoming: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.incoming.put((reader, writer))
            await asyncio.Event().wait()  # the channel stays open (the benchmark reads it)

        self.protocol = MuxProtocol(
            fmt, polymux.SessionConfig(**OPTIONS), is_client=client, handler=None if client else handler
        )
        self.transport = MemoryTransport(record, "c2s" if client else "s2c")


def join(a: Side, b: Side) -> None:
    a.transport.peer, b.transport.peer = b.protocol, a.protocol
    a.transport.peer_transport, b.transport.peer_transport = b.transport, a.transport
    a.transport._protocol, b.transport._protocol = a.protocol, b.protocol
    a.protocol.connection_made(a.transport)
    b.protocol.connection_made(b.transport)


class Clock:
    """Time spent in the receiving side's own calls: ``data_received``, and the reads of
    its application that find data waiting (a read that waits is timed from its wake-up
    by the ``data_received`` that fed it)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, protocol: MuxProtocol) -> None:
        received = protocol.data_received

        def timed(data: bytes) -> None:
            start = _clock()
            received(data)
            self.seconds += _clock() - start

        protocol.data_received = timed  # type: ignore[method-assign]

    async def read_all(self, reader: asyncio.StreamReader) -> int:
        got = 0
        while True:
            if reader._buffer or _waiting(reader):  # type: ignore[attr-defined]
                start = _clock()
                data = await reader.read(READ)
                self.seconds += _clock() - start
            else:
                data = await reader.read(READ)
            if not data:
                return got
            got += len(data)


def _waiting(reader: asyncio.StreamReader) -> bool:
    inbox = getattr(reader, "_inbox", None)
    return bool(inbox is not None and inbox.size)


async def both(fmt: str, total: int, write: int) -> tuple[float, float, list[tuple[int, str, bytes]]]:
    """Seconds for ``total`` bytes through a client and a server in memory, the part of
    them spent on the receiving side, and what crossed, as a capture's chunks."""
    chunks: list[tuple[int, str, bytes]] = []
    client, server = Side(fmt, client=True, record=chunks), Side(fmt, client=False, record=chunks)
    join(client, server)
    reader, writer = await client.protocol.session.open_channel("bench")
    writer.write(b"x")  # formats that open on the first data
    await writer.drain()
    sreader, _swriter = await server.incoming.get()
    clock = Clock()
    clock.wrap(server.protocol)
    reading = asyncio.ensure_future(clock.read_all(sreader))
    block = memoryview(bytes(write))
    gc.collect()
    clock.seconds = 0.0
    start = _clock()
    small = write < 4096
    for _ in range(total // write):
        writer.write(block)
        await writer.drain()
        if small:
            await asyncio.sleep(0)  # one message per loop turn: one frame each
    writer.write_eof()
    got = await reading
    elapsed = _clock() - start
    assert got == total // write * write + 1, (got, total)
    del reader
    return elapsed, clock.seconds, chunks


def data_frames(fmt: str, chunks: list[tuple[int, str, bytes]]) -> int:
    """The client's data frames in a run, counted by polymux's trace decoder."""
    return sum(
        1
        for record in decode_chunks(fmt, chunks, session="bench")
        if record.direction == "c2s" and record.frame_type == "data" and record.length > 1
    )


async def measure(fmt: str, shape: str, total: int, repeat: int) -> dict[str, float]:
    write = SHAPES[shape]
    total = total if shape == "bulk" else min(total, 20_000 * write)
    sends, receives = [], []
    frames = 1
    for _ in range(repeat):
        elapsed, received, chunks = await both(fmt, total, write)
        frames = data_frames(fmt, chunks)
        sends.append(elapsed - received)
        receives.append(received)
    return {
        "frames": frames,
        "send_us": statistics.median(sends) / frames * 1e6,
        "receive_us": statistics.median(receives) / frames * 1e6,
    }


def main() -> None:  # pragma: no cover - a command-line tool
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--formats", default=",".join(polymux.PROTOCOLS))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--mib", type=int, default=64, help="MiB per bulk run (default 64)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile one run of the first format and shape"
    )
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    shapes = [s for s in args.shapes.split(",") if s]
    if args.loop == "uvloop":
        import uvloop

        runner: Any = uvloop.run
    else:
        runner = asyncio.run
    if args.profile:
        fmt, shape = formats[0], shapes[0]

        async def profiled() -> None:
            await both(fmt, args.mib * MIB, SHAPES[shape])
            profile = cProfile.Profile()
            profile.enable()
            await both(fmt, args.mib * MIB, SHAPES[shape])
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)

        runner(profiled())
        return
    print(
        f"bench_frames: {args.loop}, {args.mib} MiB bulk, median of {args.repeat}; microseconds per data frame"
    )
    print(f"{'format':<20}{'shape':<7}{'frames':>9}{'send us':>10}{'receive us':>12}")
    for fmt in formats:
        for shape in shapes:
            row = runner(measure(fmt, shape, args.mib * MIB, args.repeat))
            print(
                f"{fmt:<20}{shape:<7}{row['frames']:>9.0f}{row['send_us']:>10.2f}{row['receive_us']:>12.2f}"
            )


if __name__ == "__main__":
    main()

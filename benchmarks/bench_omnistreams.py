"""omnistreams throughput beside its raw baselines, in the same run: polymux over WebSocket
against raw ``websockets``, and polymux over TCP (4-byte length prefix) against raw asyncio
TCP, on the default asyncio loop and on uvloop.

Both sides run in this process and share one event loop (as ``bench_bulk.py --receiver
inline`` does), so every row, raw or not, pays for both ends on one CPU. Each case moves
SIZE bytes in all, on 1 stream and on 16 streams in parallel (SIZE/16 each): the sender
writes 64 KiB slices (``write`` + ``drain()`` / one ``send()`` per WebSocket message), the
receiver reads and counts. The clock runs from the first write until the receiver's
confirmation arrives (raw: a 1-byte reply; omnistreams, whose streams are one-way: a
control message per stream). Connection and stream setup are not timed. Rows are
interleaved (A/B/A/B) and the best of ``--repeat`` runs is shown, with the ratio
polymux / raw of the same loop.

    .venv/bin/python benchmarks/bench_omnistreams.py [--mib 64] [--repeat 3] [--loops asyncio,uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import sys
import time
from collections.abc import Awaitable, Callable

import polymux


MIB = 1 << 20
WRITE = 64 * 1024
PARALLEL = 16
LIMIT = 120.0


async def _count_stream(reader: asyncio.StreamReader, expected: int | None) -> int:
    n = 0
    while expected is None or n < expected:
        data = await reader.read(256 * 1024)
        if not data:
            break
        n += len(data)
    return n


# -- raw TCP ---------------------------------------------------------------------------------


async def raw_tcp(payload: memoryview, streams: int) -> float:
    part = len(payload) // streams

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = await _count_stream(reader, part)
        writer.write(b"\x01" if n == part else b"\x00")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pairs = [await asyncio.open_connection("127.0.0.1", port) for _ in range(streams)]

    async def send(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        view = payload[i * part : (i + 1) * part]
        for off in range(0, part, WRITE):
            writer.write(view[off : off + WRITE])
            await writer.drain()
        if await reader.read(1) != b"\x01":
            raise RuntimeError("raw tcp: wrong byte count")

    try:
        start = time.perf_counter()
        await asyncio.gather(*(send(i, r, w) for i, (r, w) in enumerate(pairs)))
        return time.perf_counter() - start
    finally:
        for _r, w in pairs:
            w.close()
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


# -- raw WebSocket ---------------------------------------------------------------------------


async def raw_websocket(payload: memoryview, streams: int) -> float:
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import ServerConnection, serve

    part = len(payload) // streams

    async def handle(ws: ServerConnection) -> None:
        n = 0
        while n < part:
            message = await ws.recv()
            n += len(message)
        await ws.send(b"\x01" if n == part else b"\x00")

    server = await serve(handle, "127.0.0.1", 0, compression=None, max_size=None)
    port = next(iter(server.sockets)).getsockname()[1]
    clients = [
        await connect(f"ws://127.0.0.1:{port}/", compression=None, max_size=None) for _ in range(streams)
    ]

    async def send(i: int) -> None:
        ws = clients[i]
        view = payload[i * part : (i + 1) * part]
        for off in range(0, part, WRITE):
            await ws.send(view[off : off + WRITE])
        if await ws.recv() != b"\x01":
            raise RuntimeError("raw websocket: wrong byte count")

    try:
        start = time.perf_counter()
        await asyncio.gather(*(send(i) for i in range(streams)))
        return time.perf_counter() - start
    finally:
        for ws in clients:
            await ws.close()
        server.close()
        await server.wait_closed()


# -- polymux omnistreams ---------------------------------------------------------------------


async def polymux_omnistreams(payload: memoryview, streams: int, over: str) -> float:
    part = len(payload) // streams

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = await _count_stream(reader, None)
        session = writer.transport.get_extra_info("session")
        session.send_control(b"\x01" if n == part else b"\x00")  # streams are one-way: answer out of band
        writer.close()

    if over == "ws":
        server = await polymux.serve_websocket(handler, "127.0.0.1", 0)
        session = await polymux.connect_websocket(f"ws://127.0.0.1:{server.port}/omnistreams")
    else:
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol="omnistreams")
        session = await polymux.connect("127.0.0.1", server.port, protocol="omnistreams")
    writers = [(await session.open_channel(f"bench/{i}"))[1] for i in range(streams)]

    async def send(i: int) -> None:
        writer = writers[i]
        view = payload[i * part : (i + 1) * part]
        for off in range(0, part, WRITE):
            writer.write(view[off : off + WRITE])
            await writer.drain()
        writer.write_eof()

    try:
        start = time.perf_counter()
        await asyncio.gather(*(send(i) for i in range(streams)))
        for _ in range(streams):
            if await session.receive_control() != b"\x01":
                raise RuntimeError(f"polymux omnistreams over {over}: wrong byte count")
        return time.perf_counter() - start
    finally:
        for w in writers:
            w.close()
        await session.aclose()
        await server.aclose()


# -- driver ----------------------------------------------------------------------------------

ROWS: list[tuple[str, str, Callable[[memoryview, int], Awaitable[float]]]] = [
    ("ws", "raw websockets", raw_websocket),
    ("ws", "polymux omnistreams/ws", lambda p, s: polymux_omnistreams(p, s, "ws")),
    ("tcp", "raw asyncio TCP", raw_tcp),
    ("tcp", "polymux omnistreams/tcp", lambda p, s: polymux_omnistreams(p, s, "tcp")),
]


async def measure(size: int, repeat: int) -> dict[tuple[str, int], float]:
    payload = memoryview(bytes(size))
    best: dict[tuple[str, int], float] = {}
    for _ in range(repeat):
        for streams in (1, PARALLEL):
            for _group, name, run in ROWS:  # interleaved: raw, polymux, raw, polymux
                async with asyncio.timeout(LIMIT):
                    elapsed = await run(payload, streams)
                key = (name, streams)
                best[key] = min(best.get(key, float("inf")), elapsed)
    return best


def report(loop: str, size: int, best: dict[tuple[str, int], float]) -> None:
    print(f"\n{loop}: {size // MIB} MiB per case, best of the runs, both ends in one process")
    print(f"{'row':<26}{'streams':>8}{'MiB/s':>10}{'ratio':>8}")
    for streams in (1, PARALLEL):
        baseline = 0.0
        for group, name, _run in ROWS:
            rate = size / MIB / best[(name, streams)]
            if name.startswith("raw"):
                baseline = rate
                ratio = ""
            else:
                ratio = f"{rate / baseline:.2f}"
            print(f"{name:<26}{streams:>8}{rate:>10.1f}{ratio:>8}")
            del group


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64, help="MiB moved per case (default 64)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the best counts (default 3)")
    parser.add_argument("--loops", default="asyncio,uvloop", help="event loops (default asyncio,uvloop)")
    args = parser.parse_args()
    size = args.mib * MIB - (args.mib * MIB) % (PARALLEL * WRITE)
    print(f"polymux {polymux.__version__}, Python {platform.python_version()}, {platform.machine()}")
    for loop in args.loops.split(","):
        if loop == "uvloop":
            import uvloop

            best = uvloop.run(measure(size, args.repeat))
        elif loop == "asyncio":
            best = asyncio.run(measure(size, args.repeat))
        else:
            sys.exit(f"unknown loop {loop!r}")
        report(loop, size, best)


if __name__ == "__main__":
    main()

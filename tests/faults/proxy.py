"""A loopback TCP proxy (127.0.0.1) that injects network faults between a client and a
server, without ever reordering or altering bytes:

* ``pieces``: forwards every byte in its own write (1-byte pieces) for the first
  ``PIECES_BYTES`` of each direction (every header and frame boundary of a small
  transfer), then in random pieces of 1-512 bytes (one write per byte of 64 KiB x 2
  directions x 3 channels would take the CI machine most of a minute per transfer);
* ``stall``: forwards what arrives, after random delays (stalls), in random splits;
* ``cut``: forwards up to a random byte offset of either direction, then cuts the
  connection (a reset or a FIN on both sides, at random).

Each connection draws its mode and offsets from a seeded ``random.Random``, so a failure
is reproduced by its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket


MODES = ("pieces", "stall", "cut")
PIECES_BYTES = 8 * 1024


class FaultProxy:
    """``await FaultProxy(upstream_port, seed).start()`` -> the port to connect to."""

    def __init__(
        self, upstream_port: int, seed: int, modes: tuple[str, ...] = MODES, cut_range: int = 80_000
    ) -> None:
        self.upstream_port = upstream_port
        self.rng = random.Random(seed)
        self.modes = modes
        self.cut_range = cut_range
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        self.cuts = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in list(self.writers):
            writer.transport.abort()

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        mode = self.rng.choice(self.modes)
        self.writers.add(cwriter)
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.transport.abort()
            self.writers.discard(cwriter)
            return
        self.writers.add(swriter)
        for w in (cwriter, swriter):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cut = asyncio.Event()
        reset = self.rng.random() < 0.5
        limits = (
            (self.rng.randrange(self.cut_range), self.rng.randrange(self.cut_range))
            if mode == "cut"
            else (None, None)
        )
        seeds = (self.rng.randrange(2**32), self.rng.randrange(2**32))
        pumps = [
            asyncio.ensure_future(
                self._pump(creader, swriter, mode, limits[0], cut, random.Random(seeds[0]))
            ),
            asyncio.ensure_future(
                self._pump(sreader, cwriter, mode, limits[1], cut, random.Random(seeds[1]))
            ),
        ]
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            waiter = asyncio.ensure_future(cut.wait())
            await asyncio.wait([*pumps, waiter], return_when=asyncio.FIRST_COMPLETED)
            if cut.is_set():
                self.cuts += 1
                for p in pumps:
                    p.cancel()
                for w in (cwriter, swriter):
                    if reset:
                        w.transport.abort()
                    else:
                        w.close()
            await asyncio.gather(*pumps, return_exceptions=True)
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
        finally:
            for w in (cwriter, swriter):
                w.transport.abort() if w.transport.is_closing() else w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
                self.writers.discard(w)
            self.tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        mode: str,
        limit: int | None,
        cut: asyncio.Event,
        rng: random.Random,
    ) -> None:
        sent = 0
        try:
            while data := await reader.read(65536):
                if limit is not None and sent + len(data) >= limit:
                    writer.write(data[: limit - sent])
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    cut.set()
                    return
                if mode == "pieces":
                    pos = 0
                    while pos < len(data):
                        step = 1 if sent + pos < PIECES_BYTES else rng.randrange(1, 513)
                        writer.write(data[pos : pos + step])
                        await writer.drain()
                        pos += step
                        if pos % 64 == 0:
                            await asyncio.sleep(0)
                elif mode == "stall":
                    pos = 0
                    while pos < len(data):
                        if rng.random() < 0.3:
                            await asyncio.sleep(rng.uniform(0, 0.02))
                        step = rng.randrange(1, 4096)
                        writer.write(data[pos : pos + step])
                        await writer.drain()
                        pos += step
                else:
                    writer.write(data)
                    await writer.drain()
                sent += len(data)
            if writer.can_write_eof():
                writer.write_eof()  # pass the half-close on
        except (ConnectionError, OSError):
            cut.set()

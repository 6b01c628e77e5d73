"""A small TCP proxy for the chat tests: it forwards connections to a server and cuts them
on request, the way networks do: ``fin`` (both sides closed), ``rst`` (both sides reset),
``silent`` (it stops forwarding and never closes: a Wi-Fi drop, a NAT that forgot the
connection) and ``stall`` (silent, but what the client sent is held and can be delivered
later with :meth:`CutProxy.release`: a say that reaches the server after the client came
back). While ``down`` it refuses new connections (reset at once)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field


__all__ = ["CutProxy"]


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    frozen: asyncio.Event = field(default_factory=asyncio.Event)
    """Set: nothing is forwarded any more (silent, stall)."""
    held: bytearray = field(default_factory=bytearray)
    """Client bytes read while stalled (delivered by release)."""
    stalled: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class CutProxy:
    """``await CutProxy.start(port)``; clients connect to ``proxy.port``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.links: list[_Link] = []
        """Every connection so far, the newest last."""
        self.accepted = 0
        self.changed = asyncio.Event()
        """Set at each new connection (clear it before waiting)."""
        self.down = False
        self._server: asyncio.Server | None = None

    @classmethod
    async def start(cls, target: int) -> CutProxy:
        proxy = cls(target)
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        proxy.port = proxy._server.sockets[0].getsockname()[1]
        return proxy

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self.links.append(link)
        self.accepted += 1
        self.changed.set()
        link.tasks = [
            asyncio.ensure_future(self._pump(reader, up_writer, link, upstream=True)),
            asyncio.ensure_future(self._pump(up_reader, writer, link, upstream=False)),
        ]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link, *, upstream: bool
    ) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if link.frozen.is_set():  # silent: read into nothing (held when stalled)
                    if upstream and link.stalled:
                        link.held += data
                    continue
                writer.write(data)
                await writer.drain()
            if not link.frozen.is_set():
                if writer.can_write_eof():
                    writer.write_eof()
                else:
                    writer.close()

    def cut(self, mode: str, link: _Link | None = None) -> None:
        """Cut ``link`` (the newest connection by default) by ``mode``."""
        link = link or self.links[-1]
        if mode == "fin":
            for task in link.tasks:
                task.cancel()
            link.client.close()
            link.server.close()
        elif mode == "rst":
            for task in link.tasks:
                task.cancel()
            _reset(link.client)
            _reset(link.server)
        elif mode in ("silent", "stall"):
            link.stalled = mode == "stall"
            link.frozen.set()
        else:
            raise ValueError(f"unknown cut {mode!r}")

    def cut_all(self, mode: str) -> None:
        """Cut every connection open now."""
        for link in self.links:
            if not link.client.is_closing():
                self.cut(mode, link)

    async def release(self, link: _Link) -> None:
        """Deliver to the server what a stalled link held from its client."""
        link.server.write(bytes(link.held))
        link.held.clear()
        await link.server.drain()

    async def close(self) -> None:
        for link in self.links:
            for task in link.tasks:
                task.cancel()
            for writer in (link.client, link.server):
                writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

"""A raw WebSocket peer for the hostile tests: a plain socket that performs the HTTP upgrade
itself and then writes whatever frames a test crafts (valid, or not at all), reading only
when the test says so."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import socket
import struct
import time


GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def frame(
    opcode: int, payload: bytes = b"", *, mask: bool = True, fin: bool = True, length: int | None = None
) -> bytes:
    """One WebSocket frame; ``length`` overrides the announced payload length (a lie)."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def accept_key(key: bytes) -> bytes:
    """The ``Sec-WebSocket-Accept`` answer to a ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1(key + GUID).digest())


class RawWebSocket:
    """A WebSocket client that never reads unless asked (``await RawWebSocket.open(port)``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def connect(cls, port: int) -> RawWebSocket:
        """The TCP connection only (no upgrade yet)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return cls(sock)

    @classmethod
    async def open(cls, port: int, path: str = "/") -> RawWebSocket:
        """Connect and upgrade (raises if the server does not answer 101)."""
        ws = await cls.connect(port)
        try:
            await ws.upgrade(port, path)
        except BaseException:
            ws.close()
            raise
        return ws

    def request(self, port: int, path: str = "/") -> bytes:
        key = base64.b64encode(os.urandom(16))
        return (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()

    async def upgrade(self, port: int, path: str = "/") -> None:
        await self.send(self.request(port, path))
        head = b""
        async with asyncio.timeout(10):
            while b"\r\n\r\n" not in head:
                data = await self.loop.sock_recv(self.sock, 4096)
                if not data:
                    raise ConnectionResetError(f"closed during the upgrade: {head!r}")
                head += data
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionRefusedError(status.decode())

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def dropped(self, timeout: float) -> float:  # noqa: ASYNC109
        """Seconds until the server has closed its socket for good: not its half-close (a
        close frame and a FIN), its socket gone, which our next bytes find as a reset.
        Reads (and discards) what comes meanwhile, sending a ping every 50 ms (a valid
        frame: the probe itself breaks nothing)."""
        start = time.monotonic()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await self.send(frame(PING, b"probe"))
                    data = b"-"
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.05):  # the probe's pace, not synchronisation
                            data = await self.loop.sock_recv(self.sock, 65536)
                    if not data:  # the server's FIN: its socket may still be open
                        await asyncio.sleep(0.05)  # the probe's pace, not synchronisation
                except (ConnectionError, BrokenPipeError):
                    return time.monotonic() - start

    async def closed(self, timeout: float) -> float:  # noqa: ASYNC109
        """Seconds until the server closes the connection (EOF or reset), reading and
        discarding what comes meanwhile; sends nothing (after the upgrade, any byte we sent
        would be a frame, maybe a violation)."""
        start = time.monotonic()
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionError):
                while await self.loop.sock_recv(self.sock, 65536):
                    pass
        return time.monotonic() - start

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.sock.close()

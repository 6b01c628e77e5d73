"""What the forward tests share: a target server whose behaviour each connection picks
with its first line, clients that send, half-close and read the whole answer, a SOCKS5
client, and a running pair of ends in this process."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import polymux
from polymux.forward import FarEnd, NearEnd, start_far_end, start_near_end


MIB = 1 << 20


async def _target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """``echo``: every byte back, then the end; ``hash``: read to the end, then answer
    ``<n> <sha256>`` (an answer that exists only after the client's half-close);
    ``send <n>``: n pattern bytes, then the end; ``hold``: read and never answer."""
    try:
        command = (await reader.readline()).decode().split()
        if command[:1] == ["echo"]:
            while data := await reader.read(256 * 1024):
                writer.write(data)
                await writer.drain()
        elif command[:1] == ["hash"]:
            digest = hashlib.sha256()
            n = 0
            while data := await reader.read(256 * 1024):
                digest.update(data)
                n += len(data)
            writer.write(f"{n} {digest.hexdigest()}".encode())
        elif command[:1] == ["send"]:
            block = pattern(256 * 1024)
            left = int(command[1])
            while left > 0:
                writer.write(block[: min(left, len(block))])
                left -= min(left, len(block))
                await writer.drain()
        elif command[:1] == ["hold"]:
            await reader.read()
        writer.write_eof()
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def pattern(n: int, seed: int = 0) -> bytes:
    """``n`` bytes that differ per ``seed`` (a swapped or misplaced block shows)."""
    block = hashlib.sha256(seed.to_bytes(4, "big")).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


@contextlib.asynccontextmanager
async def target_server() -> AsyncIterator[int]:
    """A target on 127.0.0.1 (see :func:`_target`); yields its port."""
    server = await asyncio.start_server(_target, "127.0.0.1", 0, backlog=1024)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def exchange(port: int, command: str, payload: bytes = b"", *, host: str = "127.0.0.1") -> bytes:
    """Connect to ``port``, send ``command`` line and ``payload``, half-close (as ``nc -N``
    does), and return everything that comes back until the end."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        return await _talk(reader, writer, command, payload)
    finally:
        writer.close()


async def _talk(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, command: str, payload: bytes
) -> bytes:
    async def send() -> None:
        writer.write(f"{command}\n".encode())
        view = memoryview(payload)
        for offset in range(0, len(view), 256 * 1024):
            writer.write(view[offset : offset + 256 * 1024])
            await writer.drain()
        writer.write_eof()

    sending = asyncio.ensure_future(send())
    chunks = []
    try:
        while data := await reader.read(256 * 1024):
            chunks.append(data)
        await sending
    finally:
        sending.cancel()
    return b"".join(chunks)


async def refused(port: int) -> bool:
    """Whether a connection to ``port`` is closed at once with nothing in it (an end, or a
    reset) while it says something."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"echo\nanything")
        return await reader.read() == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        writer.close()


def hash_answer(payload: bytes) -> bytes:
    """What the ``hash`` target answers for ``payload``."""
    return f"{len(payload)} {hashlib.sha256(payload).hexdigest()}".encode()


async def socks_connect(
    port: int, host: str, target_port: int, *, kind: int = 3, command: int = 1
) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    """Negotiate with the SOCKS5 server on ``port`` and ask for ``host:target_port`` (``kind``
    1 IPv4, 3 a name, 4 IPv6); the reply code and the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    if kind == 1:
        address = socket.inet_aton(host)
    elif kind == 4:
        address = socket.inet_pton(socket.AF_INET6, host)
    else:
        address = bytes([len(host)]) + host.encode()
    writer.write(bytes((5, command, 0, kind)) + address + target_port.to_bytes(2, "big"))
    head = await reader.readexactly(4)
    assert head[0] == 5, head
    await reader.readexactly(4 if head[3] == 1 else 16)
    await reader.readexactly(2)
    return head[1], reader, writer


async def socks_exchange(port: int, host: str, target_port: int, command: str, payload: bytes) -> bytes:
    """Through the SOCKS5 server on ``port`` to ``host:target_port``: :func:`exchange`."""
    code, reader, writer = await socks_connect(port, host, target_port)
    try:
        assert code == 0, f"SOCKS5 reply {code}"
        return await _talk(reader, writer, command, payload)
    finally:
        writer.close()


@dataclass
class Ends:
    """A far end and a near end talking, in this process."""

    far: FarEnd
    near: NearEnd

    def port(self, kind: str, index: int = 0) -> int:
        """The local port of the ``index``-th forward of ``kind`` (``-R``: on the far end)."""
        return [fwd for fwd in self.near.forwards if fwd.kind == kind][index].bind.port


@contextlib.asynccontextmanager
async def ends(
    protocol: str,
    *,
    to: str | None = None,
    allow: tuple[str, ...] = ("127.0.0.1:*",),
    reverse: bool | str = True,
    local: tuple[str, ...] = (),
    remote: tuple[str, ...] = (),
    socks: tuple[str, ...] = (),
    far_options: dict[str, object] | None = None,
    **near_options: object,
) -> AsyncIterator[Ends]:
    """A far end on 127.0.0.1 and a near end with these forwards; both cut at the end."""
    far = await start_far_end(
        f"{protocol}:tcp:127.0.0.1:0", to=to, allow=allow, reverse=reverse, **(far_options or {})
    )
    try:
        near = await start_near_end(
            f"{protocol}:tcp:127.0.0.1:{far.endpoint.port}",
            local=local,
            remote=remote,
            socks=socks,
            **near_options,  # type: ignore[arg-type]
        )
        try:
            yield Ends(far, near)
        finally:
            near.close()
            await near.wait_closed()
    finally:
        far.close()
        await far.wait_closed()


def named(protocol: str) -> bool:
    """Whether ``protocol``'s channels carry names."""
    return polymux.formats.get(protocol).caps.names

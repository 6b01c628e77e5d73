"""yamux against the reference implementation npm ``@chainsafe/libp2p-yamux`` 8.0.1,
driven by ``node/yamux_peer.mjs`` over a raw socket.

Both roles (the connecting side is the yamux client), TCP and unix sockets: 64
concurrent streams each echoing 1 MiB, half-close both ways, reset, ping, GoAway, and a
32 MiB single stream. yamux streams have no names: the opener writes ``<name>\\n`` first
and the responder reacts to it (see the header of ``node/yamux_peer.mjs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from pathlib import Path

import pytest

import polymux

from .peers import echo_through, finish_node, pattern, start_node


pytestmark = [pytest.mark.interop, pytest.mark.timeout(150)]

CHANNELS = 64
SIZE = 1 << 20
BIG = 32 * 1024 * 1024


async def _node(node_dir: Path, *args: str) -> asyncio.subprocess.Process:
    return await start_node(node_dir / "yamux_peer.mjs", *args, watchdog=120)


_finish = finish_node


async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The polymux side when the Node peer opens the streams."""
    name = (await reader.readline()).decode().rstrip("\n")
    try:
        if name.startswith("echo/"):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        elif name.startswith("halfclose/"):
            total = 0
            while data := await reader.read(65536):
                total += len(data)
            writer.write(str(total).encode())
        elif name.startswith("big/"):
            digest = hashlib.sha256()
            total = 0
            while data := await reader.read(1 << 20):
                digest.update(data)
                total += len(data)
            writer.write(f"{total} {digest.hexdigest()}".encode())
        elif name.startswith("error/"):
            writer.transport.abort()
            return
        writer.write_eof()
        await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(polymux.PolymuxError, ConnectionError):
            await writer.wait_closed()


async def _open(session: polymux.Session, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await session.open_channel(name)
    writer.write(name.encode() + b"\n")
    return reader, writer


async def _drive(session: polymux.Session) -> None:
    async def echo(i: int) -> None:
        reader, writer = await _open(session, f"echo/{i}")
        data = pattern(i, SIZE)
        received = await echo_through(reader, writer, data)
        assert received == data, f"echo/{i}: {len(received)} bytes back"
        writer.close()

    async def halfclose() -> None:
        reader, writer = await _open(session, "halfclose/x")
        writer.write(b"z" * 300_000)
        writer.write_eof()
        await writer.drain()
        assert await reader.read(-1) == b"300000"
        writer.close()

    async def error() -> None:
        reader, writer = await _open(session, "error/x")
        with pytest.raises(polymux.ChannelReset):
            await reader.read(-1)
        writer.close()

    async def big() -> None:
        reader, writer = await _open(session, "big/x")
        data = pattern(99, BIG)
        view = memoryview(data)
        for off in range(0, len(data), 64 * 1024):
            writer.write(view[off : off + 64 * 1024])
            await writer.drain()
        writer.write_eof()
        assert (await reader.read(-1)).decode() == f"{BIG} {hashlib.sha256(data).hexdigest()}"
        writer.close()

    rtt = await session.ping()
    assert rtt >= 0
    await asyncio.gather(*(echo(i) for i in range(CHANNELS)), halfclose(), error(), big())


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_polymux_client_node_server(node_peers: Path, tmp_path: Path, transport: str) -> None:
    """A Node yamux server that responds; polymux (the client) opens every stream, pings,
    and closes with GoAway."""
    where = ["--tcp", "0"] if transport == "tcp" else ["--unix", str(tmp_path / "s")]
    proc = await _node(node_peers, "--listen", *where, "--mode", "responder")
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
        assert line[:1] == ["LISTENING"], line
        if transport == "tcp":
            session = await polymux.connect("127.0.0.1", int(line[1]), protocol="yamux")
        else:
            session = await polymux.connect_unix(line[1], protocol="yamux")
        async with session:
            await asyncio.wait_for(_drive(session), 120)
        result = await _finish(proc)
        assert result.get("ok") is True, result
        assert result.get("remote_goaway") == 0, result  # our aclose() said GoAway(normal)
        assert result.get("remote_pings", 0) >= 1, result  # the RTT ping at connect
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_node_client_polymux_server(node_peers: Path, tmp_path: Path, transport: str) -> None:
    """A polymux yamux server that responds; the Node client opens every stream."""
    if transport == "tcp":
        server = await polymux.start_server(respond, "127.0.0.1", 0, protocol="yamux")
        where = ["--tcp", str(server.port)]
    else:
        path = str(tmp_path / "s")
        server = await polymux.start_unix_server(respond, path, protocol="yamux")
        where = ["--unix", path]
    async with server:
        proc = await _node(
            node_peers,
            "--connect",
            *where,
            "--mode",
            "driver",
            "--channels",
            str(CHANNELS),
            "--size",
            str(SIZE),
            "--big",
            str(BIG),
        )
        result = await _finish(proc)
    assert result.get("ok") is True, result
    print(json.dumps(result)[:2000])

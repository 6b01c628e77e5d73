"""mplex / multiplex against the reference implementations: npm ``multiplex`` 6.7.0
(maxogden, ``{halfOpen: true}``) and npm ``@libp2p/mplex`` 12.x, driven by
``node/mplex_peer.mjs`` over a raw socket.

Both roles, TCP and unix sockets: 32 concurrent channels each echoing 1 MiB, stream
names as each implementation sends them, half-close, reset with a message (multiplex
carries the text; libp2p sends empty resets), and a 5 MiB single write.

@libp2p/mplex drops the names it receives (it names inbound streams "r<id>" and sends
"i<id>" itself), so in libp2p mode every stream starts with a ``<name>\\n`` line that the
responder strips (see the header of ``node/mplex_peer.mjs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from pathlib import Path

import pytest

import polymux

from .peers import echo_through, finish_node, pattern, start_node


pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

CHANNELS = 32
SIZE = 1 << 20
BIG = 5 * 1024 * 1024
NAME = "name/héllo wörld/✓"
IMPL = {"multiplex": "multiplex", "mplex": "libp2p"}


async def _node(node_dir: Path, *args: str) -> asyncio.subprocess.Process:
    return await start_node(node_dir / "mplex_peer.mjs", *args, watchdog=90)


_finish = finish_node


def responder(libp2p: bool):  # type: ignore[no-untyped-def]
    """The polymux side of the scenarios when the Node peer opens the streams."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream_name = writer.get_extra_info("channel_name")
        name = (await reader.readline()).decode().rstrip("\n") if libp2p else stream_name
        try:
            if name.startswith("echo/"):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            elif name.startswith("name/"):
                writer.write(stream_name.encode())
                await reader.read()
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
                transport = writer.transport
                assert isinstance(transport, polymux.ChannelTransport)
                transport.reset(name[len("error/") :])
                return
            writer.write_eof()
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(polymux.PolymuxError, ConnectionError):
                await writer.wait_closed()

    return respond


async def _open(
    session: polymux.Session, name: str, libp2p: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await session.open_channel(name)
    if libp2p:
        writer.write(name.encode() + b"\n")
    return reader, writer


async def _drive(session: polymux.Session, protocol: str) -> None:
    libp2p = protocol == "mplex"

    async def echo(i: int) -> None:
        reader, writer = await _open(session, f"echo/{i}", libp2p)
        data = pattern(i, SIZE)
        received = await echo_through(reader, writer, data)
        assert received == data, f"echo/{i}: {len(received)} bytes back"
        writer.close()

    async def name() -> None:
        reader, writer = await _open(session, NAME, libp2p)
        reply = (await reader.read(-1)).decode()
        if libp2p:
            assert reply.startswith("r"), reply  # libp2p names inbound streams "r<id>"
        else:
            assert reply == NAME
        writer.write_eof()
        writer.close()

    async def halfclose() -> None:
        reader, writer = await _open(session, "halfclose/x", libp2p)
        writer.write(b"z" * 300_000)
        writer.write_eof()
        await writer.drain()
        assert await reader.read(-1) == b"300000"
        writer.close()

    async def error() -> None:
        reader, writer = await _open(session, "error/boom from node", libp2p)
        with pytest.raises(polymux.ChannelReset) as reset:
            await reader.read(-1)
        if libp2p:
            assert reset.value.message is None  # libp2p resets carry no text
        else:
            assert reset.value.message == "boom from node"
        writer.close()

    async def big() -> None:
        reader, writer = await _open(session, "big/x", libp2p)
        data = pattern(99, BIG)
        writer.write(data)  # one 5 MiB write
        writer.write_eof()
        await writer.drain()
        assert (await reader.read(-1)).decode() == f"{BIG} {hashlib.sha256(data).hexdigest()}"
        writer.close()

    await asyncio.gather(*(echo(i) for i in range(CHANNELS)), name(), halfclose(), error(), big())


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("protocol", ["multiplex", "mplex"])
async def test_polymux_client_node_server(
    node_peers: Path, tmp_path: Path, protocol: str, transport: str
) -> None:
    """A Node listener that responds, and polymux opening every stream."""
    where = ["--tcp", "0"] if transport == "tcp" else ["--unix", str(tmp_path / "s")]
    proc = await _node(node_peers, "--impl", IMPL[protocol], "--listen", *where, "--mode", "responder")
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
        assert line[:1] == ["LISTENING"], line
        if transport == "tcp":
            session = await polymux.connect("127.0.0.1", int(line[1]), protocol=protocol)
        else:
            session = await polymux.connect_unix(line[1], protocol=protocol)
        async with session:
            await asyncio.wait_for(_drive(session, protocol), 90)
        result = await _finish(proc)
        assert result.get("ok") is True, result
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("protocol", ["multiplex", "mplex"])
async def test_node_client_polymux_server(
    node_peers: Path, tmp_path: Path, protocol: str, transport: str
) -> None:
    """A polymux server that responds, and a Node client opening every stream."""
    handler = responder(libp2p=protocol == "mplex")
    if transport == "tcp":
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol=protocol)
        where = ["--tcp", str(server.port)]
    else:
        path = str(tmp_path / "s")
        server = await polymux.start_unix_server(handler, path, protocol=protocol)
        where = ["--unix", path]
    async with server:
        proc = await _node(
            node_peers,
            "--impl",
            IMPL[protocol],
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
    assert result.get("echo_ok", CHANNELS) == CHANNELS, result

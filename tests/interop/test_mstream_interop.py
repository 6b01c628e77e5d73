"""MultiplexingStream v1/v2/v3 against the reference implementation (npm ``nerdbank-streams``).

Both roles, TCP and unix sockets: a Node server with polymux offering channels, and a
Node client offering channels to a polymux server. Each run moves 16 concurrent channels
of 1 MiB echoed both ways, checks names (non-ASCII), half-close, a rejected offer and a
channel terminated with an error message.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

import polymux

from .peers import finish_node, offer_filter, pattern, respond, start_node


pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

CHANNELS = 16
SIZE = 1 << 20
NAME = "name/héllo wörld/✓"


async def _node(node_dir: Path, *args: str) -> asyncio.subprocess.Process:
    return await start_node(node_dir / "mstream_peer.js", *args, watchdog=60)


_finish = finish_node


async def _drive(session: polymux.Session, version: int) -> None:
    """polymux offers every scenario to a Node responder."""

    async def echo(i: int) -> None:
        reader, writer = await session.open_channel(f"echo/{i}")
        data = pattern(i, SIZE)

        async def send() -> None:
            view = memoryview(data)
            for off in range(0, len(data), 100_000):
                writer.write(view[off : off + 100_000])
                await writer.drain()
            writer.write_eof()

        sender = asyncio.create_task(send())
        received = await reader.read(-1)
        await sender
        assert received == data, f"echo/{i}: {len(received)} bytes back, first difference matters"
        writer.close()

    await asyncio.gather(*(echo(i) for i in range(CHANNELS)))

    reader, writer = await session.open_channel(NAME)
    assert (await reader.read(-1)).decode() == NAME
    writer.write_eof()
    writer.close()

    reader, writer = await session.open_channel("halfclose/x")
    writer.write(b"z" * 300_000)
    writer.write_eof()
    await writer.drain()
    assert await reader.read(-1) == b"300000"
    writer.close()

    with pytest.raises(polymux.ChannelRejected) as rejected:
        await session.open_channel("reject/x")
    assert "reject/x" in str(rejected.value)

    reader, writer = await session.open_channel("error/boom from node")
    with pytest.raises(polymux.ChannelReset) as reset:
        await reader.read(-1)
    if version >= 2:
        assert reset.value.message is not None and "boom from node" in reset.value.message
    else:
        assert reset.value.message is None  # v1 carries no error text
    writer.close()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_polymux_client_node_server(
    node_peers: Path, tmp_path: Path, version: int, transport: str
) -> None:
    """A Node server (responder) and a polymux client that offers the channels."""
    where = ["--tcp", "0"] if transport == "tcp" else ["--unix", str(tmp_path / "s")]
    proc = await _node(node_peers, "--listen", *where, "--version", str(version), "--mode", "responder")
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
        assert line[:1] == ["LISTENING"], line
        protocol = f"mstream-v{version}"
        if transport == "tcp":
            session = await polymux.connect("127.0.0.1", int(line[1]), protocol=protocol)
        else:
            session = await polymux.connect_unix(line[1], protocol=protocol)
        async with session:
            await _drive(session, version)
        result = await _finish(proc)
        assert result.get("ok") is True, result
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_node_client_polymux_server(
    node_peers: Path, tmp_path: Path, version: int, transport: str
) -> None:
    """A polymux server (responder) and a Node client that offers the channels."""
    protocol = f"mstream-v{version}"
    if transport == "tcp":
        server = await polymux.start_server(
            respond, "127.0.0.1", 0, protocol=protocol, offer_filter=offer_filter
        )
        where = ["--tcp", str(server.port)]
    else:
        path = str(tmp_path / "s")
        server = await polymux.start_unix_server(respond, path, protocol=protocol, offer_filter=offer_filter)
        where = ["--unix", path]
    async with server:
        proc = await _node(
            node_peers,
            "--connect",
            *where,
            "--version",
            str(version),
            "--mode",
            "driver",
            "--channels",
            str(CHANNELS),
            "--size",
            str(SIZE),
        )
        result = await _finish(proc)
    assert result.get("ok") is True, result
    print(json.dumps(result), file=sys.stderr)

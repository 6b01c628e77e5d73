"""omnistreams against the npm package ``omnistreams`` 0.9.0 (legacy numbering) over
WebSocket (npm ``ws``), driven by ``node/omnistreams_peer.mjs``.

Both roles: 16 concurrent streams of 1 MiB each way, creation metadata, END, cancel by
the receiver both ways, control messages. omnistreams streams are one-way, so answers
travel on streams opened back (see the header of ``node/omnistreams_peer.mjs``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

import polymux

from .peers import finish_node, pattern, start_node


pytestmark = [pytest.mark.interop, pytest.mark.timeout(150)]

CHANNELS = 16
SIZE = 1 << 20
PROTOCOL = "omnistreams-legacy"


async def _read_listening(proc: asyncio.subprocess.Process) -> int:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.startswith(b"LISTENING "), line
    return int(line.split()[1])


async def test_polymux_drives_node(node_peers: Path) -> None:
    """polymux connects and opens streams; the npm package responds."""
    proc = await start_node(
        node_peers / "omnistreams_peer.mjs", "--listen", "--port", "0", "--mode", "responder"
    )
    try:
        async with asyncio.timeout(90):
            port = await _read_listening(proc)
            session = await polymux.connect_websocket(f"ws://127.0.0.1:{port}/omnistreams", protocol=PROTOCOL)

            async def sink(i: int) -> None:
                _reader, writer = await session.open_channel(f"sink/{i}")
                data = pattern(i, SIZE)
                for off in range(0, SIZE, 64 * 1024):
                    writer.write(data[off : off + 64 * 1024])
                    await writer.drain()
                writer.close()  # STREAM_END
                await writer.wait_closed()

            async def results() -> dict[str, tuple[bytes, dict[str, object]]]:
                got: dict[str, tuple[bytes, dict[str, object]]] = {}
                while len(got) < CHANNELS:
                    reader, writer = await session.accept_channel()
                    metadata = json.loads(writer.transport.get_extra_info("metadata"))
                    got[writer.transport.get_extra_info("channel_name")] = (await reader.read(), metadata)
                    writer.close()
                return got

            collector = asyncio.ensure_future(results())
            await asyncio.gather(*(sink(i) for i in range(CHANNELS)))
            got = await collector
            for i in range(CHANNELS):
                body, metadata = got[f"result/{i}"]
                want = pattern(i, SIZE)
                assert body.decode() == f"{SIZE} {hashlib.sha256(want).hexdigest()}"
                assert metadata == {"name": f"result/{i}", "chunkSize": 65536, "for": f"sink/{i}"}

            # The receiver cancels: TERMINATE_SENDER reaches our writer as a reset.
            _reader, writer = await session.open_channel("cancel/0")
            with pytest.raises(polymux.ChannelReset, match="cancelled by the receiver"):
                while True:
                    writer.write(b"c" * 65536)
                    await writer.drain()

            session.send_control(b"hello")
            assert await session.receive_control() == b"echo:hello"
            await session.aclose()
    finally:
        summary = await finish_node(proc)
    assert summary["ok"], summary
    assert summary["sinks"] == CHANNELS
    assert summary["cancelled"] == 1
    assert summary["controls"] == ["hello"]
    metadata = summary["metadata"]
    assert isinstance(metadata, list)
    assert {"name": "sink/3", "chunkSize": 65536} in metadata


async def test_node_drives_polymux(node_peers: Path) -> None:
    """The npm package connects and opens streams; polymux serves."""
    failures: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        name = transport.get_extra_info("channel_name")
        session = transport.get_extra_info("session")
        try:
            if name.startswith("data/"):
                body = await reader.read()
                answer = f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
                _r, out = await session.open_channel("ack/" + name[len("data/") :])
            elif name == "meta/x":
                assert await reader.read() == b""  # created and ended at once
                answer = transport.get_extra_info("metadata")
                _r, out = await session.open_channel("ack/meta")
            elif name == "cancelme/x":
                await reader.readexactly(10)
                writer.close()  # we stop reading: TERMINATE_SENDER
                return
            else:
                failures.append(f"unexpected stream {name!r}")
                return
            out.write(answer)
            out.close()
            await out.wait_closed()
        except Exception as exc:  # noqa: BLE001 - reported by the test below
            failures.append(f"{name}: {exc!r}")
        finally:
            writer.close()

    async def session_handler(session: polymux.Session) -> None:
        while True:
            try:
                message = await session.receive_control()
            except polymux.SessionClosed:
                return
            session.send_control(b"pong:" + message)

    server = await polymux.serve_websocket(
        handler, "127.0.0.1", 0, protocol=PROTOCOL, session_handler=session_handler
    )
    try:
        proc = await start_node(
            node_peers / "omnistreams_peer.mjs",
            "--connect",
            "--url",
            f"ws://127.0.0.1:{server.port}/omnistreams",
            "--mode",
            "driver",
            "--channels",
            str(CHANNELS),
            "--size",
            str(SIZE),
        )
        summary = await finish_node(proc)
    finally:
        await asyncio.wait_for(server.aclose(), 15)
    assert not failures, failures
    assert summary["ok"], summary
    assert summary["data_streams"] == CHANNELS
    assert summary["cancel"] == "terminated"
    assert summary["control"] == "pong:ping"
    assert json.loads(str(summary["metadata_echoed"])) == {
        "name": "meta/x",
        "chunkSize": 1000,
        "extra": "€ ok",
    }

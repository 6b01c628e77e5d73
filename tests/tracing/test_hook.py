"""The session's capture hook: what the factory is told, and a failing factory does not
break the session."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import polymux
from polymux._types import BytesLike


class Sink:
    """Keeps what a session hands over, in memory."""

    def __init__(self, info: Mapping[str, str]) -> None:
        self.info = dict(info)
        self.got_in: list[bytes] = []
        self.got_out: list[bytes] = []
        self.closed = asyncio.get_running_loop().create_future()

    def received(self, data: BytesLike) -> None:
        self.got_in.append(bytes(data))

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        self.got_out.append(b"".join(bytes(c) for c in chunks))

    def close(self) -> None:
        self.closed.set_result(None)


class Recorder:
    """A minimal capture factory."""

    def __init__(self) -> None:
        self.sinks: list[Sink] = []

    def __call__(self, info: Mapping[str, str]) -> Sink:
        sink = Sink(info)
        self.sinks.append(sink)
        return sink


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_factory_info_and_bytes(host: str) -> None:
    recorder = Recorder()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())
        writer.close()

    async with asyncio.timeout(20):
        server = await polymux.start_server(handler, host, 0, protocol="mplex", capture=recorder)
        port = server.sockets[0].getsockname()[1]
        session = await polymux.connect(host, port, protocol="mplex", capture=recorder)
        reader, writer = await session.open_channel("x")
        writer.write(b"hello")
        writer.write_eof()
        assert await reader.read() == b"hello"
        await session.aclose()
        server.close()
        await server.wait_closed()
        await asyncio.gather(*(s.closed for s in recorder.sinks))
    client, srv = sorted(recorder.sinks, key=lambda s: s.info["role"])
    shown = f"[{host}]" if ":" in host else host
    assert client.info == {
        "format": "mplex",
        "role": "client",
        "local": client.info["local"],
        "peer": f"{shown}:{port}",
    }
    assert srv.info["local"] == f"{shown}:{port}" and srv.info["peer"] == client.info["local"]
    assert b"".join(client.got_out) == b"".join(srv.got_in)
    assert b"".join(srv.got_out) == b"".join(client.got_in)
    assert b"hello" in b"".join(client.got_out)


async def test_failing_factory_does_not_break_the_session(caplog: pytest.LogCaptureFixture) -> None:
    def broken(info: Mapping[str, str]) -> Any:
        raise RuntimeError("no disk")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())
        writer.close()

    with caplog.at_level(logging.ERROR, logger="polymux"):
        async with asyncio.timeout(20):
            server = await polymux.start_server(handler, "127.0.0.1", 0, protocol="yamux")
            port = server.sockets[0].getsockname()[1]
            session = await polymux.connect("127.0.0.1", port, protocol="yamux", capture=broken)
            reader, writer = await session.open_channel("x")
            writer.write(b"still works")
            writer.write_eof()
            assert await reader.read() == b"still works"
            await session.aclose()
            server.close()
            await server.wait_closed()
    assert "the capture factory failed; this session is not recorded" in caplog.text

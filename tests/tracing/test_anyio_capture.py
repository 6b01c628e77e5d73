"""The capture hook on polymux.anyio sessions: a recorded anyio session decodes like an
asyncio one (both backends)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketAttribute

import polymux.anyio as pm_anyio
from polymux.tracing import CaptureRecorder, decode_chunks, read_capture

from .conftest import data_bytes


async def _drain(channel: pm_anyio.AnyioChannel) -> bytes:
    data = b""
    try:
        while True:
            data += await channel.receive()
    except anyio.EndOfStream:
        return data


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_anyio_session_is_recorded(backend: str, tmp_path: Path) -> None:
    recorder = CaptureRecorder(tmp_path)

    async def main() -> int:
        with anyio.fail_after(20):
            async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
                port = listener.extra(SocketAttribute.local_port)
                client_end = await anyio.connect_tcp("127.0.0.1", port)
                server_end = await listener.listeners[0].accept()
            async with (
                client_end,
                server_end,
                pm_anyio.session(server_end, protocol="yamux", is_client=False) as server,
                pm_anyio.session(client_end, protocol="yamux", capture=recorder) as client,
            ):
                channel = await client.open_channel("x")
                await channel.send(bytes(70_000))
                await channel.send_eof()
                incoming = await server.accept_channel()
                data = await _drain(incoming)
                await incoming.send(data[:1000])
                await incoming.send_eof()
                assert len(await _drain(channel)) == 1000
            return int(port)

    port = anyio.run(main, backend=backend)
    recorder.close()
    (path,) = recorder.paths
    cap = read_capture(path)
    assert (cap.format, cap.role) == ("yamux", "client")
    assert cap.local.startswith("127.0.0.1:") and cap.peer == f"127.0.0.1:{port}"
    records = list(decode_chunks("yamux", cap.chunks, session=cap.session))
    assert data_bytes(records) == {"c2s": Counter([70_000]), "s2c": Counter([1000])}
    assert not [r for r in records if r.frame_type in ("violation", "truncated")]

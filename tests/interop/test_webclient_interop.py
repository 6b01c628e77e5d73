"""polymux's browser client (``src/polymux/web/omnistreams.js``) in Node, driven by
``node/webclient_peer.mjs``:

* against the npm package ``omnistreams`` 0.9.0 (legacy numbering), as its client and as its
  server: streams both ways, metadata, cancel both ways, control messages, and a clear
  timeout for a pair (npm does not answer pairs);
* against polymux itself (spec numbering): pairs (``Session.open_pair``) both ways, one-way
  streams both ways, cancels both ways, control messages;
* against a server that breaks the protocol: the session ends with an error naming the
  format, the field and the value.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import polymux

from .peers import finish_node, pattern, start_node


pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

SIZE = 1 << 20
PEER = "webclient_peer.mjs"


async def test_web_client_and_npm_omnistreams_both_roles(node_peers: Path) -> None:
    proc = await start_node(node_peers / PEER, "--mode", "npm")
    summary = await finish_node(proc)
    assert summary["ok"], summary
    for role in ("ours_client", "ours_server"):
        report = summary[role]
        assert isinstance(report, dict), summary
        assert report["cancelled_by_npm"] == "cancelled"
        assert report["cancelled_by_us"] == "terminated"
        assert report["control"] == "echo:ping"
        assert "no answer within 300 ms" in report["pair_error"]
        assert {"name": "up/3", "chunkSize": 65536, "extra": "€ ok"} in report["metadata"]


async def test_web_client_against_polymux(node_peers: Path) -> None:
    failures: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = writer.get_extra_info("channel_name")
        session = writer.get_extra_info("session")
        try:
            if name.startswith("echo/"):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            elif name == "sink":
                body = await reader.read()
                session.send_control(f"sink {len(body)} {hashlib.sha256(body).hexdigest()}".encode())
            elif name == "flood":
                try:
                    while True:
                        writer.write(b"f" * 65536)
                        await writer.drain()
                except polymux.ChannelReset as exc:
                    session.send_control(f"flood {exc}".encode())
            elif name == "stopper":
                await reader.readexactly(65536)
            elif name == "hold":
                try:
                    await writer.wait_closed()  # no reading: the client's credit runs out
                    session.send_control(b"hold closed")
                except polymux.PolymuxError as exc:
                    session.send_control(f"hold {exc}".encode())
            else:
                failures.append(f"unexpected channel {name!r}")
        except Exception as exc:  # noqa: BLE001 - reported by the test below
            failures.append(f"{name}: {exc!r}")
        finally:
            writer.close()

    async def push(session: polymux.Session) -> None:
        _reader, writer = await session.open_channel("push")
        writer.write(pattern(9, SIZE))
        writer.close()
        await writer.wait_closed()
        session.send_control(b"push ok")
        reader, writer = await session.open_pair("ask")
        data = pattern(5, 512 * 1024)
        writer.write(data)
        writer.write_eof()
        back = await reader.read()
        writer.close()
        session.send_control(b"ask ok" if back == data else f"ask got {len(back)} bytes".encode())

    async def session_handler(session: polymux.Session) -> None:
        while True:
            try:
                message = await session.receive_control()
            except polymux.SessionClosed:
                return
            if message == b"push":
                await push(session)

    server = await polymux.serve_websocket(handler, "127.0.0.1", 0, session_handler=session_handler)
    try:
        proc = await start_node(
            node_peers / PEER, "--mode", "polymux", "--url", f"ws://127.0.0.1:{server.port}/ws"
        )
        summary = await finish_node(proc)
    finally:
        await asyncio.wait_for(server.aclose(), 15)
    assert not failures, failures
    assert summary["ok"], summary
    assert summary["sink"] == f"sink {SIZE} {hashlib.sha256(pattern(3, SIZE)).hexdigest()}"
    assert "cancelled by the receiver" in str(summary["flood"])
    assert str(summary["stopper"]).startswith("cancelled: omnistreams: stream "), summary["stopper"]
    assert "was cancelled by the receiver" in str(summary["stopper"])
    assert summary["hold"] == 'cancelled: omnistreams: stream "hold" was cancelled (by the test)', summary
    assert "cancelled by the" in str(summary["hold_polymux"]), summary
    assert summary["push_write_error"] == "usage"  # a stream polymux opened is receive-only
    assert summary["pushed"] == "push ok"
    assert summary["asked"] == "ask ok"
    assert summary["closed"] == {"code": 1000, "reason": "", "error": None}
    print(
        f"\nomnistreams.js in Node <-> polymux: 8 pairs echoing 2 MiB, {summary['echo_mb_s']} MB/s both ways"
    )


def _create(sid: int, meta: object) -> bytes:
    return bytes((1, sid)) + json.dumps(meta).encode()


# What a broken server sends once the client's first message arrived, and the error expected.
ERRORS: dict[str, tuple[Callable[[], list[bytes | str]], str]] = {
    "text message": (lambda: ["hello"], r"received a text WebSocket message"),
    "unknown type": (
        lambda: [bytes((9, 0))],
        r"unknown message type 9 \(the omnistreams numbering has 0\.\.6\)",
    ),
    "empty message": (lambda: [b""], r"empty message \(no type byte\)"),
    "no stream id": (lambda: [bytes((2,))], r"STREAM_DATA message of 1 byte has no stream id byte"),
    "request count": (
        lambda: [bytes((5, 0, 1, 2))],
        r"STREAM_REQUEST_DATA for stream 0 has 2 count bytes \(expected 1\)",
    ),
    "end payload": (lambda: [bytes((3, 4, 0))], r"STREAM_END for stream 4 carries 1 unexpected bytes"),
    "end never created": (lambda: [bytes((3, 7))], r"STREAM_END for stream 7, which was never created"),
    "bad chunkSize": (
        lambda: [_create(0, {"name": "x", "chunkSize": "big"})],
        r'chunkSize "big" of stream 0 must be an int in 1\.\.1048576',
    ),
    "chunk over chunkSize": (
        lambda: [_create(0, {"name": "x", "chunkSize": 4}), bytes((2, 0)) + b"12345"],
        r"STREAM_DATA of 5 bytes on stream 0 exceeds its chunkSize 4",
    ),
    "beyond credit": (
        # chunkSize 1 MiB: the client grants one message (its window is 1 MiB); we send two.
        lambda: [_create(0, {"name": "x", "chunkSize": 1 << 20}), bytes((2, 0, 1)), bytes((2, 0, 2))],
        r"STREAM_DATA beyond the credit on stream 0 \(1 messages requested\)",
    ),
    "created twice": (
        lambda: [_create(0, {"name": "x"}), _create(0, {"name": "x"})],
        r"CREATE_RECEIVE_STREAM for stream 0, which is already open",
    ),
    "data after end": (
        lambda: [_create(0, {"name": "x"}), bytes((3, 0)), bytes((2, 0, 1))],
        r"STREAM_DATA for stream 0 after its STREAM_END",
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
async def test_web_client_reports_protocol_errors(node_peers: Path, case: str) -> None:
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.exceptions import ConnectionClosed

    messages, expected = ERRORS[case]
    grants: list[int] = []  # STREAM_REQUEST_DATA counts for our stream 0

    async def broken(ws: ServerConnection) -> None:
        await ws.recv()  # the client's first CREATE_RECEIVE_STREAM
        for message in messages():
            await ws.send(message)
        # Read what the client still sends (credit), up to its close (code 1002).
        with contextlib.suppress(ConnectionClosed):
            async for got in ws:
                if isinstance(got, bytes) and got[:2] == bytes((5, 0)):
                    grants.append(got[2])  # noqa: PERF401 - kept when the close raises

    async with serve(broken, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        proc = await start_node(node_peers / PEER, "--mode", "error", "--url", f"ws://127.0.0.1:{port}/")
        summary = await finish_node(proc, limit=30)
    assert summary["ok"], summary
    assert summary["code"] == "protocol", summary
    assert str(summary["error"]).startswith("omnistreams: "), summary
    assert re.search(expected, str(summary["error"])), summary
    assert summary["ws_code"] == 1002, summary
    if case == "chunk over chunkSize":
        # 4-byte chunks: the client grants 1,020 messages (its cap), not 1 MiB / 4 of them.
        assert grants == [255, 255, 255, 255]

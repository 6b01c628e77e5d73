"""polymux forward against the Go libraries that kcptun-style tools are built on:
hashicorp/yamux and xtaci/smux (v1 and v2), through the Go peers of ``go/`` (built by
``gobuild.py``; a missing Go toolchain fails these tests, it never skips them).

* A far end started with ``to=`` serves Go clients: the Go driver opens its streams (an
  echo per stream, a large upload answered by its SHA-256, a stream the target resets or
  ends at once), each mapped to one TCP target, which answers as the Go responder would
  (by the stream's first line: the peers' convention).
* A near end with bare ``-L`` works against a Go server that echoes every stream: local
  clients connect, send the responder's first line and their bytes, half-close, and get
  the whole answer (echoes, a 64 MiB upload's SHA-256, the count of a half-closed
  stream).
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from polymux.forward import start_far_end, start_near_end

from .gobuild import GoUnavailable, build
from .peers import pattern, start_peer


pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

MIB = 1 << 20
VERSIONS = [pytest.param("smux", id="v1"), pytest.param("smux-v2", id="v2")]


@pytest.fixture(scope="session")
def go_smux_peer() -> Path:
    """The Go peer over xtaci/smux (``go/smux_peer``), built if its sources changed."""
    try:
        return build("smux_peer")
    except GoUnavailable as exc:
        pytest.fail(f"interop tests against xtaci/smux (they are never skipped): {exc}")


async def _target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The one TCP target every stream is mapped to: it reads the stream's first line and
    answers as the Go responder does (``echo/*``, ``big/<n>``, ``error/*``: a reset,
    ``close/*``: the end at once)."""
    try:
        kind, _, arg = (await reader.readline()).decode().strip().partition("/")
        if kind == "echo":
            while data := await reader.read(256 * 1024):
                writer.write(data)
                await writer.drain()
        elif kind == "big":
            n = int(arg)
            digest = hashlib.sha256()
            left = n
            while left:
                data = await reader.read(min(left, 256 * 1024))
                if not data:
                    break
                digest.update(data)
                left -= len(data)
            writer.write(f"{n - left} {digest.hexdigest()}".encode())
            await writer.drain()
            await reader.read()  # until the stream's end
        elif kind == "error":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # a reset: the Go driver expects its stream reset
            return
        writer.close()
    except (ConnectionError, OSError):
        writer.transport.abort()


@pytest.fixture
async def target() -> AsyncIterator[int]:
    server = await asyncio.start_server(_target, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_far_end_with_to_serves_go_yamux_clients(go_yamux_peer: Path, target: int) -> None:
    far = await start_far_end("yamux:tcp:127.0.0.1:0", to=f"127.0.0.1:{target}")
    try:
        go = await start_peer(
            go_yamux_peer, "--connect", "--tcp", str(far.endpoint.port), "--mode", "driver",
            "--channels", "32", "--size", str(MIB), "--big", str(16 * MIB),
        )  # fmt: skip
        try:
            result = await go.finish(180)
        finally:
            await go.aclose()
    finally:
        far.close()
        await far.wait_closed()
    assert result["ok"], result
    assert result["echo_ok"] == 32
    assert str(result["big"]["reply"]).startswith(f"{16 * MIB} ")  # type: ignore[index]
    assert far.stats.total >= 34  # every stream went to the target


@pytest.mark.parametrize("protocol", VERSIONS)
async def test_a_far_end_with_to_serves_go_smux_clients(
    go_smux_peer: Path, target: int, protocol: str
) -> None:
    far = await start_far_end(f"{protocol}:tcp:127.0.0.1:0", to=f"127.0.0.1:{target}")
    version = "1" if protocol == "smux" else "2"
    try:
        go = await start_peer(
            go_smux_peer, "--connect", "--tcp", str(far.endpoint.port), "--mode", "driver", "--version", version,
            "--channels", "32", "--size", str(MIB), "--big", str(16 * MIB),
        )  # fmt: skip
        try:
            result = await go.finish(180)
        finally:
            await go.aclose()
    finally:
        far.close()
        await far.wait_closed()
    assert result["ok"], result
    assert result["echo_ok"] == 32
    assert str(result["big"]["reply"]).startswith(f"{16 * MIB} ")  # type: ignore[index]


async def _exchange(port: int, first_line: str, payload: bytes) -> bytes:
    """Through the near end's bare -L: the responder's first line, the payload, the
    half-close; everything that comes back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:

        async def send() -> None:
            writer.write(first_line.encode() + b"\n")
            view = memoryview(payload)
            for offset in range(0, len(view), 256 * 1024):
                writer.write(view[offset : offset + 256 * 1024])
                await writer.drain()
            writer.write_eof()

        sending = asyncio.ensure_future(send())
        got = bytearray()
        while data := await reader.read(256 * 1024):
            got += data
        await sending
        return bytes(got)
    finally:
        writer.close()


def _big(n: int) -> tuple[bytes, bytes]:
    data = pattern(99, n)
    return data, f"{n} {hashlib.sha256(data).hexdigest()}".encode()


async def test_a_near_end_with_bare_l_works_against_a_go_yamux_server(go_yamux_peer: Path) -> None:
    go = await start_peer(go_yamux_peer, "--listen", "--tcp", "0", "--mode", "responder", watchdog=180)
    try:
        port = await go.listening()
        near = await start_near_end(f"yamux:tcp:127.0.0.1:{port}", local=["0"])
        try:
            local = near.forwards[0].bind.port
            echoes = await asyncio.gather(
                *(_exchange(local, f"echo/{i}", pattern(i, MIB)) for i in range(16))
            )
            assert all(got == pattern(i, MIB) for i, got in enumerate(echoes))
            big, answer = _big(64 * MIB)
            assert await _exchange(local, f"big/{64 * MIB}", big) == answer
            assert await _exchange(local, "halfclose/x", pattern(3, 300_000)) == b"300000"
        finally:
            await near.aclose()
        result = await go.finish(120)
    finally:
        await go.aclose()
    assert result["ok"], result
    assert result["handled"] == {"echo": 16, "big": 1, "halfclose": 1}, result


@pytest.mark.parametrize("protocol", VERSIONS)
async def test_a_near_end_with_bare_l_works_against_a_go_smux_server(
    go_smux_peer: Path, protocol: str
) -> None:
    version = "1" if protocol == "smux" else "2"
    go = await start_peer(
        go_smux_peer, "--listen", "--tcp", "0", "--mode", "responder", "--version", version, watchdog=180
    )
    try:
        port = await go.listening()
        near = await start_near_end(f"{protocol}:tcp:127.0.0.1:{port}", local=["0"])
        try:
            local = near.forwards[0].bind.port
            echoes = await asyncio.gather(
                *(_exchange(local, f"echo/{MIB}", pattern(i, MIB)) for i in range(16))
            )
            assert all(got == pattern(i, MIB) for i, got in enumerate(echoes))
            big, answer = _big(64 * MIB)
            assert await _exchange(local, f"big/{64 * MIB}", big) == answer
            # Half-closed after 1,000 bytes, the stream still gets its answer: the count and 5 bytes.
            assert await _exchange(local, "halfclose/5", pattern(3, 1000)) == b"1000\n" + pattern(5, 5)
        finally:
            await near.aclose()
        result = await go.finish(120)
    finally:
        await go.aclose()
    assert result["ok"], result
    assert result["handled"] == {"echo": 16, "big": 1, "halfclose": 1}, result

"""One memory budget per server, and one address's share of the connections.

* ``polymux serve --max-memory 256MiB`` (a process of its own, its RSS sampled): 64 raw
  connections each try to fill their session's whole budget (128 yamux streams of echo
  within the credit, never reading a byte back: 32 MiB unread or unsent each, 2 GiB in all
  without the shared budget; the issue measured 29 MiB -> 2.2 GiB). The server's RSS growth stays under 256 MiB + :data:`SLACK`, and a new
  honest client is still served: its echo comes back.
* ``max_connections_per_address``: the connections of one address beyond it are refused
  (and logged), while another address is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time

import pytest

import polymux

from .raw import MIB, RawPeer, RssSampler
from .test_bounds import _data_cycle


pytestmark = pytest.mark.timeout(180)

MAX_MEMORY = 256 * MIB
SLACK = 96 * MIB
"""What the server's RSS may grow past ``max_memory``: the interpreter's own growth under
64 connections (sessions, channels, buffers' slack: 30-40 MiB measured), and what each
session reads before it finds out that the server is at its limit (one read of up to
256 KiB each)."""
CONNECTIONS = 64
STREAMS = 128  # x 256 KiB of yamux credit: a session's whole budget (32 MiB) each
SECONDS = 4.0


async def _serve(*args: str) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "polymux",
        "serve",
        "--protocol",
        "yamux",
        "--tcp",
        "127.0.0.1:0",
        "--quiet",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PYTHONASYNCIODEBUG": "", "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        line = (await proc.stdout.readline()).decode()
    m = re.search(r"on tcp:127\.0\.0\.1:(\d+)", line)
    assert m, line
    return proc, int(m.group(1))


async def _echo_once(port: int) -> bytes:
    async with asyncio.timeout(20), await polymux.connect("127.0.0.1", port, protocol="yamux") as session:
        reader, writer = await session.open_channel("honest")
        writer.write(b"still served?")
        writer.write_eof()
        return await reader.read()


async def test_64_full_sessions_stay_within_max_memory_and_a_new_client_is_served() -> None:
    proc, port = await _serve("--max-memory", "256MiB", "--max-connections-per-address", "off")
    peers: list[RawPeer] = []
    try:
        assert await _echo_once(port) == b"still served?"  # (warm: the code paths are loaded)
        sampler = RssSampler(proc.pid)
        for _ in range(CONNECTIONS):
            peer = await RawPeer.connect(port, "yamux")
            await peer.handshake()
            peers.append(peer)
        handles = [await peer.open_many(STREAMS) for peer in peers]
        started = time.monotonic()
        sent = await asyncio.gather(
            *(
                peer.flood(_data_cycle(peer, h, 16 * 1024), SECONDS)
                for peer, h in zip(peers, handles, strict=True)
            )
        )
        await asyncio.sleep(1.0)  # the server's work on what it read (RSS sampled meanwhile)
        answer = await _echo_once(port)
        await sampler.stop()
        print(
            f"{CONNECTIONS} connections sent {sum(sent) / MIB:.0f} MiB in {time.monotonic() - started:.1f} s; "
            f"server RSS {sampler.baseline / MIB:.1f} -> peak {sampler.peak / MIB:.1f} MiB "
            f"(+{sampler.growth / MIB:.1f} MiB; max_memory {MAX_MEMORY // MIB} MiB + slack {SLACK // MIB})"
        )
        # The peers were stopped by the server's limit (it stopped reading them), not by
        # their credit: each has credit left, 2 GiB in all, the sessions' full budgets.
        left = sum(peer.engine.send_credit(h) for peer, hs in zip(peers, handles, strict=True) for h in hs)
        assert sum(sent) > MAX_MEMORY and left > MAX_MEMORY, (sum(sent), left)
        assert sampler.growth < MAX_MEMORY + SLACK, sampler.growth
        assert answer == b"still served?"
    finally:
        for peer in peers:
            peer.close()
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20):
                await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        writer.write(await reader.read())
        writer.close()


async def _echoed(session: polymux.Session, data: bytes) -> bytes:
    """``data`` sent on a new channel of ``session`` and what the echo server returned."""
    reader, writer = await session.open_channel("echo")
    writer.write(data)
    writer.write_eof()
    async with asyncio.timeout(10):
        return await reader.read()


async def test_one_address_holds_at_most_its_share_of_the_connections(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await polymux.start_server(
        _echo, "127.0.0.1", 0, protocol="mplex", max_connections_per_address=3
    )
    sessions: list[polymux.Session] = []
    async with server:
        sessions.extend([await polymux.connect("127.0.0.1", server.port, protocol="mplex") for _ in range(3)])
        async with asyncio.timeout(10):
            while len(server.sessions) < 3:  # noqa: ASYNC110 - the server has no event for it
                await asyncio.sleep(0.01)
        # The 4th from the same address is refused: its connection is closed at once.
        extra = await polymux.connect("127.0.0.1", server.port, protocol="mplex")
        async with asyncio.timeout(10):
            await extra.wait_closed()
        assert "127.0.0.1 holds max_connections_per_address=3 connections" in caplog.text
        # Another address is served (127.0.0.0/8 is all loopback).
        other = await polymux.connect("127.0.0.1", server.port, protocol="mplex", local_addr=("127.0.0.2", 0))
        async with other:
            assert await _echoed(other, b"hi") == b"hi"
        # One of the first three leaves: its address may connect again.
        await sessions.pop().aclose()
        async with asyncio.timeout(10):
            while len(server.sessions) > 2:  # noqa: ASYNC110 - the server has no event for it
                await asyncio.sleep(0.01)
        again = await polymux.connect("127.0.0.1", server.port, protocol="mplex")
        async with again:
            assert await _echoed(again, b"back") == b"back"
        for s in sessions:
            await s.aclose()

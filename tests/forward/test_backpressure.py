"""Backpressure end to end: a local client that does not read, behind a near end and a
far end (a process of their own, ``probe.py``), and a target that sends as fast as it is
let. The target is held back, and the two ends together hold no more than their two
sessions' budgets (``max_session_memory``, a session holding at most 1.5 x its own) plus
the copy's buffers of the two TCP connections, whatever the target offers; then every
byte arrives. The figures are printed (``-s``)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from polymux.bridging import COPY_CHUNK

from .helpers import MIB, pattern


pytestmark = pytest.mark.timeout(120)

PROBE = Path(__file__).with_name("probe.py")
BUDGET = 2 * MIB
OFFERED = 64 * MIB


def bound() -> int:
    """What the two ends may hold: each session 1.5 x its budget; per TCP connection (the
    local client's, the target's) a copy read each way, the stream reader's buffer (twice
    its 64 KiB limit) and the transport's 64 KiB; per session a socket read and a
    scheduler batch (256 KiB each)."""
    sessions = 2 * (BUDGET * 3 // 2)
    per_connection = 2 * COPY_CHUNK + 2 * 64 * 1024 + 64 * 1024
    per_session = 2 * 256 * 1024
    return sessions + 2 * per_connection + 2 * per_session


@pytest.mark.parametrize("protocol", ["yamux", "mplex"], ids=["credit", "no-credit"])
async def test_a_client_that_does_not_read_holds_back_the_target(protocol: str) -> None:
    sent = 0
    block = pattern(256 * 1024)

    async def source(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await reader.readline()
        while sent < OFFERED:  # as fast as it is let: drain() is the only brake
            writer.write(block)
            await writer.drain()
            sent += len(block)
        writer.close()

    target = await asyncio.start_server(source, "127.0.0.1", 0)
    port = target.sockets[0].getsockname()[1]
    options = {"max_session_memory": BUDGET}
    probe = await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), protocol, str(port), json.dumps(options),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert probe.stdin is not None and probe.stdout is not None
    try:
        ready = (await asyncio.wait_for(probe.stdout.readline(), 30)).decode().split()
        assert ready[:1] == ["READY"], ready
        probe.stdin.write(b"mark\n")
        reader, writer = await asyncio.open_connection("127.0.0.1", int(ready[1]))
        writer.write(b"send\n")
        # Until nothing moves any more: every buffer on the way is full.
        last = -1
        while sent != last:
            last = sent
            await asyncio.sleep(1.0)  # a period to compare progress over, not synchronisation
        probe.stdin.write(b"report\n")
        report = json.loads(await asyncio.wait_for(probe.stdout.readline(), 30))
        held_back_at = sent
        # Then the client reads: everything arrives, in order.
        received = 0
        while data := await reader.read(1 << 20):
            assert data == (block * 2)[received % len(block) : received % len(block) + len(data)]
            received += len(data)
        writer.close()
    finally:
        probe.stdin.write(b"stop\n")
        try:
            await asyncio.wait_for(probe.wait(), 10)
        except TimeoutError:
            probe.kill()
            await probe.wait()
        target.close()
    print(
        f"\n{protocol}: a client that does not read; the target was held back after "
        f"{held_back_at / MIB:.1f} of {OFFERED / MIB:.0f} MiB; both ends' peak RSS "
        f"+{report['hwm_growth'] / MIB:.2f} MiB (bound {bound() / MIB:.2f} MiB + 8 MiB of allocator slack)"
    )
    assert held_back_at < OFFERED
    assert report["hwm_growth"] <= bound() + 8 * MIB, report
    assert received == OFFERED

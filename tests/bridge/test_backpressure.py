"""Backpressure end to end through the bridge: the far side reads slowly, the near side
writes as fast as it is let; the bridge (a process of its own, ``memory_probe.py``)
holds no more than its configuration allows, and the writer is held back to the
reader's pace.

Bound per channel: the near side's receive window (unread, credit not yet returned),
one copy read (``COPY_CHUNK``) and ``write_buffer_high`` unsent towards the far side;
plus, per session, the socket read buffers and one scheduler batch in the transport.
Measured by tracemalloc (peak above the moment the channels were all flowing) and by
the peak RSS (VmHWM reset at that moment). The figures are printed (``-s``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

import pytest

import polymux
from polymux import formats
from polymux.bridging import COPY_CHUNK

from .helpers import until


pytestmark = pytest.mark.timeout(90)

CHANNELS = 8
WINDOW = 256 * 1024
WRITE_HIGH = 64 * 1024
READ = 16 * 1024
"""The slow reader: READ bytes, then a pause of PAUSE s (about 1.6 MB/s per channel)."""
PAUSE = 0.01
MEASURE = 2 << 20
"""Bytes each channel's slow reader reads between the mark and the report."""
PROBE = Path(__file__).with_name("memory_probe.py")


def bridge_bound() -> int:
    """What the bridge may hold by its configuration: per channel the near window, one
    read, the far write buffer (and what the last write put over it); per session (two)
    a 256 KiB socket read, one 256 KiB scheduler batch and the transport's 64 KiB."""
    per_channel = WINDOW + COPY_CHUNK + WRITE_HIGH
    per_session = 256 * 1024 + 256 * 1024 + 64 * 1024
    return CHANNELS * per_channel + 2 * per_session


async def stop(probe: asyncio.subprocess.Process) -> None:
    """Ask the bridge's process to stop (killed if it does not within 10 s)."""
    if probe.returncode is None:
        assert probe.stdin is not None
        probe.stdin.write(b"stop\n")
        try:
            await asyncio.wait_for(probe.wait(), 10)
        except TimeoutError:
            probe.kill()
            await probe.wait()


@pytest.mark.parametrize(
    ("near", "far"),
    [("yamux", "mplex"), ("mplex", "yamux"), ("mstream-v3", "smux-v2")],
    ids=["credit-to-none", "none-to-credit", "credit-to-credit"],
)
async def test_a_slow_reader_holds_back_the_writer_and_the_bridge_stays_bounded(near: str, far: str) -> None:
    received = [0] * CHANNELS

    async def slow_reader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Nameless formats get the name as a first line (names="line").
        name = writer.get_extra_info("channel_name")
        if not formats.get(far).caps.names:
            name = (await reader.readline()).decode().strip()
        index = int(name.rpartition("/")[2])
        while data := await reader.read(READ):
            received[index] += len(data)
            await asyncio.sleep(PAUSE)  # the pace of a slow consumer, not a synchronisation

    config = {"receive_window": WINDOW, "max_receive_window": WINDOW, "write_buffer_high": WRITE_HIGH}

    def own(fmt: str) -> dict[str, int]:
        """yamux's max_receive_window for yamux only: another format refuses it."""
        return config if fmt == "yamux" else {k: v for k, v in config.items() if k != "max_receive_window"}

    server = await polymux.start_server(slow_reader, "127.0.0.1", 0, protocol=far, **own(far))
    probe = await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), f"{near}:tcp:127.0.0.1:0", f"{far}:tcp:127.0.0.1:{server.port}",
        json.dumps({**config, "names": "line"}),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert probe.stdin is not None and probe.stdout is not None
    written = [0] * CHANNELS
    session: polymux.Session | None = None
    writers: list[asyncio.Task[None]] = []
    try:
        ready = (await asyncio.wait_for(probe.stdout.readline(), 30)).decode().split()
        assert ready[:1] == ["READY"], ready
        session = await polymux.connect("127.0.0.1", int(ready[1]), protocol=near, **own(near))
        block = memoryview(bytes(range(256)) * 256)  # 64 KiB

        async def fast_writer(index: int) -> None:
            assert session is not None
            _reader, writer = await session.open_channel(f"slow/{index}")
            if not formats.get(near).caps.names:
                writer.write(f"slow/{index}\n".encode())
            while True:  # as fast as it is let: drain() is the only brake
                writer.write(block)
                await writer.drain()
                written[index] += len(block)

        writers = [asyncio.ensure_future(fast_writer(i)) for i in range(CHANNELS)]
        # Every channel flowing and its writer held back: then measure.
        await until(lambda: all(r > 4 * READ for r in received), 30)
        await until(lambda: all(w > 0 for w in written), 30)
        probe.stdin.write(b"mark\n")
        start_written, start_received = sum(written), sum(received)
        base = list(received)
        await until(lambda: all(r - b >= MEASURE for r, b in zip(received, base, strict=True)), 60)
        probe.stdin.write(b"report\n")
        report = json.loads(await asyncio.wait_for(probe.stdout.readline(), 30))
        lead = sum(written) - sum(received)
        pushed = sum(written) - start_written
        read = sum(received) - start_received
    finally:
        for task in writers:
            task.cancel()
        if session is not None:
            session.abort()
        await stop(probe)
        server.close()
    bound = bridge_bound()
    mib = 1 << 20
    print(
        f"\n{near} -> bridge -> {far} (slow reader): {CHANNELS} channels, window {WINDOW // 1024} KiB, "
        f"write_buffer_high {WRITE_HIGH // 1024} KiB; while the readers read {read / mib:.1f} MiB the "
        f"writers pushed {pushed / mib:.1f} MiB; bridge: tracemalloc peak +{report['traced_peak'] / mib:.2f} MiB, "
        f"peak RSS +{report['hwm_growth'] / mib:.2f} MiB (bound by configuration {bound / mib:.2f} MiB); "
        f"writers ahead of the readers by {lead / mib:.2f} MiB"
    )
    # The bridge's own buffers stay within its configuration ...
    assert report["traced_peak"] <= bound, report
    # ... and so does its RSS, allowing for the allocator's own slack.
    assert report["hwm_growth"] <= bound + 8 * mib, report
    # The writers went at the readers' pace: what they pushed meanwhile is what was read,
    # give or take what the path holds (the bridge, each side's windows and buffers, and
    # the kernel's socket buffers of two connections).
    path = bound + CHANNELS * (WINDOW + 2 * 256 * 1024) + 2 * 8 * mib
    assert lead <= path, (lead, path)
    assert pushed <= read + path, (pushed, read)


async def test_one_budget_for_a_bridged_pair_end_to_end() -> None:
    """1,024 channels through an mplex -> yamux bridge to an echo server, and a client that
    never reads the echoes: the bridge holds both directions of every channel, on both of
    its sessions. Both together stay within one max_session_memory (32 MiB by default;
    each session gets a third, and holds at most 1.5 x that), plus each bridged channel's
    bookkeeping; not one budget per session (their buffers grew by 62-71 MiB)."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, polymux.PolymuxError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux")
    probe = await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), "mplex:tcp:127.0.0.1:0", f"yamux:tcp:127.0.0.1:{server.port}", "{}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert probe.stdin is not None and probe.stdout is not None
    session: polymux.Session | None = None
    try:
        ready = (await asyncio.wait_for(probe.stdout.readline(), 30)).decode().split()
        assert ready[:1] == ["READY"], ready
        probe.stdin.write(b"mark\n")
        session = await polymux.connect("127.0.0.1", int(ready[1]), protocol="mplex")
        chunk = bytes(64 * 1024)
        sent = 0

        async def flood(i: int) -> None:
            nonlocal sent
            assert session is not None
            _reader, writer = await session.open_channel(f"c{i}")  # kept: never read
            with contextlib.suppress(ConnectionError, polymux.PolymuxError):
                for _ in range(16):  # 1 MiB a channel: 1 GiB offered, far beyond any budget
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(chunk)

        tasks = [asyncio.ensure_future(flood(i)) for i in range(1024)]
        # Until nothing moves any more: every buffer on the way is full.
        last = -1
        while sent != last:
            last = sent
            await asyncio.sleep(2.0)  # a period to compare progress over, not synchronisation
        probe.stdin.write(b"report\n")
        report = json.loads(await asyncio.wait_for(probe.stdout.readline(), 30))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        if session is not None:
            session.abort()
        await stop(probe)
        server.close()
    mib = 1 << 20
    budget = polymux.SessionConfig().max_session_memory
    print(
        f"\nmplex -> bridge -> yamux echo, 1,024 channels never read: {sent / mib:.0f} MiB taken in; "
        f"bridge: tracemalloc peak +{report['traced_peak'] / mib:.1f} MiB, peak RSS "
        f"+{report['hwm_growth'] / mib:.1f} MiB (pair budget {budget / mib:.0f} MiB)"
    )
    # The pair's budget, plus per-channel bookkeeping (two channels, their readers,
    # writers and copy tasks: about 14 KiB a bridged channel) and the sockets' reads and
    # batches.
    slack = 1024 * 16 * 1024 + 4 * mib
    assert report["traced_peak"] <= budget + slack, report

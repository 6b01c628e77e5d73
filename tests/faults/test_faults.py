"""Fault injection: many small transfers per format through a proxy that splits data into
1-byte pieces, stalls it, or cuts the connection at a random byte offset.

Every channel of every transfer either completes byte-exact, or its reader raises and
then its writer raises, within a bounded time: never a hang, never a silent end of data
(EOF before all bytes). After each batch no task, socket or file descriptor is left over.

CI runs ``POLYMUX_FAULT_TRANSFERS`` (default 100) transfers per format; the 1,000 per
format run is ``POLYMUX_FAULT_TRANSFERS=1000`` (its result is in fuzz/README.md). A
failure prints the seed; ``POLYMUX_FAULT_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from dataclasses import dataclass, field

import pytest

import polymux

from .proxy import FaultProxy


pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(600)]

TRANSFERS = int(os.environ.get("POLYMUX_FAULT_TRANSFERS", "100"))
SEED = int(os.environ.get("POLYMUX_FAULT_SEED", "0")) or None
CONCURRENCY = 16
BATCH = 50
BOUND = 30.0  # seconds a transfer may take, faults included (a loaded 2-core CI machine)
ERROR_BOUND = 5.0  # seconds from a reader's error to its writer's


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()


@dataclass
class Tally:
    completed: int = 0
    failed_cleanly: int = 0
    sessions_refused: int = 0
    problems: list[str] = field(default_factory=list)


async def _channel(session: polymux.Session, name: str, data: bytes, tally: Tally) -> None:
    try:
        reader, writer = await session.open_pair(name)
    except (ConnectionError, polymux.PolymuxError):
        tally.failed_cleanly += 1  # the open itself failed with an error: nothing was lost
        return

    async def send() -> None:
        view = memoryview(data)
        for off in range(0, len(view), 16384):
            writer.write(view[off : off + 16384])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.ensure_future(send())
    got = b""
    reader_error: BaseException | None = None
    try:
        got = await reader.read()
    except (ConnectionError, polymux.PolymuxError, EOFError) as exc:
        reader_error = exc
    if reader_error is None:
        if got == data:
            try:
                async with asyncio.timeout(ERROR_BOUND):
                    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
                        await sender
            except TimeoutError:
                tally.problems.append(f"{name}: drain() blocked after the echo completed")
                return
            tally.completed += 1
            writer.close()
            return
        tally.problems.append(f"{name}: silent truncation: EOF after {len(got)} of {len(data)} bytes")
        sender.cancel()
        return
    # The reader raised: the writer must raise too, within ERROR_BOUND.
    try:
        async with asyncio.timeout(ERROR_BOUND):
            with contextlib.suppress(ConnectionError, polymux.PolymuxError):
                await sender
    except TimeoutError:
        tally.problems.append(
            f"{name}: drain() still blocked {ERROR_BOUND} s after the reader raised {reader_error!r}"
        )
        return
    try:
        async with asyncio.timeout(ERROR_BOUND):
            writer.write(b"after the error")
            await writer.drain()
    except (ConnectionError, polymux.PolymuxError):
        tally.failed_cleanly += 1
    except TimeoutError:
        tally.problems.append(f"{name}: the writer hung after the reader raised {reader_error!r}")
    else:
        tally.problems.append(f"{name}: the reader raised {reader_error!r} but the writer did not")
    writer.transport.abort()


async def _transfer(fmt: str, port: int, rng: random.Random, tally: Tally) -> None:
    sizes = [rng.randrange(1024, 64 * 1024) for _ in range(rng.randrange(1, 4))]
    started = time.monotonic()
    session: polymux.Session | None = None
    try:
        async with asyncio.timeout(BOUND):
            try:
                session = await polymux.connect(
                    "127.0.0.1", port, protocol=fmt, handshake_timeout=5, close_timeout=2
                )
            except (ConnectionError, polymux.PolymuxError, OSError):
                tally.sessions_refused += 1  # cut during the handshake: an error, as it should be
                return
            try:
                await asyncio.gather(
                    *(_channel(session, f"t/{i}", rng.randbytes(size), tally) for i, size in enumerate(sizes))
                )
            finally:
                with contextlib.suppress(ConnectionError, polymux.PolymuxError):
                    await session.aclose()
                session.abort()
    except TimeoutError:
        state = "no session" if session is None else f"{session!r} exception={session.exception!r}"
        tally.problems.append(f"a transfer hung for more than {BOUND} s (sizes {sizes}; {state})")
    assert time.monotonic() - started < BOUND + 5


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_transfers_through_faults(fmt: str) -> None:
    seed = SEED or random.randrange(1, 2**31)
    print(f"fault seed for {fmt}: {seed} (POLYMUX_FAULT_SEED={seed} replays it)")
    rng = random.Random(seed)
    server = await polymux.start_server(_echo, "127.0.0.1", 0, protocol=fmt, close_timeout=2)
    modes = tuple(os.environ.get("POLYMUX_FAULT_MODES", "pieces,stall,cut").split(","))
    proxy = FaultProxy(server.port, rng.randrange(2**32), modes)
    port = await proxy.start()
    me = asyncio.current_task()
    baseline_tasks = {t for t in asyncio.all_tasks() if t is not me}
    baseline_fds = _fds()
    tally = Tally()
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(k: int) -> None:
        async with sem:
            await _transfer(fmt, port, random.Random(rng.randrange(2**32)), tally)

    try:
        for start in range(0, TRANSFERS, BATCH):
            await asyncio.gather(*(one(k) for k in range(start, min(TRANSFERS, start + BATCH))))
            assert not tally.problems, f"seed {seed}: {tally.problems[:5]}"
            # Nothing left behind: server sessions gone, tasks and fds back to the baseline.
            await _settle(server, proxy, baseline_tasks, baseline_fds, me, seed)
    finally:
        await proxy.aclose()
        server.close()
        await server.wait_closed()
    print(
        f"{fmt}: {TRANSFERS} transfers, {tally.completed} channels byte-exact, "
        f"{tally.failed_cleanly} failed with errors on reader and writer, "
        f"{tally.sessions_refused} sessions cut before ready; proxy: {proxy.connections} "
        f"connections, {proxy.cuts_done} cuts"
    )
    assert tally.completed > 0 and tally.failed_cleanly > 0, tally


async def _settle(
    server: polymux.Server,
    proxy: FaultProxy,
    baseline_tasks: set[asyncio.Task[object]],
    baseline_fds: int,
    me: asyncio.Task[object] | None,
    seed: int,
) -> None:
    deadline = time.monotonic() + 10
    while True:
        extra = {t for t in asyncio.all_tasks() if t is not me} - baseline_tasks
        fds = _fds()
        if not extra and fds <= baseline_fds and not server.sessions and not proxy.tasks:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"seed {seed}: leaked after a batch: {len(extra)} tasks {list(extra)[:3]}, "
                f"{fds - baseline_fds} fds, {len(server.sessions)} server sessions"
            )
        await asyncio.sleep(0.02)

"""Demanding but legitimate use with default settings, on every format and both drivers:
our own limits (budgets, held responses, keepalive, stall and open limits) must never cut
an honest peer.

Each case runs every format under three pairings of drivers side by side in one event
loop (asyncio server + asyncio client, anyio server + asyncio client, asyncio server +
anyio client), with :class:`~polymux.SessionConfig` defaults on both ends, and must end
byte-exact (SHA-256 of every stream), with no channel reset and no session failure:

* **a slow application reader**: a handler that reads nothing for longer than keepalive
  interval + timeout (25 s) while its peer writes 16 MiB, and a client that does the same
  while the server writes 16 MiB to it;
* **many channels at the session budget**: 64 channels x 1 MiB into handlers that read
  nothing for 3 s (the session holds its budget meanwhile), then read everything;
* **one 64 MiB transfer** echoed on one channel (a Streamux echo holds the whole response
  until the request ends: ``streamux_response_hold``);
* **concurrent large requests** shaped like a go-streamux client's: 32 x 1 MiB, each
  written whole, ended, and its echo read;
* **a burst of opens** up to the documented limits (1,000 channels at once; 250 where the
  format's ids or an accept loop's ``accept_backlog`` are fewer), each echoing a message.

omnistreams' streams are one-way: there the server checks what it received and the
client reads nothing back (the driver pairs streams for two-way use: tests/cli/test_demo.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from anyio.abc import SocketAttribute

import polymux
import polymux.anyio as pmanyio
from polymux.apps.common import two_way

from .test_drivers import Chan


MIB = 1024 * 1024
COMBOS = (("asyncio", "asyncio"), ("anyio", "asyncio"), ("asyncio", "anyio"))
"""(server driver, client driver)."""
SLOW = 27.0
"""Seconds a slow reader reads nothing: longer than keepalive interval + timeout (25 s)."""
BLOCK = os.urandom(MIB + 4096)
HEADER = 16


def header(mode: str, i: int) -> bytes:
    return f"{mode:<6}{i:09d}\n".encode()


def body(i: int, size: int) -> list[memoryview]:
    """``size`` bytes for stream ``i`` (views of a shared random block, rotated by ``i``)."""
    view = memoryview(BLOCK)
    start = (i * 4099) % 4096
    parts = []
    while size > 0:
        n = min(size, MIB)
        parts.append(view[start : start + n])
        size -= n
    return parts


@dataclass
class Run:
    """One format under one pairing of drivers: what the server saw and what went wrong."""

    fmt: str
    server_driver: str
    client_driver: str
    received: dict[int, tuple[int, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    server_sessions: list[Any] = field(default_factory=list)
    max_held: int = 0

    @property
    def label(self) -> str:
        return f"{self.fmt} ({self.server_driver} server, {self.client_driver} client)"

    @property
    def two_way(self) -> bool:
        return two_way(self.fmt)


async def send_all(chan: Chan, parts: list[memoryview]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
        await chan.send(part)  # type: ignore[arg-type]  # a view: both drivers take it
    return digest.hexdigest()


async def read_all(chan: Chan) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while data := await chan.recv(MIB):
        digest.update(data)
        size += len(data)
    return size, digest.hexdigest()


async def read_exact(chan: Chan, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = await chan.recv(n - len(out))
        if not data:
            raise EOFError(f"{len(out)} of {n} bytes, then the end")
        out += data
    return bytes(out)


async def serve_channel(run: Run, chan: Chan, down_size: int) -> None:
    """The server's application, by the stream's header: ``echo`` sends back what it
    reads; ``sink`` reads all and answers its size and SHA-256; ``slow`` and ``lazy`` do
    the same after reading nothing for SLOW or 3 s; ``down`` sends ``down_size`` bytes."""
    try:
        head = (await read_exact(chan, HEADER)).decode()
        mode, i = head[:6].strip(), int(head[6:15])
        if mode == "echo" and run.two_way:
            while data := await chan.recv(MIB):
                await chan.send(data)
            await chan.send_eof()
            return
        if mode == "down":
            await read_all(chan)
            await send_all(chan, body(i, down_size))
            await chan.send_eof()
            return
        if mode in ("slow", "lazy"):
            await asyncio.sleep(SLOW if mode == "slow" else 3.0)  # the application is busy
        got = await read_all(chan)
        run.received[i] = got
        if run.two_way:
            await chan.send(f"{got[0]} {got[1]}".encode())
            await chan.send_eof()
    except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
        run.errors.append(f"server channel: {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await chan.close()


@asynccontextmanager
async def connected(run: Run, down_size: int = 0) -> AsyncIterator[Any]:
    """A client session of ``run``'s format to a server of its own, both with defaults."""
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async with contextlib.AsyncExitStack() as stack:
        if run.server_driver == "asyncio":

            async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await serve_channel(run, Chan((reader, writer)), down_size)

            server = await polymux.start_server(
                handler, "127.0.0.1", 0, protocol=run.fmt, session_handler=run.server_sessions.append
            )
            await stack.enter_async_context(server)
            port = server.port
        else:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
            await stack.enter_async_context(listener)
            port = listener.extra(SocketAttribute.local_port)

            async def accept_one() -> None:
                stream = await listener.listeners[0].accept()
                async with stream, pmanyio.session(stream, protocol=run.fmt, is_client=False) as theirs:
                    run.server_sessions.append(theirs)
                    async with anyio.create_task_group() as tg:
                        async for channel in theirs:
                            tg.start_soon(serve_channel, run, Chan(channel), down_size)

            spawn(accept_one())
        if run.client_driver == "asyncio":
            session = await polymux.connect("127.0.0.1", port, protocol=run.fmt)
            await stack.enter_async_context(session)
        else:
            stream = await anyio.connect_tcp("127.0.0.1", port)
            await stack.enter_async_context(stream)
            session = await stack.enter_async_context(pmanyio.session(stream, protocol=run.fmt))
        sampling = asyncio.ensure_future(sample_held(run))
        try:
            yield session
        finally:
            sampling.cancel()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(sampling, *tasks, return_exceptions=True)
            run.errors.extend(f"session: {e}" for e in session_errors(run, session))


async def sample_held(run: Run) -> None:
    while True:
        for s in run.server_sessions:
            core = s.mux.core if isinstance(s, polymux.Session) else s.core
            run.max_held = max(run.max_held, core.budget.held)
        await asyncio.sleep(0.05)


def session_errors(run: Run, client: Any) -> list[str]:
    out = []
    for s in [client, *run.server_sessions]:
        error = s.exception if isinstance(s, polymux.Session) else s.error
        if error is not None:
            out.append(f"{type(error).__name__}: {error}")
    return out


async def open_chan(session: Any, name: str) -> Chan:
    return Chan(await session.open_channel(name))


async def client_stream(run: Run, session: Any, mode: str, i: int, size: int) -> None:
    """Open a channel, send ``header + size bytes``, end it, and check the answer: the
    echo, or the server's size and SHA-256 of what it read (one-way formats: what the
    server recorded)."""
    chan = await open_chan(session, f"{mode}-{i}")
    sent_digest = hashlib.sha256(b"".join(body(i, size))).hexdigest() if mode == "echo" else ""

    async def write() -> str:
        await chan.send(header(mode, i))
        digest = await send_all(chan, body(i, size))
        await chan.send_eof()
        return digest

    if not run.two_way:
        digest = await write()
        await wait_for_server(run, i)
        assert run.received[i] == (size, digest), (run.received[i], size, digest)
        await chan.close()
        return
    writing = asyncio.ensure_future(write())
    if mode == "echo":
        got = await read_all(chan)
        digest = await writing
        assert digest == sent_digest
        assert got == (size, digest), f"echo of stream {i}: {got[0]} of {size} bytes"
    else:
        answer = b""
        while data := await chan.recv():
            answer += data
        digest = await writing
        assert answer.decode() == f"{size} {digest}", (answer, size, digest)
    await chan.close()


async def client_down(run: Run, session: Any, i: int, size: int, pause: float) -> None:
    """Ask the server for ``size`` bytes and read nothing for ``pause`` seconds first."""
    chan = await open_chan(session, f"down-{i}")
    await chan.send(header("down", i))
    await chan.send_eof()
    await asyncio.sleep(pause)  # the application is busy
    got = await read_all(chan)
    assert got == (size, hashlib.sha256(b"".join(body(i, size))).hexdigest()), f"down: {got[0]} of {size}"
    await chan.close()


async def wait_for_server(run: Run, i: int) -> None:
    while i not in run.received:  # noqa: ASYNC110 - the server's handler has no event for it
        await asyncio.sleep(0.02)


Scenario = Callable[[Run, Any], Awaitable[None]]


async def run_all(scenario: Scenario, timeout: float, down_size: int = 0) -> list[Run]:  # noqa: ASYNC109
    """``scenario(run, client_session)`` for every format x pairing, side by side."""
    runs = [Run(fmt, s, c) for fmt in polymux.PROTOCOLS for s, c in COMBOS]

    async def one(run: Run) -> None:
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout - 5), connected(run, down_size) as session:
                await scenario(run, session)
        except TimeoutError:
            run.errors.append(f"not done within {timeout - 5:g} s")
        except Exception as exc:  # noqa: BLE001 - the test reports every run's outcome
            run.errors.append(f"{type(exc).__name__}: {exc}")
            for inner in getattr(exc, "exceptions", ()):  # a task group's: what really failed
                run.errors.append("".join(traceback.format_exception(inner)))
        took = time.monotonic() - start
        print(f"{run.label}: {took:.1f} s, server held up to {run.max_held / MIB:.1f} MiB")

    async with asyncio.timeout(timeout):
        await asyncio.gather(*(one(r) for r in runs))
    failed = [f"{r.label}: {'; '.join(r.errors)}" for r in runs if r.errors]
    assert not failed, "\n".join(failed)
    return runs


@pytest.mark.timeout(150)
async def test_a_slow_application_reader_on_either_side() -> None:
    """A handler reads nothing for 27 s while its client writes 16 MiB on its channel, and
    a client reads nothing for 27 s while the server writes 16 MiB to it: our own
    backpressure (the window, the slow-reader pause of formats without credit, the
    budget) stops the data; keepalive blames no one, and everything arrives."""
    size = 16 * MIB

    async def scenario(run: Run, session: Any) -> None:
        jobs = [client_stream(run, session, "slow", 1, size)]
        if run.two_way:
            jobs.append(client_down(run, session, 2, size, SLOW))
        await asyncio.gather(*jobs)

    await run_all(scenario, 140, down_size=size)


@pytest.mark.timeout(150)
async def test_many_channels_held_at_the_session_budget_then_completed() -> None:
    """64 channels x 1 MiB into handlers that read nothing for 3 s: the server holds its
    memory budget (reading paused where the format has no credit, windows sized to the
    budget where it has), then the handlers read and every channel completes."""

    async def scenario(run: Run, session: Any) -> None:
        await asyncio.gather(*(client_stream(run, session, "lazy", i, MIB) for i in range(64)))

    runs = await run_all(scenario, 140)
    budget = polymux.SessionConfig().max_session_memory
    for run in runs:
        assert run.max_held <= budget + 2 * MIB, run.label


@pytest.mark.timeout(150)
async def test_one_64_mib_transfer_echoed() -> None:
    """64 MiB on one channel, echoed as it is read (Streamux: the response is held until
    the request ends, within streamux_response_hold)."""

    async def scenario(run: Run, session: Any) -> None:
        await client_stream(run, session, "echo", 0, 64 * MIB - HEADER)

    await run_all(scenario, 140)


@pytest.mark.timeout(150)
async def test_concurrent_large_requests_like_a_go_streamux_client() -> None:
    """32 requests of 1 MiB at once, each written whole and ended, then its echo read (a
    go-streamux client's pattern; on every format)."""

    async def scenario(run: Run, session: Any) -> None:
        await asyncio.gather(*(client_stream(run, session, "echo", i, MIB) for i in range(32)))

    await run_all(scenario, 140)


@pytest.mark.timeout(150)
async def test_a_burst_of_opens_up_to_the_documented_limits() -> None:
    """1,000 channels opened at once (below max_channels and max_inbound_channels, 1,024),
    each echoing a message; 250 where an accept loop serves them (accept_backlog: 256
    untaken) or the format's ids are fewer (omnistreams: 256 streams)."""

    async def scenario(run: Run, session: Any) -> None:
        n = 1000 if run.server_driver == "asyncio" and run.two_way else 250
        await asyncio.gather(*(client_stream(run, session, "echo", i, 100) for i in range(n)))

    await run_all(scenario, 140)

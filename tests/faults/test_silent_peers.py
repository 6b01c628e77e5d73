"""A silent cut (the proxy stops forwarding, reads nothing more and closes nothing: a NAT
that forgot the connection, a dropped Wi-Fi link) is noticed on every format, by the client
and by the server, with default settings on both, within the documented bound:
``keepalive_interval + keepalive_timeout`` (25 s) after the cut (docs/connection-loss.md).

Each format runs twice at once, on an idle session with a channel open (a chat) and on a
session whose client is sending (a file transfer, paced), each cut between 31 and 45 s in
(after two keepalive intervals: the peer's heartbeats or pings are measured by then; each
run at another point of the keepalive cycle), under two pairings of drivers (asyncio
server and anyio client, and the other way round). The loop's clock jumps ahead when it
only waits (tests/faults/warp.py): the minutes of timeouts take about a second. A failure
prints the proxy's plans.

The other side of the rule: quiet but honest peers are never cut, with defaults on our
side: a channel open and nothing said for 10 minutes, a peer whose keepalive interval is
60 s, a peer that sends no heartbeats (``keepalive_interval=None``, as a foreign
implementation of a format without pings), and an application that reads nothing for
100 s while the other side writes to it. (smux is left out of the two peers whose keepalive
is slower or off: the format's reference closes a session that hears nothing for its
KeepAliveTimeout, and so does polymux.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from anyio.abc import SocketAttribute

import polymux
import polymux.anyio as pmanyio
from polymux.apps.common import conversation_options, two_way
from session.test_drivers import Chan

from . import warp
from .proxy import FaultProxy, Plan


DEFAULTS = polymux.SessionConfig()
BOUND = (DEFAULTS.keepalive_interval or 0.0) + DEFAULTS.keepalive_timeout
"""The documented bound: 25 s with the defaults."""
SLACK = 1.0  # the timer's own lateness on a loaded machine


@dataclass
class Run:
    fmt: str
    shape: str  # "idle" or "sending"
    server_driver: str
    client_driver: str
    cut_at: float = 40.0
    ended: dict[str, float] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.fmt} {self.shape} ({self.server_driver} server, {self.client_driver} client)"


def _error(session: Any) -> BaseException | None:
    return session.exception if isinstance(session, polymux.Session) else session.error


async def _watch(run: Run, side: str, session: Any, cut: asyncio.Event) -> None:
    await session.wait_closed()
    now = asyncio.get_running_loop().time()
    run.ended[side] = now
    run.why[side] = str(_error(session))
    if not cut.is_set():
        run.problems.append(f"the {side} ended before the cut: {run.why[side]}")


DOWN = 3 * 1024 * 1024  # more than a channel's receive window (1 MiB)


async def _serve_channel(chan: Chan) -> None:
    """Read to the end; a channel that starts with b"down" gets :data:`DOWN` bytes first."""
    with contextlib.suppress(Exception):
        first = await chan.recv()
        if first.startswith(b"down"):
            await chan.send(bytes(DOWN))
        while await chan.recv():
            pass


@asynccontextmanager
async def _server(run: Run, cut: asyncio.Event, tasks: list[asyncio.Task[None]]) -> AsyncIterator[int]:
    if run.server_driver == "asyncio":

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _serve_channel(Chan((reader, writer)))

        def started(session: polymux.Session) -> None:
            tasks.append(asyncio.ensure_future(_watch(run, "server", session, cut)))

        server = await polymux.start_server(
            handler, "127.0.0.1", 0, protocol=run.fmt, session_handler=started
        )
        async with server:
            yield server.port
        return
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener:

        async def accept_one() -> None:
            stream = await listener.listeners[0].accept()
            options = conversation_options(run.fmt)
            async with (
                stream,
                pmanyio.session(stream, protocol=run.fmt, is_client=False, **options) as theirs,
            ):
                tasks.append(asyncio.ensure_future(_watch(run, "server", theirs, cut)))
                async with anyio.create_task_group() as tg:
                    async for channel in theirs:
                        tg.start_soon(_serve_channel, Chan(channel))

        tasks.append(asyncio.ensure_future(accept_one()))
        yield listener.extra(SocketAttribute.local_port)


@asynccontextmanager
async def _client(run: Run, port: int, **options: Any) -> AsyncIterator[Any]:
    if run.client_driver == "asyncio":
        session = await polymux.connect("127.0.0.1", port, protocol=run.fmt, **options)
        try:
            yield session
        finally:
            session.abort()
        return
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream, pmanyio.session(stream, protocol=run.fmt, **options) as session:
        yield session


async def _send_paced(chan: Chan) -> None:
    """64 KiB every 0.25 s until the channel fails (the loop idles between writes)."""
    block = bytes(64 * 1024)
    with contextlib.suppress(Exception):
        while True:
            await chan.send(block)
            await asyncio.sleep(0.25)


async def _one(run: Run) -> None:
    loop = asyncio.get_running_loop()
    cut = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    proxy = FaultProxy(0, 1, plan=lambda _i, _rng: Plan("clean"))
    try:
        async with _server(run, cut, tasks) as port:
            proxy.upstream_port = port
            async with _client(run, await proxy.start()) as session:
                tasks.append(asyncio.ensure_future(_watch(run, "client", session, cut)))
                opened = await session.open_channel("chat" if run.shape == "idle" else "file")
                chan = Chan(opened)
                await chan.send(b"hello")
                if run.shape == "sending":
                    tasks.append(asyncio.ensure_future(_send_paced(chan)))
                await asyncio.sleep(run.cut_at)
                cut.set()
                at = loop.time()
                proxy.cut_all("silent")
                try:
                    async with asyncio.timeout(BOUND + 30):
                        while len(run.ended) < 2:  # noqa: ASYNC110 - two watchers, two sides
                            await asyncio.sleep(0.5)
                except TimeoutError:
                    run.problems.append(
                        f"still open {BOUND + 30:g} s after the cut: {sorted(run.ended)} ended"
                    )
                for side, when in run.ended.items():
                    if when - at > BOUND + SLACK:
                        run.problems.append(f"the {side} noticed after {when - at:.1f} s: {run.why[side]}")
                    elif "keepalive failed" not in run.why[side]:
                        run.problems.append(f"the {side} ended otherwise: {run.why[side]}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await proxy.aclose()
        if run.problems:
            run.problems.append(proxy.describe())


async def _all(server_driver: str, client_driver: str) -> list[Run]:
    runs = [
        Run(fmt, shape, server_driver, client_driver, 31.0 + (i * 1.7) % 14)
        for i, (fmt, shape) in enumerate((f, s) for f in polymux.PROTOCOLS for s in ("idle", "sending"))
    ]
    await asyncio.gather(*(_one(r) for r in runs))
    return runs


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("server_driver", "client_driver"), [("asyncio", "anyio"), ("anyio", "asyncio")])
def test_a_silent_cut_is_noticed_by_both_sides_with_defaults(server_driver: str, client_driver: str) -> None:
    runs = warp.run(_all(server_driver, client_driver))
    failed = [f"{r.label}: {'; '.join(r.problems)}" for r in runs if r.problems]
    assert not failed, "\n".join(failed)
    assert all(set(r.ended) == {"client", "server"} for r in runs)
    assert all(two_way(r.fmt) or r.fmt.startswith("omnistreams") for r in runs)


async def _honest(run: Run, options: dict[str, Any], writer: bool) -> None:
    """A client with ``options`` and a server with defaults, a channel open for 10 minutes
    (``writer``: the server writes :data:`DOWN` bytes into it at once, read only after
    100 s); neither may end."""
    never = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        async with (
            asyncio.timeout(900.0),  # (virtual seconds: a wait that never ends must fail)
            _server(run, never, tasks) as port,
            _client(run, port, **options) as session,
        ):
            tasks.append(asyncio.ensure_future(_watch(run, "client", session, never)))
            chan = Chan(await session.open_channel("quiet"))
            await chan.send(b"down" if writer else b"quiet")
            if writer:
                await asyncio.sleep(100.0)  # the application is busy: reads nothing
                got = 0
                while got < DOWN and (data := await chan.recv()):
                    got += len(data)
                if got != DOWN:
                    run.problems.append(f"got {got} of {DOWN} bytes")
            await asyncio.sleep(600.0)
            for task in tasks:  # what ends from here on is the test's own close
                task.cancel()
    except Exception as exc:  # noqa: BLE001 - every failure is the finding
        run.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


HONEST = {
    "defaults": ({}, False),
    "a 60 s keepalive interval": ({"keepalive_interval": 60.0}, False),
    "no heartbeats": ({"keepalive_interval": None}, False),
    "an application busy for 100 s": ({}, True),
}


@pytest.mark.timeout(120)
def test_quiet_honest_peers_are_never_cut() -> None:
    async def main() -> list[Run]:
        runs: list[tuple[Run, dict[str, Any], bool]] = []
        for label, (options, writer) in HONEST.items():
            for i, fmt in enumerate(polymux.PROTOCOLS):
                if writer and not two_way(fmt):
                    continue
                if options and fmt.startswith("smux"):
                    continue  # smux's own rule (xtaci's): a peer silent for keepalive_timeout is gone
                drivers = ("asyncio", "anyio") if i % 2 else ("anyio", "asyncio")
                runs.append((Run(fmt, label, *drivers), options, writer))
        await asyncio.gather(*(_honest(run, options, writer) for run, options, writer in runs))
        return [run for run, _o, _w in runs]

    runs = warp.run(main())
    failed = [f"{r.label}: {'; '.join(r.problems)}" for r in runs if r.problems]
    assert not failed, "\n".join(failed)


async def test_tcp_keepalive_is_set_on_both_ends() -> None:
    """Every TCP connection polymux makes or accepts keeps TCP keepalive with the session's
    timings (a gone host noticed by the kernel); none with ``keepalive_interval=None``."""
    import socket

    def options(sock: Any) -> tuple[int, int, int, int]:
        return (
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        )

    accepted: list[polymux.Session] = []
    server = await polymux.start_server(
        None, "127.0.0.1", 0, protocol="mplex", session_handler=accepted.append
    )
    async with server:
        async with await polymux.connect("127.0.0.1", server.port, protocol="mplex") as session:
            await session.open_channel("x")
            async with asyncio.timeout(10):
                while not accepted:  # noqa: ASYNC110 - the server has no event for it
                    await asyncio.sleep(0.01)
            assert options(session.get_extra_info("socket")) == (1, 15, 4, 3)
            assert options(accepted[0].get_extra_info("socket")) == (1, 15, 4, 3)
        stream = await anyio.connect_tcp("127.0.0.1", server.port)
        async with stream, pmanyio.session(stream, protocol="mplex", keepalive_interval=40.0):
            raw = stream.extra(SocketAttribute.raw_socket)
            assert options(raw) == (1, 40, 4, 3)
        async with await polymux.connect(
            "127.0.0.1", server.port, protocol="mplex", keepalive_interval=None
        ) as quiet:
            assert quiet.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0

"""The soak (``python -m benchmarks --scenarios soak --minutes N``): for N minutes, clients
of every format at once connect and disconnect, open and close channels, echo small and
large messages and send files, all through the fault proxy of the test suite
(tests/faults/proxy.py: cuts by FIN, RST or silently, stalls, delays, one direction held),
against one server process: an echo server and a file receiver per format.

Each minute the server process reports its resident memory (RSS), open file descriptors,
asyncio tasks and live sessions, while the load goes on; at the end the load stops, and
once every session is gone (a silently cut one ends within its keepalive bound) the same
is measured again. The soak fails when, after the first minute, a live figure grows past
the first minute's by more than :data:`SLACK`, when the quiet figures at the end do not
come back to the start's (within :data:`SLACK`), or when a byte arrives wrong (an echo that
differs, a file not verified after its retries without an error that says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import polymux
from polymux.apps.common import conversation_options, two_way
from polymux.apps.filetransfer import Receiver, Transfer, send_with_retries


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.faults.proxy import ALL_CUTS, FaultProxy


MIB = 1024 * 1024
SLACK = {"rss_mib": 32.0, "fds": 32, "tasks": 128, "sessions": 48}
"""How far a live figure may grow past the first minute's (the load goes on: sessions and
their tasks come and go), and a quiet figure at the end past the start's (RSS: the
allocator keeps some of what it had)."""
WORKERS = 2
"""Clients per format at a time."""
MODES = ("clean", "clean", "clean", "stall", "delay", "hold", "cut", "cut")
"""What the proxy does to a connection (drawn per connection)."""
OP_TIMEOUT = 180.0


# -- the server process ------------------------------------------------------------------------


def _quiet_logs() -> None:
    """The proxy's cuts end sessions by the hundred (each logged as a warning): only errors."""
    for name in ("polymux", "asyncio"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _server_child(formats: list[str], conn: Connection) -> None:
    _quiet_logs()
    asyncio.run(_serve(formats, conn))


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
        writer.close()


async def _sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        total = 0
        while data := await reader.read(256 * 1024):
            total += len(data)
        writer.close()


def _stats(servers: list[polymux.Server]) -> dict[str, float]:
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return {
        "rss_mib": rss / MIB,
        "fds": len(os.listdir("/proc/self/fd")),
        "tasks": len(asyncio.all_tasks()),
        "sessions": sum(len(s.sessions) for s in servers),
    }


async def _serve(formats: list[str], conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    root = Path(tempfile.mkdtemp(prefix="polymux-soak-"))
    servers: list[polymux.Server] = []
    ports: dict[str, tuple[int, int]] = {}
    try:
        for fmt in formats:
            options = conversation_options(fmt)
            echo = await polymux.start_server(
                _echo if two_way(fmt) else _sink, "127.0.0.1", 0, protocol=fmt, **options
            )
            receiver = Receiver(root / fmt, log=lambda _line: None)
            files = await polymux.start_server(receiver.handle, "127.0.0.1", 0, protocol=fmt, **options)
            servers += [echo, files]
            ports[fmt] = (echo.port, files.port)
        conn.send(ports)
        while True:
            ready = await loop.run_in_executor(None, conn.poll, 0.5)
            if not ready:
                continue
            what = conn.recv()
            if what == "stats":
                conn.send(_stats(servers))
            elif what == "stop":
                break
    finally:
        for server in servers:
            server.close()
        await asyncio.gather(*(s.wait_closed() for s in servers), return_exceptions=True)
        shutil.rmtree(root, ignore_errors=True)
        conn.send("stopped")


class ServerProcess:
    """The server process and its pipe."""

    def __init__(self, formats: list[str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_server_child, args=(formats, child), daemon=True)

    async def start(self) -> dict[str, tuple[int, int]]:
        self.proc.start()
        ports: dict[str, tuple[int, int]] = await self._recv(60)
        return ports

    async def _recv(self, timeout: float) -> Any:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, self.conn.poll, timeout):
            raise TimeoutError(f"the soak's server process did not answer within {timeout:g} s")
        return self.conn.recv()

    async def stats(self) -> dict[str, float]:
        self.conn.send("stats")
        stats: dict[str, float] = await self._recv(30)
        return stats

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send("stop")
            await self._recv(60)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


# -- the clients -------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients did."""

    echoes: int = 0
    files: int = 0
    errors: int = 0
    """Operations that failed with an error that says why (the proxy's cuts)."""
    wrong: list[str] = field(default_factory=list)
    """Bytes that arrived wrong without an error: the soak fails."""


async def _echo_session(fmt: str, port: int, rng: random.Random, tally: Tally) -> None:
    async with await polymux.connect("127.0.0.1", port, protocol=fmt) as session:

        async def one(i: int) -> None:
            size = rng.randrange(16, 4096) if rng.random() < 0.7 else rng.randrange(64 * 1024, MIB)
            data = rng.randbytes(size)
            reader, writer = await session.open_channel(f"soak/{i}")
            writer.write(data)
            writer.write_eof()
            if not two_way(fmt):
                await writer.drain()
                writer.close()
                tally.echoes += 1
                return
            got = await reader.read()
            if got != data:
                tally.wrong.append(f"{fmt}: echo of {size} bytes came back as {len(got)} bytes, no error")
            else:
                tally.echoes += 1
            writer.close()

        await asyncio.gather(*(one(i) for i in range(rng.randrange(1, 9))))


async def _file_session(fmt: str, port: int, rng: random.Random, tally: Tally, src: Path) -> None:
    transfers = []
    for i in range(rng.randrange(1, 4)):
        path = src / f"f{i}.bin"
        path.write_bytes(rng.randbytes(rng.randrange(16 * 1024, 2 * MIB)))
        transfers.append(Transfer(path, f"{src.name}/f{i}.bin", path.stat().st_size))

    async def connect() -> polymux.Session:
        return await polymux.connect("127.0.0.1", port, protocol=fmt)

    await send_with_retries(connect, transfers, retries=5, progress="none", rng=rng)
    for t in transfers:
        if t.status in ("done", "unchanged"):
            tally.files += 1
        elif not t.error:
            tally.wrong.append(f"{fmt}: {t.name} not verified, and no error says why")
        else:
            tally.errors += 1


async def _worker(
    fmt: str, ports: tuple[int, int], rng: random.Random, tally: Tally, stop: asyncio.Event, src: Path
) -> None:
    await asyncio.to_thread(src.mkdir, parents=True, exist_ok=True)
    while not stop.is_set():
        try:
            async with asyncio.timeout(OP_TIMEOUT):
                if rng.random() < 0.7:
                    await _echo_session(fmt, ports[0], rng, tally)
                else:
                    await _file_session(fmt, ports[1], rng, tally, src)
        except (ConnectionError, polymux.PolymuxError, OSError, EOFError):
            tally.errors += 1  # (TimeoutError is an OSError: a hang is counted, and shown)
        await asyncio.sleep(rng.uniform(0.05, 0.5))


def _client_stats() -> dict[str, float]:
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return {"rss_mib": rss / MIB, "fds": len(os.listdir("/proc/self/fd")), "tasks": len(asyncio.all_tasks())}


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Sample:
    minute: str
    server: dict[str, float]
    client: dict[str, float]
    echoes: int
    files: int
    errors: int


async def soak(
    formats: list[str], minutes: float, seed: int, progress: bool = True
) -> tuple[list[Sample], list[str]]:
    """Run the soak; returns the samples and the problems (none: it passed)."""
    _quiet_logs()
    rng = random.Random(seed)
    server = ServerProcess(formats)
    ports = await server.start()
    proxies: list[FaultProxy] = []
    tally = Tally()
    stop = asyncio.Event()
    samples: list[Sample] = []
    problems: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="polymux-soak-src-"))
    workers: list[asyncio.Task[None]] = []
    try:
        start = await server.stats()
        samples.append(Sample("start", start, _client_stats(), 0, 0, 0))
        for fmt in formats:
            fronts = []
            for port in ports[fmt]:
                proxy = FaultProxy(port, rng.randrange(2**32), MODES, 2 * MIB, cuts=ALL_CUTS)
                fronts.append(await proxy.start())
                proxies.append(proxy)
            workers.extend(
                asyncio.ensure_future(
                    _worker(
                        fmt,
                        (fronts[0], fronts[1]),
                        random.Random(rng.random()),
                        tally,
                        stop,
                        work / f"{fmt}-{w}",
                    )
                )
                for w in range(WORKERS)
            )
        began = time.monotonic()
        minute = 0
        while time.monotonic() - began < minutes * 60:
            await asyncio.sleep(min(60.0, minutes * 60 - (time.monotonic() - began)))
            minute += 1
            sample = Sample(
                str(minute), await server.stats(), _client_stats(), tally.echoes, tally.files, tally.errors
            )
            samples.append(sample)
            if progress:
                print(_row(sample), flush=True)
        stop.set()
        _done, pending = await asyncio.wait(workers, timeout=OP_TIMEOUT + 30)
        for task in pending:
            task.cancel()
        # Quiet: every session gone (a silently cut one within its keepalive bound).
        quiet = await server.stats()
        deadline = time.monotonic() + 90
        while quiet["sessions"] and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            quiet = await server.stats()
        end = Sample("end (quiet)", quiet, _client_stats(), tally.echoes, tally.files, tally.errors)
        if os.environ.get("POLYMUX_SOAK_DEBUG"):
            import collections

            names = collections.Counter(
                getattr(t.get_coro(), "__qualname__", repr(t.get_coro())) for t in asyncio.all_tasks()
            )
            print("client tasks at the end:", names.most_common(12), flush=True)
            print("pending workers:", len(pending), flush=True)
        samples.append(end)
        if progress:
            print(_row(end), flush=True)
        problems += tally.wrong
        problems += _judge(samples)
    finally:
        stop.set()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for proxy in proxies:
            await proxy.aclose()
        await server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return samples, problems


QUIET_SLACK = {"fds": 8, "tasks": 8}
"""What the quiet figures at the end may exceed the start's by (the pipe's and the loop's
own bookkeeping)."""


def _judge(samples: list[Sample]) -> list[str]:
    """The soak's verdict (see the module docstring): the problems found."""
    problems = []
    start, end = samples[0], samples[-1]
    minutes = samples[1:-1]
    if minutes:
        first = minutes[0]
        for s in minutes[1:]:
            for key, slack in SLACK.items():
                if s.server[key] > first.server[key] + slack:
                    problems.append(
                        f"minute {s.minute}: server {key} {s.server[key]:.1f} grew past minute 1's "
                        f"{first.server[key]:.1f} + {slack}"
                    )
        if end.server["rss_mib"] > first.server["rss_mib"] + SLACK["rss_mib"]:
            problems.append(
                f"at the end: server RSS {end.server['rss_mib']:.1f} MiB, past minute 1's "
                f"{first.server['rss_mib']:.1f} + {SLACK['rss_mib']}"
            )
    for key, slack in QUIET_SLACK.items():
        if end.server[key] > start.server[key] + slack:
            problems.append(
                f"at the end: server {key} {end.server[key]:.0f}, against {start.server[key]:.0f} at the start"
            )
    if end.server["sessions"]:
        problems.append(f"at the end: {end.server['sessions']:.0f} sessions still open")
    if not end.echoes or not end.files:
        problems.append(f"too little done: {end.echoes} echoes, {end.files} files")
    return problems


def _row(s: Sample) -> str:
    srv = s.server
    return (
        f"| {s.minute} | {srv['rss_mib']:.1f} | {srv['fds']:.0f} | {srv['tasks']:.0f} | {srv['sessions']:.0f} "
        f"| {s.client['rss_mib']:.1f} | {s.client['fds']:.0f} | {s.client['tasks']:.0f} "
        f"| {s.echoes} | {s.files} | {s.errors} |"
    )


HEADER = (
    "| minute | server RSS MiB | server fds | server tasks | server sessions | client RSS MiB "
    "| client fds | client tasks | echoes | files | errors (cuts) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def report(formats: list[str], minutes: float, samples: list[Sample], problems: list[str]) -> str:
    """The soak's table in markdown."""
    lines = [
        f"# Soak: {minutes:g} minutes, {len(formats)} formats, {WORKERS} clients each, through the fault proxy",
        "",
        HEADER,
        *(_row(s) for s in samples),
        "",
        (
            f"Slack after the first minute (live, and RSS at the end): {SLACK}; at the end, once "
            f"quiet, against the start: {QUIET_SLACK}, no session."
        ),
        "",
        "Result: " + ("passed" if not problems else "FAILED:\n" + "\n".join(f"- {p}" for p in problems)),
    ]
    return "\n".join(lines) + "\n"


def run(formats: list[str], minutes: float, out: Path, seed: int, progress: bool = True) -> int:
    """Run the soak and write ``soak.md`` into ``out``; exit status 1 when it failed."""
    if progress:
        print(
            f"soak: {minutes:g} minutes, formats {', '.join(formats)}, {WORKERS} clients each (seed {seed})\n{HEADER}",
            flush=True,
        )
    samples, problems = asyncio.run(soak(formats, minutes, seed, progress))
    text = report(formats, minutes, samples, problems)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.md").write_text(text)
    if progress:
        print(text)
    return 1 if problems else 0

"""The receiving process: one child per (event loop, transport), serving raw asyncio
streams, a raw ``asyncio.Protocol`` and one polymux server per format, all with the same
per-stream behaviour (chosen by the stream's header, see :mod:`benchmarks.common`).

The parent talks to it over a ``multiprocessing`` pipe: the child sends its endpoints,
then answers ``"rss"`` (current RSS), ``"reset_peak"`` and ``"peak"`` (VmHWM), ``"cpu"``
(its user and system CPU seconds), ``"cprofile_on"`` / ``"cprofile_off"``, until ``"stop"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import io
import multiprocessing
import os
import pstats
import resource
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

import polymux
from benchmarks.common import (
    MODE_BULK,
    MODE_CHURN,
    MODE_IDLE,
    MODE_MESSAGES,
    MODE_RR,
    MODE_SLOW,
    RAW_PROTOCOL,
    RAW_STREAMS,
    SERVER_OPTIONS,
    SETUP_TIMEOUT,
    BenchError,
    Endpoint,
    loop_factory,
    peak_rss_bytes,
    pin,
    reset_peak_rss,
    rss_bytes,
)
from polymux.formats import get as get_format


READ = 256 * 1024
BACKLOG = 4096
"""Listen backlog of the raw servers (256 raw connections are opened back to back)."""


async def _count_to_eof(reader: asyncio.StreamReader) -> int:
    n = 0
    while data := await reader.read(READ):
        n += len(data)
    return n


async def handle_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Server side of one raw connection or one channel: read the header, act on it."""
    try:
        head = await reader.readexactly(9)
        mode, arg = head[:1], int.from_bytes(head[1:], "big")
        if mode == MODE_BULK:
            n = await _count_to_eof(reader)
            writer.write(b"\x01" if n == arg else b"\x00")
        elif mode == MODE_MESSAGES:
            count = 0
            readexactly = reader.readexactly
            with contextlib.suppress(asyncio.IncompleteReadError):
                while True:
                    size = int.from_bytes(await readexactly(4), "big")
                    await readexactly(size)
                    count += 1
            writer.write(count.to_bytes(8, "big"))
        elif mode == MODE_RR:
            readexactly = reader.readexactly
            with contextlib.suppress(asyncio.IncompleteReadError):
                while True:
                    prefix = await readexactly(4)
                    body = await readexactly(int.from_bytes(prefix, "big"))
                    writer.write(prefix + body)
                    await writer.drain()
        elif mode == MODE_CHURN:
            await _count_to_eof(reader)
            writer.write(b"\x01")
        elif mode == MODE_IDLE:
            await _count_to_eof(reader)
        elif mode == MODE_SLOW:
            delay = arg / 1e6
            while await reader.read(64 * 1024):  # noqa: ASYNC110 (a slow reader on purpose)
                await asyncio.sleep(delay)
            writer.write(b"\x01")
        else:
            raise BenchError(f"unknown stream mode {mode!r}")
        if writer.can_write_eof():
            writer.write_eof()
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, polymux.PolymuxError):
        pass
    finally:
        writer.close()


class CountingProtocol(asyncio.Protocol):
    """Raw ``asyncio.Protocol`` receiver for bulk: header, then count bytes in
    ``data_received`` until EOF; reply b"\\x01" if the count matches."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.expected = -1
        self.count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.expected < 0:
            self.head += data
            if len(self.head) < 9:
                return
            self.expected = int.from_bytes(self.head[1:9], "big")
            self.count = len(self.head) - 9
            self.head = b""
            return
        self.count += len(data)

    def eof_received(self) -> bool:
        assert self.transport is not None
        self.transport.write(b"\x01" if self.count == self.expected else b"\x00")
        self.transport.close()
        return True


class ModeProtocol(asyncio.Protocol):
    """A channel served by ``polymux.ChannelProtocols`` instead of a handler task: the
    scale scenario's second receiver (idle channels cost no task). Understands the idle
    and churn headers: read to EOF, answer churn with b"\\x01"."""

    __slots__ = ("head", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if len(self.head) < 9:
            self.head += data[: 9 - len(self.head)]

    def eof_received(self) -> bool:
        assert self.transport is not None
        mode = self.head[:1]
        if mode == MODE_CHURN:
            self.transport.write(b"\x01")
        elif mode != MODE_IDLE:
            self.transport.abort()
            return True
        self.transport.close()
        return True


def protocols_endpoint(fmt: str) -> str:
    """The peer's endpoint key of ``fmt`` served by :class:`ModeProtocol` (no task per channel)."""
    return f"{fmt}+protocols"


def profile_text(profiler: cProfile.Profile, top: int) -> str:
    """The top ``top`` functions of a profile by own time, as pstats prints them."""
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)
    return out.getvalue()


def _child(loop_name: str, transport: str, formats: list[str], conn: Connection, cpu: int | None) -> None:
    pin(cpu)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        profiler = cProfile.Profile(time.process_time)
        servers: list[Any] = []
        endpoints: dict[str, Endpoint] = {}
        with tempfile.TemporaryDirectory(prefix="polymux-bench-") as tmp:

            def unix_path(name: str) -> str:
                return os.path.join(tmp, name.replace("/", "_") + ".sock")

            if transport == "tcp":
                s = await asyncio.start_server(handle_stream, "127.0.0.1", 0, backlog=BACKLOG)
                p = await loop.create_server(CountingProtocol, "127.0.0.1", 0, backlog=BACKLOG)
                endpoints[RAW_STREAMS] = Endpoint("tcp", s.sockets[0].getsockname()[1])
                endpoints[RAW_PROTOCOL] = Endpoint("tcp", p.sockets[0].getsockname()[1])
            else:
                s = await asyncio.start_unix_server(handle_stream, unix_path(RAW_STREAMS), backlog=BACKLOG)
                p = await loop.create_unix_server(CountingProtocol, unix_path(RAW_PROTOCOL), backlog=BACKLOG)
                endpoints[RAW_STREAMS] = Endpoint("unix", unix_path(RAW_STREAMS))
                endpoints[RAW_PROTOCOL] = Endpoint("unix", unix_path(RAW_PROTOCOL))
            servers += [s, p]
            for fmt in formats:
                if transport == "tcp":
                    ps = await polymux.start_server(
                        handle_stream, "127.0.0.1", 0, protocol=fmt, **SERVER_OPTIONS
                    )
                    endpoints[fmt] = Endpoint("tcp", ps.port)
                else:
                    ps = await polymux.start_unix_server(
                        handle_stream, unix_path(fmt), protocol=fmt, **SERVER_OPTIONS
                    )
                    endpoints[fmt] = Endpoint("unix", unix_path(fmt))
                servers.append(ps)
                if get_format(fmt).caps.one_way:
                    continue  # omnistreams pairs its streams for stream handlers only
                handler = polymux.ChannelProtocols(ModeProtocol)
                if transport == "tcp":
                    ps = await polymux.start_server(handler, "127.0.0.1", 0, protocol=fmt, **SERVER_OPTIONS)
                    endpoints[protocols_endpoint(fmt)] = Endpoint("tcp", ps.port)
                else:
                    path = unix_path(protocols_endpoint(fmt))
                    ps = await polymux.start_unix_server(handler, path, protocol=fmt, **SERVER_OPTIONS)
                    endpoints[protocols_endpoint(fmt)] = Endpoint("unix", path)
                servers.append(ps)
            conn.send(endpoints)
            while True:
                command = await loop.run_in_executor(None, conn.recv)
                if command == "rss":
                    conn.send(rss_bytes())
                elif command == "reset_peak":
                    conn.send(reset_peak_rss())
                elif command == "peak":
                    conn.send(peak_rss_bytes())
                elif command == "cpu":
                    # This process's CPU seconds so far: user, system (benchmarks/account.py;
                    # getrusage, not os.times: clock ticks of 10 ms are too coarse).
                    usage = resource.getrusage(resource.RUSAGE_SELF)
                    conn.send((usage.ru_utime, usage.ru_stime))
                elif command == "cprofile_on":
                    # CPU time (not wall clock) of this process's loop thread.
                    profiler = cProfile.Profile(time.process_time)
                    profiler.enable()
                    conn.send(True)
                elif command == "cprofile_entries":
                    # Every entry, for benchmarks/account.py's split by layer:
                    # (file, line, function, calls, own CPU seconds).
                    profiler.disable()
                    raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
                    conn.send(
                        [(f, line, fn, nc, tt) for (f, line, fn), (_cc, nc, tt, _ct, _c) in raw.items()]
                    )
                elif command == "cprofile_off":
                    profiler.disable()
                    conn.send(profile_text(profiler, 30))
                else:
                    break
            for server in servers:
                server.close()

    with asyncio.Runner(loop_factory=loop_factory(loop_name)) as runner:
        runner.run(main())


class Peer:
    """Handle on the receiving child process (start with :meth:`start`, end with :meth:`stop`)."""

    def __init__(self, loop_name: str, transport: str, formats: list[str], cpu: int | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child, args=(loop_name, transport, formats, child_conn, cpu), daemon=True
        )
        self.endpoints: dict[str, Endpoint] = {}

    def start(self) -> Peer:
        """Start the child and wait for its endpoints."""
        self._proc.start()
        if not self._conn.poll(SETUP_TIMEOUT):
            self._proc.kill()
            raise BenchError("the receiving process did not start")
        self.endpoints = self._conn.recv()
        return self

    async def ask(self, command: str) -> Any:
        """Send a command to the child and return its answer (without blocking the loop)."""
        self._conn.send(command)
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, self._conn.poll, SETUP_TIMEOUT):
            raise BenchError(f"the receiving process did not answer {command!r}")
        return self._conn.recv()

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._proc.pid

    def stop(self) -> None:
        """Tell the child to stop; kill it if it does not within SETUP_TIMEOUT."""
        with contextlib.suppress(OSError):
            self._conn.send("stop")
        self._proc.join(SETUP_TIMEOUT)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()

"""Tools of the RSS tests: a polymux server in its own process (server_proc.py) whose
resident memory is sampled while an attacker on a raw, non-blocking socket floods it.

The attacker reads only when it chooses to (``loop.sock_recv``): nothing reads in the
background, so "never reads" means the kernel buffers fill and stay full. Frames are
crafted with polymux's sans-I/O engine of the same format (our side is the client), and
the engine only ever sees what the attacker chose to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from polymux.config import SessionConfig
from polymux.engine import Engine, events as ev
from polymux.exceptions import ProtocolError
from polymux.formats import make_engine


MIB = 1024 * 1024
SERVER = Path(__file__).with_name("server_proc.py")


def rss(pid: int) -> int:
    """Resident set size of process ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """``async with ServerProcess(protocol, mode, **options) as server:``; ``server.port``,
    ``server.rss()``, ``await server.closed()`` (the next CLOSED line)."""

    def __init__(
        self,
        protocol: str,
        mode: str = "echo",
        *,
        uvloop: bool = False,
        pythonpath: str | None = None,
        quiet: bool = False,
        websocket: bool = False,
        **options: Any,
    ) -> None:
        self.spec = {
            "protocol": protocol,
            "mode": mode,
            "options": options,
            "uvloop": uvloop,
            "lenient": pythonpath is not None,
            "websocket": websocket,
        }
        self.pythonpath = pythonpath
        self.quiet = quiet  # the server's stderr dropped (benchmarks), else shown
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self.stderr = b""

    async def __aenter__(self) -> Self:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.pythonpath is not None:  # another polymux (benchmarks: before / after)
            env["PYTHONPATH"] = self.pythonpath
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SERVER),
            json.dumps(self.spec),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if self.quiet else None,
            env=env,
        )
        assert self.proc.stdout is not None
        async with asyncio.timeout(30):
            line = (await self.proc.stdout.readline()).decode()
        if not line.startswith("PORT "):
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(line.split()[1])
        self._reader = asyncio.ensure_future(self._read_lines())
        return self

    async def _read_lines(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            await self.lines.put(line.decode().rstrip("\n"))

    async def next_line(self, prefix: str, timeout: float = 10.0) -> str:  # noqa: ASYNC109
        """The next line the server prints that starts with ``prefix``."""
        async with asyncio.timeout(timeout):
            while True:
                line = await self.lines.get()
                if line.startswith(prefix):
                    return line

    def rss(self) -> int:
        assert self.proc is not None
        return rss(self.proc.pid)

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            async with asyncio.timeout(10):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


class RssSampler:
    """Samples a process's RSS every 20 ms in the background: ``baseline``, ``peak``,
    ``series`` (seconds since start, bytes)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.baseline = rss(pid)
        self.peak = self.baseline
        self.series: list[tuple[float, int]] = []
        self._start = time.monotonic()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            while True:
                value = rss(self.pid)
                self.peak = max(self.peak, value)
                self.series.append((time.monotonic() - self._start, value))
                await asyncio.sleep(0.02)  # a sampling period, not synchronisation

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            self.peak = max(self.peak, rss(self.pid))


class RawPeer:
    """One raw connection to the server; ``engine`` crafts (and parses what we read)."""

    def __init__(self, fmt: str, sock: socket.socket, **options: Any) -> None:
        self.format = fmt
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.engine: Engine = make_engine(fmt, SessionConfig(**options), is_client=True)
        self.events: list[ev.Event] = []
        self.eof = False
        self.received = 0  # bytes read from the server, in all

    @classmethod
    async def connect(cls, port: int, fmt: str, *, rcvbuf: int | None = None, **options: Any) -> RawPeer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return cls(fmt, sock, **options)

    def take(self) -> bytes:
        return b"".join(bytes(c) for c in self.engine.data_to_send())

    async def send(self, data: bytes | None = None) -> None:
        await self.loop.sock_sendall(self.sock, self.take() if data is None else data)

    async def recv(self) -> bool:
        """Read once and feed the engine (ignoring its complaints); False at EOF/reset."""
        try:
            data = await self.loop.sock_recv(self.sock, 256 * 1024)
        except ConnectionError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.received += len(data)
        with contextlib.suppress(ProtocolError):
            self.events.extend(self.engine.receive_data(data))
        return True

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while not predicate():
                if not await self.recv():
                    raise ConnectionResetError(f"{self.format}: the server closed while we waited")

    async def handshake(self) -> None:
        await self.send()
        await self.until(lambda: self.engine.ready)
        await self.send()

    async def open_many(self, n: int, *, first: bytes = b"") -> list[int]:
        """Open ``n`` channels and wait (reading) until the server accepted them all."""
        handles = []
        for i in range(n):
            handle = self.engine.open_channel(f"c{i}")
            if first and self.engine.send_credit(handle) > 0:
                self.engine.send_data(handle, first)
            handles.append(handle)
        await self.send()
        if self.engine.needs_acceptance:
            want = set(handles)
            await self.until(
                lambda: want.issubset({e.channel for e in self.events if isinstance(e, ev.ChannelAccepted)}),
                timeout=30,
            )
        if self.format.startswith("omnistreams"):  # credit comes with the acceptance
            await self.until(lambda: all(self.engine.send_credit(h) > 0 for h in handles), timeout=30)
        return handles

    async def flood(self, data: Callable[[], bytes], seconds: float) -> int:
        """Send what ``data()`` makes, again and again, for ``seconds``; never read.
        Returns the bytes the kernel took."""
        sent = 0
        deadline = time.monotonic() + seconds
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(seconds):
                while time.monotonic() < deadline:
                    chunk = data()
                    if not chunk:
                        break
                    await self.loop.sock_sendall(self.sock, chunk)
                    sent += len(chunk)
        return sent

    async def closed_by_server(self, timeout: float) -> float:  # noqa: ASYNC109
        """Read (discarding) until the server's side is gone; the seconds it took."""
        start = time.monotonic()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    data = await self.loop.sock_recv(self.sock, 1 << 20)
                except ConnectionError:
                    break
                if not data:
                    break
        return time.monotonic() - start

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.sock.close()

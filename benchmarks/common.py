"""What every scenario shares: event loops, endpoints (TCP or unix socket) of the receiving
process, the wire header each stream starts with, measurement rows and the A/B/A/B
interleaving of polymux and its baselines.

Every stream the suite opens (a raw TCP / unix connection or a polymux channel) starts
with a 9-byte header: one mode byte and an 8-byte big-endian argument. The receiving
process (:mod:`benchmarks.peer`) dispatches on the mode, so raw connections and channels
of every format get exactly the same server-side code.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import polymux


MIB = 1 << 20
KIB = 1 << 10
LOOPS = ("asyncio", "uvloop")
TRANSPORTS = ("tcp", "unix")
CONNECT_RETRIES = 200
"""Attempts of a raw unix connect that meets a full listen backlog (EAGAIN)."""
SETUP_TIMEOUT = 60.0
"""Seconds allowed for connecting, opening channels and closing, per measurement."""

# Stream header modes (see benchmarks.peer).
MODE_BULK = b"B"  # arg = bytes that follow; count them until EOF, reply b"\x01" if exact
MODE_MESSAGES = b"M"  # arg = messages that follow (4-byte length + body); reply 8-byte count at EOF
MODE_RR = b"R"  # echo length-prefixed messages until EOF
MODE_CHURN = b"C"  # read until EOF, reply b"\x01"
MODE_IDLE = b"I"  # read until EOF (idle channels)
MODE_SLOW = b"S"  # arg = microseconds to sleep after each 64 KiB read; reply b"\x01" at EOF


def cpu_pair() -> tuple[int, int] | None:
    """Two CPUs, for the sending and the receiving process, or None where this process
    cannot pin itself (no ``sched_setaffinity``, or fewer than two CPUs allowed).

    Unpinned, the scheduler often put both processes of a bulk run on one core of this
    2-vCPU machine (their CPU shares summed to 100 %), and a row swung by 2x between runs.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[-1]) if len(cpus) >= 2 else None


async def reap(*procs: asyncio.subprocess.Process | None) -> None:
    """Kill the reference peer processes that still run, and wait for each."""
    for proc in procs:
        if proc is not None:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


def pin(cpu: int | None) -> None:
    """Pin the calling process to ``cpu`` (None: leave it where it is)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


RAW_STREAMS = "raw-streams"
"""Baseline: asyncio.open_connection / start_server on the same kind of socket."""
RAW_PROTOCOL = "raw-protocol"
"""Baseline: a plain asyncio.Protocol on both ends (no StreamReader / StreamWriter)."""

SERVER_OPTIONS: dict[str, Any] = {
    # Only limits, so that the scale scenario can open 100,000 channels on one session;
    # none of them changes the data path.
    "max_channels": 250_000,
    "max_inbound_channels": 250_000,
    "max_outbound_channels": 250_000,
    "accept_backlog": 250_000,
    "inbound_channel_rate": 1e9,
}


class BenchError(Exception):
    """A measurement failed (timeout, wrong byte count, broken connection)."""


def header(mode: bytes, arg: int = 0) -> bytes:
    """The 9-byte stream header: mode byte and 8-byte big-endian argument."""
    return mode + arg.to_bytes(8, "big")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """``asyncio.Runner(loop_factory=...)`` for ``"asyncio"`` or ``"uvloop"``."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop  # type: ignore[no-any-return]
    if name != "asyncio":
        raise ValueError(f"unknown event loop {name!r}; choose from {', '.join(LOOPS)}")
    return asyncio.new_event_loop


@dataclass(frozen=True)
class Endpoint:
    """Where the receiving process listens for one stack: ``("tcp", port)`` or ``("unix", path)``."""

    transport: str
    address: int | str

    async def open_streams(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw asyncio stream connection to this endpoint."""
        for attempt in range(CONNECT_RETRIES):
            try:
                if self.transport == "tcp":
                    return await asyncio.open_connection("127.0.0.1", int(self.address))
                return await asyncio.open_unix_connection(str(self.address))
            except BlockingIOError:  # a unix listener's backlog is full (EAGAIN): retry
                if attempt == CONNECT_RETRIES - 1:
                    raise
                await asyncio.sleep(0.01)
        raise AssertionError("unreachable")

    async def create_connection(
        self, factory: Callable[[], asyncio.Protocol]
    ) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        """A raw ``asyncio.Protocol`` connection to this endpoint."""
        loop = asyncio.get_running_loop()
        for attempt in range(CONNECT_RETRIES):
            try:
                if self.transport == "tcp":
                    return await loop.create_connection(factory, "127.0.0.1", int(self.address))
                return await loop.create_unix_connection(factory, str(self.address))
            except BlockingIOError:  # a unix listener's backlog is full (EAGAIN): retry
                if attempt == CONNECT_RETRIES - 1:
                    raise
                await asyncio.sleep(0.01)
        raise AssertionError("unreachable")

    async def connect(self, protocol: str, **options: Any) -> polymux.Session:
        """A polymux session to this endpoint."""
        opts = {**SERVER_OPTIONS, **options}
        if self.transport == "tcp":
            return await polymux.connect("127.0.0.1", int(self.address), protocol=protocol, **opts)
        return await polymux.connect_unix(str(self.address), protocol=protocol, **opts)


async def close_session(session: polymux.Session | None) -> None:
    """Close a session politely, or cut it after SETUP_TIMEOUT."""
    if session is None:
        return
    try:
        await asyncio.wait_for(session.aclose(), SETUP_TIMEOUT)
    except (TimeoutError, polymux.PolymuxError, OSError):
        session.abort()


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a raw stream writer and wait (bounded) for it."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), SETUP_TIMEOUT)
    except (TimeoutError, OSError, polymux.PolymuxError):
        pass


async def open_stream(
    session: polymux.Session, name: str = ""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A bidirectional channel on any format: ``Session.open_pair`` where the session has
    it (omnistreams streams are one-way: a pair is a stream each way), else ``open_channel``."""
    open_pair = getattr(session, "open_pair", None)
    if open_pair is not None:
        pair: tuple[asyncio.StreamReader, asyncio.StreamWriter] = await open_pair(name)
        return pair
    return await session.open_channel(name)


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size (VmHWM) since the start or the last :func:`reset_peak_rss`."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: ``5`` to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# -- rows ------------------------------------------------------------------------------------


@dataclass
class Row:
    """One measured figure: a scenario case for one stack (a format or a baseline)."""

    scenario: str
    case: str
    """The scenario's parameters, e.g. ``"1 ch"`` or ``"64 B x 1 ch"``."""
    stack: str
    """A format of ``polymux.PROTOCOLS``, a baseline name, or ``<format>>node``."""
    loop: str
    transport: str
    unit: str
    higher_is_better: bool = True
    values: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    baseline: str | None = None
    """The stack this row's ratio is taken against (same scenario, case, loop, transport)."""
    extra: dict[str, Any] = field(default_factory=dict)
    x: float | None = None
    """The plotted parameter (channel count, message size)."""

    @property
    def median(self) -> float | None:
        """Median of the repeats (None if every run failed)."""
        return statistics.median(self.values) if self.values else None

    def key(self) -> tuple[str, str, str, str]:
        """Rows comparable for a ratio share this key."""
        return (self.scenario, self.case, self.loop, self.transport)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (adds the median)."""
        out = asdict(self)
        out["median"] = self.median
        return out


@dataclass
class Job:
    """One measurable thing: ``run()`` returns the figure of one repeat for ``row``."""

    row: Row
    run: Callable[[], Awaitable[float]]


async def interleave(jobs: list[Job], repeat: int, *, time_limit: float, progress: bool) -> None:
    """Run every job once per repeat, in order (A/B/A/B ...), so a slow phase of the
    machine hits every stack alike; figures go to ``job.row.values``."""
    for rep in range(repeat):
        for job in jobs:
            row = job.row
            gc.collect()
            label = f"[{row.loop}/{row.transport} {rep + 1}/{repeat}] {row.scenario} {row.case} {row.stack}"
            start = time.perf_counter()
            try:
                async with asyncio.timeout(time_limit):
                    value = await job.run()
            except TimeoutError:
                row.errors.append(f"timeout after {time_limit:g} s")
                note = "FAILED (timeout)"
            except (BenchError, polymux.PolymuxError, OSError, asyncio.IncompleteReadError) as exc:
                row.errors.append(f"{type(exc).__name__}: {exc}")
                note = f"FAILED ({row.errors[-1]})"
            else:
                row.values.append(value)
                note = f"{value:,.1f} {row.unit}"
            if progress:
                print(f"  {label}: {note} ({time.perf_counter() - start:.1f} s)", flush=True)

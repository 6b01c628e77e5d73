"""Bulk-transfer throughput of polymux sessions (every wire format) against raw TCP.

By default the receiving side runs in a child process (``--receiver process``), as client
and server do in real use, so sender and receiver each have a core; ``--receiver inline``
runs both in one process and one thread, sharing the event loop, which charges both
stacks' costs to one CPU. Either way the raw baseline is measured exactly like polymux.
For each event loop (the default asyncio loop and uvloop) the script measures, in the
same loop run:

* raw TCP over 127.0.0.1: one connection moving SIZE bytes, and 16 connections in
  parallel moving SIZE/16 each;
* polymux, per protocol: one session over 127.0.0.1 TCP carrying one channel that moves
  SIZE bytes, and 16 channels in parallel on one session moving SIZE/16 each.

Senders write 256 KiB memoryview slices of one preallocated ``bytes`` object and
``await drain()`` after each; receivers ``read(256 KiB)`` and only count. The clock runs
from the first write until the receiver's 1-byte reply arrives (for 16 streams, until
the last reply). Connection, session and channel setup are not timed. Each figure is the
best of ``--repeat`` runs; runs of the different cases are interleaved.

Run ``.venv/bin/python benchmarks/bench_bulk.py --help`` for the options;
benchmarks/README.md explains the output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import multiprocessing
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import polymux


MIB = 1 << 20
CHUNK = 256 * 1024
_settings = {"write_size": CHUNK}
"""Bytes per ``write()`` on the sending side (``--write-kib``)."""
"""Bytes per ``write()`` on the sending side and per ``read()`` on the receiving side."""
PARALLEL = 16
"""Connections (raw) or channels (polymux) of the parallel case."""
SETUP_TIMEOUT = 30.0
"""Seconds allowed for connecting, opening channels and closing, per measurement."""

RAW = "raw-tcp"
LOOPS = ("asyncio", "uvloop")


class BenchError(Exception):
    """A measurement failed (timeout, wrong byte count, broken connection)."""


# -- the two sides of one stream -------------------------------------------------------------


async def _send(
    payload: memoryview, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, half_close: bool
) -> None:
    """Write ``payload`` in ``write_size`` slices with ``drain()`` after each, then wait for the
    receiver's 1-byte reply."""
    step = _settings["write_size"]
    for off in range(0, len(payload), step):
        writer.write(payload[off : off + step])
        await writer.drain()
    if half_close:
        writer.write_eof()
    reply = await reader.read(1)
    if reply != b"\x01":
        raise BenchError(f"receiver did not confirm the byte count (reply {reply!r})")


async def _timed_send(
    views: list[memoryview],
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    time_limit: float,
    *,
    half_close: bool,
) -> float:
    """Send each view on its stream in parallel; return the seconds until the last reply."""
    async with asyncio.timeout(time_limit):
        start = time.perf_counter()
        await asyncio.gather(
            *(_send(v, r, w, half_close=half_close) for v, (r, w) in zip(views, pairs, strict=True))
        )
        return time.perf_counter() - start


async def _count(reader: asyncio.StreamReader, expected: int | None) -> int:
    """Read CHUNK at a time; stop at ``expected`` bytes, or at EOF when it is None."""
    n = 0
    while expected is None or n < expected:
        data = await reader.read(CHUNK)
        if not data:
            break
        n += len(data)
    return n


async def _close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), SETUP_TIMEOUT)


# -- raw TCP baseline ------------------------------------------------------------------------


async def raw_transfer(payload: memoryview, streams: int, time_limit: float) -> float:
    """Move ``payload`` over ``streams`` parallel TCP connections (len/streams each);
    return the seconds from the first write to the last reply."""
    part = len(payload) // streams
    handlers: set[asyncio.Task[None]] = set()
    counts: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            n = await _count(reader, part)
            counts.append(n)
            writer.write(b"\x01" if n == part else b"\x00")
            await writer.drain()
        finally:
            await _close_writer(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    writers: list[asyncio.StreamWriter] = []
    try:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(SETUP_TIMEOUT):
            pairs = [await asyncio.open_connection("127.0.0.1", port) for _ in range(streams)]
        writers = [w for _r, w in pairs]
        views = [payload[i * part : (i + 1) * part] for i in range(streams)]
        elapsed = await _timed_send(views, pairs, time_limit, half_close=False)
        if counts != [part] * streams:
            raise BenchError(f"raw server counted {counts}, expected {part} per connection")
        return elapsed
    finally:
        for w in writers:
            await _close_writer(w)
        server.close()
        for task in handlers:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), SETUP_TIMEOUT)


# -- polymux ---------------------------------------------------------------------------------


async def _channel_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Server side of one channel: count until EOF, reply b"\\x01" if the count matches
    the 8-byte size that starts the channel's data (yamux streams have no names)."""
    try:
        expected = int.from_bytes(await reader.readexactly(8), "big")
        n = await _count(reader, None)
        writer.write(b"\x01" if n == expected else b"\x00")
        writer.write_eof()
        await writer.drain()
    finally:
        writer.close()


async def polymux_transfer(protocol: str, payload: memoryview, streams: int, time_limit: float) -> float:
    """Move ``payload`` over ``streams`` parallel channels of one session (len/streams
    each); return the seconds from the first write to the last reply."""
    part = len(payload) // streams
    server = await polymux.start_server(_channel_handler, "127.0.0.1", 0, protocol=protocol)
    session: polymux.Session | None = None
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with asyncio.timeout(SETUP_TIMEOUT):
            session = await polymux.connect("127.0.0.1", server.port, protocol=protocol)
            pairs = [await session.open_channel(f"bench/{part}") for _ in range(streams)]
            for _r, w in pairs:
                w.write(part.to_bytes(8, "big"))
        views = [payload[i * part : (i + 1) * part] for i in range(streams)]
        return await _timed_send(views, pairs, time_limit, half_close=True)
    finally:
        for _r, w in pairs:
            w.close()
        if session is not None:
            try:
                await asyncio.wait_for(session.aclose(), SETUP_TIMEOUT)
            except (TimeoutError, polymux.PolymuxError, OSError):
                session.abort()
        try:
            await asyncio.wait_for(server.aclose(), SETUP_TIMEOUT)
        except (TimeoutError, polymux.PolymuxError, OSError):
            server.close()


# -- receiver in a child process -------------------------------------------------------------


async def _raw_counter(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Raw receiver in the child: an 8-byte expected size, then bytes until EOF."""
    try:
        expected = int.from_bytes(await reader.readexactly(8), "big")
        n = await _count(reader, None)
        writer.write(b"\x01" if n == expected else b"\x00")
        await writer.drain()
    finally:
        await _close_writer(writer)


def _child(loop_name: str, protocols: list[str], conn: Connection) -> None:
    """Serve raw TCP and one polymux server per protocol until told to stop."""

    async def main() -> None:
        raw = await asyncio.start_server(_raw_counter, "127.0.0.1", 0)
        servers = {
            p: await polymux.start_server(_channel_handler, "127.0.0.1", 0, protocol=p) for p in protocols
        }
        ports = {RAW: raw.sockets[0].getsockname()[1], **{p: s.port for p, s in servers.items()}}
        conn.send(ports)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        raw.close()
        for s in servers.values():
            s.close()

    with asyncio.Runner(loop_factory=_loop_factory(loop_name)) as runner:
        runner.run(main())


async def raw_transfer_remote(port: int, payload: memoryview, streams: int, time_limit: float) -> float:
    """Like :func:`raw_transfer`, to the child's raw receiver."""
    part = len(payload) // streams
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with asyncio.timeout(SETUP_TIMEOUT):
            pairs = [await asyncio.open_connection("127.0.0.1", port) for _ in range(streams)]
        for _r, w in pairs:
            w.write(part.to_bytes(8, "big"))
        views = [payload[i * part : (i + 1) * part] for i in range(streams)]
        return await _timed_send(views, pairs, time_limit, half_close=True)
    finally:
        for _r, w in pairs:
            await _close_writer(w)


async def polymux_transfer_remote(
    protocol: str, port: int, payload: memoryview, streams: int, time_limit: float
) -> float:
    """Like :func:`polymux_transfer`, to the child's polymux server."""
    part = len(payload) // streams
    session: polymux.Session | None = None
    pairs: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with asyncio.timeout(SETUP_TIMEOUT):
            session = await polymux.connect("127.0.0.1", port, protocol=protocol)
            pairs = [await session.open_channel(f"bench/{part}") for _ in range(streams)]
            for _r, w in pairs:
                w.write(part.to_bytes(8, "big"))
        views = [payload[i * part : (i + 1) * part] for i in range(streams)]
        return await _timed_send(views, pairs, time_limit, half_close=True)
    finally:
        for _r, w in pairs:
            w.close()
        if session is not None:
            try:
                await asyncio.wait_for(session.aclose(), SETUP_TIMEOUT)
            except (TimeoutError, polymux.PolymuxError, OSError):
                session.abort()


# -- the Node reference peers as receivers ---------------------------------------------------

NODE_DIR = Path(__file__).resolve().parent.parent / "tests" / "interop" / "node"
NODE_PEERS: dict[str, tuple[str, list[str], bool]] = {
    # protocol: (script, extra args, stream name travels as a first line of data)
    "yamux": ("yamux_peer.mjs", [], True),
    "mplex": ("mplex_peer.mjs", ["--impl", "libp2p"], True),
    "multiplex": ("mplex_peer.mjs", ["--impl", "multiplex"], False),
}
NODE_SUFFIX = ">node"


async def node_transfer(protocol: str, payload: memoryview, time_limit: float) -> float:
    """polymux sends ``payload`` on one stream to the npm reference implementation of the
    format (its interop peer, ``halfclose/`` behaviour: count, reply the count)."""
    script, extra, name_line = NODE_PEERS[protocol]
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / script),
        *extra,
        "--listen",
        "--tcp",
        "0",
        "--mode",
        "responder",
        "--timeout-ms",
        str(int((time_limit + SETUP_TIMEOUT) * 1000)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    session: polymux.Session | None = None
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(SETUP_TIMEOUT):
            line = (await proc.stdout.readline()).decode().split()
            if line[:1] != ["LISTENING"]:
                raise BenchError(f"the Node peer did not start: {line}")
            session = await polymux.connect("127.0.0.1", int(line[1]), protocol=protocol)
            reader, writer = await session.open_channel("halfclose/bench")
            if name_line:
                writer.write(b"halfclose/bench\n")
        async with asyncio.timeout(time_limit):
            start = time.perf_counter()
            step = _settings["write_size"]
            for off in range(0, len(payload), step):
                writer.write(payload[off : off + step])
                await writer.drain()
            writer.write_eof()
            reply = await reader.read()
            elapsed = time.perf_counter() - start
        if reply != str(len(payload)).encode():
            raise BenchError(f"the Node peer counted {reply!r}, expected {len(payload)}")
        writer.close()
        return elapsed
    finally:
        if session is not None:
            try:
                await asyncio.wait_for(session.aclose(), SETUP_TIMEOUT)
            except (TimeoutError, polymux.PolymuxError, OSError):
                session.abort()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


# -- driving ---------------------------------------------------------------------------------


@dataclass
class Case:
    """One row of the table: a transport (raw-tcp or a protocol) and a stream count."""

    loop: str
    transport: str
    streams: int
    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def best_mibs(self, size: int) -> float | None:
        return size / MIB / min(self.times) if self.times else None

    def median_mibs(self, size: int) -> float | None:
        return size / MIB / statistics.median(self.times) if self.times else None


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop  # type: ignore[no-any-return]
    return asyncio.new_event_loop


async def _measure(case: Case, payload: memoryview, time_limit: float, ports: dict[str, int] | None) -> None:
    gc.collect()
    try:
        if case.transport.endswith(NODE_SUFFIX):
            elapsed = await node_transfer(case.transport[: -len(NODE_SUFFIX)], payload, time_limit)
        elif ports is not None and case.transport == RAW:
            elapsed = await raw_transfer_remote(ports[RAW], payload, case.streams, time_limit)
        elif ports is not None:
            port = ports[case.transport]
            elapsed = await polymux_transfer_remote(case.transport, port, payload, case.streams, time_limit)
        elif case.transport == RAW:
            elapsed = await raw_transfer(payload, case.streams, time_limit)
        else:
            elapsed = await polymux_transfer(case.transport, payload, case.streams, time_limit)
    except TimeoutError:
        case.errors.append(f"timeout after {time_limit:g} s")
    except (BenchError, polymux.PolymuxError, OSError) as exc:
        case.errors.append(f"{type(exc).__name__}: {exc}")
    else:
        case.times.append(elapsed)


def run_loop(
    loop_name: str, protocols: list[str], payload: memoryview, args: argparse.Namespace
) -> list[Case]:
    """All cases on one event loop, in one ``asyncio.Runner``; runs are interleaved."""
    cases = [Case(loop_name, t, s) for t in (RAW, *protocols) for s in (1, PARALLEL)]
    if args.node:
        cases += [Case(loop_name, p + NODE_SUFFIX, 1) for p in protocols if p in NODE_PEERS]
    ports: dict[str, int] | None = None
    child = None
    parent_conn: Connection | None = None
    if args.receiver == "process":
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        child = ctx.Process(target=_child, args=(loop_name, protocols, child_conn), daemon=True)
        child.start()
        if not parent_conn.poll(SETUP_TIMEOUT):
            child.kill()
            raise BenchError("the receiver process did not start")
        ports = parent_conn.recv()

    async def main() -> None:
        for rep in range(args.repeat):
            for case in cases:
                if not args.quiet:
                    print(
                        f"  [{loop_name} run {rep + 1}/{args.repeat}] {case.transport} x{case.streams} ...",
                        end="",
                        flush=True,
                        file=sys.stderr,
                    )
                n_before = len(case.times)
                await _measure(case, payload, args.timeout, ports)
                if not args.quiet:
                    note = (
                        f" {len(payload) / MIB / case.times[-1]:.0f} MiB/s"
                        if len(case.times) > n_before
                        else f" FAILED ({case.errors[-1]})"
                    )
                    print(note, file=sys.stderr, flush=True)

    try:
        with asyncio.Runner(loop_factory=_loop_factory(loop_name)) as runner:
            runner.run(main())
    finally:
        if child is not None and parent_conn is not None:
            parent_conn.send("stop")
            child.join(SETUP_TIMEOUT)
            if child.is_alive():
                child.kill()
    return cases


def print_table(cases: list[Case], size: int) -> None:
    header = (
        f"{'loop':<8} {'transport':<15} {'streams':>7} {'MiB/s best':>11} "
        f"{'MiB/s median':>13} {'best s':>8} {'vs raw':>7}  note"
    )
    print(header)
    print("-" * len(header))
    raw = {(c.loop, c.streams): c.best_mibs(size) for c in cases if c.transport == RAW}
    for c in cases:
        best, median = c.best_mibs(size), c.median_mibs(size)
        base = raw.get((c.loop, c.streams))
        ratio = f"{best / base:6.2f}x" if best is not None and base else "      -"
        kind = "conns" if c.transport == RAW else "chans"
        note = f"{len(c.errors)} failed: {c.errors[0]}" if c.errors else ""
        print(
            f"{c.loop:<8} {c.transport:<15} {c.streams:>2} {kind:<4} "
            f"{_fmt(best, 11)} {_fmt(median, 13)} "
            f"{(f'{min(c.times):8.3f}' if c.times else '       -')} {ratio}  {note}".rstrip()
        )


def _fmt(value: float | None, width: int) -> str:
    return f"{value:{width}.1f}" if value is not None else " " * (width - 1) + "-"


def profile(loop_name: str, protocol: str, payload: memoryview, args: argparse.Namespace) -> None:
    """One 1-channel polymux transfer under cProfile: top functions by tottime.

    Sender and receiver share the loop, so the profile shows both sides."""
    profiler = cProfile.Profile()
    result: list[float] = []

    async def main() -> None:
        # Warm up (imports, first connection) outside the profile.
        await polymux_transfer(protocol, payload[: 4 * CHUNK], 1, args.timeout)
        profiler.enable()
        try:
            result.append(await polymux_transfer(protocol, payload, 1, args.timeout))
        finally:
            profiler.disable()

    with asyncio.Runner(loop_factory=_loop_factory(loop_name)) as runner:
        runner.run(main())
    elapsed = result[0]
    print(
        f"\ncProfile: {protocol}, 1 channel, {loop_name}: {len(payload) / MIB:g} MiB in {elapsed:.2f} s "
        f"= {len(payload) / MIB / elapsed:.1f} MiB/s under the profiler (slower than unprofiled)"
    )
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(args.profile_top)
    print(out.getvalue().rstrip())


def _parse_list(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad or value!r}; choose from {', '.join(allowed)}")
    return items


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--size-mib", type=float, default=256.0, help="MiB moved per measurement (default 256)"
    )
    parser.add_argument(
        "--protocols",
        type=lambda v: _parse_list(v, polymux.PROTOCOLS, "protocol"),
        default=list(polymux.PROTOCOLS),
        help=f"comma-separated (default {','.join(polymux.PROTOCOLS)})",
    )
    parser.add_argument(
        "--loops",
        type=lambda v: _parse_list(v, LOOPS, "loop"),
        default=list(LOOPS),
        help="comma-separated: asyncio,uvloop (default both)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per figure; the best is shown (default 3)"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds allowed per transfer (default 300)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the table, profile one 1-channel polymux transfer "
        "(first of --protocols, first of --loops)",
    )
    parser.add_argument("--profile-top", type=int, default=25, help="functions shown by --profile (25)")
    parser.add_argument(
        "--write-kib", type=int, default=256, help="KiB per write() on the sending side (default 256)"
    )
    parser.add_argument(
        "--receiver",
        choices=["process", "inline"],
        default="process",
        help="receiving side in a child process (default) or in the sender's loop",
    )
    parser.add_argument(
        "--node",
        action="store_true",
        help="also send to the npm reference peer of each format that has one (rows '<format>>node'; "
        "needs scripts/setup --with-node)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-run progress on stderr")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.size_mib <= 0 or args.timeout <= 0:
        parser.error("--repeat must be >= 1, --size-mib and --timeout > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _settings["write_size"] = args.write_kib * 1024
    # A multiple of PARALLEL so that every stream of the parallel case moves the same amount.
    size = max(PARALLEL, int(args.size_mib * MIB) // PARALLEL * PARALLEL)
    # One preallocated buffer; senders write memoryview slices of it (no data generation).
    payload = memoryview(bytes(range(256)) * (size // 256) + bytes(range(size % 256)))
    versions = {"python": platform.python_version(), "polymux": polymux.__version__}
    if "uvloop" in args.loops:
        import uvloop

        versions["uvloop"] = uvloop.__version__
    print(
        "bench_bulk: "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f" ({platform.python_implementation()}, {platform.machine()}, {platform.system()})"
    )
    if args.profile:
        print(f"size {size / MIB:g} MiB, {args.write_kib} KiB writes, {os.cpu_count()} CPUs", flush=True)
        profile(args.loops[0], args.protocols[0], payload, args)
        return 0
    print(
        f"size {size / MIB:g} MiB ({size} bytes) per measurement, {args.write_kib} KiB writes, "
        f"parallel case {PARALLEL} x {size // PARALLEL / MIB:g} MiB; loops: {', '.join(args.loops)}; "
        f"best of {args.repeat}; receiver {args.receiver}; {os.cpu_count()} CPUs",
        flush=True,
    )
    failed = False
    for loop_name in args.loops:
        loop_cases = run_loop(loop_name, args.protocols, payload, args)
        print(f"\nloop: {loop_name}, python {platform.python_version()}, size {size / MIB:g} MiB")
        print_table(loop_cases, size)
        sys.stdout.flush()
        failed = failed or any(c.errors for c in loop_cases)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The scenarios. Each returns :class:`~benchmarks.common.Job` lists (interleaved by the
suite) or measures directly (scale, slow reader), always against the receiving process
of :mod:`benchmarks.peer` for the same event loop and transport.

* bulk: N channels of one session move SIZE bytes in all in 64 KiB writes; baselines:
  N raw stream connections and N raw ``asyncio.Protocol`` connections (MiB/s);
* messages: length-prefixed messages (4-byte length + body) on one channel, written
  one by one with ``drain()``, parsed one by one with ``readexactly`` at the other end;
  baseline: the same on a raw connection (messages/s);
* rr: round trips (4-byte length + 64 B, echoed) on 1 and on 64 channels at once,
  each channel one request at a time; baseline: as many raw connections (round trips/s);
* churn: open a channel, send 1 KiB, half-close, wait for the 1-byte answer, close,
  16 at a time; baseline: a new raw connection for each (operations/s);
* scale: N idle channels on one session, memory per channel (no baseline: the target
  is absolute);
* slow reader: a fast writer into a receiver that sleeps after every 64 KiB read; the
  receiving process's peak RSS growth against the receive window.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

import polymux
from benchmarks.common import (
    MIB,
    MODE_BULK,
    MODE_CHURN,
    MODE_IDLE,
    MODE_MESSAGES,
    MODE_RR,
    MODE_SLOW,
    RAW_PROTOCOL,
    RAW_STREAMS,
    SETUP_TIMEOUT,
    BenchError,
    Endpoint,
    Job,
    Row,
    close_session,
    close_writer,
    header,
    loop_factory,
    open_stream,
    rss_bytes,
)
from benchmarks.peer import Peer, protocols_endpoint


StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]
WRITE = 64 * 1024


# -- bulk ------------------------------------------------------------------------------------


async def _send_views(views: list[memoryview], pairs: list[StreamPair]) -> float:
    """Write each view on its stream (64 KiB writes, drain after each), half-close, wait
    for every b"\\x01"; return the seconds from the first write to the last reply."""

    async def one(view: memoryview, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        write, drain = writer.write, writer.drain
        for off in range(0, len(view), WRITE):
            write(view[off : off + WRITE])
            await drain()
        writer.write_eof()
        reply = await reader.read(1)
        if reply != b"\x01":
            raise BenchError(f"the receiver did not confirm the byte count (reply {reply!r})")

    start = time.perf_counter()
    await asyncio.gather(*(one(v, r, w) for v, (r, w) in zip(views, pairs, strict=True)))
    return time.perf_counter() - start


def _split(payload: memoryview, n: int) -> list[memoryview]:
    part = len(payload) // n
    return [payload[i * part : (i + 1) * part] for i in range(n)]


async def bulk_raw_streams(ep: Endpoint, payload: memoryview, n: int) -> float:
    """Raw asyncio streams: ``n`` connections, len/n bytes each; MiB/s."""
    views = _split(payload, n)
    pairs: list[StreamPair] = []
    try:
        async with asyncio.timeout(SETUP_TIMEOUT):
            for v in views:
                pair = await ep.open_streams()
                pairs.append(pair)
                pair[1].write(header(MODE_BULK, len(v)))
        elapsed = await _send_views(views, pairs)
    finally:
        for _r, w in pairs:
            await close_writer(w)
    return len(payload) / MIB / elapsed


class _SendingProtocol(asyncio.Protocol):
    """Raw ``asyncio.Protocol`` sender: writes 64 KiB slices while the transport is not
    paused, half-closes, resolves ``done`` on the receiver's reply."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.off = 0
        self.paused = False
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[bytes] = loop.create_future()
        self.started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(header(MODE_BULK, len(self.view)))  # type: ignore[attr-defined]

    def start(self) -> None:
        self.started = True
        self._pump()

    def _pump(self) -> None:
        transport = self.transport
        assert transport is not None
        view, end = self.view, len(self.view)
        while not self.paused and self.off < end:
            transport.write(view[self.off : self.off + WRITE])
            self.off += WRITE
        if self.off >= end and not self.paused and not transport.is_closing():
            if transport.can_write_eof():
                transport.write_eof()
            self.off = end + 1  # EOF written once

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.started and self.off <= len(self.view):
            self._pump()

    def data_received(self, data: bytes) -> None:
        if not self.done.done():
            self.done.set_result(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or BenchError("connection closed before the reply"))


async def bulk_raw_protocol(ep: Endpoint, payload: memoryview, n: int) -> float:
    """Raw ``asyncio.Protocol`` on both ends: ``n`` connections; MiB/s."""
    views = _split(payload, n)
    protos: list[_SendingProtocol] = []
    transports: list[asyncio.BaseTransport] = []
    try:
        async with asyncio.timeout(SETUP_TIMEOUT):
            for v in views:
                t, p = await ep.create_connection(lambda v=v: _SendingProtocol(v))  # type: ignore[misc]
                transports.append(t)
                protos.append(p)  # type: ignore[arg-type]
        start = time.perf_counter()
        for p in protos:
            p.start()
        replies = await asyncio.gather(*(p.done for p in protos))
        elapsed = time.perf_counter() - start
        if any(r[:1] != b"\x01" for r in replies):
            raise BenchError(f"the raw protocol receiver did not confirm the byte count: {replies[:3]}")
    finally:
        for t in transports:
            t.close()
    return len(payload) / MIB / elapsed


async def bulk_polymux(
    ep: Endpoint, fmt: str, payload: memoryview, n: int, options: dict[str, Any] | None = None
) -> float:
    """``n`` channels of one polymux session, len/n bytes each; MiB/s."""
    views = _split(payload, n)
    session: polymux.Session | None = None
    pairs: list[StreamPair] = []
    try:
        async with asyncio.timeout(SETUP_TIMEOUT):
            session = await ep.connect(fmt, **(options or {}))
            pairs = list(await asyncio.gather(*(open_stream(session, f"bulk/{i}") for i in range(n))))
            for v, (_r, w) in zip(views, pairs, strict=True):
                w.write(header(MODE_BULK, len(v)))
        elapsed = await _send_views(views, pairs)
    finally:
        for _r, w in pairs:
            w.close()
        await close_session(session)
    return len(payload) / MIB / elapsed


async def bulk_captured(
    ep: Endpoint,
    fmt: str,
    payload: memoryview,
    directory: str,
    recorder_class: Any,
    recorder_options: dict[str, Any] | None = None,
) -> float:
    """:func:`bulk_polymux` on 1 channel with ``SessionConfig.capture`` set to a fresh
    ``CaptureRecorder`` (closed, its files converted, and removed after the clock
    stopped); MiB/s."""
    where = tempfile.mkdtemp(dir=directory)
    recorder = recorder_class(where, **(recorder_options or {}))
    loop = asyncio.get_running_loop()
    try:
        return await bulk_polymux(ep, fmt, payload, 1, {"capture": recorder})
    finally:
        await loop.run_in_executor(None, recorder.close)
        await loop.run_in_executor(None, shutil.rmtree, where, True)


def bulk_jobs(
    peer: Peer,
    loop: str,
    transport: str,
    formats: list[str],
    channels: list[int],
    payload: memoryview,
    capture_dir: str | None,
) -> list[Job]:
    """Bulk rows: for each channel count, both baselines then every format."""
    eps = peer.endpoints
    jobs: list[Job] = []
    size_mib = len(payload) / MIB

    def row(case: str, stack: str, n: int) -> Row:
        return Row(
            "bulk",
            case,
            stack,
            loop,
            transport,
            "MiB/s",
            baseline=None if stack == RAW_STREAMS else RAW_STREAMS,
            extra={"channels": n, "mib": size_mib, "write_kib": WRITE // 1024},
            x=n,
        )

    for n in channels:
        case = f"{n} ch"
        jobs.append(
            Job(row(case, RAW_STREAMS, n), lambda n=n: bulk_raw_streams(eps[RAW_STREAMS], payload, n))
        )
        jobs.append(
            Job(row(case, RAW_PROTOCOL, n), lambda n=n: bulk_raw_protocol(eps[RAW_PROTOCOL], payload, n))
        )
        jobs += [
            Job(row(case, fmt, n), lambda n=n, fmt=fmt: bulk_polymux(eps[fmt], fmt, payload, n))
            for fmt in formats
        ]
    if capture_dir is not None:
        # Tracing overhead: the same 1-channel bulk with a CaptureRecorder on the sender
        # (three representative formats: one per frame-size family), in both modes: every
        # byte ("capture on"), and frame records only ("frame records").
        from polymux.tracing import CaptureRecorder  # type: ignore[import-not-found,unused-ignore]

        modes: list[tuple[str, dict[str, Any]]] = [("full capture", {})]
        if "mode" in inspect.signature(CaptureRecorder).parameters:
            modes.append(("frame records", {"mode": "records"}))
        traced = [f for f in formats if f in ("mstream-v3", "mplex", "yamux")] or formats[:1]
        for fmt in traced:
            off = f"{fmt} (no capture)"
            r0 = Row("tracing", "1 ch, capture", off, loop, transport, "MiB/s")
            jobs.append(Job(r0, lambda fmt=fmt: bulk_polymux(eps[fmt], fmt, payload, 1)))
            for what, options in modes:
                r = Row(
                    "tracing",
                    "1 ch, capture",
                    f"{fmt} ({what})",
                    loop,
                    transport,
                    "MiB/s",
                    baseline=off,
                    extra={"channels": 1, "capture": options.get("mode", "full")},
                )
                jobs.append(
                    Job(
                        r,
                        lambda fmt=fmt, options=options: bulk_captured(
                            eps[fmt], fmt, payload, capture_dir, CaptureRecorder, options
                        ),
                    )
                )
    return jobs


# -- messages --------------------------------------------------------------------------------


async def _send_messages(pairs: list[StreamPair], size: int, count: int) -> float:
    """On each stream: ``count`` messages of ``size`` bytes, one write + drain each; return
    the seconds until every receiver reported its count."""
    msg = size.to_bytes(4, "big") + bytes(size)

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        write, drain = writer.write, writer.drain
        for _ in range(count):
            write(msg)
            await drain()
        writer.write_eof()
        got = int.from_bytes(await reader.readexactly(8), "big")
        if got != count:
            raise BenchError(f"the receiver parsed {got} messages, expected {count}")

    start = time.perf_counter()
    await asyncio.gather(*(one(r, w) for r, w in pairs))
    return time.perf_counter() - start


async def messages_raw(ep: Endpoint, size: int, count: int, n: int) -> float:
    """Length-prefixed messages on ``n`` raw connections; messages/s in all."""
    pairs: list[StreamPair] = []
    try:
        for _ in range(n):
            pair = await ep.open_streams()
            pair[1].write(header(MODE_MESSAGES, count))
            pairs.append(pair)
        elapsed = await _send_messages(pairs, size, count)
    finally:
        for _r, w in pairs:
            await close_writer(w)
    return n * count / elapsed


async def messages_polymux(ep: Endpoint, fmt: str, size: int, count: int, n: int) -> float:
    """Length-prefixed messages on ``n`` channels of one session; messages/s in all."""
    session: polymux.Session | None = None
    pairs: list[StreamPair] = []
    try:
        session = await ep.connect(fmt)
        pairs = list(await asyncio.gather(*(open_stream(session, f"msg/{i}") for i in range(n))))
        for _r, w in pairs:
            w.write(header(MODE_MESSAGES, count))
        elapsed = await _send_messages(pairs, size, count)
    finally:
        for _r, w in pairs:
            w.close()
        await close_session(session)
    return n * count / elapsed


def message_jobs(
    peer: Peer,
    loop: str,
    transport: str,
    formats: list[str],
    sizes: list[int],
    count: int,
    channels: int = 1,
) -> list[Job]:
    """Small-message rows: for each size, the raw baseline then every format."""
    eps = peer.endpoints
    jobs: list[Job] = []
    for size in sizes:
        case = f"{size} B x {channels} ch"
        n = max(1, count // channels) if size < 4096 else max(1, count // channels // 4)
        for stack in (RAW_STREAMS, *formats):
            r = Row(
                "messages",
                case,
                stack,
                loop,
                transport,
                "msg/s",
                baseline=None if stack == RAW_STREAMS else RAW_STREAMS,
                extra={"size": size, "channels": channels, "messages_per_channel": n},
                x=size,
            )
            if stack == RAW_STREAMS:
                run: Callable[[], Awaitable[float]] = lambda size=size, n=n: messages_raw(
                    eps[RAW_STREAMS], size, n, channels
                )
            else:
                run = lambda size=size, n=n, stack=stack: messages_polymux(
                    eps[stack], stack, size, n, channels
                )
            jobs.append(Job(r, run))
    return jobs


# -- request / response ----------------------------------------------------------------------


async def _round_trips(pairs: list[StreamPair], size: int, seconds: float) -> float:
    """Each stream does one request at a time for ``seconds``; round trips per second."""
    msg = size.to_bytes(4, "big") + bytes(size)
    stop = time.perf_counter() + seconds
    counts = [0] * len(pairs)

    async def one(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        write, readexactly = writer.write, reader.readexactly
        while time.perf_counter() < stop:
            write(msg)
            await readexactly(len(msg))
            n += 1
        counts[i] = n

    start = time.perf_counter()
    await asyncio.gather(*(one(i, r, w) for i, (r, w) in enumerate(pairs)))
    return sum(counts) / (time.perf_counter() - start)


async def rr_raw(ep: Endpoint, size: int, n: int, seconds: float) -> float:
    """Round trips on ``n`` raw connections."""
    pairs: list[StreamPair] = []
    try:
        for _ in range(n):
            pair = await ep.open_streams()
            pair[1].write(header(MODE_RR))
            pairs.append(pair)
        return await _round_trips(pairs, size, seconds)
    finally:
        for _r, w in pairs:
            await close_writer(w)


async def rr_polymux(ep: Endpoint, fmt: str, size: int, n: int, seconds: float) -> float:
    """Round trips on ``n`` channels of one session."""
    session: polymux.Session | None = None
    pairs: list[StreamPair] = []
    try:
        session = await ep.connect(fmt)
        pairs = list(await asyncio.gather(*(open_stream(session, f"rr/{i}") for i in range(n))))
        for _r, w in pairs:
            w.write(header(MODE_RR))
        return await _round_trips(pairs, size, seconds)
    finally:
        for _r, w in pairs:
            w.close()
        await close_session(session)


def rr_jobs(
    peer: Peer, loop: str, transport: str, formats: list[str], channels: list[int], seconds: float
) -> list[Job]:
    """Request/response rows (64-byte requests and answers)."""
    eps = peer.endpoints
    jobs: list[Job] = []
    for n in channels:
        for stack in (RAW_STREAMS, *formats):
            r = Row(
                "rr",
                f"64 B x {n} ch",
                stack,
                loop,
                transport,
                "rt/s",
                baseline=None if stack == RAW_STREAMS else RAW_STREAMS,
                extra={"channels": n, "size": 64, "seconds": seconds},
                x=n,
            )
            if stack == RAW_STREAMS:
                run: Callable[[], Awaitable[float]] = lambda n=n: rr_raw(eps[RAW_STREAMS], 64, n, seconds)
            else:
                run = lambda n=n, stack=stack: rr_polymux(eps[stack], stack, 64, n, seconds)
            jobs.append(Job(r, run))
    return jobs


# -- churn -----------------------------------------------------------------------------------

CHURN_BODY = bytes(1024)
CHURN_WORKERS = 16


async def _churn(open_one: Callable[[], Awaitable[StreamPair]], seconds: float) -> float:
    stop = time.perf_counter() + seconds
    total = [0]
    msg = header(MODE_CHURN) + CHURN_BODY

    async def worker() -> None:
        while time.perf_counter() < stop:
            reader, writer = await open_one()
            writer.write(msg)
            writer.write_eof()
            if await reader.read(1) != b"\x01":
                raise BenchError("churn: no answer")
            writer.close()
            total[0] += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CHURN_WORKERS)))
    return total[0] / (time.perf_counter() - start)


async def churn_raw(ep: Endpoint, seconds: float) -> float:
    """A new raw connection per operation."""
    return await _churn(ep.open_streams, seconds)


async def churn_polymux(ep: Endpoint, fmt: str, seconds: float) -> float:
    """A new channel of one session per operation."""
    session = await ep.connect(fmt)
    try:
        return await _churn(lambda: open_stream(session), seconds)
    finally:
        await close_session(session)


def churn_jobs(peer: Peer, loop: str, transport: str, formats: list[str], seconds: float) -> list[Job]:
    """Channel churn rows: open, send 1 KiB, close (16 at a time)."""
    eps = peer.endpoints
    jobs: list[Job] = []
    for stack in (RAW_STREAMS, *formats):
        r = Row(
            "churn",
            f"1 KiB x {CHURN_WORKERS} workers",
            stack,
            loop,
            transport,
            "op/s",
            baseline=None if stack == RAW_STREAMS else RAW_STREAMS,
            extra={"workers": CHURN_WORKERS, "seconds": seconds},
        )
        if stack == RAW_STREAMS:
            run: Callable[[], Awaitable[float]] = lambda: churn_raw(eps[RAW_STREAMS], seconds)
        else:
            run = lambda stack=stack: churn_polymux(eps[stack], stack, seconds)
        jobs.append(Job(r, run))
    return jobs


# -- scale -----------------------------------------------------------------------------------


async def _open_idle(session: polymux.Session, count: int) -> list[StreamPair]:
    """Open ``count`` idle channels (1,000 at a time), each with its header sent, then one
    round trip on a further channel so that the peer has seen them all."""
    pairs: list[StreamPair] = []
    batch = 1000
    for base in range(0, count, batch):
        k = min(batch, count - base)
        got = await asyncio.gather(*(open_stream(session, f"idle/{base + i}") for i in range(k)))
        for _r, w in got:
            w.write(header(MODE_IDLE))
        pairs.extend(got)
    r, w = await open_stream(session, "sync")
    w.write(header(MODE_CHURN))
    w.write_eof()
    if await r.read(1) != b"\x01":
        raise BenchError("scale: the sync channel got no answer")
    w.close()
    return pairs


async def scale(peer: Peer, fmt: str, count: int, loop: str, transport: str, progress: bool) -> Row:
    """Open ``count`` idle channels on one session; memory per channel.

    Two passes on fresh sessions: the first measures RSS growth on both sides (opening
    process; receiving process, which includes its per-channel handler task), the second
    the Python allocations on the opening side with tracemalloc (which itself costs RSS,
    hence the separate pass)."""
    ep = peer.endpoints[fmt]
    row = Row("scale", f"{count:,} idle ch", fmt, loop, transport, "B/ch", higher_is_better=False)
    extra: dict[str, Any] = {"channels": count}
    session: polymux.Session | None = None
    pairs: list[StreamPair] = []
    try:
        async with asyncio.timeout(SETUP_TIMEOUT * max(1, count // 10_000)):
            # Pass 1: RSS on both sides.
            session = await ep.connect(fmt)
            pairs = await _open_idle(session, 8)  # warm-up
            peer_before = await peer.ask("rss")
            rss_before = rss_bytes()
            start = time.perf_counter()
            pairs += await _open_idle(session, count)
            extra["open_s"] = time.perf_counter() - start
            extra["rss_per_ch"] = (rss_bytes() - rss_before) / count
            extra["peer_rss_per_ch"] = (await peer.ask("rss") - peer_before) / count
            # Pass 1b: the receiver serving channels with ChannelProtocols (no task each),
            # while pass 1's channels still live (memory they freed would hide growth).
            pep = peer.endpoints.get(protocols_endpoint(fmt))
            if pep is not None:
                second = await pep.connect(fmt)
                try:
                    more = await _open_idle(second, 8)
                    peer_before = await peer.ask("rss")
                    more += await _open_idle(second, count)
                    extra["peer_rss_per_ch_protocols"] = (await peer.ask("rss") - peer_before) / count
                finally:
                    second.abort()
                more.clear()
            session.abort()
            pairs.clear()
            session = None
            # Pass 2: tracemalloc on the opening side.
            session = await ep.connect(fmt)
            pairs = await _open_idle(session, 8)
            tracemalloc.start()
            traced_before = tracemalloc.get_traced_memory()[0]
            pairs += await _open_idle(session, count)
            traced = tracemalloc.get_traced_memory()[0] - traced_before
            tracemalloc.stop()
        extra["tracemalloc_per_ch"] = traced / count
        extra["side"] = "tracemalloc and RSS: opening process; receiver RSS: the receiving process"
        row.values.append(traced / count)
        row.extra = extra
        if progress:
            print(
                f"  [{loop}/{transport}] scale {fmt} {count:,} ch: {traced / count:,.0f} B/ch traced, "
                f"{extra['rss_per_ch']:,.0f} B/ch RSS, receiver {extra['peer_rss_per_ch']:,.0f} B/ch RSS "
                f"(ChannelProtocols: {extra.get('peer_rss_per_ch_protocols', float('nan')):,.0f}), "
                f"opened in {extra['open_s']:.1f} s",
                flush=True,
            )
    except polymux.LimitExceeded as exc:
        # The format cannot hold this many channels (e.g. 256 omnistreams ids): not a failure.
        extra["limit"] = f"format limit: {exc}"
        row.extra = extra
        if progress:
            print(f"  [{loop}/{transport}] scale {fmt} {count:,} ch: {extra['limit']}", flush=True)
    except (TimeoutError, BenchError, polymux.PolymuxError, OSError) as exc:
        row.errors.append(f"{type(exc).__name__}: {exc}")
        row.extra = extra
        if progress:
            print(f"  [{loop}/{transport}] scale {fmt} {count:,} ch: FAILED {row.errors[-1]}", flush=True)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        if session is not None:
            session.abort()
        pairs.clear()
    return row


def _scale_child(loop: str, transport: str, fmt: str, count: int, progress: bool, conn: Connection) -> None:
    peer = Peer(loop, transport, [fmt]).start()
    try:
        with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
            row = runner.run(scale(peer, fmt, count, loop, transport, progress))
    finally:
        peer.stop()
    conn.send(row)


async def scale_isolated(fmt: str, count: int, loop: str, transport: str, progress: bool) -> Row:
    """:func:`scale` in a fresh opening process against a fresh receiving process, so that
    memory freed by earlier measurements (still resident) cannot hide the RSS growth."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_scale_child, args=(loop, transport, fmt, count, progress, child))
    proc.start()
    limit = SETUP_TIMEOUT * (4 + 2 * max(1, count // 10_000))
    try:
        ready = await asyncio.get_running_loop().run_in_executor(None, parent.poll, limit)
        if not ready:
            raise BenchError(f"scale: no result within {limit:g} s")
        row: Row = parent.recv()
        return row
    except (BenchError, EOFError, OSError) as exc:
        row = Row("scale", f"{count:,} idle ch", fmt, loop, transport, "B/ch", higher_is_better=False)
        row.errors.append(f"{type(exc).__name__}: {exc}")
        return row
    finally:
        await asyncio.get_running_loop().run_in_executor(None, proc.join, SETUP_TIMEOUT)
        if proc.is_alive():
            proc.kill()


# -- slow reader -----------------------------------------------------------------------------


async def slow_reader(
    stack: str, formats: list[str], size: int, delay_us: int, loop: str, transport: str, progress: bool
) -> Row:
    """Write ``size`` bytes as fast as possible into a receiver that sleeps ``delay_us``
    after each 64 KiB read; the receiving process's peak RSS growth, in KiB.

    Each stack gets a fresh receiving process, so that memory freed by earlier scenarios
    (still resident) cannot hide the growth."""
    peer = Peer(loop, transport, formats)
    await asyncio.get_running_loop().run_in_executor(None, peer.start)
    ep = peer.endpoints[stack]
    window = polymux.SessionConfig().receive_window
    row = Row(
        "slow reader",
        f"{size // MIB} MiB, {delay_us} us/64 KiB read",
        stack,
        loop,
        transport,
        "KiB peak",
        higher_is_better=False,
        extra={"receive_window_kib": window // 1024},
    )
    session: polymux.Session | None = None
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(SETUP_TIMEOUT * 4):
            if stack == RAW_STREAMS:
                warm_r, warm_w = await ep.open_streams()
                reader, writer = await ep.open_streams()
            else:
                session = await ep.connect(stack)
                warm_r, warm_w = await open_stream(session, "warm")
                reader, writer = await open_stream(session, "slow")
            # Warm up the receiver's code paths (1 MiB at full speed) outside the measurement.
            warm_w.write(header(MODE_SLOW, 0))
            await _send_views([memoryview(bytes(MIB))], [(warm_r, warm_w)])
            warm_w.close()
            await peer.ask("reset_peak")
            before = await peer.ask("rss")
            writer.write(header(MODE_SLOW, delay_us))
            start = time.perf_counter()
            await _send_views([memoryview(bytes(size))], [(reader, writer)])
            elapsed = time.perf_counter() - start
            peak = await peer.ask("peak")
        growth = max(0, peak - before)
        row.values.append(growth / 1024)
        row.extra.update(
            {"peak_growth_over_window": growth / window, "seconds": elapsed, "rss_before_mib": before / MIB}
        )
        if progress:
            print(
                f"  [{loop}/{transport}] slow reader {stack}: peak +{growth / 1024:,.0f} KiB "
                f"({growth / window:.2f} x window) in {elapsed:.1f} s",
                flush=True,
            )
    except (TimeoutError, BenchError, polymux.PolymuxError, OSError) as exc:
        row.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        if writer is not None:
            writer.close()
        await close_session(session)
        await asyncio.get_running_loop().run_in_executor(None, peer.stop)
    return row

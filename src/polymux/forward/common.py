"""What both ends of a forward share: the connections in flight and their counts, the
copy between a socket and a channel (the bridge's copy loop), reading a request line,
and the per-connection log line."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from polymux.aio import Server
from polymux.bridging import _Failed, _reset, copy_both
from polymux.exceptions import PolymuxError
from polymux.forward.request import MAX_LINE, ForwardError, Reply
from polymux.forward.spec import HostPort


__all__ = ["ForwardStats", "logger"]

logger = logging.getLogger("polymux.forward")

StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]

BACKLOG = 1024
"""The listen backlog of the forwards' listeners (asyncio's default, 100, drops a burst's
connections past it for a second: the clients' SYN retransmission)."""


@dataclass
class ForwardStats:
    """What one end of a forward has carried so far (``--stats`` prints it)."""

    open: int = 0
    """Connections open now."""
    total: int = 0
    """Connections that ended (refused and failed ones included)."""
    refused: int = 0
    """Of those, how many were refused (a target refused or not allowed, over
    ``max_connections``, no session with the far end)."""
    failed: int = 0
    """Of those, how many ended with a reset or an error after they were connected."""
    bytes_out: int = 0
    """Bytes carried towards targets (for the near end: from its local clients)."""
    bytes_back: int = 0
    """Bytes carried back from targets."""
    started: float = field(default_factory=time.monotonic)
    """When the end started (``time.monotonic()``)."""

    def line(self, previous: tuple[float, int] | None = None) -> str:
        """One line: connections open and done, bytes each way, and the rate since
        ``previous`` (a ``(monotonic time, bytes)`` pair from :meth:`mark`)."""
        now, carried = self.mark()
        text = (
            f"{self.open} open, {self.total} done ({self.refused} refused, {self.failed} failed), "
            f"{_size(self.bytes_out)} out, {_size(self.bytes_back)} back"
        )
        if previous is not None and now > previous[0]:
            text += f", {(carried - previous[1]) / (now - previous[0]) / 1e6:.2f} MB/s"
        return text

    def mark(self) -> tuple[float, int]:
        """``(now, bytes carried both ways)``, for the rate of the next :meth:`line`."""
        return time.monotonic(), self.bytes_out + self.bytes_back


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class Connection:
    """One forwarded connection: what it is, its byte counts, and how to cut it."""

    def __init__(self, tracker: Tracker, label: str) -> None:
        self.tracker = tracker
        self.label = label
        self.start = time.monotonic()
        self.counts = [0, 0]  # towards the target, back from it
        self.writers: list[asyncio.StreamWriter] = []
        self.task = asyncio.current_task()

    def hold(self, *writers: asyncio.StreamWriter) -> None:
        """Cut these too when the connection is aborted."""
        self.writers.extend(writers)

    def abort(self) -> None:
        """Cut the connection at once (its sockets and channels)."""
        for writer in self.writers:
            _reset(writer, "polymux forward: stopped")


class Tracker:
    """The connections in flight on one end: admitted up to ``max_connections``, counted,
    and logged one line each when they end."""

    def __init__(self, stats: ForwardStats, max_connections: int | None) -> None:
        if max_connections is not None and max_connections <= 0:
            raise ValueError(f"max_connections must be positive or None, got {max_connections!r}")
        self.stats = stats
        self.max_connections = max_connections
        self.live: set[Connection] = set()
        self.idle = asyncio.Event()
        self.idle.set()
        self._ended: list[asyncio.Future[None]] = []  # waiting for a connection to end

    def admit(self, label: str) -> Connection | None:
        """A new connection, or None (counted as refused and logged) when
        ``max_connections`` are open."""
        if self.max_connections is not None and len(self.live) >= self.max_connections:
            self.stats.total += 1
            self.stats.refused += 1
            logger.warning("%s: refused: max_connections=%d are open", label, self.max_connections)
            return None
        conn = Connection(self, label)
        self.live.add(conn)
        self.stats.open += 1
        self.idle.clear()
        return conn

    def done(self, conn: Connection, outcome: str, *, refused: bool = False) -> None:
        """``conn`` ended: count it and log its line (a warning unless it went well)."""
        if conn not in self.live:
            return
        self.live.discard(conn)
        stats = self.stats
        stats.open -= 1
        stats.total += 1
        stats.bytes_out += conn.counts[0]
        stats.bytes_back += conn.counts[1]
        if refused:
            stats.refused += 1
        elif outcome != "ok":
            stats.failed += 1
        level = logging.INFO if outcome == "ok" else logging.WARNING
        logger.log(
            level,
            "%s: %d bytes out, %d bytes back, %.3f s, %s",
            conn.label,
            conn.counts[0],
            conn.counts[1],
            time.monotonic() - conn.start,
            outcome,
        )
        if not self.live:
            self.idle.set()
        waiters, self._ended = self._ended, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def one_ends(self) -> None:
        """Wait until a connection ends (its channel is released)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ended.append(waiter)
        await waiter

    def abort_all(self) -> None:
        """Cut every connection in flight."""
        for conn in list(self.live):
            conn.abort()


async def relay(conn: Connection, sock: StreamPair, channel: StreamPair, *, target: bool = False) -> str:
    """Copy between a TCP connection and a channel both ways until both have ended (an end
    of writing is carried as a half-close), with backpressure (the bridge's copy loop:
    bounded reads, each after the other side took the last). ``target``: the socket is the
    target's (its bytes count as coming back). Returns the outcome for the log line; a
    side that fails cuts the other (a reset channel aborts the socket, a reset socket
    resets the channel, saying why where the format carries text)."""
    sock_writer = sock[1]
    chan_reader, chan_writer = channel
    conn.hold(sock_writer, chan_writer)
    # copy_both counts its first pair's bytes first: that of the side towards the target.
    first, second = ((chan_reader, chan_writer), sock) if target else (sock, (chan_reader, chan_writer))
    try:
        await copy_both(*first, *second, conn.counts)
    except _Failed as failed:
        why = describe(failed.error)
        if (failed.side == "src") != target:  # the socket: the channel learns why
            sock_writer.transport.abort()
            _reset(chan_writer, f"polymux forward: {why}")
            return f"failed: {why}"
        _reset(chan_writer, None)
        sock_writer.transport.abort()
        return f"failed: {why}"
    except BaseException:
        conn.abort()
        raise
    for writer in (sock_writer, chan_writer):
        writer.close()
    for writer in (sock_writer, chan_writer):
        with contextlib.suppress(PolymuxError, OSError):
            await writer.wait_closed()
    return "ok"


def describe(error: BaseException) -> str:
    """An error in a few words (the exception's text, else its kind)."""
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, asyncio.IncompleteReadError):
        return "the peer ended the connection"
    if isinstance(error, OSError) and error.strerror and not error.filename:
        return error.strerror
    return str(error) or type(error).__name__


async def read_line(reader: asyncio.StreamReader, timeout: float | None, what: str) -> bytes:  # noqa: ASYNC109
    """One request, reply or control line (``\\n`` included), within ``timeout`` seconds.

    Raises:
        ForwardError: the line did not come in time, is too long, or the channel ended.
    """
    try:
        async with asyncio.timeout(timeout):
            line = await reader.readuntil(b"\n")
    except TimeoutError:
        raise ForwardError(f"no {what} within {timeout:g} s", Reply.TTL_EXPIRED) from None
    except asyncio.IncompleteReadError as exc:
        got = f" after {len(exc.partial)} bytes" if exc.partial else ""
        raise ForwardError(f"the channel ended before its {what}{got}") from None
    except asyncio.LimitOverrunError:
        raise ForwardError(f"no {what}: more than {MAX_LINE} bytes without a newline") from None
    if len(line) > MAX_LINE:
        raise ForwardError(f"no {what}: a line of {len(line)} bytes, more than {MAX_LINE}")
    return line


def peer_of(writer: asyncio.StreamWriter | Any) -> HostPort | None:
    """The peer address of a socket's writer (or a session), or None (a unix socket)."""
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return HostPort(str(peer[0]), int(peer[1]))
    return None


def local_of(writer: asyncio.StreamWriter) -> HostPort | None:
    """The local address of a socket's writer, or None."""
    local = writer.get_extra_info("sockname")
    if isinstance(local, tuple) and len(local) >= 2:
        return HostPort(str(local[0]), int(local[1]))
    return None


def stop_listening(server: Server | asyncio.AbstractServer | None) -> None:
    """Stop accepting connections, leaving those accepted (and their sessions) open."""
    if server is None:
        return
    inner: Any = server._server if isinstance(server, Server) else server
    if inner is None:
        return
    try:
        keeps = "close_connections" in inspect.signature(inner.close).parameters
    except (TypeError, ValueError):  # a compiled loop's server (uvloop): no signature to read
        keeps = False
    if keeps:
        inner.close(close_connections=False)  # websockets' server: its connections stay
    else:
        inner.close()  # asyncio's and uvloop's: on 3.11-3.12 accepted connections stay


def spawn(
    tasks: set[asyncio.Task[None]],
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """``asyncio.start_server``'s callback: run ``handler`` in a task of ``tasks`` (kept
    until it ends), not in one of asyncio's own, whose done-callback logs a handler
    cancelled at shutdown as an error (CPython 3.11)."""
    task = asyncio.ensure_future(handler(reader, writer))
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def stats_every(interval: float, stats: ForwardStats, say: Callable[[str], None]) -> None:
    """``say(stats line)`` every ``interval`` seconds, with the rate since the last one."""
    previous = stats.mark()
    while True:
        await asyncio.sleep(interval)
        say(stats.line(previous))
        previous = stats.mark()

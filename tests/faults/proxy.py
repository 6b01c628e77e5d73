"""A loopback TCP proxy (127.0.0.1) that injects network faults between a client and a
server, without ever reordering or altering the bytes it forwards.

Each connection gets a :class:`Plan`, drawn from a seeded ``random.Random`` (so a failure
is replayed from its seed), or given by the test:

* ``clean``: forwards as it comes;
* ``pieces``: every byte in its own write (1-byte pieces) for the first ``PIECES_BYTES`` of
  each direction (every header and frame boundary of a small transfer), then random pieces
  of 1-512 bytes (one write per byte of 64 KiB x 2 directions x 3 channels would take a CI
  machine most of a minute per transfer);
* ``stall``: forwards after random short delays, in random splits;
* ``delay``: every chunk held for a fixed latency (``Plan.delay`` seconds) each way;
* ``hold``: one direction stops for ``Plan.hold`` seconds from a random byte offset (the
  proxy reads nothing meanwhile, so the sender's buffers fill), then goes on;
* ``cut``: forwards up to a random byte offset of either direction, then cuts the
  connection, ``Plan.cut`` being how: ``fin`` (both sides closed), ``rst`` (both reset), or
  ``silent`` (nothing more is forwarded either way and nothing is closed: what a NAT that
  forgot the connection, a dropped Wi-Fi link or a hung middlebox does; the proxy reads
  nothing more, so each side's bytes pile up in the buffers as on a dead path, and closes
  a side only once that side closes; after :data:`SILENT_DRAIN_AFTER` it reads and drops).

A test can also cut every live connection now (:meth:`FaultProxy.cut_all`), or stop
accepting (:meth:`FaultProxy.refuse`). :attr:`FaultProxy.log` has one line per connection
(its plan), to print with a failing seed. The benchmarks' soak uses it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass


MODES = ("pieces", "stall", "cut")
"""The modes :class:`FaultProxy` draws from by default."""
ALL_MODES = ("clean", "pieces", "stall", "delay", "hold", "cut")
CUTS = ("fin", "rst")
"""How a ``cut`` ends the connection by default (``silent`` is asked for: see the docstring)."""
ALL_CUTS = ("fin", "rst", "silent")
PIECES_BYTES = 8 * 1024
SILENT_DRAIN_AFTER = 120.0
"""Seconds after which a silently cut link reads and drops what each side still sends (a
middlebox that forgot the connection does): the sides' FINs then reach the proxy, which
lets go of the sockets (with full buffers they would stay stuck behind a zero window, and
a long soak would pile links up). Far past the 25 s in which polymux notices the cut."""


@dataclass
class Plan:
    """What happens to one connection. ``limits``: the byte offset of each direction
    (client to server, server to client) at which a ``cut`` or ``hold`` starts (``None``:
    never in that direction)."""

    mode: str = "clean"
    cut: str = "fin"
    limits: tuple[int | None, int | None] = (None, None)
    hold: float = 0.0
    delay: float = 0.0
    seed: int = 0

    def __str__(self) -> str:
        what = self.mode
        if self.mode == "cut":
            what += f" {self.cut}"
        if self.mode in ("cut", "hold"):
            what += f" at c->s {self.limits[0]}, s->c {self.limits[1]}"
        if self.mode == "hold":
            what += f" for {self.hold:.2f} s"
        if self.mode == "delay":
            what += f" {self.delay * 1000:.0f} ms"
        return what


def draw(
    rng: random.Random,
    modes: tuple[str, ...] = MODES,
    cuts: tuple[str, ...] = CUTS,
    cut_range: int = 80_000,
    hold_range: tuple[float, float] = (0.5, 3.0),
) -> Plan:
    """A random plan from ``rng``."""
    mode = rng.choice(modes)
    plan = Plan(mode, seed=rng.randrange(2**32))
    if mode == "cut":
        plan.cut = rng.choice(cuts)
        plan.limits = (rng.randrange(cut_range), rng.randrange(cut_range))
    elif mode == "hold":
        offset = rng.randrange(cut_range)
        plan.limits = (offset, None) if rng.random() < 0.5 else (None, offset)
        plan.hold = rng.uniform(*hold_range)
    elif mode == "delay":
        plan.delay = rng.uniform(0.001, 0.05)
    return plan


_PEER_CLOSED_STATES = frozenset({6, 7, 8, 9, 11})
"""Linux TCP states in which the peer has closed or reset: TIME_WAIT, CLOSE, CLOSE_WAIT,
LAST_ACK, CLOSING (include/net/tcp_states.h)."""


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` has closed it (its state, from ``TCP_INFO``; False
    where the kernel cannot say)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return False
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, option, 1)[0] in _PEER_CLOSED_STATES
    except OSError:
        return True  # reset


class _Link:
    """One proxied connection: its two sockets and pumps."""

    def __init__(self, plan: Plan, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.plan = plan
        self.writers = (client, server)
        self.ended = asyncio.Event()
        self.cut: str | None = None
        """How it was cut (``fin``, ``rst``, ``silent``), once it is."""
        self.silent = False
        self.closed = [False, False]  # by its own side (client, server)

    def end(self, kind: str) -> None:
        """Cut now (once)."""
        if self.cut is not None:
            return
        self.cut = kind
        if kind == "silent":
            self.silent = True  # the pumps drop what they read from now on
            return
        for w in self.writers:
            if kind == "rst":
                w.transport.abort()
            else:
                w.close()
        self.ended.set()


class FaultProxy:
    """``port = await FaultProxy(upstream_port, seed).start()``: connect to ``port``.

    ``plan(index, rng)``, if given, makes each connection's :class:`Plan` (else one is
    drawn from ``modes`` and ``cuts``)."""

    def __init__(
        self,
        upstream_port: int,
        seed: int,
        modes: tuple[str, ...] = MODES,
        cut_range: int = 80_000,
        *,
        cuts: tuple[str, ...] = CUTS,
        plan: Callable[[int, random.Random], Plan] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.upstream_port = upstream_port
        self.host = host
        self.seed = seed
        self.rng = random.Random(seed)
        self.modes = modes
        self.cuts = cuts
        self.cut_range = cut_range
        self.plan = plan
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.links: set[_Link] = set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        self.cuts_done = 0
        self.log: list[str] = []
        """One line per connection: its plan (and how it ended)."""
        self._refusing = False

    async def start(self) -> int:
        """Listen; return the port."""
        self.server = await asyncio.start_server(self._accept, self.host, 0)
        return int(self.server.sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        """The port clients connect to."""
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def refuse(self, on: bool = True) -> None:
        """Reset new connections at once (the server is down) until ``refuse(False)``."""
        self._refusing = on

    def cut_all(self, kind: str) -> int:
        """Cut every live connection now (``fin``, ``rst`` or ``silent``); return how many."""
        n = 0
        for link in list(self.links):
            if link.cut is None:
                link.end(kind)
                self.cuts_done += 1
                n += 1
        return n

    async def aclose(self) -> None:
        """Stop listening and drop every connection (reset)."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in list(self.writers):
            writer.transport.abort()

    def describe(self) -> str:
        """The seed and each connection's plan, for a failure message."""
        lines = "\n".join(f"  {line}" for line in self.log[-40:])
        return f"proxy seed {self.seed}, {self.connections} connections:\n{lines}"

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        # asyncio's start_server asks this task for its exception when it ends: a
        # cancellation (aclose) is an ordinary end here, not an error to log.
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve(creader, cwriter)

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        if self._refusing:
            self.log.append(f"#{index}: refused")
            cwriter.transport.abort()
            return
        plan = (
            self.plan(index, self.rng)
            if self.plan is not None
            else draw(self.rng, self.modes, self.cuts, self.cut_range)
        )
        self.log.append(f"#{index}: {plan}")
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        ends = [cwriter]
        self.writers.add(cwriter)
        try:
            try:
                sreader, swriter = await asyncio.open_connection(self.host, self.upstream_port)
            except OSError:
                self.log[-1] += " -> upstream refused"
                return
            ends.append(swriter)
            self.writers.add(swriter)
            for w in ends:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(plan, cwriter, swriter)
            self.links.add(link)
            rng = random.Random(plan.seed)
            pumps = [
                asyncio.ensure_future(self._pump(link, 0, creader, swriter, random.Random(rng.random()))),
                asyncio.ensure_future(self._pump(link, 1, sreader, cwriter, random.Random(rng.random()))),
            ]
            waiter = asyncio.ensure_future(link.ended.wait())
            try:
                # A direction that ends passes its half-close on; the other goes on until
                # its own end, or until the link is cut.
                pending: set[asyncio.Future[object]] = {*pumps, waiter}
                while not link.ended.is_set() and not all(p.done() for p in pumps):
                    _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                for p in pumps:
                    p.cancel()
                await asyncio.gather(waiter, *pumps, return_exceptions=True)
                self.links.discard(link)
                if link.cut is not None:
                    self.log[index] += f" -> cut {link.cut}"
        finally:
            for w in ends:
                with contextlib.suppress(Exception):
                    w.transport.abort() if w.transport.is_closing() else w.close()
                self.writers.discard(w)
            self.tasks.discard(task)

    async def _pump(
        self,
        link: _Link,
        direction: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        rng: random.Random,
    ) -> None:
        """Forward one direction (0: client to server) by the link's plan until its end,
        then pass the half-close on (a silent link passes nothing, and its pump ends only
        once both sides have closed)."""
        plan = link.plan
        limit = plan.limits[direction] if plan.mode in ("cut", "hold") else None
        sent = 0
        try:
            while True:
                data = await reader.read(65536)
                if link.silent:
                    await self._until_closed(link, direction, reader)
                    return
                if not data:
                    break
                if limit is not None and sent + len(data) >= limit:
                    head, data = data[: limit - sent], data[limit - sent :]
                    writer.write(head)
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    sent += len(head)
                    limit = None
                    if plan.mode == "cut":
                        if link.cut is None:
                            self.cuts_done += 1
                        link.end(plan.cut)
                        if link.silent:
                            await self._until_closed(link, direction, reader)
                        return
                    await asyncio.sleep(plan.hold)  # hold: read nothing meanwhile
                await self._forward(plan, data, sent, writer, rng)
                sent += len(data)
            if writer.can_write_eof():
                writer.write_eof()  # pass the half-close on
        except (ConnectionError, OSError):
            if not link.silent:
                link.end("rst")

    async def _until_closed(self, link: _Link, direction: int, reader: asyncio.StreamReader) -> None:
        """A silent link: read nothing more from this side (its bytes pile up in the
        buffers, as unacknowledged data does on a dead path), and close our socket to it
        only once it has closed (looked at without taking a byte: MSG_PEEK, TCP_INFO);
        after :data:`SILENT_DRAIN_AFTER`, drop what it sends until it ends."""
        side = link.writers[direction]
        sock = side.get_extra_info("socket")
        peek = socket.socket(fileno=os.dup(sock.fileno())) if sock is not None else None
        loop = asyncio.get_running_loop()
        since = loop.time()
        try:
            while True:
                if getattr(reader, "_eof", False) or side.transport.is_closing():
                    break
                if loop.time() - since > SILENT_DRAIN_AFTER:
                    # Full buffers would hold this side's FIN back for ever: drop what it
                    # sends until it ends.
                    with contextlib.suppress(ConnectionError, OSError):
                        while await reader.read(65536):
                            pass
                    break
                if peek is not None:
                    try:
                        if peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                            break
                    except BlockingIOError:
                        pass
                    except OSError:
                        break  # reset
                    # Bytes it sent after the cut hide its FIN from MSG_PEEK: ask TCP.
                    if _peer_closed(peek):
                        break
                await asyncio.sleep(0.25)
        finally:
            if peek is not None:
                peek.close()
        side.transport.abort()
        link.closed[direction] = True
        if all(link.closed):
            link.ended.set()  # both sides closed: the link is over
        else:
            await asyncio.Event().wait()  # the other side's pump ends the link

    @staticmethod
    async def _forward(
        plan: Plan, data: bytes, sent: int, writer: asyncio.StreamWriter, rng: random.Random
    ) -> None:
        mode = plan.mode
        if mode == "pieces":
            pos = 0
            while pos < len(data):
                step = 1 if sent + pos < PIECES_BYTES else rng.randrange(1, 513)
                writer.write(data[pos : pos + step])
                await writer.drain()
                pos += step
                if pos % 64 == 0:
                    await asyncio.sleep(0)
        elif mode == "stall":
            pos = 0
            while pos < len(data):
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.uniform(0, 0.02))
                step = rng.randrange(1, 4096)
                writer.write(data[pos : pos + step])
                await writer.drain()
                pos += step
        else:
            if mode == "delay":
                await asyncio.sleep(plan.delay)
            if data:
                writer.write(data)
                await writer.drain()

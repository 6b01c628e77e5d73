"""Hostile peers against a polymux server, one test per attack, every format where the
attack applies. The polymux server runs in this process; its Python memory during the
attack (tracemalloc peak) must stay under the bound each test states (also listed in
SECURITY.md). The peer is a raw socket whose bytes are crafted with polymux's engines and
codecs (tests/hostile/peer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest

import polymux
from polymux.exceptions import FlowControlError

from .peer import HostilePeer, peak_memory, until


pytestmark = pytest.mark.timeout(90)

MIB = 1024 * 1024
ALL = polymux.PROTOCOLS
BIDI = tuple(p for p in ALL if not p.startswith("omnistreams"))  # omnistreams streams are one-way
FLOW = ("mstream-v2", "mstream-v3", "yamux", "omnistreams")  # credit on the wire


class Counter:
    """A capture sink that counts what the server received."""

    def __init__(self) -> None:
        self.count = 0

    def received(self, data: Any) -> None:
        self.count += len(data)

    def sent(self, chunks: Sequence[Any]) -> None:
        return

    def close(self) -> None:
        return


class Served:
    """A polymux server and what it saw."""

    def __init__(self) -> None:
        self.server: polymux.Server | None = None
        self.counters: list[Counter] = []

    def capture(self, info: Mapping[str, str]) -> Counter:
        counter = Counter()
        self.counters.append(counter)
        return counter

    @property
    def session(self) -> polymux.Session:
        assert self.server is not None
        (session,) = self.server.sessions
        return session

    def received(self) -> int:
        return self.counters[-1].count if self.counters else 0


@pytest.fixture
async def served() -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    made: list[Served] = []

    async def start(handler: Any = None, **options: Any) -> Served:
        s = Served()
        s.server = await polymux.start_server(handler, "127.0.0.1", 0, capture=s.capture, **options)
        made.append(s)
        return s

    yield start
    for s in made:
        assert s.server is not None
        s.server.close()
        await asyncio.wait_for(s.server.wait_closed(), 10)


async def _processed(s: Served, total: int) -> None:
    """Wait until the server has read ``total`` bytes of the attack, or closed."""
    await until(lambda: not s.server.sessions or s.received() >= total, timeout=30)  # type: ignore[union-attr]


# -- offer / stream-open floods ---------------------------------------------------------

FLOOD = int(os.environ.get("POLYMUX_HOSTILE_FLOOD", "10000"))
FLOOD_BOUND = 24 * MIB


@pytest.mark.parametrize("fmt", ALL)
async def test_open_flood(fmt: str, served: Callable[..., Awaitable[Served]]) -> None:
    """10,000 channel opens (offers, SYNs, NewStreams, first request chunks) as fast as
    the socket takes them, none ever taken by the application, and the peer reads none
    of the answers. Bound: 24 MiB. The server refuses what exceeds ``accept_backlog`` /
    ``max_channels`` (or ends the session when the format's own id space is abused),
    and never tracks more than ``max_channels`` channels."""
    s = await served(None, protocol=fmt)
    peer = await HostilePeer.connect(s.server.port, fmt)  # type: ignore[union-attr]
    try:
        await peer.handshake()
        opened = 0
        with contextlib.suppress(RuntimeError, polymux.LimitExceeded):
            for _ in range(FLOOD):
                handle = peer.engine.open_channel("")
                if peer.engine.send_credit(handle) > 0:
                    peer.engine.send_data(handle, b"x")
                opened += 1
        flood = peer.take()
        assert opened >= 256, f"{fmt}: only {opened} opens could be crafted"
        base = s.received()
        with peak_memory() as peak:
            await peer.send(flood)
            await _processed(s, base + len(flood))
            channels = len(s.session.mux._channels) if s.server.sessions else 0  # type: ignore[union-attr]
        assert channels <= s.session.config.max_channels if s.server.sessions else True  # type: ignore[union-attr]
        print(f"open flood {fmt}: {opened} opens, peak {peak[0]} bytes")
        assert peak[0] < FLOOD_BOUND, f"{fmt}: peak {peak[0]} bytes for {opened} opens"
    finally:
        peer.close()


# -- window overruns ----------------------------------------------------------------------

OVERRUN_BOUND = 4 * MIB


@pytest.mark.parametrize("fmt", FLOW)
async def test_window_overrun(fmt: str, served: Callable[..., Awaitable[Served]]) -> None:
    """A peer that sends past the window it was given (the server's handler never
    reads, so no credit comes back): the session ends with FlowControlError once the
    window is exceeded, having buffered at most one window. Bound: window (256 KiB here)
    + 4 MiB."""
    never = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await never.wait()

    window = 256 * 1024  # yamux's own first window; the others are given it (yamux refuses it)
    s = await served(hold, protocol=fmt, **({} if fmt == "yamux" else {"receive_window": window}))
    peer = await HostilePeer.connect(s.server.port, fmt)  # type: ignore[union-attr]
    try:
        await peer.handshake()
        handle = await peer.open("overrun")
        record = peer.engine._channels[handle]
        record.send.window = None  # lie to our own engine: unlimited credit
        peer.engine.send_data(handle, bytes(window * 4 if fmt != "omnistreams" else 64 * 1024))
        attack = peer.take()
        if fmt == "omnistreams":
            # Credit counts messages here: many small messages past the granted count.
            for _ in range(2000):
                peer.engine.send_data(handle, b"m")
            attack += peer.take()
        with peak_memory() as peak:
            with contextlib.suppress(ConnectionError):
                await peer.send(attack)
            await peer.closed_by_server(10)
        print(f"window overrun {fmt}: peak {peak[0]} bytes")
        assert peak[0] < window + OVERRUN_BOUND, f"{fmt}: peak {peak[0]}"
        assert not s.server.sessions  # type: ignore[union-attr]
    finally:
        never.set()
        peer.close()


async def test_window_overrun_is_a_flow_control_error() -> None:
    """The session's exception is FlowControlError (checked on yamux, over a socketpair
    so the server session is at hand)."""
    async with asyncio.timeout(20):
        never = asyncio.Event()

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await never.wait()

        server = await polymux.start_server(hold, "127.0.0.1", 0, protocol="yamux")
        async with server:
            peer = await HostilePeer.connect(server.port, "yamux")
            await peer.handshake()
            handle = await peer.open()
            await until(lambda: bool(server.sessions))
            (session,) = server.sessions
            peer.engine._channels[handle].send.window = None
            peer.engine.send_data(handle, bytes(2 * MIB))
            with contextlib.suppress(ConnectionError):
                await peer.send()
            await session.wait_closed()
            assert isinstance(session.exception, FlowControlError), session.exception
            never.set()
            peer.close()


# -- a peer that never returns credit / never reads ----------------------------------------

WRITER_BOUND = 4 * MIB


async def _flood_writer(
    fmt: str, served: Callable[..., Awaitable[Served]], *, read_socket: bool, **options: Any
) -> tuple[int, int, polymux.SessionConfig]:
    """A server handler writes as fast as ``drain()`` lets it; the peer opens one channel
    and then either reads the socket but never returns credit, or never reads at all.
    Returns (bytes the handler wrote before drain() blocked for good, peak, config)."""
    written = 0
    blocked = asyncio.Event()
    stop = asyncio.Event()

    async def writer_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        chunk = bytes(64 * 1024)
        with contextlib.suppress(ConnectionError, polymux.PolymuxError):
            while not stop.is_set():
                writer.write(chunk)
                written += len(chunk)
                try:
                    await asyncio.wait_for(writer.drain(), 0.5)
                except TimeoutError:
                    blocked.set()
                    await stop.wait()

    s = await served(writer_handler, protocol=fmt, **options)
    peer = await HostilePeer.connect(s.server.port, fmt)  # type: ignore[union-attr]
    try:
        await peer.handshake()
        handle = await peer.open("pour")
        if fmt == "streamux":  # a response goes out only once its request has ended
            peer.engine.end_channel(handle)
            await peer.send()
        with peak_memory() as peak:
            async with asyncio.timeout(30):
                if read_socket:
                    reading = asyncio.ensure_future(peer.until(lambda: False, timeout=60))
                    await blocked.wait()
                    reading.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                        await reading
                else:
                    await blocked.wait()
        return written, peak[0], s.session.config
    finally:
        stop.set()
        peer.close()


@pytest.mark.parametrize("fmt", ("mstream-v2", "mstream-v3", "yamux"))
async def test_peer_never_returns_credit(fmt: str, served: Callable[..., Awaitable[Served]]) -> None:
    """The peer reads everything off the socket but never acknowledges: the writer's
    ``drain()`` blocks once the peer's window and our write buffer are full. Bound:
    4 MiB, and the handler wrote at most window + write_buffer_high + one write."""
    written, peak, config = await _flood_writer(fmt, served, read_socket=True)
    window = 1024 * 1024 if fmt.startswith("mstream") else 256 * 1024  # the peer's (defaults)
    print(f"no credit {fmt}: wrote {written} bytes before drain() blocked, peak {peak} bytes")
    assert written <= window + config.write_buffer_high + 128 * 1024, (fmt, written)
    assert peak < WRITER_BOUND, (fmt, peak)


@pytest.mark.parametrize("fmt", BIDI)
async def test_peer_never_reads(fmt: str, served: Callable[..., Awaitable[Served]]) -> None:
    """The peer never reads the socket: once the kernel buffers are full the connection
    pauses, the channel's buffer reaches write_buffer_high and ``drain()`` blocks; memory
    stays within the channel and transport buffers. Bound: 4 MiB."""
    written, peak, _config = await _flood_writer(fmt, served, read_socket=False)
    print(f"never reads {fmt}: wrote {written} bytes before drain() blocked, peak {peak} bytes")
    assert peak < WRITER_BOUND, (fmt, peak)


# -- giant length fields ------------------------------------------------------------------


def _giant(fmt: str, peer: HostilePeer) -> bytes:
    """A frame header announcing ~4 GiB (or the largest the field holds)."""
    if fmt == "yamux":
        from polymux.wire import yamux

        return yamux.encode_header(yamux.Type.DATA, yamux.Flag.SYN, 1, 0xFFFFFFFF)
    if fmt in ("mplex", "multiplex"):
        from polymux.wire._varint import encode_uvarint

        return encode_uvarint(3 << 3 | 2) + encode_uvarint(1 << 40)
    if fmt == "mstream-v1":
        return bytes([2]) + (1).to_bytes(4, "big") + (0xFFFF).to_bytes(2, "big")
    if fmt in ("mstream-v2", "mstream-v3"):
        # [Content, id, (source,) bin32 of 0xFFFFFFFF bytes]
        return (b"\x94\x02\x01\x01" if fmt == "mstream-v3" else b"\x93\x02\x01") + b"\xc6\xff\xff\xff\xff"
    if fmt.startswith("omnistreams"):
        return b"\xff\xff\xff\xff"
    if fmt == "streamux":
        # The longest chunk the negotiated widths allow, on request id 0.
        engine = peer.engine
        assert engine.negotiated is not None  # type: ignore[attr-defined]
        from polymux.wire import streamux

        n = engine.negotiated  # type: ignore[attr-defined]
        return streamux.encode_header(n, 0, n.max_length, False, False)
    if fmt in ("smux", "smux-v2"):
        # The largest a u16 holds, on a stream never opened.
        from polymux.wire import smux

        return smux.encode_header(1 if fmt == "smux" else 2, smux.Cmd.PSH, 1, smux.MAX_PAYLOAD)
    raise AssertionError(f"no giant length field for {fmt}: add one")


@pytest.mark.parametrize("fmt", ALL)
async def test_giant_length_field(fmt: str, served: Callable[..., Awaitable[Served]]) -> None:
    """A header announcing a gigantic payload, then a trickle: nothing is allocated for
    the announced size. Either the session ends at once with a ProtocolError (the length
    exceeds the format's limit), or it waits for the rest holding only what arrived (a
    legal length: Streamux chunks up to the negotiated width). Bound: 2 MiB."""
    s = await served(None, protocol=fmt, idle_timeout=None)
    peer = await HostilePeer.connect(s.server.port, fmt)  # type: ignore[union-attr]
    try:
        await peer.handshake()
        with peak_memory() as peak:
            with contextlib.suppress(ConnectionError):
                await peer.send(_giant(fmt, peer) + bytes(64 * 1024))
            await _processed(s, 1)
            await until(lambda: not s.server.sessions or s.received() > 64 * 1024, timeout=10)  # type: ignore[union-attr]
        print(f"giant length {fmt}: peak {peak[0]} bytes")
        assert peak[0] < 2 * MIB, (fmt, peak[0])
        if s.server.sessions:  # type: ignore[union-attr]
            assert fmt == "streamux", f"{fmt}: a giant length did not end the session"
        else:
            await peer.closed_by_server(5)
    finally:
        peer.close()


async def test_streamux_chunk_is_not_buffered_whole(served: Callable[..., Awaitable[Served]]) -> None:
    """8 MiB sent inside one legal 512 MiB chunk should cost at most the receive window."""

    async def discard(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, polymux.PolymuxError):
            while await reader.read(64 * 1024):
                pass

    # A server configured for big chunks (the default recommends 16 bits); its handler
    # reads as the data comes, so what the chunk costs is what is held in between.
    s = await served(
        discard,
        protocol="streamux",
        idle_timeout=None,
        receive_window=256 * 1024,
        streamux_length_bits=(6, 30, 29),
    )
    peer = await HostilePeer.connect(s.server.port, "streamux")  # type: ignore[union-attr]
    from polymux.wire import streamux

    peer.engine.ours = streamux.InitMessage(  # type: ignore[attr-defined]
        quick_request=False,
        quick_allowed=False,
        id_min=1,
        id_max=1,
        id_rec=1,
        length_min=15,
        length_max=29,
        length_rec=29,
    )
    peer.engine._out = [streamux.encode_init(peer.engine.ours)]  # type: ignore[attr-defined]
    try:
        await peer.handshake()
        n = peer.engine.negotiated  # type: ignore[attr-defined]
        assert n.length_bits >= 20, n
        header = streamux.encode_header(n, 0, n.max_length, False, False)
        attack = memoryview(header + bytes(8 * MIB))  # made outside the measurement
        with peak_memory() as peak:
            for off in range(0, len(attack), 64 * 1024):
                await peer.send(attack[off : off + 64 * 1024])
            await _processed(s, 8 * MIB)
        assert peak[0] < 4 * MIB, peak[0]
    finally:
        peer.close()


# -- id reuse -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ALL)
async def test_id_reuse(fmt: str, served: Callable[..., Awaitable[Served]]) -> None:
    """The same channel-open bytes sent twice (an id still in use is opened again): the
    server treats it as a protocol error or ignores it; it never tracks two channels
    for one id, never crashes, and an honest session on the same server still works."""
    got: list[bytes] = []

    async def take(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            got.append(await reader.read(1))
        writer.transport.abort()

    s = await served(take, protocol=fmt)
    peer = await HostilePeer.connect(s.server.port, fmt)  # type: ignore[union-attr]
    try:
        await peer.handshake()
        handle = peer.engine.open_channel("dup")
        if peer.engine.send_credit(handle) > 0:
            peer.engine.send_data(handle, b"1")
        opening = peer.take()
        await peer.send(opening + opening)
        await until(lambda: not s.server.sessions or s.received() >= 2 * len(opening))  # type: ignore[union-attr]
        if s.server.sessions:  # type: ignore[union-attr]
            assert len(s.session.mux._channels) <= 1, s.session.mux._channels
        # The server is unharmed: an honest client gets through.
        honest = await polymux.connect("127.0.0.1", s.server.port, protocol=fmt)  # type: ignore[union-attr]
        async with honest:
            _r, w = await honest.open_pair("ok") if not fmt.startswith("omni") else (None, None)
            if w is None:
                _r2, w = await honest.open_channel("ok")  # type: ignore[assignment]
            w.write(b"2")  # type: ignore[union-attr]
            await until(lambda: b"2" in got)
    finally:
        peer.close()


# -- half-open connections ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ALL)
async def test_silent_peer_is_closed_by_idle_timeout(
    fmt: str, served: Callable[..., Awaitable[Served]]
) -> None:
    """A peer that connects and never sends a byte (not even a handshake), and never
    closes: the server closes it after idle_timeout."""
    s = await served(None, protocol=fmt, idle_timeout=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)  # type: ignore[union-attr]
    try:
        async with asyncio.timeout(5):
            while await reader.read(65536):
                pass  # the server's handshake, if any, then EOF
        await until(lambda: not s.server.sessions)  # type: ignore[union-attr]
    finally:
        writer.transport.abort()


async def test_idle_timeout_spares_sessions_with_channels(served: Callable[..., Awaitable[Served]]) -> None:
    """A session with an open channel is not idle, however quiet; once the channel is
    gone the clock starts."""

    async def drain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()

    s = await served(drain, protocol="mplex", idle_timeout=0.3)
    session = await polymux.connect("127.0.0.1", s.server.port, protocol="mplex")  # type: ignore[union-attr]
    async with session:
        _reader, writer = await session.open_channel("quiet")
        await asyncio.sleep(0.9)  # three idle periods with a channel open: not closed
        assert not session.is_closed
        writer.transport.abort()
        async with asyncio.timeout(5):
            await session.wait_closed()
    assert s.counters, "the server session existed"


@pytest.mark.parametrize("fmt", ("yamux", "streamux"))
async def test_peer_that_never_answers_pings(fmt: str, served: Callable[..., Awaitable[Served]]) -> None:
    """A peer that completes the handshake, keeps a channel open (so idle_timeout does
    not apply) but never answers a ping: keepalive ends the session within
    keepalive_interval + keepalive_timeout."""
    never = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await never.wait()

    s = await served(hold, protocol=fmt, keepalive_interval=0.2, keepalive_timeout=0.3, idle_timeout=None)
    peer = await HostilePeer.connect(s.server.port, fmt)  # type: ignore[union-attr]
    try:
        await peer.handshake()
        handle = peer.engine.open_channel("held")
        if peer.engine.send_credit(handle) > 0:
            peer.engine.send_data(handle, b"x")
        await peer.send()
        await until(lambda: bool(s.server.sessions))  # type: ignore[union-attr]
        (session,) = s.server.sessions  # type: ignore[union-attr]
        # From now on the peer reads nothing and answers nothing.
        async with asyncio.timeout(5):
            await session.wait_closed()
        assert isinstance(session.exception, polymux.SessionClosed), session.exception
        assert "keepalive" in str(session.exception)
    finally:
        never.set()
        peer.close()


async def test_keepalive_is_not_fooled_by_a_trickle(served: Callable[..., Awaitable[Served]]) -> None:
    """A peer that never answers a ping but keeps sending a small frame every 50 ms (a
    trickle, not a busy peer whose answer sits behind full socket reads) is dead to
    keepalive: the session ends within interval + timeout (+ slack), not never."""
    got = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal got
        with contextlib.suppress(ConnectionError, polymux.PolymuxError):
            while data := await reader.read(65536):
                got += len(data)

    s = await served(
        count, protocol="yamux", keepalive_interval=0.1, keepalive_timeout=0.2, idle_timeout=None
    )
    peer = await HostilePeer.connect(s.server.port, "yamux")  # type: ignore[union-attr]
    try:
        await peer.handshake()
        handle = peer.engine.open_channel("busy")
        await peer.send()
        await until(lambda: bool(s.server.sessions))  # type: ignore[union-attr]
        (session,) = s.server.sessions  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        start = loop.time()
        with contextlib.suppress(ConnectionError):
            for _ in range(100):  # up to 5 s of trickle; the session ends long before
                if session.is_closed:
                    break
                peer.engine.send_data(handle, b"x")
                await peer.send()
                await asyncio.sleep(0.05)  # the peer's pace, not synchronisation
        async with asyncio.timeout(5):
            await session.wait_closed()
        assert "keepalive" in str(session.exception), session.exception
        assert loop.time() - start < 2.0, loop.time() - start
        assert got >= 1
    finally:
        peer.close()

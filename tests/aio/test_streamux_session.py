"""Streamux over real sockets (TCP on 127.0.0.1 and unix sockets): request/response with
``Session.request``, cancels under load, quick init, pings, bad input and the slow-reader
policy.

* A channel is one request: the opener's writes and ``write_eof()`` are the request, the
  other side's writes and end are the response. Chunks of many requests interleave on
  the wire (a small ``streamux_length_bits`` makes them small).
* ``writer.transport.abort()`` on a request cancels it: the id stays locked until the
  peer's cancel ack, late response chunks are discarded, the serving handler sees
  :class:`polymux.ChannelReset`. Cancelling the task that awaits ``Session.request`` is
  not a cancel on the wire: ``request()`` closes its channel gracefully, so the serving
  handler runs to its end and the answer is discarded.
* An empty request is a ping on the wire (Streamux's empty message): the peer answers with
  an empty response at once and no handler runs.
* Streamux has no flow control and no way for a responder to fail a request: with
  ``slow_reader="reset"`` the responder's engine ends the response (an empty termination,
  once the request has ended: no response chunk goes out before that), so the requester
  reads a plain EOF.
* Protocol violations end the session with a :class:`polymux.ProtocolError` naming
  "streamux" (Streamux has no goodbye message: the connection is just closed); the server
  goes on serving other sessions.

A :class:`RawStreamux` is a hand-driven Streamux peer on a plain asyncio stream: it writes
exactly the bytes a test crafts with ``polymux.wire.streamux``'s own ``encode_init`` and
``encode_header`` and decodes what polymux sends with its ``Decoder``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import polymux
from polymux.aio.channel import ChannelTransport
from polymux.engine.plane import DataRuns
from polymux.engine.streamux import StreamuxEngine
from polymux.exceptions import ChannelOverflow
from polymux.wire.streamux import (
    Chunk,
    Decoder,
    InitMessage,
    Negotiated,
    NegotiationError,
    decode_init,
    encode_header,
    encode_init,
)

from .helpers import until


T = TypeVar("T")
Serve = Callable[..., Awaitable[polymux.Server]]
Connect = Callable[..., Awaitable[polymux.Session]]
Listen = Callable[..., Awaitable[tuple[polymux.Server, Connect]]]

KiB = 1024
MiB = 1024 * KiB
SMALL_CHUNKS: dict[str, Any] = {"streamux_length_bits": (6, 12, 12)}
"""4095-byte chunks (with the default 14-bit ids: 4-byte headers)."""


# -- helpers -------------------------------------------------------------------------------


async def wait(aw: Awaitable[T], timeout: float = 10) -> T:  # noqa: ASYNC109
    """Await ``aw``, failing the test instead of hanging."""
    return await asyncio.wait_for(aw, timeout)


def pattern(size: int, seed: int = 1) -> bytes:
    """``size`` reproducible pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


def answer(body: bytes) -> bytes:
    """The response to ``body``: an echo for small requests, else its SHA-256 and its
    first 100 bytes reversed."""
    if len(body) <= 1 * KiB:
        return body
    return hashlib.sha256(body).digest() + body[:100][::-1]


def engine_of(session: polymux.Session) -> StreamuxEngine:
    engine = session.engine
    assert isinstance(engine, StreamuxEngine)
    return engine


def spy_sessions(server: polymux.Server) -> list[polymux.Session]:
    """Every session ``server`` makes from now on (``server.sessions`` forgets closed ones)."""
    made: list[polymux.Session] = []
    factory = server._factory

    def make() -> Any:
        mux = factory()
        made.append(mux.session)
        return mux

    server._factory = make
    return made


class Answering:
    """Server-side handler: read the whole request, write ``answer(body)``, close. Counts
    the requests it served; records channel errors."""

    def __init__(self) -> None:
        self.served = 0
        self.errors: list[BaseException] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            body = await reader.read()
            self.served += 1
            writer.write(answer(body))
            writer.close()
            await writer.wait_closed()
        except ConnectionError as exc:
            self.errors.append(exc)


@pytest.fixture
async def listen(tmp_path: Path) -> AsyncIterator[Listen]:
    """``await listen(kind, handler, **options)``: a streamux server on TCP (``kind="tcp"``,
    127.0.0.1 port 0) or a unix socket in ``tmp_path`` (``"unix"``), and a function that
    connects a client session to it (``await connect(**options)``). Servers and clients
    are closed after the test."""
    servers: list[polymux.Server] = []
    clients: list[polymux.Session] = []

    async def start(kind: str, handler: Any, **options: Any) -> tuple[polymux.Server, Connect]:
        if kind == "tcp":
            server = await polymux.start_server(handler, "127.0.0.1", 0, protocol="streamux", **options)
        else:
            path = tmp_path / f"s{len(servers)}.sock"
            server = await polymux.start_unix_server(handler, path, protocol="streamux", **options)
        servers.append(server)

        async def connect(**client_options: Any) -> polymux.Session:
            if kind == "tcp":
                session = await wait(
                    polymux.connect("127.0.0.1", server.port, protocol="streamux", **client_options)
                )
            else:
                session = await wait(polymux.connect_unix(path, protocol="streamux", **client_options))
            clients.append(session)
            return session

        return server, connect

    yield start
    for client in clients:
        client.abort()
    for server in servers:
        server.close()
    for server in servers:
        await asyncio.wait_for(server.wait_closed(), 5)


async def assert_server_still_serves(server: polymux.Server) -> None:
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as client:
        body = b"e" + pattern(100 * KiB, seed=7)
        assert await wait(client.request(body)) == answer(body)
        assert client.exception is None


# -- many concurrent requests ----------------------------------------------------------------


def request_sizes(seed: int) -> list[int]:
    """1,000 sizes from 0 B to 4 MiB: mostly small, some medium, a few large (~30 MiB)."""
    rnd = random.Random(seed)
    sizes = [0, 1, 1 * KiB, 1 * KiB + 1, 4095, 4096, 4 * MiB]
    sizes += [rnd.randint(0, 2 * KiB) for _ in range(940)]
    sizes += [rnd.randint(4 * KiB, 256 * KiB) for _ in range(45)]
    sizes += [rnd.randint(1 * MiB, 4 * MiB) for _ in range(8)]
    rnd.shuffle(sizes)
    assert len(sizes) == 1000
    return sizes


def record_data_events(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[int]]:
    """Per engine (``id()`` of its ``runs``, the data plane's receiving side), the channel
    handle of every data chunk received, in order (into an inbox or into an event)."""
    log: dict[int, list[int]] = {}
    original = DataRuns.add

    def add(self: DataRuns, record: Any, payload: Any, n: int) -> None:
        log.setdefault(id(self), []).append(record.handle)
        original(self, record, payload, n)

    monkeypatch.setattr(DataRuns, "add", add)
    return log


def interleaved(handles: list[int]) -> int:
    """How many channels' data was interrupted by another channel's data."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, handle in enumerate(handles):
        first.setdefault(handle, i)
        last[handle] = i
    count = Counter(handles)
    return sum(1 for handle in count if last[handle] - first[handle] + 1 > count[handle])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_a_thousand_concurrent_requests(
    kind: str, listen: Listen, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = record_data_events(monkeypatch)
    handler = Answering()
    server, connect = await listen(kind, handler, **SMALL_CHUNKS)
    sessions = spy_sessions(server)
    session = await connect(**SMALL_CHUNKS)
    engine = engine_of(session)
    assert engine.negotiated == Negotiated(14, 12)
    assert engine.max_frame == 4095
    sizes = request_sizes(seed=11)
    bodies = [pattern(size, seed=i) for i, size in enumerate(sizes)]
    started = time.monotonic()
    answers = await wait(asyncio.gather(*(session.request(body) for body in bodies)), 50)
    elapsed = time.monotonic() - started
    for body, got in zip(bodies, answers, strict=True):
        assert got == answer(body), len(body)
    # An empty request is a ping on the wire: answered empty, no handler ran.
    empty = sizes.count(0)
    assert empty >= 1
    assert handler.served == len(sizes) - empty
    assert handler.errors == []
    assert session.exception is None and not session.is_closed
    (server_session,) = sessions
    assert server_session.exception is None
    # Chunks of different requests interleaved on the wire (each way).
    server_engine = engine_of(server_session)
    assert interleaved(log[id(server_engine.runs)]) > 10
    await until(lambda: engine.channel_count == 0 and server_engine.channel_count == 0)
    assert elapsed < 45


@pytest.mark.timeout(30)
async def test_request_with_a_limit(serve: Serve) -> None:
    server = await serve(Answering(), protocol="streamux")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        body = pattern(500)
        assert await wait(session.request(body, limit=500)) == body
        with pytest.raises(polymux.LimitExceeded, match="streamux: the answer exceeds limit=499 bytes"):
            await wait(session.request(body, limit=499))
        assert await wait(session.request(body)) == body  # the session goes on
        assert session.exception is None


# -- cancel --------------------------------------------------------------------------------


class Canceller:
    """Server-side handler. A request's first byte says what to do:

    * ``w``: read it all, wait for ``release`` (or the end of the channel), then answer;
    * ``s``: read it all, then stream 16 KiB pieces until the channel fails;
    * anything else: answer at once.

    The request's first 8 bytes are its key; ``arrived``, ``finished`` and ``errors`` are
    keyed by it.
    """

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived: set[bytes] = set()
        self.finished: set[bytes] = set()
        self.errors: dict[bytes, BaseException] = {}
        self.streamed: dict[bytes, int] = {}

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = b""
        try:
            body = await reader.read()
            key = body[:8]
            self.arrived.add(key)
            closed = asyncio.ensure_future(writer.wait_closed())  # fails if the channel does
            closed.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
            if body[:1] == b"w":
                released = asyncio.ensure_future(self.release.wait())
                await asyncio.wait({closed, released}, return_when=asyncio.FIRST_COMPLETED)
                released.cancel()
                if closed.done():
                    closed.result()  # raises why the channel ended (the requester's cancel)
            elif body[:1] == b"s":
                self.streamed[key] = 0
                piece = pattern(16 * KiB, seed=3)
                while self.streamed[key] < 256 * MiB:  # a bound, should the cancel never come
                    writer.write(piece)
                    await writer.drain()
                    self.streamed[key] += len(piece)
                    await asyncio.sleep(0)  # let the others run
            writer.write(answer(body))
            writer.close()
            await closed
            self.finished.add(key)
        except ConnectionError as exc:
            self.errors[key] = exc


def key(kind: str, i: int) -> bytes:
    return f"{kind}{i:07d}".encode()


def count_late_responses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count response chunks engines discard because their id is locked (cancelled)."""
    late = [0]
    original = StreamuxEngine._on_response

    def on_response(
        self: StreamuxEngine, cid: int, termination: bool, payload: Any, events: list[Any]
    ) -> None:
        if cid in self._locked and (len(payload) or termination):
            late[0] += 1
        original(self, cid, termination, payload, events)

    monkeypatch.setattr(StreamuxEngine, "_on_response", on_response)
    return late


@pytest.mark.timeout(60)
async def test_cancel_under_load(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    late = count_late_responses(monkeypatch)
    handler = Canceller()
    server = await serve(handler, protocol="streamux", **SMALL_CHUNKS)
    sessions = spy_sessions(server)
    # 6-bit ids: 64 request ids, so the requests below must reuse them.
    session = await wait(
        polymux.connect(
            "127.0.0.1", server.port, protocol="streamux", streamux_id_bits=(1, 6, 6), **SMALL_CHUNKS
        )
    )
    async with session:
        engine = engine_of(session)
        assert engine.negotiated == Negotiated(6, 12)
        await until(lambda: session.rtt is not None)  # the first (RTT) ping is answered

        # 12 requests whose handlers wait, aborted by the requester (a cancel on the wire).
        aborted = []
        for i in range(12):
            reader, writer = await wait(session.open_channel())
            writer.write(key("w", i) + pattern(i * 1000, seed=i))
            writer.write_eof()
            aborted.append((reader, writer))
        # 6 requests whose handlers stream an endless response, aborted while it flows.
        streams = []
        for i in range(6):
            reader, writer = await wait(session.open_channel())
            writer.write(key("s", i))
            writer.write_eof()
            streams.append((reader, writer))
        # 6 request() calls whose awaiting task is cancelled.
        cancelled = [
            asyncio.create_task(session.request(key("w", 200 + i) + b"x" * 10_000)) for i in range(6)
        ]
        # 20 request() calls that complete once released.
        normal_bodies = [key("w", 100 + i) + pattern(i * 3000, seed=50 + i) for i in range(20)]
        normal = [asyncio.create_task(session.request(body)) for body in normal_bodies]
        in_flight = 12 + 6 + 6 + 20
        await until(lambda: len(handler.arrived) == in_flight)
        assert engine.channel_count == in_flight

        for _reader, writer in aborted:
            writer.transport.abort()
        for reader, writer in streams:
            assert len(await wait(reader.readexactly(20 * KiB))) == 20 * KiB  # the response flows
            writer.transport.abort()
        for task in cancelled:
            task.cancel()
        for task in cancelled:
            with pytest.raises(asyncio.CancelledError):
                await wait(task)
        # Each cancel is acked; then no id is locked any more.
        await until(lambda: all(key("w", i) in handler.errors for i in range(12)))
        await until(lambda: all(key("s", i) in handler.errors for i in range(6)))
        await until(lambda: not engine._locked)
        for i in range(12):
            error = handler.errors[key("w", i)]
            assert isinstance(error, polymux.ChannelReset)
            assert error.message == "request cancelled by the peer"
            assert str(error).startswith("streamux: ")
        for i in range(6):
            assert isinstance(handler.errors[key("s", i)], polymux.ChannelReset)
        assert late[0] > 0  # streamed chunks that were on their way when the cancel went out
        for reader, _writer in aborted:
            assert await wait(reader.read()) == b""  # an aborted channel just ends locally

        # Cancelling a request() task cancels its request on the wire too.
        await until(lambda: all(key("w", 200 + i) in handler.errors for i in range(6)))
        assert all(isinstance(handler.errors[key("w", 200 + i)], polymux.ChannelReset) for i in range(6))
        # The released handlers answer.
        handler.release.set()
        for body, task in zip(normal_bodies, normal, strict=True):
            assert await wait(task) == answer(body)
        await until(lambda: engine.channel_count == 0)
        assert not engine._locked

        # Healthy: 200 more requests in waves of 40 reuse the 64 ids.
        for wave in range(5):
            bodies = [key("e", wave * 40 + i) + pattern(i * 500, seed=i) for i in range(40)]
            answers = await wait(asyncio.gather(*(session.request(body) for body in bodies)))
            assert answers == [answer(body) for body in bodies]
        assert session.exception is None and not session.is_closed
        (server_session,) = sessions
        assert server_session.exception is None and not server_session.is_closed
        assert engine_of(server_session).channel_count == 0


@pytest.mark.timeout(30)
async def test_cancelling_the_request_task_cancels_on_the_wire(serve: Serve) -> None:
    """Cancelling the task awaiting ``Session.request`` sends a cancel: the serving handler
    sees ChannelReset, the id is locked until the cancel ack, then free again."""
    handler = Canceller()
    server = await serve(handler, protocol="streamux")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        engine = engine_of(session)
        task = asyncio.create_task(session.request(key("w", 1) + b"payload"))
        await until(lambda: key("w", 1) in handler.arrived)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait(task)
        assert engine.channel_count == 0  # the cancel went out: the request is gone here
        await until(lambda: key("w", 1) in handler.errors)
        assert isinstance(handler.errors[key("w", 1)], polymux.ChannelReset)
        await until(lambda: not engine._locked)  # the cancel ack arrived
        assert await wait(session.request(key("e", 2) + b"next")) == answer(key("e", 2) + b"next")
        assert session.exception is None


# -- quick init ----------------------------------------------------------------------------


@pytest.mark.timeout(20)
async def test_quick_init_against_a_server_that_allows_it(serve: Serve) -> None:
    server = await serve(Answering(), protocol="streamux", streamux_quick_init="allow")
    sessions = spy_sessions(server)
    session = await wait(
        polymux.connect("127.0.0.1", server.port, protocol="streamux", streamux_quick_init="request")
    )
    async with session:
        engine = engine_of(session)
        assert engine.ready  # at once: the requester assumes its own recommended values
        assert engine.negotiated == Negotiated(14, 16)
        body = pattern(300 * KiB, seed=5)
        assert await wait(session.request(body)) == answer(body)
        assert await wait(session.request(b"small")) == b"small"
        assert engine.theirs is not None and engine.theirs.quick_allowed
        (server_session,) = sessions
        assert engine_of(server_session).negotiated == Negotiated(14, 16)
        assert session.exception is None and server_session.exception is None


@pytest.mark.timeout(20)
async def test_quick_init_request_goes_out_before_the_servers_init() -> None:
    """A raw server that reads the whole request before it sends its initialize message:
    the polymux requester must have sent the request without waiting for it."""
    requests: dict[int, bytes] = {}
    pings: list[int] = []
    client_init: list[InitMessage] = []

    async def raw_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        theirs = decode_init(await reader.readexactly(5))
        client_init.append(theirs)
        n = Negotiated(theirs.id_rec, theirs.length_rec)
        decoder = Decoder(n)
        partial: dict[int, bytes] = {}
        while not requests:  # until a whole request came
            data = await reader.read(64 * KiB)
            if not data:
                return
            for c in decoder.feed(data):
                assert not c.response
                if c.termination and c.id not in partial and not c.payload:
                    pings.append(c.id)  # the RTT ping (an empty message)
                elif c.termination:
                    requests[c.id] = partial.pop(c.id, b"") + bytes(c.payload)
                else:
                    partial[c.id] = partial.get(c.id, b"") + bytes(c.payload)
        # Only now the server's init, then the ping acks and the response.
        [(cid, _body)] = requests.items()
        writer.write(
            encode_init(InitMessage(quick_allowed=True))
            + b"".join(encode_header(n, p, 0, True, True) for p in pings)
            + encode_header(n, cid, 5, True, False)
            + b"hello"
            + encode_header(n, cid, 0, True, True)
        )
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until polymux closes
        writer.close()

    raw = await asyncio.start_server(raw_server, "127.0.0.1", 0)
    async with raw:
        port = raw.sockets[0].getsockname()[1]
        session = await wait(
            polymux.connect(
                "127.0.0.1",
                port,
                protocol="streamux",
                streamux_quick_init="request",
                streamux_id_bits=(1, 12, 12),
                streamux_length_bits=(6, 12, 12),
                keepalive_interval=None,
            )
        )
        async with session:
            assert session.engine.ready
            assert await wait(session.request(b"question")) == b"hello"
            assert list(requests.values()) == [b"question"]  # sent before the server's init
            assert client_init[0].quick_request and not client_init[0].quick_allowed
            assert (client_init[0].id_rec, client_init[0].length_rec) == (12, 12)
            await until(lambda: session.rtt is not None)  # the ping was acked too
            assert engine_of(session).negotiated == Negotiated(12, 12)
            assert session.exception is None


@pytest.mark.timeout(20)
async def test_quick_init_against_a_server_that_does_not_allow_it(serve: Serve) -> None:
    server = await serve(Answering(), protocol="streamux", streamux_quick_init="off")
    sessions = spy_sessions(server)
    session = await wait(
        polymux.connect("127.0.0.1", server.port, protocol="streamux", streamux_quick_init="request")
    )
    assert session.engine.ready  # it does not know yet
    await wait(session.wait_closed())
    await until(lambda: len(sessions) == 1 and sessions[0].is_closed)
    for s in (session, sessions[0]):
        exc = s.exception
        assert isinstance(exc, NegotiationError)
        assert isinstance(exc, polymux.ProtocolError)
        assert exc.format == "streamux"
        assert str(exc).startswith("streamux: negotiation failed: ")
        assert "quick init requested, but the other peer does not allow it" in str(exc)
    with pytest.raises(polymux.SessionClosed) as info:
        await wait(session.request(b"too late"))
    assert isinstance(info.value.__cause__, NegotiationError)
    await assert_server_still_serves(server)


@pytest.mark.timeout(20)
async def test_incompatible_ranges_fail_the_handshake(serve: Serve) -> None:
    server = await serve(Answering(), protocol="streamux", streamux_id_bits=(10, 15, 10))
    sessions = spy_sessions(server)
    with pytest.raises(polymux.SessionClosed, match="id bits: max 8 < min 10") as info:
        await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux", streamux_id_bits=(6, 8, 8)))
    assert isinstance(info.value.__cause__, NegotiationError)
    await until(lambda: len(sessions) == 1 and sessions[0].is_closed)
    assert isinstance(sessions[0].exception, NegotiationError)
    assert "id bits: max 8 < min 10" in str(sessions[0].exception)


# -- pings ---------------------------------------------------------------------------------


@pytest.mark.timeout(20)
async def test_ping_measures_the_round_trip(serve: Serve) -> None:
    sessions: list[polymux.Session] = []
    server = await serve(Answering(), protocol="streamux", session_handler=sessions.append)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        rtt = await wait(session.ping())
        assert 0 < rtt < 5
        assert session.rtt is not None and 0 < session.rtt < 5
        rtts = await wait(asyncio.gather(*(session.ping() for _ in range(20))))
        assert all(0 < x < 5 for x in rtts)
        # the server can ping too: each peer is requester and responder
        await until(lambda: len(sessions) == 1)
        assert 0 < await wait(sessions[0].ping()) < 5
        assert sessions[0].rtt is not None
        # pings never reach the handler and leave no channel behind
        assert engine_of(session).channel_count == 0
        assert engine_of(sessions[0]).channel_count == 0
        assert session.exception is None


# -- all ids in flight ---------------------------------------------------------------------


@pytest.mark.timeout(20)
async def test_all_ids_in_flight_is_a_polymux_error(serve: Serve) -> None:
    handler = Canceller()
    server = await serve(handler, protocol="streamux")
    session = await wait(
        polymux.connect("127.0.0.1", server.port, protocol="streamux", streamux_id_bits=(1, 1, 1))
    )
    async with session:
        await until(lambda: session.rtt is not None)  # the RTT ping gave its id back
        held = [asyncio.create_task(session.request(key("w", i))) for i in range(2)]
        await until(lambda: len(handler.arrived) == 2)
        try:
            with pytest.raises(polymux.PolymuxError):
                await wait(session.request(b"third"))
        finally:
            handler.release.set()
            await wait(asyncio.gather(*held))


# -- bad input from a raw peer -------------------------------------------------------------


RAW_INIT = InitMessage(id_min=1, id_max=8, id_rec=8, length_min=6, length_max=12, length_rec=12)
"""The raw peer's offer: against polymux's defaults, 8-bit ids and 12-bit lengths (3-byte
headers whose top two bits are unused)."""
RAW = Negotiated(8, 12)


def hdr(cid: int, length: int, *, resp: bool = False, term: bool = False) -> bytes:
    return encode_header(RAW, cid, length, resp, term)


class RawStreamux:
    """One end of a Streamux connection driven byte by byte by the test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.theirs: InitMessage | None = None
        self._decoder = Decoder(RAW)
        self._chunks: deque[Chunk] = deque()

    @classmethod
    async def connect(cls, port: int) -> RawStreamux:
        reader, writer = await wait(asyncio.open_connection("127.0.0.1", port))
        raw = cls(reader, writer)
        raw.theirs = decode_init(await wait(reader.readexactly(5)))  # polymux speaks first
        return raw

    def send(self, *parts: bytes) -> None:
        self.writer.write(b"".join(parts))

    async def receive(self) -> Chunk:
        while not self._chunks:
            try:
                data = await wait(self.reader.read(64 * KiB))
            except ConnectionResetError:
                data = b""
            if not data:
                raise EOFError("polymux closed the connection")
            self._chunks.extend(c._replace(payload=bytes(c.payload)) for c in self._decoder.feed(data))
        return self._chunks.popleft()

    async def until_eof(self) -> list[Chunk]:
        """Every chunk polymux sends until it closes the connection."""
        chunks: list[Chunk] = []
        with contextlib.suppress(EOFError):
            while True:
                chunks.append(await self.receive())
        return chunks

    async def expect(self, predicate: Callable[[Chunk], bool]) -> Chunk:
        while True:
            chunk = await self.receive()
            if predicate(chunk):
                return chunk

    def close(self) -> None:
        self.writer.close()


def response_to(cid: int) -> Callable[[Chunk], bool]:
    """A chunk polymux sends in answer to the raw peer's request ``cid``.

    polymux's own requests (its RTT ping at connect) use ids from a random start, so an id alone
    may match one of them: the response bit tells the two apart.
    """
    return lambda c: c.id == cid and c.response


async def raw_session(server: polymux.Server, sessions: list[polymux.Session]) -> RawStreamux:
    """Connect a raw peer to ``server`` (whose sessions ``spy_sessions`` collects)."""
    count = len(sessions)
    raw = await RawStreamux.connect(server.port)
    await until(lambda: len(sessions) == count + 1)
    assert raw.theirs == InitMessage()
    return raw


async def hold_or_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A request whose first byte is ``h`` is held (never read again, never answered)
    until its channel or session ends; any other is answered."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        first = await reader.readexactly(1)
        if first == b"h":
            await writer.wait_closed()
            return
        rest = await reader.read()
        writer.write(answer(first + rest))
        writer.close()
        await writer.wait_closed()


def init_with(word_or: int = 0, version: int = 1, message: InitMessage = RAW_INIT) -> bytes:
    init = encode_init(message)
    word = int.from_bytes(init[1:], "big") | word_or
    return bytes((version,)) + word.to_bytes(4, "big")


BAD_INPUT = [
    pytest.param([init_with(version=2)], "protocol versions differ: 1 and 2", id="version-2"),
    pytest.param([init_with(1 << 31)], "initialize message has reserved bits set: 0x2", id="reserved-bit-31"),
    pytest.param([init_with(1 << 30)], "initialize message has reserved bits set: 0x1", id="reserved-bit-30"),
    pytest.param(
        [init_with(message=InitMessage(length_min=1, length_max=5, length_rec=5))],
        "length bits: max 5 < min 6",
        id="incompatible-ranges",
    ),
    pytest.param(
        [init_with(message=InitMessage(quick_request=True))],
        "quick init requested, but the other peer does not allow it",
        id="quick-init-not-allowed",
    ),
    pytest.param(
        [init_with(), (1 << 23 | (5 << 12 | 3) << 2).to_bytes(3, "little"), b"abc"],
        "chunk header 0x81400c has unused high bits set (id 8 bits, length 12 bits)",
        id="unused-header-bit",
    ),
    pytest.param(
        [init_with(), (((255 << 12) + 4096 + 10) << 2).to_bytes(3, "little")],
        "has unused high bits set",
        id="length-over-the-width",
    ),
    pytest.param(
        [init_with(), hdr(9, 3, resp=True), b"abc"],
        "response to request 9, which we never sent",
        id="response-to-unknown-request",
    ),
    pytest.param(
        [init_with(), hdr(9, 0, resp=True)],
        "cancel ack for request 9, which we did not cancel",
        id="cancel-ack-not-cancelled",
    ),
    pytest.param(
        [init_with(), hdr(3, 1, term=True), b"h", hdr(3, 1), b"x"],
        "request 3 continued after its termination",
        id="request-after-termination",
    ),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("parts", "problem"), BAD_INPUT)
async def test_bad_input_ends_the_session_with_a_protocol_error(
    serve: Serve, parts: list[bytes], problem: str
) -> None:
    server = await serve(hold_or_answer, protocol="streamux")
    sessions = spy_sessions(server)
    raw = await raw_session(server, sessions)
    raw.send(*parts)
    await wait(raw.until_eof())  # polymux closes the connection (Streamux has no goodbye)
    session = sessions[-1]
    await wait(session.wait_closed())
    exc = session.exception
    assert isinstance(exc, polymux.ProtocolError)
    assert exc.format == "streamux"
    assert str(exc).startswith("streamux: ")
    assert problem in str(exc)
    raw.close()
    await assert_server_still_serves(server)


@pytest.mark.timeout(20)
async def test_eof_inside_a_chunk_is_a_protocol_error(serve: Serve) -> None:
    server = await serve(hold_or_answer, protocol="streamux")
    sessions = spy_sessions(server)
    raw = await raw_session(server, sessions)
    raw.send(init_with(), hdr(4, 10), b"h" * 6)  # 6 of 10 bytes
    raw.writer.write_eof()
    await wait(raw.until_eof())
    await wait(sessions[-1].wait_closed())
    exc = sessions[-1].exception
    assert isinstance(exc, polymux.ProtocolError)
    assert "streamux: connection ended inside a chunk (9 bytes of it received)" in str(exc)
    raw.close()
    await assert_server_still_serves(server)


@pytest.mark.timeout(20)
async def test_raw_peer_requests_pings_and_cancels(serve: Serve) -> None:
    """What polymux sends back to well-formed input, chunk by chunk."""
    server = await serve(hold_or_answer, protocol="streamux")
    sessions = spy_sessions(server)
    raw = await raw_session(server, sessions)
    raw.send(init_with(), hdr(7, 5, term=True), b"world")  # a one-chunk request
    assert await raw.expect(response_to(7)) == Chunk(7, True, False, b"world")
    assert await raw.receive() == Chunk(7, True, True, b"")  # the empty termination
    raw.send(hdr(7, 0, term=True))  # a ping with the same id: request 7 is complete
    assert await raw.expect(response_to(7)) == Chunk(7, True, True, b"")  # the ping ack
    raw.send(hdr(200, 0))  # a cancel for a request polymux does not know
    assert await raw.expect(response_to(200)) == Chunk(200, True, False, b"")  # the ack
    raw.send(hdr(8, 2), b"hx")  # a held request ...
    await until(lambda: engine_of(sessions[-1]).channel_count == 1)
    raw.send(hdr(8, 0))  # ... cancelled
    assert await raw.expect(response_to(8)) == Chunk(8, True, False, b"")
    await until(lambda: engine_of(sessions[-1]).channel_count == 0)
    # a request spread over chunks interleaved with another one
    raw.send(
        hdr(1, 3), b"abc", hdr(2, 2), b"xy", hdr(1, 3), b"def", hdr(2, 0, term=True), hdr(1, 0, term=True)
    )
    got: dict[int, bytes] = {1: b"", 2: b""}
    ended: set[int] = set()
    while ended != {1, 2}:
        chunk = await raw.receive()
        if chunk == Chunk(chunk.id, False, True, b""):
            continue  # a ping of polymux's own (keepalive) between the answers
        assert chunk.response
        got[chunk.id] += chunk.payload
        if chunk.termination:
            ended.add(chunk.id)
    assert got == {1: b"abcdef", 2: b"xy"}
    assert not sessions[-1].is_closed and sessions[-1].exception is None
    raw.close()
    await wait(sessions[-1].wait_closed())


@pytest.mark.timeout(20)
async def test_request_and_its_cancel_in_one_read(serve: Serve) -> None:
    server = await serve(hold_or_answer, protocol="streamux")
    sessions = spy_sessions(server)
    raw = await raw_session(server, sessions)
    raw.send(init_with() + hdr(3, 2) + b"hi" + hdr(3, 0))  # one write: one read on loopback
    assert await raw.expect(response_to(3)) == Chunk(3, True, False, b"")  # the ack
    assert not sessions[-1].is_closed and sessions[-1].exception is None
    raw.close()


# -- slow_reader="reset" -------------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_slow_reader_reset_ends_the_response(serve: Serve) -> None:
    errors: list[BaseException] = []

    async def hold_or_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.readexactly(1)
            if first == b"h":
                await writer.wait_closed()  # never reads again
                return
            rest = await reader.read()
            writer.write(answer(first + rest))
            writer.close()
        except ConnectionError as exc:
            errors.append(exc)

    server = await serve(
        hold_or_echo,
        protocol="streamux",
        receive_window=256 * KiB,
        slow_reader="reset",
        slow_reader_timeout=0.2,
    )
    sessions = spy_sessions(server)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        # Streamux cannot carry a reset from the responder to the requester: the server
        # ends the response (an empty termination), so the requester reads a plain EOF.
        assert await wait(session.request(b"h" + pattern(2 * MiB))) == b""
        await until(lambda: len(errors) == 1)
        [overflow] = errors
        assert isinstance(overflow, ChannelOverflow)
        assert str(overflow).startswith("streamux: ")
        assert "slow_reader='reset'" in str(overflow)
        assert "receive_window=262144" in str(overflow)

        # The same through open_channel: the server drops the rest of the request, and its
        # (empty) response comes once the request has ended: a response never goes out
        # before its request's end.
        reader, writer = await wait(session.open_channel())
        writer.write(b"h" + pattern(2 * MiB, seed=2))
        await until(lambda: len(errors) == 2)
        assert isinstance(errors[1], ChannelOverflow)
        assert not reader.at_eof()
        writer.write_eof()
        assert await wait(reader.read()) == b""
        transport = writer.transport
        assert isinstance(transport, ChannelTransport)
        await until(lambda: transport.is_closing())
        writer.close()

        # The session goes on.
        body = b"e" + pattern(MiB, seed=3)
        assert await wait(session.request(body)) == answer(body)
        await until(lambda: engine_of(session).channel_count == 0)
        (server_session,) = sessions
        assert session.exception is None and server_session.exception is None
        assert engine_of(server_session).channel_count == 0

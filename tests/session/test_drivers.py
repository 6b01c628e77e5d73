"""One behaviour suite, run against both drivers of the session core: the asyncio API
(``polymux.connect`` / ``start_server``, channels as StreamReader/StreamWriter) and the
anyio one (``polymux.anyio.session`` over anyio TCP streams, channels as ByteStreams).
Both only move bytes, time and events between the core and their I/O, so what a session
does (limits, filters, budgets, keepalive, half-close, resets, pings, omnistreams stream
pairs and control messages, requests, what waiting tasks get: session/waiters.py) must not
differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, Self

import anyio
import pytest
from anyio.abc import SocketAttribute

import polymux
import polymux.aio.session as aio_session
import polymux.anyio as pmanyio
from polymux.session import events as ce
from polymux.session.waiters import Waiters
from polymux.wire.yamux import Decoder, Flag, GoAwayCode, Type, encode_header


pytestmark = pytest.mark.timeout(60)

DRIVERS = ("asyncio", "anyio")
FORMATS = ("mstream-v3", "mplex", "yamux", "streamux", "smux-v2", "omnistreams")
"""On omnistreams, whose streams are one-way, a channel of these tests is a stream pair."""


class Chan:
    """A channel, the same to the tests whichever driver carries it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def send(self, data: bytes) -> None:
        if isinstance(self.inner, tuple):
            writer = self.inner[1]
            writer.write(data)
            await writer.drain()
        else:
            await self.inner.send(data)

    async def send_eof(self) -> None:
        if isinstance(self.inner, tuple):
            self.inner[1].write_eof()
        else:
            await self.inner.send_eof()

    async def recv(self, n: int = 65536) -> bytes:
        """Up to ``n`` bytes; b"" at the peer's end of writing."""
        if isinstance(self.inner, tuple):
            return bytes(await self.inner[0].read(n))
        try:
            return bytes(await self.inner.receive(n))
        except anyio.EndOfStream:
            return b""

    async def recv_all(self) -> bytes:
        out = bytearray()
        while data := await self.recv():
            out += data
        return bytes(out)

    async def close(self) -> None:
        if isinstance(self.inner, tuple):
            self.inner[1].close()
        else:
            await self.inner.aclose()

    async def reset(self) -> None:
        if isinstance(self.inner, tuple):
            self.inner[1].transport.abort()
        else:
            await self.inner.reset()


class Side:
    """A session, the same to the tests whichever driver runs it."""

    def __init__(self, session: Any) -> None:
        self.session = session

    @property
    def is_asyncio(self) -> bool:
        return isinstance(self.session, polymux.Session)

    async def open(self, name: str = "") -> Chan:
        """A two-way channel: a stream pair on one-way formats (both drivers have
        ``open_pair``; on the other formats it is ``open_channel``)."""
        return Chan(await self.session.open_pair(name))

    async def open_one_way(self, name: str = "") -> Chan:
        """A plain channel (on omnistreams: a stream we may only write)."""
        return Chan(await self.session.open_channel(name))

    async def accept(self) -> Chan:
        return Chan(await self.session.accept_channel())

    async def request(self, body: bytes, name: str = "", limit: int | None = None) -> bytes:
        return bytes(await self.session.request(body, name, limit=limit))

    def send_control(self, data: bytes) -> None:
        self.session.send_control(data)

    async def receive_control(self) -> bytes:
        return bytes(await self.session.receive_control())

    async def aclose(self) -> None:
        await self.session.aclose()

    async def ping(self) -> float:
        return float(await self.session.ping())

    @property
    def core(self) -> polymux.session.SessionCore:
        return self.session.mux.core if self.is_asyncio else self.session.core

    @property
    def waiters(self) -> Waiters[Any, Any, Any]:
        return self.session.mux.waiters if self.is_asyncio else self.session.waiters  # type: ignore[no-any-return]

    def process(self) -> None:
        """Act on the core's events now (what the driver does after every read)."""
        if self.is_asyncio:
            self.session.mux.process()
        else:
            self.session._process()

    async def closed(self) -> None:
        await self.session.wait_closed()

    @property
    def error(self) -> BaseException | None:
        if self.is_asyncio:
            return self.session.exception  # type: ignore[no-any-return]
        return self.session.error  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def pair(
    driver: str,
    protocol: str,
    *,
    offer_filter: Callable[[str], bool] | None = None,
    server_options: dict[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Side, Side]]:
    """``(client, server)`` sessions over loopback TCP, both run by ``driver``; the server
    takes incoming channels with ``accept``."""
    server_opts = {**options, **(server_options or {})}
    if driver == "asyncio":
        accepted: asyncio.Queue[polymux.Session] = asyncio.Queue()
        server = await polymux.start_server(
            None,
            "127.0.0.1",
            0,
            protocol=protocol,
            session_handler=accepted.put_nowait,
            offer_filter=offer_filter,
            **server_opts,
        )
        async with server:
            client = await polymux.connect("127.0.0.1", server.port, protocol=protocol, **options)
            async with client:
                theirs = await asyncio.wait_for(accepted.get(), 10)
                yield Side(client), Side(theirs)
                theirs.abort()
        return
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(SocketAttribute.local_port)
        client_end = await anyio.connect_tcp("127.0.0.1", port)
        server_end = await listener.listeners[0].accept()
        async with (
            client_end,
            server_end,
            pmanyio.session(
                server_end, protocol=protocol, is_client=False, offer_filter=offer_filter, **server_opts
            ) as theirs,
            pmanyio.session(client_end, protocol=protocol, **options) as client,
        ):
            yield Side(client), Side(theirs)


@pytest.mark.parametrize("protocol", FORMATS)
@pytest.mark.parametrize("driver", DRIVERS)
async def test_channels_carry_bytes_both_ways_with_half_close(driver: str, protocol: str) -> None:
    """8 channels, 256 KiB each way: the client half-closes, the server reads to the end,
    answers, and ends; byte-exact."""
    async with pair(driver, protocol) as (client, server):
        payloads = [os.urandom(256 * 1024) for _ in range(8)]

        async def serve_one() -> None:
            chan = await server.accept()
            data = await chan.recv_all()
            await chan.send(data[::-1])
            await chan.send_eof()

        async def one(i: int) -> None:
            chan = await client.open(f"c{i}")
            await chan.send(payloads[i])
            await chan.send_eof()
            assert await chan.recv_all() == payloads[i][::-1]
            await chan.close()

        async with asyncio.timeout(30):
            await asyncio.gather(*(serve_one() for _ in payloads), *(one(i) for i in range(len(payloads))))


@pytest.mark.parametrize("protocol", ("mstream-v3", "omnistreams"))
@pytest.mark.parametrize("driver", DRIVERS)
async def test_the_offer_filter_refuses(driver: str, protocol: str) -> None:
    """An offer the server's filter refuses fails to open (mstream: rejected; an
    omnistreams pair: its first half reset) and leaves the session usable."""
    async with pair(driver, protocol, offer_filter=lambda name: name != "nope") as (client, server):
        with pytest.raises((polymux.ChannelRejected, anyio.BrokenResourceError, polymux.PolymuxError)):
            async with asyncio.timeout(10):
                await client.open("nope")
        chan = await client.open("yes")
        peer = await server.accept()
        await chan.send(b"hi")
        assert await peer.recv() == b"hi"


@pytest.mark.parametrize("driver", DRIVERS)
async def test_max_channels_refuses_the_peers_opens_beyond_it(driver: str) -> None:
    async with pair(driver, "mstream-v3", server_options={"max_channels": 2}) as (client, _server):
        first = [await client.open(f"c{i}") for i in range(2)]
        with pytest.raises((polymux.ChannelRejected, anyio.BrokenResourceError, polymux.PolymuxError)):
            async with asyncio.timeout(10):
                await client.open("third")
        assert len(first) == 2


@pytest.mark.parametrize("driver", DRIVERS)
async def test_opening_faster_than_the_rate_ends_the_session(driver: str) -> None:
    async with pair(driver, "mplex", server_options={"inbound_channel_rate": 5}) as (client, server):
        for i in range(20):
            with contextlib.suppress(polymux.PolymuxError, ConnectionError, anyio.BrokenResourceError):
                await client.open(f"c{i}")
        async with asyncio.timeout(10):
            await server.closed()
        assert "faster than 5 per second" in str(server.error)


@pytest.mark.parametrize("protocol", ("yamux", "streamux"))
@pytest.mark.parametrize("driver", DRIVERS)
async def test_ping_measures_a_round_trip(driver: str, protocol: str) -> None:
    async with pair(driver, protocol) as (client, _server):
        async with asyncio.timeout(10):
            rtt = await client.ping()
        assert 0 < rtt < 5


@pytest.mark.parametrize("protocol", ("mstream-v3", "omnistreams"))
@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_reset_reaches_the_reader_as_an_error(driver: str, protocol: str) -> None:
    async with pair(driver, protocol) as (client, server):
        chan = await client.open("r")
        peer = await server.accept()
        await chan.send(b"x")
        assert await peer.recv() == b"x"
        await chan.reset()
        with pytest.raises((polymux.ChannelReset, anyio.BrokenResourceError)):
            async with asyncio.timeout(10):
                await peer.recv_all()


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_reader_that_stops_bounds_what_the_session_holds(driver: str) -> None:
    """No credit on the wire (mplex): the receiver's unread bytes stay bounded by its budget
    (the session stops reading), whatever the sender writes."""
    budget = 2 * 1024 * 1024
    async with pair(  # (close_timeout: closing with unsent data and a peer that reads none)
        driver,
        "mplex",
        close_timeout=1.0,
        server_options={"max_session_memory": budget, "receive_window": 4 * budget},
    ) as (client, server):
        chan = await client.open("flood")
        held = await server.accept()  # never read (kept: a writer collected would close it)
        sent = 0

        async def flood() -> None:
            nonlocal sent
            chunk = bytes(64 * 1024)
            while True:
                await chan.send(chunk)
                sent += len(chunk)

        task = asyncio.ensure_future(flood())
        try:
            async with asyncio.timeout(10):
                while server.core.reading:  # noqa: ASYNC110 - the core's state has no event
                    await asyncio.sleep(0.01)
            assert server.core.budget.held <= budget + 256 * 1024
            assert held.inner is not None
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@pytest.mark.parametrize("driver", DRIVERS)
async def test_keepalive_ends_a_session_whose_peer_stops_answering(driver: str) -> None:
    """The server's peer (our client) goes silent (its reading and its keepalive stop):
    the server's keepalive ends the session within interval + timeout."""
    async with pair(
        driver, "yamux", server_options={"keepalive_interval": 0.2, "keepalive_timeout": 0.2}
    ) as (client, server):
        core = client.core
        core.receive_data = lambda data, now: None  # type: ignore[method-assign]  # deaf from now on
        async with asyncio.timeout(10):
            await server.closed()
        assert "keepalive" in str(server.error)


@pytest.mark.parametrize("protocol", ("mstream-v3", "yamux"))
@pytest.mark.parametrize("driver", DRIVERS)
async def test_many_writers_waiting_for_credit_do_not_stall_the_session(driver: str, protocol: str) -> None:
    """256 channels write 1 MiB each to a peer that reads them all: their unsent bytes
    (tens of MiB, waiting for credit) must not stop the session from reading the very credit
    they wait for (it deadlocked when unsent bytes counted towards the reading budget)."""
    async with pair(driver, protocol) as (client, server):

        async def sink() -> None:
            chan = await server.accept()
            assert len(await chan.recv_all()) == 1024 * 1024
            await chan.send_eof()

        async def one(i: int) -> None:
            chan = await client.open(f"c{i}")
            for _ in range(4):
                await chan.send(bytes(256 * 1024))
            await chan.send_eof()
            assert await chan.recv_all() == b""

        async with asyncio.timeout(40):
            await asyncio.gather(*(sink() for _ in range(256)), *(one(i) for i in range(256)))


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_server_session_whose_peer_sends_nothing_ends_at_handshake_timeout(driver: str) -> None:
    """A server's session (is_client=False) of a format without a handshake whose peer says
    nothing ends at handshake_timeout (its first-frame deadline), in both drivers; the
    client's side, silent too, has no such deadline of its own."""
    async with pair(driver, "mplex", server_options={"handshake_timeout": 0.3}) as (client, server):
        async with asyncio.timeout(10):
            await server.closed()
        assert "not one whole frame from the peer within 0.3 s (handshake_timeout)" in str(server.error)
        async with asyncio.timeout(10):
            await client.closed()  # the server's close reaches the client: its own end
        assert "handshake_timeout" not in str(client.error)


# -- omnistreams: one-way streams, stream pairs, control messages --------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
async def test_the_wrong_half_of_a_one_way_stream_fails_clearly(driver: str) -> None:
    """A plain omnistreams stream carries data from its opener to its acceptor: the
    opener's read and the acceptor's write fail, saying so (never a silent EOF or a hang);
    the right direction works."""
    async with pair(driver, "omnistreams") as (client, server):
        chan = await client.open_one_way("one-way")
        with pytest.raises((polymux.ChannelClosedError, anyio.BrokenResourceError)) as info:
            async with asyncio.timeout(10):
                await chan.recv()
        assert "is send-only" in str(info.value)
        peer = await server.accept()
        with pytest.raises((polymux.ChannelClosedError, anyio.BrokenResourceError)) as info:
            async with asyncio.timeout(10):
                await peer.send(b"nope")
        assert "is receive-only" in str(info.value)
        await chan.send(b"data")
        await chan.send_eof()
        async with asyncio.timeout(10):
            assert await peer.recv_all() == b"data"


@pytest.mark.parametrize("driver", DRIVERS)
async def test_stream_pairs_half_close_and_close_both_streams(driver: str) -> None:
    """An omnistreams pair: each side's end of writing ends one stream (the other goes on);
    closing the pair ends both streams on both sides (no stream left in either engine)."""
    async with pair(driver, "omnistreams") as (client, server):
        chan = await client.open("chat")
        peer = await server.accept()
        async with asyncio.timeout(10):
            await chan.send(b"hello")
            assert await peer.recv(5) == b"hello"
            await chan.send_eof()
            assert await peer.recv() == b""
            await peer.send(b"still open")
            assert await chan.recv(10) == b"still open"
            await peer.send_eof()
            assert await chan.recv() == b""
            await chan.close()
            await peer.close()
            while client.core.engine.channel_count or server.core.engine.channel_count:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert not client.core.pairs.handles and not client.core.channels and not server.core.channels


@pytest.mark.parametrize("driver", DRIVERS)
async def test_pairs_one_after_another_beyond_the_accept_backlog(driver: str) -> None:
    """Our answered pairs never count in our accept backlog (the peer's half of each is
    ours, not an incoming channel): twice accept_backlog pairs in a row on sessions that
    take incoming channels with accept (on asyncio the fifth used to hang)."""
    async with pair(driver, "omnistreams", accept_backlog=4) as (client, server):

        async def serve() -> None:
            for _ in range(8):
                peer = await server.accept()
                await peer.send(await peer.recv_all())
                await peer.close()

        serving = asyncio.ensure_future(serve())
        async with asyncio.timeout(20):
            for i in range(8):
                chan = await client.open(f"p{i}")
                await chan.send(b"%d" % i)
                await chan.send_eof()
                assert await chan.recv_all() == b"%d" % i
                await chan.close()
            await serving
        assert client.core.table.untaken == 0 and server.core.table.untaken == 0


@pytest.mark.parametrize("driver", DRIVERS)
async def test_control_messages_both_ways_until_the_session_ends(driver: str) -> None:
    async with pair(driver, "omnistreams") as (client, server):
        async with asyncio.timeout(10):
            client.send_control(b"hello")
            client.send_control(b"")
            assert await server.receive_control() == b"hello"
            assert await server.receive_control() == b""
            server.send_control(b"\x00\xff")
            assert await client.receive_control() == b"\x00\xff"
            pending = asyncio.ensure_future(server.receive_control())
            await asyncio.sleep(0)
            await client.aclose()
            with pytest.raises(polymux.SessionClosed):
                await pending


@pytest.mark.parametrize("driver", DRIVERS)
async def test_control_messages_need_the_format(driver: str) -> None:
    async with pair(driver, "yamux") as (client, _server):
        with pytest.raises(polymux.PolymuxError, match="yamux has no control messages"):
            client.send_control(b"x")


# -- requests --------------------------------------------------------------------------------------


async def reverse_echo(server: Side, count: int) -> None:
    """Answer ``count`` requests: everything the request sent, reversed."""

    async def one() -> None:
        chan = await server.accept()
        data = await chan.recv_all()
        await chan.send(data[::-1])
        await chan.send_eof()

    await asyncio.gather(*(one() for _ in range(count)))


@pytest.mark.parametrize("protocol", ("streamux", "yamux", "mstream-v3", "mplex", "smux-v2"))
@pytest.mark.parametrize("driver", DRIVERS)
async def test_requests_return_the_whole_answer(driver: str, protocol: str) -> None:
    """request(): 16 at once, up to 1 MiB each way (beyond every window: credit must come
    back while the answer is collected). (Not an empty body: on Streamux an empty request
    is a ping, answered by the peer's session itself.)"""
    async with pair(driver, protocol) as (client, server):
        bodies = [os.urandom(size) for size in (1, 1000, 65_536, 300_000, 1024 * 1024)] * 4
        bodies = bodies[:16]
        async with asyncio.timeout(30):
            serving = asyncio.ensure_future(reverse_echo(server, len(bodies)))
            answers = await asyncio.gather(*(client.request(body, f"r{i}") for i, body in enumerate(bodies)))
            await serving
        assert answers == [body[::-1] for body in bodies]


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_request_answer_past_its_limit_fails_and_the_session_goes_on(driver: str) -> None:
    async with pair(driver, "yamux") as (client, server):
        async with asyncio.timeout(10):
            serving = asyncio.ensure_future(reverse_echo(server, 1))
            with pytest.raises(polymux.LimitExceeded, match="the answer exceeds limit=499 bytes"):
                await client.request(bytes(500), limit=499)
            with contextlib.suppress(polymux.PolymuxError, ConnectionError, anyio.BrokenResourceError):
                await serving  # its answer was cut by the reset
            serving = asyncio.ensure_future(reverse_echo(server, 1))
            assert await client.request(b"abc", limit=3) == b"cba"
            await serving


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_refused_request_raises_the_refusal(driver: str) -> None:
    async with pair(driver, "mstream-v3", offer_filter=lambda name: name != "nope") as (client, _server):
        with pytest.raises(polymux.ChannelRejected):
            async with asyncio.timeout(10):
                await client.request(b"q", "nope")


@pytest.mark.parametrize("driver", DRIVERS)
async def test_cancelling_a_request_resets_its_channel(driver: str) -> None:
    """Cancelling the call resets the request on the wire: the serving side sees the
    reset; the client keeps no channel for it."""
    async with pair(driver, "yamux") as (client, server):
        task = asyncio.ensure_future(client.request(b"question"))
        async with asyncio.timeout(10):
            peer = await server.accept()
            assert await peer.recv_all() == b"question"  # the request and its end
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not client.core.channels and not client.core.requests.answers
            while server.core.channels:  # noqa: ASYNC110 - the core's state has no event
                await asyncio.sleep(0.01)
            with pytest.raises((polymux.ChannelReset, anyio.BrokenResourceError)) as info:
                await peer.send(b"too late")
        reset = info.value if driver == "asyncio" else info.value.__cause__
        assert isinstance(reset, polymux.ChannelReset)


@pytest.mark.parametrize("driver", DRIVERS)
async def test_no_requests_on_one_way_streams(driver: str) -> None:
    async with pair(driver, "omnistreams") as (client, _server):
        with pytest.raises(polymux.ChannelClosedError, match="a request has no way back"):
            await client.request(b"q")


# -- what tasks wait for (session/waiters.py): the same on both drivers ---------------------------


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the session's state has no event
            await asyncio.sleep(0.01)


class RawYamux:
    """A yamux peer on 127.0.0.1 driven by the test: it records the streams opened to it,
    acknowledges one when told (``ack``), and never answers a ping."""

    def __init__(self) -> None:
        self.syns: list[int] = []
        self.server: asyncio.Server | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        if self.writer is not None:
            self.writer.transport.abort()
        self.server.close()
        await asyncio.wait_for(self.server.wait_closed(), 10)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        decoder = Decoder(1 << 24)
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    if frame.type in (Type.DATA, Type.WINDOW_UPDATE) and frame.flags & Flag.SYN:
                        self.syns.append(frame.stream_id)

    def send(self, frame: bytes) -> None:
        assert self.writer is not None
        self.writer.write(frame)

    def ack(self, stream_id: int) -> None:
        self.send(encode_header(Type.WINDOW_UPDATE, Flag.ACK, stream_id, 0))

    def go_away(self) -> None:
        self.send(encode_header(Type.GO_AWAY, 0, 0, GoAwayCode.NORMAL))

    def cut(self) -> None:
        """The connection is gone (reset)."""
        assert self.writer is not None
        self.writer.transport.abort()


@contextlib.asynccontextmanager
async def client_of(driver: str, peer: RawYamux, **options: Any) -> AsyncIterator[Side]:
    """A yamux client session to ``peer``, run by ``driver`` (no keepalive: the peer never
    answers a ping)."""
    options = {"keepalive_interval": None, **options}
    if driver == "asyncio":
        session = await polymux.connect("127.0.0.1", peer.port, protocol="yamux", **options)
        try:
            yield Side(session)
        finally:
            session.abort()
        return
    async with (
        await anyio.connect_tcp("127.0.0.1", peer.port) as stream,
        pmanyio.session(stream, protocol="yamux", **options) as session,
    ):
        yield Side(session)


def channel_id(chan: Chan) -> str:
    """The wire id of a channel of ours, from its label ("channel 3 (local, 'a')")."""
    if isinstance(chan.inner, tuple):
        label = chan.inner[1].get_extra_info("channel")
    else:
        label = chan.inner.extra(pmanyio.ChannelAttribute.channel)
    return str(label).split()[1]


@pytest.mark.parametrize("driver", DRIVERS)
async def test_waiting_opens_go_in_order_one_per_acknowledgement(driver: str) -> None:
    """With ``max_unacked_opens`` of our opens unacknowledged, opens wait first come, first
    served, and each acknowledgement lets exactly one more go (anyio used to wake them all
    to race for it)."""
    async with RawYamux() as peer, client_of(driver, peer, max_unacked_opens=1) as client:
        await client.open_one_way("a")
        waiting = []
        for i in range(3):
            waiting.append(asyncio.ensure_future(client.open_one_way(f"w{i}")))
            await until(lambda: len(client.waiters.room.waiting) == len(waiting))
        for sid, task in zip((1, 3, 5), waiting, strict=True):
            peer.ack(sid)
            chan = await asyncio.wait_for(task, 10)
            assert channel_id(chan) == str(sid + 2)
            assert sum(t.done() for t in waiting) == waiting.index(task) + 1  # one at a time
        await until(lambda: peer.syns == [1, 3, 5, 7])


@pytest.mark.parametrize("driver", DRIVERS)
async def test_an_open_that_comes_while_room_is_given_waits_behind(driver: str) -> None:
    """Room freed for the first waiting open is its own: an open that starts before that
    one has run goes behind it (it used to take the room and send the waiting one back)."""
    async with RawYamux() as peer, client_of(driver, peer, max_unacked_opens=1) as client:
        first = await client.open_one_way("a")
        waiting = asyncio.ensure_future(client.open_one_way("waited"))
        await until(lambda: len(client.waiters.room.waiting) == 1)
        late = asyncio.ensure_future(client.open_one_way("late"))  # starts before `waiting` runs
        await first.reset()  # (no await inside: room for one, now)
        chan = await asyncio.wait_for(waiting, 10)
        assert channel_id(chan) == "3" and not late.done()
        await until(lambda: len(client.waiters.room.waiting) == 1)
        peer.ack(3)
        assert channel_id(await asyncio.wait_for(late, 10)) == "5"


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_waiting_open_has_no_deadline_of_its_own(
    driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One timeout rule on both drivers, the core's: an open the peer does not acknowledge
    within ``stream_open_timeout`` is reset, and the room it frees fails the first waiting
    open (tests/aio/test_yamux_unacked_opens.py, tests/anyio_tests). anyio used to add its
    own: an open that had waited ``stream_open_timeout`` failed, whoever held the room.
    Here the core's clock stands still, so its rule cannot fire: the waiting open outlives
    five ``stream_open_timeout`` of real time, and opens once the peer acknowledges."""
    async with (
        RawYamux() as peer,
        client_of(driver, peer, max_unacked_opens=1, stream_open_timeout=0.2) as client,
    ):
        frozen = client.core.now
        monkeypatch.setattr(aio_session if driver == "asyncio" else pmanyio, "_clock", lambda: frozen)
        await client.open_one_way("a")
        waiting = asyncio.ensure_future(client.open_one_way("b"))
        await until(lambda: len(client.waiters.room.waiting) == 1)
        await asyncio.sleep(1.0)  # the time that passes is the subject here
        assert not waiting.done()
        peer.ack(1)
        assert channel_id(await asyncio.wait_for(waiting, 10)) == "3"


@pytest.mark.parametrize("driver", DRIVERS)
async def test_every_wait_fails_with_one_session_closed_when_the_connection_is_lost(driver: str) -> None:
    """A ping, an open waiting for room and an accept, all waiting when the connection goes:
    one SessionClosed, the same text on both drivers (they differed: 'session ended: ...' for
    some, 'the session is closed' for others)."""
    async with RawYamux() as peer, client_of(driver, peer, max_unacked_opens=1) as client:
        await client.open_one_way("a")
        waits = [
            asyncio.ensure_future(client.ping()),
            asyncio.ensure_future(client.open_one_way("b")),
            asyncio.ensure_future(client.accept()),
        ]
        waiters = client.waiters
        await until(lambda: bool(waiters.pings.waiting and waiters.room.waiting and waiters.incoming.waiting))
        peer.cut()
        errors = []
        for task in waits:
            with pytest.raises(polymux.SessionClosed) as info:
                await asyncio.wait_for(task, 10)
            errors.append(str(info.value))
        assert len(set(errors)) == 1 and errors[0].startswith("yamux: session ended: "), errors
        with pytest.raises(polymux.SessionClosed) as info:
            await asyncio.wait_for(client.accept(), 10)  # and every wait begun later
        assert str(info.value) == errors[0]


@pytest.mark.parametrize("driver", DRIVERS)
async def test_an_accept_waits_through_the_peers_go_away_until_the_end(driver: str) -> None:
    """After the peer's GoAway an accept still waits, until the connection is gone (the
    asyncio driver's raised at once: a server iterating its session then closed while the
    peer was still closing, and the peer saw a reset)."""
    async with RawYamux() as peer, client_of(driver, peer) as client:
        peer.go_away()
        await until(lambda: client.core.peer_goaway is not None)
        accept = asyncio.ensure_future(client.accept())
        await until(lambda: len(client.waiters.incoming.waiting) == 1)
        peer.cut()
        with pytest.raises(polymux.SessionClosed, match="session ended"):
            await asyncio.wait_for(accept, 10)


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_control_message_for_a_reader_cancelled_before_it_ran_goes_to_the_next(driver: str) -> None:
    """A message given to a receive_control() cancelled before it could return it is not
    lost (asyncio lost it): the next reader gets it."""
    async with pair(driver, "omnistreams") as (_client, server):
        first = asyncio.ensure_future(server.receive_control())
        second = asyncio.ensure_future(server.receive_control())
        await until(lambda: len(server.waiters.control.waiting) == 2)
        core = server.core
        core.controls.arrived(b"only one")  # as a read of the peer's message does it
        core.emit(ce.ControlArrived())
        server.process()
        first.cancel()  # before it ran
        assert await asyncio.wait_for(second, 10) == b"only one"
        assert first.cancelled()

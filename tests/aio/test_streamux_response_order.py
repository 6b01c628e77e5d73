"""Streamux: a response never goes on the wire before its request has ended.

go-streamux fails the session on a response chunk for a request it is still sending
("Cannot receive response N: Message has not been completely sent"); the spec's flow is
request, then response. Streamux has no credit on the wire, so the server holds what the
handler writes until the request ends, and the handler's ``drain()`` does not block
meanwhile (an echo handler that stopped reading would never see the request end), up to
``streamux_response_hold`` per response and ``streamux_hold_budget`` per session; past
them the channel is reset (the handler gets :class:`polymux.ChannelOverflow`, the
requester an empty response).

The order is checked on the server's own wire: :class:`OrderProbe` is the server
session's capture sink, so it sees every byte the server received and sent in the order
the session handled them, and decodes both streams as they pass (no payload is kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import polymux
from polymux._types import BytesLike
from polymux.wire import streamux as wire

from .test_streamux_session import Serve, spy_sessions, wait


KiB = 1024
MiB = 1024 * KiB


class OrderProbe:
    """A capture sink that decodes both directions of a Streamux session as they pass and
    notes every response chunk (data or termination; not a cancel ack) sent for a request
    whose terminating chunk had not been received yet."""

    def __init__(self) -> None:
        self.init: dict[str, bytearray] = {"in": bytearray(), "out": bytearray()}
        self.early: list[str] = []
        self.open: set[int] = set()  # the peer's requests still arriving
        self.pings: set[int] = set()  # the peer's pings not answered yet
        self.ended = 0  # request terminations received
        self.responses = 0  # response chunks sent
        self.response_bytes = 0
        self.closed = False
        self._pending: dict[str, list[bytes]] = {"in": [], "out": []}
        self._decoders: dict[str, wire.Decoder] = {}

    def received(self, data: BytesLike) -> None:
        self._feed("in", bytes(data))

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        for part in chunks:
            self._feed("out", bytes(part))

    def close(self) -> None:
        self.closed = True

    def _feed(self, way: str, data: bytes) -> None:
        head = self.init[way]
        if len(head) < wire.INIT_SIZE:
            take = wire.INIT_SIZE - len(head)
            head += data[:take]
            data = data[take:]
            if len(self.init["in"]) == len(self.init["out"]) == wire.INIT_SIZE:
                n = wire.negotiate(wire.decode_init(self.init["out"]), wire.decode_init(self.init["in"]))
                self._decoders = {w: wire.Decoder(n, stream_bodies=True) for w in ("in", "out")}
                for w, held in self._pending.items():
                    for piece in held:
                        self._chunks(w, piece)
        if not data:
            return
        if not self._decoders:
            self._pending[way].append(data)  # the other side's initialize message is not in yet
            return
        self._chunks(way, data)

    def _chunks(self, way: str, data: bytes) -> None:
        for c in self._decoders[way].feed(data):
            n = len(c.payload)
            if way == "in":
                if c.response:
                    continue
                if c.termination or n == 0:  # the end, a ping, or a cancel
                    if c.termination and c.id in self.open:
                        self.ended += 1
                    elif c.termination and n == 0:
                        self.pings.add(c.id)
                    self.open.discard(c.id)
                else:
                    self.open.add(c.id)
            elif c.response and n == 0 and c.termination and c.id in self.pings:
                self.pings.discard(c.id)  # a ping's answer
            elif c.response and (n or c.termination):
                if c.id in self.open:
                    self.early.append(f"response chunk ({n} bytes) for request {c.id} before its end")
                self.responses += 1
                self.response_bytes += n


def probe_factory(probes: list[OrderProbe]) -> Any:
    def factory(info: Mapping[str, str]) -> OrderProbe:
        probe = OrderProbe()
        probes.append(probe)
        return probe

    return factory


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The handler of the issue: write each piece as it is read."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


def guarded(handler: Any, errors: list[BaseException]) -> Any:
    """``handler``, with the ConnectionError it ends with kept in ``errors``."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except ConnectionError as exc:
            errors.append(exc)

    return run


def key(i: int) -> bytes:
    return f"request-{i:04d}:".encode()


async def send_and_digest(session: polymux.Session, i: int, base: bytes) -> tuple[int, str]:
    """Send ``key(i) + base`` as one request (the big part by reference: no copy per
    request); return the response's size and SHA-256 (read as it comes, not kept)."""
    reader, writer = await session.open_channel()
    writer.write(key(i))
    writer.write(base)
    writer.write_eof()
    digest = hashlib.sha256()
    size = 0
    while data := await reader.read(1 * MiB):
        digest.update(data)
        size += len(data)
    writer.close()
    return size, digest.hexdigest()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("count", "size"), [(1, 64 * MiB), (64, 4 * MiB)], ids=["1x64MiB", "64x4MiB"])
async def test_echo_answers_only_after_the_request_ends(serve: Serve, count: int, size: int) -> None:
    """The issue's two transfers: everything echoed, and on the server's wire no response
    chunk for a request before that request's terminating chunk. An echo holds every byte
    of a response until its request ends, bounded by streamux_response_hold (64 MiB) and
    streamux_hold_budget (64 MiB by default: 1 x 64 MiB runs with default settings; 64 x 4
    MiB, all held at once, is given 256 MiB), never by max_session_memory."""
    probes: list[OrderProbe] = []
    room = {} if count == 1 else {"streamux_hold_budget": 256 * MiB}
    server = await serve(echo, protocol="streamux", capture=probe_factory(probes), **room)
    sessions = spy_sessions(server)
    base = bytes(range(256)) * ((size - len(key(0))) // 256)
    base += b"\x00" * (size - len(key(0)) - len(base))
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        results = await wait(asyncio.gather(*(send_and_digest(session, i, base) for i in range(count))), 100)
        for i, (got_size, digest) in enumerate(results):
            assert got_size == size
            assert digest == hashlib.sha256(key(i) + base).hexdigest()
        assert session.exception is None
    (probe,) = probes
    assert probe.early == []
    assert probe.ended == count
    assert probe.response_bytes == count * size
    assert probe.responses >= count * size // 65535  # the responses did go through the probe
    assert [s.exception for s in sessions] == [None]


@pytest.mark.timeout(60)
async def test_probe_sees_a_response_sent_before_the_request_ends(serve: Serve) -> None:
    """The probe itself: a raw server that answers early is caught."""
    probe = OrderProbe()
    n = wire.Negotiated(14, 16)
    probe.sent([wire.encode_init(wire.InitMessage())])
    probe.received(wire.encode_init(wire.InitMessage()))
    probe.received(wire.encode_header(n, 3, 2, False, False) + b"hi")
    probe.sent([wire.encode_header(n, 3, 2, True, False), b"hi"])
    probe.received(wire.encode_header(n, 3, 0, False, True))
    probe.sent([wire.encode_header(n, 3, 0, True, True)])
    assert probe.early == ["response chunk (2 bytes) for request 3 before its end"]
    assert probe.ended == 1 and probe.responses == 2


@pytest.mark.timeout(60)
async def test_a_response_over_streamux_response_hold_is_reset(serve: Serve) -> None:
    """Past ``streamux_response_hold`` the handler gets ChannelOverflow naming the limit,
    the requester an empty response once its request ended; the session goes on."""
    probes: list[OrderProbe] = []
    errors: list[BaseException] = []
    server = await serve(
        guarded(echo, errors),
        protocol="streamux",
        capture=probe_factory(probes),
        streamux_response_hold=1 * MiB,
    )
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        base = b"x" * (3 * MiB)
        assert await wait(send_and_digest(session, 0, base)) == (0, hashlib.sha256(b"").hexdigest())
        [error] = errors
        assert isinstance(error, polymux.ChannelOverflow)
        assert str(error).startswith("streamux: channel ")
        assert "was reset: the response to request " in str(error)
        assert "bytes exceed streamux_response_hold=1048576" in str(error)
        # a smaller one still goes through
        small = b"y" * (512 * KiB)
        size, digest = await wait(send_and_digest(session, 1, small))
        assert (size, digest) == (len(key(1)) + len(small), hashlib.sha256(key(1) + small).hexdigest())
        assert session.exception is None
    (probe,) = probes
    assert probe.early == []
    assert probe.ended == 2


@pytest.mark.timeout(60)
async def test_responses_over_streamux_hold_budget_are_reset(serve: Serve) -> None:
    """Three echoes of 600 KiB at once against a 1 MiB session budget: the response whose
    writes pass it is reset (an empty answer), the others are echoed whole."""
    probes: list[OrderProbe] = []
    errors: list[BaseException] = []
    server = await serve(
        guarded(echo, errors),
        protocol="streamux",
        capture=probe_factory(probes),
        streamux_hold_budget=1 * MiB,
        streamux_response_hold=1 * MiB,
    )
    base = b"z" * (600 * KiB)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        results = await wait(asyncio.gather(*(send_and_digest(session, i, base) for i in range(3))))
        empty = [r for r in results if r[0] == 0]
        assert 1 <= len(empty) <= 2
        for i, result in enumerate(results):
            if result[0]:
                assert result == (len(key(i)) + len(base), hashlib.sha256(key(i) + base).hexdigest())
        assert len(errors) == len(empty)
        for error in errors:
            assert isinstance(error, polymux.ChannelOverflow)
            assert "held by the session's responses exceed streamux_hold_budget=1048576" in str(error)
        assert session.exception is None
    (probe,) = probes
    assert probe.early == []
    assert probe.ended == 3


@pytest.mark.timeout(60)
async def test_a_handler_answering_a_request_that_never_ends_is_bounded(serve: Serve) -> None:
    """The requester never ends its request while the handler writes without reading:
    nothing goes out, the handler's writes stop at streamux_response_hold (ChannelOverflow),
    and the requester's reader sees no byte; its end then gets the empty response."""
    probes: list[OrderProbe] = []
    errors: list[BaseException] = []
    written = [0]

    async def talker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        piece = bytes(256 * KiB)
        try:
            while written[0] < 64 * MiB:  # a bound, should the reset never come
                writer.write(piece)
                written[0] += len(piece)
                await writer.drain()
        except ConnectionError as exc:
            errors.append(exc)

    server = await serve(
        talker, protocol="streamux", capture=probe_factory(probes), streamux_response_hold=2 * MiB
    )
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        reader, writer = await wait(session.open_channel())
        writer.write(b"a request that goes on")
        await wait(writer.drain())
        while not errors:
            await asyncio.sleep(0.01)
            assert written[0] < 64 * MiB
        [error] = errors
        assert isinstance(error, polymux.ChannelOverflow)
        assert "streamux_response_hold=2097152" in str(error)
        assert written[0] <= 2 * MiB + 256 * KiB
        assert not reader.at_eof() and not reader._buffer  # type: ignore[attr-defined]
        writer.write(b" and ends")
        writer.write_eof()
        assert await wait(reader.read()) == b""
        writer.close()
        assert session.exception is None
    (probe,) = probes
    assert probe.early == []
    assert probe.response_bytes == 0 and probe.responses == 1  # the empty termination


# -- the anyio I/O layer: its writer waits for credit, so the request is read on -----------


async def anyio_streamux_server(
    errors: list[BaseException], probes: list[OrderProbe], **options: Any
) -> tuple[int, Any]:
    """An anyio session (polymux.anyio) serving one connection on 127.0.0.1 with an echo
    handler (receive a chunk, send it: the send waits while the request is still arriving);
    returns the port and the task serving it."""
    import anyio
    from anyio.abc import SocketAttribute

    import polymux.anyio as pma

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)

    async def echo_channel(channel: Any) -> None:
        try:
            async for chunk in channel:
                await channel.send(chunk)
            await channel.send_eof()
        except anyio.BrokenResourceError as exc:
            errors.append(exc.__cause__ or exc)

    async def serve() -> None:
        async with listener:
            stream = await listener.listeners[0].accept()
        async with (
            stream,
            pma.session(
                stream, protocol="streamux", is_client=False, capture=probe_factory(probes), **options
            ) as server,
            anyio.create_task_group() as tg,
        ):
            async for channel in server:
                tg.start_soon(echo_channel, channel)

    return port, asyncio.ensure_future(serve())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("size", "hold"), [(8 * MiB, None), (4 * MiB, 2 * MiB)], ids=["echo", "over-hold"])
async def test_anyio_server_reads_the_request_on(size: int, hold: int | None) -> None:
    """The anyio session's echo handler waits in ``send`` until the request ends: the
    session reads the request on past ``receive_window`` (1 MiB) instead of stopping the
    connection (which would never let it end), up to ``streamux_response_hold``."""
    probes: list[OrderProbe] = []
    errors: list[BaseException] = []
    options = {} if hold is None else {"streamux_response_hold": hold}
    port, serving = await anyio_streamux_server(errors, probes, **options)
    try:
        base = bytes(range(256)) * (size // 256)
        async with await wait(polymux.connect("127.0.0.1", port, protocol="streamux")) as session:
            got = await wait(send_and_digest(session, 0, base), 30)
        if hold is None:
            assert got == (len(key(0)) + size, hashlib.sha256(key(0) + base).hexdigest())
            assert errors == []
        else:
            assert got == (0, hashlib.sha256(b"").hexdigest())  # reset: an empty response
            [error] = errors
            assert isinstance(error, polymux.ChannelOverflow)
            assert "bytes exceed streamux_response_hold=2097152" in str(error)
        (probe,) = probes
        assert probe.early == []
        assert probe.ended == 1
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await serving


@pytest.mark.timeout(60)
async def test_a_response_beyond_its_hold_limit_is_reset_not_stalled(serve: Serve) -> None:
    """With default settings, an echo of a request larger than streamux_response_hold
    (64 MiB) cannot hold its whole response: the handler's channel is reset with
    ChannelOverflow naming the limit and how to raise it (reading the request goes on: no
    stall), the requester gets an empty response, and the session carries the next
    request as usual."""
    errors: list[BaseException] = []
    server = await serve(guarded(echo, errors), protocol="streamux")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="streamux")) as session:
        # 72 MiB: the handler reads at most about receive_window behind the session (its
        # slow-reader policy), so it has echoed more than 64 MiB before the request ends.
        size, _digest = await wait(send_and_digest(session, 0, bytes(72 * MiB)), 30)
        assert size == 0
        size, digest = await wait(send_and_digest(session, 1, b"after"), 10)
        assert (size, digest) == (len(key(1)) + 5, hashlib.sha256(key(1) + b"after").hexdigest())
    assert len(errors) == 1 and isinstance(errors[0], polymux.ChannelOverflow), errors
    assert "exceed streamux_response_hold=67108864 (raise it" in str(errors[0])

"""``ChannelProtocols``: incoming channels served by a plain asyncio protocol each (no
reader, writer or task): data and end-of-writing both ways, names, credit withheld by
``pause_reading`` and returned on ``resume_reading``, a protocol that raises resets only
its own channel, and one-way formats refused before anything listens."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import pytest

import polymux
from polymux import formats
from polymux.aio.channel import ChannelTransport

from .helpers import until


T = TypeVar("T")

# Every two-way format that has per-channel flow control or not, one of each family.
FORMATS = ["mstream-v1", "mstream-v3", "mplex", "yamux", "smux", "streamux"]
CREDIT_FORMATS = ["mstream-v3", "yamux", "smux-v2"]

Serve = Callable[..., Awaitable[polymux.Server]]


async def wait(aw: Awaitable[T], timeout: float = 5) -> T:  # noqa: ASYNC109
    return await asyncio.wait_for(aw, timeout)


class Echo(asyncio.Protocol):
    """Echo every chunk; answer end-of-writing with our own; record what was seen."""

    made: ClassVar[list[Echo]] = []

    def __init__(self) -> None:
        self.transport: ChannelTransport | None = None
        self.received = 0
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        Echo.made.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, ChannelTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if data.startswith(b"boom"):
            raise RuntimeError("boom requested")
        self.received += len(data)
        self.transport.write(data)

    def eof_received(self) -> bool:
        assert self.transport is not None
        self.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


@pytest.fixture(autouse=True)
def _fresh_echo_list() -> None:
    Echo.made = []


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", FORMATS)
async def test_incoming_channels_get_a_protocol_each(serve: Serve, protocol: str) -> None:
    server = await serve(polymux.ChannelProtocols(Echo), protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        # (Streamux: an empty request is a ping, answered without reaching the application.)
        payloads = [os.urandom(n) for n in (0 if protocol != "streamux" else 2, 1, 300_000)]

        async def one(i: int, payload: bytes) -> bytes:
            reader, writer = await wait(client.open_channel(name=f"ch{i}"))
            writer.write(payload)
            writer.write_eof()
            await wait(writer.drain())
            back = await wait(reader.read(), 10)
            writer.close()
            return back

        results = await asyncio.gather(*(one(i, p) for i, p in enumerate(payloads)))
        assert results == payloads
        assert len(Echo.made) == 3
        names = set()
        for proto in Echo.made:
            assert proto.transport is not None
            names.add(proto.transport.get_extra_info("channel_name"))
            assert await wait(proto.lost) is None
        if formats.get(protocol).caps.names:
            assert names == {"ch0", "ch1", "ch2"}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", CREDIT_FORMATS)
async def test_pause_reading_withholds_credit_until_resumed(serve: Serve, protocol: str) -> None:
    window = 256 * 1024

    class Paused(Echo):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            assert self.transport is not None
            self.transport.pause_reading()

        def data_received(self, data: bytes) -> None:
            self.received += len(data)  # a sink: nothing written back

    # yamux's windows are its own (256 KiB at first): receive_window is refused there.
    options = {} if protocol == "yamux" else {"receive_window": window}
    server = await serve(polymux.ChannelProtocols(Paused), protocol=protocol, **options)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol, **options)) as client:
        _, writer = await wait(client.open_channel())
        payload = os.urandom(8 * window)
        writer.write(payload)
        drained = asyncio.ensure_future(writer.drain())
        # The peer got at most its window (plus its initial one for yamux, 256 KiB
        # whatever is configured) and cannot be given more while paused.
        await until(lambda: bool(Echo.made) and Echo.made[0].received >= window // 2)
        proto = Echo.made[0]
        # Whatever the peer does meanwhile, the paused side cannot give more credit.
        done, _ = await asyncio.wait([drained], timeout=0.2)
        assert not done
        assert proto.received <= 2 * window
        assert proto.transport is not None
        proto.transport.resume_reading()
        await wait(drained, 10)
        writer.write_eof()
        await until(lambda: proto.received >= len(payload))
        assert proto.received == len(payload)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", ["mstream-v3", "mplex", "yamux", "smux"])
async def test_a_protocol_that_raises_resets_only_its_channel(
    serve: Serve, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = await serve(polymux.ChannelProtocols(Echo), protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        good_r, good_w = await wait(client.open_channel(name="good"))
        bad_r, bad_w = await wait(client.open_channel(name="bad"))
        bad_w.write(b"boom")
        await wait(bad_w.drain())
        if protocol == "smux":  # smux has no reset: the channel ends with a FIN
            assert await wait(bad_r.read()) == b""
        else:
            with pytest.raises(ConnectionError):
                while await wait(bad_r.read(65536)):
                    pass
        good_w.write(b"still here")
        await wait(good_w.drain())
        assert await wait(good_r.readexactly(10)) == b"still here"
        good_w.write_eof()  # the session's graceful close then has nothing to wait for
        assert await wait(good_r.read()) == b""
        assert not client.is_closed
        assert "data_received" in caplog.text and "boom requested" in caplog.text


@pytest.mark.timeout(20)
@pytest.mark.parametrize("where", ["factory", "connection_made"])
async def test_a_protocol_that_fails_to_start_resets_its_channel(serve: Serve, where: str) -> None:
    calls = 0

    class Failing(Echo):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("no")
            super().connection_made(transport)

    def factory() -> asyncio.BaseProtocol:
        nonlocal calls
        if where == "factory":
            calls += 1
            if calls == 1:
                raise RuntimeError("no")
            return Echo()
        return Failing()

    server = await serve(polymux.ChannelProtocols(factory), protocol="yamux")
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol="yamux")) as client:
        r1, w1 = await wait(client.open_channel())
        w1.write(b"x")
        with pytest.raises(ConnectionError):
            while await wait(r1.read(65536)):
                pass
        r2, w2 = await wait(client.open_channel())
        w2.write(b"fine")
        assert await wait(r2.readexactly(4)) == b"fine"
        w2.write_eof()
        assert await wait(r2.read()) == b""


@pytest.mark.timeout(10)
async def test_one_way_formats_refuse_channel_protocols_before_listening() -> None:
    one_way = [f.name for f in formats.FORMATS if f.caps.one_way]
    assert one_way
    for protocol in one_way:
        with pytest.raises(ValueError, match="ChannelProtocols cannot serve one-way"):
            await polymux.start_server(polymux.ChannelProtocols(Echo), "127.0.0.1", 0, protocol=protocol)


def test_repr_names_the_factory() -> None:
    def factory() -> Any:
        return None

    assert "factory" in repr(polymux.ChannelProtocols(factory))

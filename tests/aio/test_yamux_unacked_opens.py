"""yamux: at most ``SessionConfig.max_unacked_opens`` opened streams await the peer's ACK.

hashicorp/yamux resets every SYN that finds its accept backlog (256) full, and its own
``OpenStream`` blocks while 256 of its opens are un-ACKed. polymux's ``open_channel`` does
the same: beyond the bound it waits for room, in order, at most ``stream_open_timeout``
(then :class:`polymux.LimitExceeded`), and fails at once when the session ends or the peer
goes away meanwhile. (Against the real library: ``tests/interop/test_yamux_go_interop.py``.)

The peer here is a raw yamux server driven frame by frame by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Self

import pytest

import polymux
from polymux.wire.yamux import Decoder, Flag, Frame, GoAwayCode, Type, encode_header

from .helpers import until


pytestmark = pytest.mark.timeout(20)


class AckingPeer:
    """A raw yamux server: records every frame polymux sends; the test decides what it
    answers (``ack``, ``goaway``)."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.server: asyncio.Server | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._decoder = Decoder(1 << 24)

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        if self.writer is not None:
            self.writer.close()
        self.server.close()
        await asyncio.wait_for(self.server.wait_closed(), 5)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                self.frames += [f._replace(body=bytes(f.body)) for f in self._decoder.feed(data)]

    def syns(self) -> list[int]:
        """Stream ids polymux opened, in order."""
        return [
            f.stream_id
            for f in self.frames
            if f.type in (Type.DATA, Type.WINDOW_UPDATE) and f.flags & Flag.SYN
        ]

    def send(self, frame: bytes) -> None:
        assert self.writer is not None
        self.writer.write(frame)

    def ack(self, stream_id: int) -> None:
        self.send(encode_header(Type.WINDOW_UPDATE, Flag.ACK, stream_id, 0))


async def _connect(peer: AckingPeer, **options: object) -> polymux.Session:
    return await asyncio.wait_for(
        polymux.connect("127.0.0.1", peer.port, protocol="yamux", keepalive_interval=None, **options),  # type: ignore[arg-type]
        5,
    )


def test_the_default_is_hashicorps_accept_backlog() -> None:
    assert polymux.SessionConfig().max_unacked_opens == 256
    with pytest.raises(ValueError, match="max_unacked_opens"):
        polymux.SessionConfig(max_unacked_opens=0)


async def test_open_channel_waits_for_an_ack_beyond_the_bound_in_order() -> None:
    async with AckingPeer() as peer:
        session = await _connect(peer, max_unacked_opens=3)
        first = [await asyncio.wait_for(session.open_channel(), 1) for _ in range(3)]
        waiting = [asyncio.create_task(session.open_channel(f"w{i}")) for i in range(3)]
        await until(lambda: len(peer.syns()) == 3)
        assert not any(task.done() for task in waiting)  # no SYN beyond the bound
        # One ACK makes room for exactly one more open: the first that waited.
        peer.ack(peer.syns()[1])
        await asyncio.wait_for(waiting[0], 5)
        await until(lambda: len(peer.syns()) == 4)
        assert not waiting[1].done() and not waiting[2].done()
        # A stream that ends un-ACKed (reset by us) frees its place too.
        first[0][1].transport.abort()
        await asyncio.wait_for(waiting[1], 5)
        for sid in peer.syns():
            peer.ack(sid)
        await asyncio.wait_for(waiting[2], 5)
        await until(lambda: peer.syns() == [1, 3, 5, 7, 9, 11])
        session.abort()


async def test_a_peer_that_never_acknowledges_fails_the_waiting_open() -> None:
    """The wait is bounded: the oldest open is reset after ``stream_open_timeout``, and the
    slot it frees fails the first waiting open with a clear LimitExceeded."""
    async with AckingPeer() as peer:
        session = await _connect(peer, max_unacked_opens=2, stream_open_timeout=0.4)
        pairs = [await asyncio.wait_for(session.open_channel(), 1) for _ in range(2)]
        started = time.monotonic()
        with pytest.raises(
            polymux.LimitExceeded,
            match=r"max_unacked_opens=2 .*not acknowledged within stream_open_timeout=0.4 s",
        ):
            await asyncio.wait_for(session.open_channel(), 5)
        assert 0.35 <= time.monotonic() - started < 3
        for reader, _writer in pairs:
            with pytest.raises(polymux.ChannelReset, match="stream_open_timeout"):
                await asyncio.wait_for(reader.read(), 5)
        assert len(peer.syns()) == 2  # nothing was opened beyond the bound
        assert not session.is_closed  # only those opens failed
        await asyncio.wait_for(session.open_channel(), 1)  # the slots are free again
        await until(lambda: len(peer.syns()) == 3)
        session.abort()


async def test_waiting_opens_fail_when_the_peer_goes_away() -> None:
    async with AckingPeer() as peer:
        session = await _connect(peer, max_unacked_opens=1)
        await asyncio.wait_for(session.open_channel(), 1)
        waiting = asyncio.create_task(session.open_channel())
        await until(lambda: len(peer.syns()) == 1)
        peer.send(encode_header(Type.GO_AWAY, 0, 0, GoAwayCode.NORMAL))
        with pytest.raises(polymux.SessionClosed, match="going away"):
            await asyncio.wait_for(waiting, 5)
        assert len(peer.syns()) == 1
        session.abort()


async def test_waiting_opens_fail_when_the_session_ends() -> None:
    async with AckingPeer() as peer:
        session = await _connect(peer, max_unacked_opens=1)
        await asyncio.wait_for(session.open_channel(), 1)
        waiting = asyncio.create_task(session.open_channel())
        await until(lambda: len(peer.syns()) == 1)
        session.abort()
        with pytest.raises(polymux.SessionClosed):
            await asyncio.wait_for(waiting, 5)


async def test_a_cancelled_waiting_open_passes_its_turn_on() -> None:
    async with AckingPeer() as peer:
        session = await _connect(peer, max_unacked_opens=1)
        await asyncio.wait_for(session.open_channel(), 1)
        cancelled = asyncio.create_task(session.open_channel())
        behind = asyncio.create_task(session.open_channel())
        await until(lambda: len(peer.syns()) == 1)
        cancelled.cancel()
        peer.ack(1)
        await asyncio.wait_for(behind, 5)
        assert cancelled.cancelled()
        await until(lambda: peer.syns() == [1, 3])
        session.abort()

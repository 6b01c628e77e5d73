"""polymux.anyio, yamux: at most ``max_unacked_opens`` opened streams await the peer's ACK
(as in the asyncio session: ``tests/aio/test_yamux_unacked_opens.py``). Beyond it,
``open_channel`` waits for an ACK, at most ``stream_open_timeout`` (then LimitExceeded), and
fails when the session ends meanwhile. On asyncio and trio."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

import polymux
from polymux.anyio import AnyioSession, session
from polymux.engine import events as ev

from .test_anyio import EnginePeer, Pending, anyio_backend, anyio_test, tcp_streams


__all__ = ["anyio_backend"]  # the fixture, used through anyio_test

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@asynccontextmanager
async def yamux_client(**options: object) -> AsyncIterator[tuple[AnyioSession, EnginePeer]]:
    async with (
        tcp_streams() as (client_end, server_end),
        session(client_end, protocol="yamux", **options) as client,
    ):
        yield client, EnginePeer(server_end, "yamux")


@anyio_test
async def test_open_channel_waits_for_an_ack_beyond_the_bound(anyio_backend: str) -> None:
    async with yamux_client(max_unacked_opens=2) as (client, peer):
        first = [await client.open_channel(name) for name in ("a", "b")]
        third = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(third.run, lambda: client.open_channel("c"))
            assert not await third.finished_within(0.3)  # no SYN beyond the bound
            await peer.accept()  # ACK the first
            assert await third.finished_within(5)
        assert third.error is None, third.error
        opened = await peer.next_event(ev.ChannelOpened)  # "b": its SYN went out before
        assert peer.engine.channel_name(opened.channel) == "3"
        opened = await peer.next_event(ev.ChannelOpened)  # then "c", only after the ACK
        assert peer.engine.channel_name(opened.channel) == "5"
        assert len(first) == 2


@anyio_test
async def test_no_ack_within_stream_open_timeout_raises_limit_exceeded(anyio_backend: str) -> None:
    async with yamux_client(max_unacked_opens=1, stream_open_timeout=0.3) as (client, _peer):
        await client.open_channel("a")
        with pytest.raises(polymux.LimitExceeded, match=r"max_unacked_opens=1 .*stream_open_timeout=0.3 s"):
            await client.open_channel("b")


@anyio_test
async def test_a_waiting_open_fails_when_the_session_ends(anyio_backend: str) -> None:
    async with yamux_client(max_unacked_opens=1) as (client, peer):
        await client.open_channel("a")
        second = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(second.run, lambda: client.open_channel("b"))
            assert not await second.finished_within(0.2)
            await peer.stream.aclose()  # the connection ends
            assert await second.finished_within(5)
        assert isinstance(second.error, polymux.SessionClosed), second.error

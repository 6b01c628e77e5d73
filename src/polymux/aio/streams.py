"""A channel as one object: :class:`Channel`, the ``(reader, writer)`` pair that
``open_channel``, ``open_pair``, ``accept_channel`` and ``async for`` give, usable with
``async with`` (closed on exit, reset on an exception), and :func:`reset`, the typed way to
terminate a channel (``writer.transport`` is typed as asyncio's ``WriteTransport``, which
has no ``reset``)."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

from polymux.aio.channel import ChannelTransport
from polymux.exceptions import PolymuxError


__all__ = ["Channel", "reset"]


def reset(writer: asyncio.StreamWriter, reason: str | None = None) -> None:
    """Terminate the channel of ``writer`` at once, both directions (unsent data is
    dropped), telling the peer ``reason`` where the format carries one (MultiplexingStream
    v2/v3, multiplex: its reader gets :class:`~polymux.exceptions.ChannelReset` with ``.message``).
    The typed spelling of ``writer.transport.reset(reason)``.

    Raises:
        TypeError: ``writer`` is not a polymux channel's.
    """
    transport = writer.transport
    if not isinstance(transport, ChannelTransport):
        raise TypeError(f"not a polymux channel's writer: its transport is a {type(transport).__name__}")
    transport.reset(reason)


class Channel(tuple[asyncio.StreamReader, asyncio.StreamWriter]):
    """One channel: its ``(reader, writer)``, which it unpacks as
    (``reader, writer = await session.open_channel()``), and an async context manager that
    closes it on exit, as websockets' connections and anyio's streams do::

        async with await session.open_channel("files/1") as (reader, writer):
            writer.write(b"hello")
            print(await reader.read(5))
        # closed here: writer.close(), then wait_closed() (bounded by close_timeout)

    An exception that leaves the block resets the channel instead (:func:`reset`: the peer
    sees the channel fail, not end cleanly). Errors of the closing itself (the session is
    gone) are not raised: the channel is over either way."""

    __slots__ = ()

    def __new__(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Self:
        return super().__new__(cls, (reader, writer))

    @property
    def reader(self) -> asyncio.StreamReader:
        """The channel's reader."""
        return self[0]

    @property
    def writer(self) -> asyncio.StreamWriter:
        """The channel's writer."""
        return self[1]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        writer = self[1]
        if exc is not None:
            writer.transport.abort()  # the peer sees a failure, not a clean end
            return
        writer.close()
        with contextlib.suppress(ConnectionError, PolymuxError):
            await writer.wait_closed()

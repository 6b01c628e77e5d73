"""The stdlib ``StreamReader`` of a channel, and the protocol that wires it.

:class:`ChannelStreamReader` tells its channel how much the application consumed, so
credit goes back to the peer on consumption, not on arrival. It talks to its transport
only through :class:`ReaderSource` (implemented by
:class:`~polymux.aio.channel.ChannelTransport`).

It builds on CPython's ``StreamReader`` internals (``_buffer``, ``_waiter``, ``_eof``,
``_exception``, ``_paused``, ``_limit``, ``_transport`` and the ``_wait_for_data`` /
``_maybe_resume_transport`` steps), which every CPython since 3.8 has kept; they are
declared below so the type checker knows them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from polymux._types import BytesLike
from polymux.exceptions import ChannelClosedError


__all__ = ["ChannelStreamProtocol", "ChannelStreamReader", "ReaderSource", "SendOnlyStreamReader"]


class ReaderSource(Protocol):
    """What a :class:`ChannelStreamReader` needs of its channel's transport."""

    @property
    def backlog_size(self) -> int:
        """Received bytes the reader does not hold yet."""

    @property
    def unconsumed(self) -> int:
        """Bytes given to the reader (its buffer plus the backlog) not yet reported consumed."""

    def read_backlog(self, n: int) -> bytes:
        """``read(n)`` served from the backlog (the reader's buffer is empty)."""

    def reader_consumed(self, held: int) -> None:
        """The application consumed everything but ``held`` bytes (buffer plus backlog)."""

    def reader_waiting(self) -> bool:
        """The reader needs more than it holds: feed it the backlog and credit what it
        holds. True if it got data (it need not wait)."""

    def resume_reading(self) -> None:
        """The stdlib reader resumes its paused transport."""


class ChannelStreamReader(asyncio.StreamReader):
    """A stdlib ``StreamReader`` that tells its channel how much the application consumed.

    Every consuming read in ``StreamReader`` ends in ``_maybe_resume_transport()``; we hook
    there, so ``read``, ``readexactly``, ``readuntil``, ``readline`` and ``async for`` all
    return credit, and nothing else does (credit on consumption, not on arrival).
    """

    # CPython's StreamReader attributes (see the module docstring).
    _buffer: bytearray
    _waiter: asyncio.Future[None] | None
    _eof: bool
    _exception: BaseException | None
    _paused: bool
    _limit: int
    _transport: Any

    _source: ReaderSource | None = None
    _deferred: Exception | None = None
    _refuse: str | None = None
    """The text of the error reads raise on the unusable half of a one-way channel
    (:class:`SendOnlyStreamReader`)."""

    def bind(self, source: ReaderSource) -> None:
        """Take data, and report consumption, through ``source`` (the channel)."""
        self._source = source

    def wakeup(self) -> None:
        """Wake a read waiting for data (CPython's ``_wakeup_waiter``)."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.cancelled():
                waiter.set_result(None)

    def set_exception(self, exc: Exception) -> None:
        """Fail the reader, after the bytes already received have been read.

        The stdlib reader raises at once and drops its buffer; but data the peer sent
        before the channel failed did arrive, so it is delivered first (unless a read is
        already waiting for more than there is: it gets the error now)."""
        if self._buffer and self._waiter is None:
            self._deferred = exc
            self.wakeup()
            return
        super().set_exception(exc)

    def exception(self) -> Exception | None:
        # drain() asks on every call: no super() round trip (the stdlib returns _exception).
        return self._deferred or self._exception  # type: ignore[return-value]

    def drop(self) -> None:
        """Forget what the reader holds (the channel was reset for falling behind)."""
        self._deferred = None
        self._buffer.clear()

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None:
            super().set_exception(exc)

    async def read(self, n: int = -1) -> bytes:
        """``StreamReader.read``; received data the buffer does not hold yet is handed
        out without passing through the buffer (one copy fewer per byte)."""
        while n > 0 and not self._buffer:
            source = self._source
            if source is None:
                break
            if source.backlog_size:
                data = source.read_backlog(n)
                self._maybe_resume_transport()
                return data
            if self._eof or self._exception is not None or self._deferred is not None:
                break
            await self._wait_for_data("read")
        return await super().read(n)

    def _maybe_resume_transport(self) -> None:
        # Runs after every consuming read (twice per message for a reader of small
        # length-prefixed messages), so the stdlib's step and the channel's credit
        # bookkeeping are inlined here.
        buffer = self._buffer
        if self._paused and len(buffer) <= self._limit:
            self._paused = False
            self._transport.resume_reading()
        source = self._source
        if source is not None:
            # Uncredited bytes are always the newest (end of the buffer, then the backlog);
            # what is gone beyond them was consumed.
            held = len(buffer) + source.backlog_size
            if source.unconsumed > held:
                source.reader_consumed(held)
        if self._deferred is not None and not buffer:
            self._raise_deferred()

    def feed_parts(self, first: BytesLike, more: tuple[BytesLike, ...]) -> None:
        """``feed_data`` for several parts with one wakeup (consecutive frames)."""
        if not more:
            self.feed_data(first)
            return
        buffer = self._buffer
        buffer.extend(first)
        for part in more:
            buffer.extend(part)
        self.wakeup()

    @property
    def buffered(self) -> int:
        """Bytes in the reader's own buffer."""
        return len(self._buffer)

    @property
    def waiting(self) -> bool:
        """Whether a read waits for data."""
        return self._waiter is not None

    async def _wait_for_data(self, func_name: str) -> None:
        # A reader that waits while bytes sit in its buffer needs more than is there
        # (readexactly(n), readuntil(...)): credit what it holds so the peer can send the
        # rest, or n > window would deadlock. The stdlib resumes a paused socket here
        # for the same reason. Memory stays bounded by what the application asked for
        # (n, or the reader's limit) plus one window.
        if self._deferred is not None:
            self._raise_deferred()
            assert self._exception is not None
            raise self._exception
        source = self._source
        if source is not None and source.reader_waiting():
            return  # it fed us: the caller re-checks its buffer
        await super()._wait_for_data(func_name)  # type: ignore[misc]  # CPython private


class SendOnlyStreamReader(ChannelStreamReader):
    """The reader of a channel we may only write (the opener's side of a one-way
    omnistreams stream): every read raises :class:`~polymux.exceptions.ChannelClosedError`
    saying so, never a silent EOF. A separate class, so other readers pay nothing."""

    def _check_readable(self) -> None:
        raise ChannelClosedError(self._refuse or "this channel is send-only")

    async def read(self, n: int = -1) -> bytes:
        self._check_readable()
        return await super().read(n)

    async def readexactly(self, n: int) -> bytes:
        self._check_readable()
        return await super().readexactly(n)

    async def readuntil(self, separator: bytes = b"\n") -> bytes:  # type: ignore[override]  # typeshed: bytes | tuple
        self._check_readable()
        return await super().readuntil(separator)


class ChannelStreamProtocol(asyncio.StreamReaderProtocol):
    """The stdlib ``StreamReaderProtocol``, lighter: its drain-waiter deque (about 700
    bytes, allocated per channel and almost always empty) becomes a list, which supports
    every operation the stdlib does on it (append, remove, iterate)."""

    _drain_waiters: Any  # CPython's FlowControlMixin attribute

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self._drain_waiters, deque) and not self._drain_waiters:
            waiters: list[asyncio.Future[None]] = []
            self._drain_waiters = waiters

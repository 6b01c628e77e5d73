"""The stdlib ``StreamReader`` of a channel, and the protocol that wires it.

:class:`ChannelStreamReader` reads its channel's inbox (the data plane,
:mod:`polymux.engine.plane`) and counts what the application consumed, so credit goes
back to the peer on consumption, not on arrival. It talks to its transport only through
:class:`ReaderSource` (implemented by :class:`~polymux.aio.channel.ChannelTransport`).

It builds on CPython's ``StreamReader`` internals (``_buffer``, ``_waiter``, ``_eof``,
``_exception``, ``_paused``, ``_limit``, ``_transport`` and the ``_wait_for_data`` /
``_maybe_resume_transport`` steps), which every CPython since 3.8 has kept; they are
declared below so the type checker knows them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from polymux.engine.plane import Inbox
from polymux.exceptions import ChannelClosedError


__all__ = ["ChannelStreamProtocol", "ChannelStreamReader", "ReaderSource", "SendOnlyStreamReader"]


class ReaderSource(Protocol):
    """What a :class:`ChannelStreamReader` needs of its channel's transport."""

    def reader_waiting(self) -> None:
        """The reader waits for more than it holds in its buffer: credit what it holds, so
        the peer can send the rest."""

    def resume_reading(self) -> None:
        """The stdlib reader resumes its paused transport."""


class ChannelStreamReader(asyncio.StreamReader):
    """A stdlib ``StreamReader`` that reads its channel's :class:`~polymux.engine.plane.Inbox`.

    The channel's data frames go into the inbox as they arrive (no call into the reader);
    ``read(n)`` takes them from there, one copy fewer per byte than the stdlib's buffer.
    The other reads (``readexactly``, ``readuntil``, ``readline``, ``async for``) move what
    the inbox holds into the stdlib buffer when they would wait, and every consuming read
    ends in ``_maybe_resume_transport()``, where what left the buffer is counted as
    consumed: credit goes back on consumption, not on arrival, batched by the inbox.
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
    _inbox: Inbox | None = None
    _deferred: Exception | None = None
    _refuse: str | None = None
    """The text of the error reads raise on the unusable half of a one-way channel
    (:class:`SendOnlyStreamReader`)."""

    def bind(self, source: ReaderSource, inbox: Inbox | None) -> None:
        """Read ``inbox``, and ask ``source`` for credit when waiting with bytes held."""
        self._source = source
        self._inbox = inbox

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
        if self._inbox is not None:
            self._inbox.drop()

    def fill(self) -> None:
        """Move what the inbox holds into the buffer (before an end: the stdlib's reads
        look at the buffer alone once ``_eof`` is set)."""
        inbox = self._inbox
        if inbox is not None and inbox.size:
            buffer = self._buffer
            for part in inbox.take_all():
                buffer.extend(part)
            inbox.waiting = False
            self.wakeup()  # a read waiting for it returns (not with the error that may follow)

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None:
            super().set_exception(exc)

    async def read(self, n: int = -1) -> bytes:
        """``StreamReader.read``; what the inbox holds is handed out without passing
        through the buffer (one copy fewer per byte)."""
        inbox = self._inbox
        if n > 0 and inbox is not None:
            while not self._buffer:
                if inbox.size:
                    return inbox.take(n)
                if self._eof or self._exception is not None or self._deferred is not None:
                    break
                await self._wait_for_data("read")
        return await super().read(n)

    def _maybe_resume_transport(self) -> None:
        # Runs after every consuming read of the stdlib's (twice per message for a reader
        # of small length-prefixed messages), so the stdlib's step is inlined here.
        buffer = self._buffer
        if self._paused and len(buffer) <= self._limit:
            self._paused = False
            self._transport.resume_reading()
        inbox = self._inbox
        if inbox is not None:
            # Unconsumed bytes are always the newest (the end of the buffer, then the
            # inbox): what is gone beyond them was consumed.
            unconsumed = inbox.unconsumed
            held = len(buffer) + inbox.size
            if unconsumed > held:
                inbox.consume(unconsumed - held)
        if self._deferred is not None and not buffer:
            self._raise_deferred()

    async def _wait_for_data(self, func_name: str) -> None:
        # Data in the inbox: into the buffer, the caller re-checks it. A reader that waits
        # while bytes sit in its buffer needs more than is there (readexactly(n),
        # readuntil(...)): credit what it holds so the peer can send the rest, or
        # n > window would deadlock. The stdlib resumes a paused socket here for the same
        # reason. Memory stays bounded by what the application asked for (n, or the
        # reader's limit) plus one window.
        if self._deferred is not None:
            self._raise_deferred()
            assert self._exception is not None
            raise self._exception
        inbox = self._inbox
        if inbox is not None:
            if inbox.size:
                self.fill()
                return
            if self._buffer and inbox.unconsumed + inbox.pending and self._source is not None:
                self._source.reader_waiting()
                if inbox.size:  # (it cannot arrive meanwhile, but a plain check is cheap)
                    self.fill()
                    return
            inbox.waits()
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

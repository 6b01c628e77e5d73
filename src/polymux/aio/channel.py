"""One channel as an ``asyncio.Transport``, and the ``StreamReader`` that returns credit.

A :class:`ChannelTransport` sits between a channel's protocol (normally the stdlib
``StreamReaderProtocol``) and the session's :class:`~polymux.aio.session.MuxProtocol`:

* Write side: ``write()`` only appends to the channel's buffer and asks the session's
  scheduler for a turn. The scheduler takes at most one frame (bounded by the frame size
  and the peer's credit) per turn. Above the high-water mark the transport calls
  ``protocol.pause_writing()``, so ``await writer.drain()`` blocks exactly while the
  peer cannot take more (no credit) or the socket is paused; it resumes at the low mark.
* Read side: data is fed to the protocol as it arrives; credit goes back to the peer as
  the application *consumes* it (:class:`ChannelStreamReader` reports every read), or,
  for plain protocols, once ``data_received`` returned while reading is not paused.
* End: ``write_eof()`` half-closes after the buffer is sent; ``close()`` also stops
  reading; ``abort()`` / :meth:`ChannelTransport.reset` terminates at once. A reset by the
  peer or a lost session reaches the protocol as ``connection_lost(exc)``, so readers and
  ``drain()`` raise it; a clean end is ``connection_lost(None)``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from polymux._types import BytesLike
from polymux.exceptions import ChannelClosedError, ChannelOverflow, ChannelReset, LimitExceeded


if TYPE_CHECKING:
    from polymux.aio.session import MuxProtocol


__all__ = ["ChannelStreamProtocol", "ChannelStreamReader", "ChannelTransport"]

_COALESCE = 64 * 1024
"""Writes smaller than this are joined into one chunk when sent; larger ones go as views."""


class ChannelStreamReader(asyncio.StreamReader):
    """A stdlib ``StreamReader`` that tells its channel how much the application consumed.

    Every consuming read in ``StreamReader`` ends in ``_maybe_resume_transport()``; we hook
    there, so ``read``, ``readexactly``, ``readuntil``, ``readline`` and ``async for`` all
    return credit, and nothing else does (credit on consumption, not on arrival).
    """

    _transport: ChannelTransport | None
    _buffer: bytearray
    _deferred: Exception | None = None
    _refuse: str | None = None
    """The text of the error reads raise on the unusable half of a one-way channel
    (:class:`SendOnlyStreamReader`)."""

    def set_exception(self, exc: Exception) -> None:
        """Fail the reader, after the bytes already received have been read.

        The stdlib reader raises at once and drops its buffer; but data the peer sent
        before the channel failed did arrive, so it is delivered first (unless a read is
        already waiting for more than there is: it gets the error now)."""
        if self._buffer and self._waiter is None:  # type: ignore[attr-defined]
            self._deferred = exc
            self._wakeup_waiter()  # type: ignore[attr-defined]
            return
        super().set_exception(exc)

    def exception(self) -> Exception | None:
        # drain() asks on every call: no super() round trip (the stdlib returns _exception).
        return self._deferred or self._exception  # type: ignore[attr-defined]

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None:
            super().set_exception(exc)

    async def read(self, n: int = -1) -> bytes:
        """``StreamReader.read``; received data the buffer does not hold yet is handed
        out without passing through the buffer (one copy fewer per byte)."""
        while n > 0 and not self._buffer:
            transport = self._transport
            if transport is None:
                break
            if transport._backlog:
                data = transport._read_backlog(n)
                self._maybe_resume_transport()
                return data
            if self._eof or self._exception is not None or self._deferred is not None:  # type: ignore[attr-defined]
                break
            await self._wait_for_data("read")
        return await super().read(n)

    def _maybe_resume_transport(self) -> None:
        # Runs after every consuming read (twice per message for a reader of small
        # length-prefixed messages), so the stdlib's step and the channel's credit
        # bookkeeping are inlined here.
        buffer = self._buffer
        if self._paused and len(buffer) <= self._limit:  # type: ignore[has-type,attr-defined]
            self._paused = False
            self._transport.resume_reading()  # type: ignore[union-attr]
        transport = self._transport
        if transport is not None:
            # Uncredited bytes are always the newest (end of the buffer, then the backlog);
            # what is gone beyond them was consumed.
            held = len(buffer) + transport._backlog_size
            if transport._unconsumed > held:
                transport._reader_consumed(held)
        if self._deferred is not None and not buffer:
            self._raise_deferred()

    def _feed_parts(self, first: BytesLike, more: tuple[BytesLike, ...]) -> None:
        """``feed_data`` for several parts with one wakeup (consecutive frames)."""
        if not more:
            self.feed_data(first)
            return
        buffer = self._buffer
        buffer.extend(first)
        for part in more:
            buffer.extend(part)
        self._wakeup_waiter()  # type: ignore[attr-defined]

    async def _wait_for_data(self, func_name: str) -> None:
        # A reader that waits while bytes sit in its buffer needs more than is there
        # (readexactly(n), readuntil(...)): credit what it holds so the peer can send the
        # rest, or n > window would deadlock. The stdlib resumes a paused socket here
        # for the same reason. Memory stays bounded by what the application asked for
        # (n, or the reader's limit) plus one window.
        if self._deferred is not None:
            self._raise_deferred()
            raise self._exception  # type: ignore[attr-defined]
        transport = self._transport
        if transport is not None and transport._reader_waiting():
            return  # it fed us: the caller re-checks its buffer
        await super()._wait_for_data(func_name)  # type: ignore[misc]


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

    async def readuntil(self, separator: bytes = b"\n") -> bytes:  # type: ignore[override]
        self._check_readable()
        return await super().readuntil(separator)


class ChannelStreamProtocol(asyncio.StreamReaderProtocol):
    """The stdlib ``StreamReaderProtocol``, lighter: its drain-waiter deque (about 700
    bytes, allocated per channel and almost always empty) becomes a list, which supports
    every operation the stdlib does on it (append, remove, iterate)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self._drain_waiters, deque) and not self._drain_waiters:  # type: ignore[has-type]
            waiters: list[asyncio.Future[None]] = []
            self._drain_waiters = waiters


_NO_DEQUE: deque[BytesLike] = deque()
"""Shared, always empty: a channel's queue until it first needs one (only cleared or
tested while shared, never appended to)."""


class ChannelTransport(asyncio.Transport):
    """The transport of one channel of a session (see the module docstring)."""

    # Slots: a session may hold 100,000 channels, and past ~30 attributes an instance
    # dict grows to ~800 bytes. "__dict__" keeps other attributes possible (lazily).
    __slots__ = (
        "__dict__",
        "_accepted",
        "_ack_pending",
        "_ack_scheduled",
        "_backlog",
        "_backlog_size",
        "_buf",
        "_buffered",
        "_close_timer",
        "_closing",
        "_done",
        "_eof_requested",
        "_eof_sent",
        "_feed_limit",
        "_handle",
        "_held_credit",
        "_high",
        "_label_text",
        "_local_origin",
        "_low",
        "_mux",
        "_name",
        "_overflow_timer",
        "_partner",
        "_protocol",
        "_protocol_paused",
        "_queued",
        "_read_closed",
        "_reader",
        "_reading_paused",
        "_receive_only",
        "_remote_ended",
        "_unconsumed",
        "_write_error",
    )

    _extra: dict[str, Any]  # asyncio.BaseTransport's extra-info dict (set by its __init__)

    def __init__(self, mux: MuxProtocol, handle: int, name: str) -> None:
        super().__init__()
        self._mux = mux
        self._handle = handle
        self._name = name
        # Captured now: the engine forgets a channel before its end reaches us.
        self._label_text = mux.engine.describe(handle)
        self._protocol: asyncio.BaseProtocol | None = None
        self._reader: ChannelStreamReader | None = None  # stream mode when set
        # Idle channels are the common case (100,000 on a session): both queues start as a
        # shared empty deque (an empty deque costs ~600 bytes) and get their own on first use.
        self._buf: deque[BytesLike] = _NO_DEQUE
        self._buffered = 0
        self._high = mux.config.write_buffer_high
        self._low = mux.config.low_water
        self._protocol_paused = False
        self._queued = False  # in the scheduler's ready queue
        self._accepted = False
        self._eof_requested = False
        self._eof_sent = False
        self._write_error: BaseException | None = None
        self._closing = False
        self._read_closed = False
        self._done = False  # connection_lost delivered
        self._unconsumed = 0  # received for the reader (buffer + backlog), not yet consumed
        self._ack_pending = 0  # consumed, credit not yet handed to the engine (this iteration)
        self._ack_scheduled = False
        # Received data the reader does not hold yet. A StreamReader's buffer is a
        # bytearray: appending to it after reads from its front moves everything it
        # holds, so it is kept small (its own pause size, 2 x limit, and at least one
        # 256 KiB read) and the rest of the window waits here.
        self._backlog: deque[BytesLike] = _NO_DEQUE
        self._backlog_size = 0
        self._feed_limit = max(2 * mux.config.stream_limit, 256 * 1024)
        self._reading_paused = False
        self._held_credit = 0  # plain protocols: consumed while paused, credit withheld
        self._close_timer: asyncio.TimerHandle | None = None
        self._remote_ended = False
        self._local_origin = True
        self._overflow_timer: asyncio.TimerHandle | None = None
        self._receive_only: str | None = None  # one-way formats: why writes are refused
        self._partner: ChannelTransport | None = None  # closed with this one (a stream pair)

    def __repr__(self) -> str:
        state = "done" if self._done else "closing" if self._closing else "open"
        return f"<ChannelTransport {self._label_text} {state} buffered={self._buffered}>"

    # -- wiring ----------------------------------------------------------------------------

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def _attach(self, protocol: asyncio.BaseProtocol, reader: ChannelStreamReader | None = None) -> None:
        """Connect ``protocol``; with ``reader`` (its ChannelStreamReader) data goes
        straight into the reader and credit follows what the application consumes."""
        self._protocol = protocol
        self._reader = reader
        engine = self._mux.engine
        if getattr(engine, "one_way", False):
            # One-way streams (omnistreams): the opener only writes, the acceptor only reads.
            fmt = engine.format
            if self._local_origin:
                if reader is not None:
                    reader._refuse = (
                        f"{fmt}: {self._label_text} is send-only: {fmt} streams carry data from "
                        "their opener to their acceptor (open a stream the other way to read)"
                    )
            else:
                self._receive_only = (
                    f"{fmt}: {self._label_text} is receive-only: {fmt} streams carry data from "
                    "their opener to their acceptor (open a stream the other way to write)"
                )
            metadata = getattr(engine, "metadata", None)
            if metadata is not None and engine.is_live(self._handle):
                self._extra["metadata"] = metadata(self._handle)  # asyncio's own extra dict
        protocol.connection_made(self)

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    @property
    def handle(self) -> int:
        """The engine's handle for this channel."""
        return self._handle

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``channel_name``, ``channel``, ``session``, ``protocol_name``, ``metadata``
        (omnistreams: the stream's creation metadata bytes) and anything the
        session's own transport knows (``peername``, ``sockname``, ``socket``,
        ``ssl_object`` ... but not ``sslcontext``, see below)."""
        if name == "channel_name":
            return self._name
        if name in self._extra:
            return self._extra[name]
        if name == "channel":
            return self._label_text
        if name == "session":
            return self._mux.session
        if name == "protocol_name":
            return self._mux.engine.format
        if name == "sslcontext":
            # asyncio's StreamReaderProtocol takes a transport with an ``sslcontext`` for one
            # that cannot half-close, and closes it at the peer's end-of-writing. A channel
            # half-closes on any connection: the TLS details stay available as
            # ``ssl_object``, ``peercert`` and ``cipher`` (and on the session).
            return default
        return self._mux.get_extra_info(name, default)

    # -- write side --------------------------------------------------------------------------

    def write(self, data: BytesLike) -> None:
        """Queue ``data``; it is sent in frames as credit and the socket allow."""
        if self._receive_only is not None:
            raise ChannelClosedError(self._receive_only)
        if self._write_error is not None:
            raise self._write_error
        if self._eof_requested:
            raise ChannelClosedError(
                f"{self._mux.engine.format}: cannot write to {self._label()} after write_eof() or close()"
            )
        if not data:
            return
        # Keep immutable bytes by reference; copy what the caller could still change.
        if data.__class__ is not bytes and not (
            isinstance(data, memoryview) and data.readonly and isinstance(data.obj, bytes)
        ):
            data = bytes(data)
        buf = self._buf
        if buf is _NO_DEQUE:
            buf = self._buf = deque()
        buf.append(data)
        self._buffered += len(data)
        if not self._queued:  # queued: the scheduler will come to it (flush pending or paused)
            self._mux._want_send(self)
        if not self._protocol_paused and self._buffered > self._high:
            self._pause_writing()
            if self._done and self._write_error is not None:  # reset: held too much (may_hold)
                raise self._write_error

    def writelines(self, list_of_data: Any) -> None:
        """Queue several buffers (joined into one write)."""
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """Half-close: send our end-of-writing once the buffered data is sent (nothing to
        do on the receive-only half of a one-way channel: ``close()`` ends that one)."""
        if self._eof_requested or self._done or (self._receive_only is not None and not self._closing):
            return
        self._eof_requested = True
        self._mux._want_send(self)

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._update_write_pause()

    def _update_write_pause(self) -> None:
        protocol = self._protocol
        if protocol is None or self._done:
            return
        if self._protocol_paused and self._buffered <= self._low:
            self._protocol_paused = False
            protocol.resume_writing()
        elif not self._protocol_paused and self._buffered > self._high:
            self._pause_writing()

    def _pause_writing(self) -> None:
        """Above the high-water mark: pause the protocol's writing (``drain()`` blocks),
        unless the format holds the bytes back itself and the writer must go on
        (``Engine.may_hold``: a Streamux response waits for the end of its request);
        past the format's bound for that, the channel is reset."""
        mux = self._mux
        try:
            if mux.engine.may_hold(self._handle, self._buffered):
                return
        except LimitExceeded as exc:
            fmt = mux.engine.format
            problem = str(exc).removeprefix(f"{fmt}: ")
            mux._reset_channel(self, problem)
            self._finish(ChannelOverflow(f"{fmt}: {self._label()} was reset: {problem}"))
            return
        self._protocol_paused = True
        self._protocol.pause_writing()  # type: ignore[union-attr]

    def _wants_send(self) -> bool:
        """Whether a scheduler turn would do anything now."""
        if not self._accepted or self._done:
            return False
        if self._buffered:
            return self._mux.engine.send_credit(self._handle) > 0
        return self._eof_requested and not self._eof_sent

    def _take(self, n: int) -> list[BytesLike]:
        """Remove and return up to ``n`` buffered bytes as parts, in order: large writes as
        they are or as views (no copy), runs of small writes joined (one copy of at most
        ``_COALESCE`` bytes, so tiny writes do not become tiny frames or iovecs). The
        engine frames the parts as one byte run, so frames are full however the
        application cut its writes (a 9-byte header before 64 KiB writes used to make every
        frame a copy; 64 KiB writes in 20 KiB frames left a 4 KiB frame each)."""
        buf = self._buf
        parts: list[BytesLike] = []
        size = 0
        while buf and size < n:
            head = buf[0]
            room = n - size
            if len(head) >= _COALESCE or len(buf) == 1:
                if len(head) > room:
                    view = memoryview(head)
                    buf[0] = view[room:]
                    parts.append(view[:room])
                    size += room
                else:
                    parts.append(buf.popleft())
                    size += len(head)
                continue
            # A run of small writes, joined.
            limit = min(room, _COALESCE)
            run: list[BytesLike] = []
            got = 0
            while buf and got < limit:
                part = buf[0]
                size_ = len(part)
                if size_ >= _COALESCE:
                    break
                left = limit - got
                if size_ > left:
                    view = memoryview(part)
                    run.append(view[:left])
                    buf[0] = view[left:]
                    got = limit
                    break
                run.append(buf.popleft())
                got += size_
            parts.append(run[0] if len(run) == 1 else b"".join(run))
            size += got
        self._buffered -= size
        if self._protocol_paused and self._buffered <= self._low:
            self._update_write_pause()
        return parts

    # -- read side ---------------------------------------------------------------------------

    def is_reading(self) -> bool:
        return not self._reading_paused and not self._done

    def pause_reading(self) -> None:
        """Stop reading. With flow control on the wire this withholds credit from the peer
        (so it stops sending this channel only); without it, the whole connection pauses.

        A channel read through its ``StreamReader`` ignores this: credit already follows
        what the application consumes (and, without flow control, the channel pauses the
        connection itself once ``receive_window`` bytes are unread)."""
        if self._reader is not None:
            return
        if not self._mux.engine.has_flow_control and self._mux.config.slow_reader == "reset":
            self._reader_behind()  # the policy's timer applies to a paused protocol too
        else:
            self._set_reading_paused(True)

    def resume_reading(self) -> None:
        if self._reader is not None:
            return
        self._set_reading_paused(False)
        if self._held_credit:
            held, self._held_credit = self._held_credit, 0
            self._mux._ack(self._handle, held)

    def _set_reading_paused(self, paused: bool) -> None:
        if paused == self._reading_paused or (paused and self._done):
            return
        self._reading_paused = paused
        if not paused and self._overflow_timer is not None:
            self._overflow_timer.cancel()
            self._overflow_timer = None
        self._mux._channel_reading_paused(self, paused)

    def _reader_behind(self) -> None:
        """The reader holds ``receive_window`` unread bytes and the format cannot slow the
        peer down: apply ``SessionConfig.slow_reader``."""
        config = self._mux.config
        if config.slow_reader == "reset" and config.slow_reader_timeout == 0:
            self._overflow()
            return
        if self._reading_paused:
            return
        self._set_reading_paused(True)  # blocks the whole connection
        if config.slow_reader == "reset":
            self._overflow_timer = self._mux.loop.call_later(config.slow_reader_timeout, self._overflow)

    def _overflow(self) -> None:
        """slow_reader="reset": drop this channel so the others can go on."""
        self._overflow_timer = None
        config = self._mux.config
        unread = self._unconsumed
        message = (
            f"reader fell behind: {unread} bytes unread"
            + (f" for {config.slow_reader_timeout:g} s" if config.slow_reader_timeout else "")
            + f" (receive_window={config.receive_window}, slow_reader='reset')"
        )
        fmt = self._mux.engine.format
        self._mux._reset_channel(self, message)
        self._backlog.clear()
        self._backlog_size = 0
        reader = self._reader
        if reader is not None:
            reader._deferred = None
            reader._buffer.clear()  # the data is gone: fail now, not after it
        self._finish(ChannelOverflow(f"{fmt}: {self._label()} was reset: {message}"))

    def _feed(self, data: BytesLike, more: tuple[BytesLike, ...], n: int) -> None:
        """``n`` bytes arrived from the peer: ``data`` followed by ``more``."""
        protocol = self._protocol
        if self._read_closed or protocol is None or self._done:
            self._mux._ack(self._handle, n)  # discard, but keep the peer's credit flowing
            return
        reader = self._reader
        if reader is not None:
            self._unconsumed += n
            buffer = reader._buffer
            if (
                buffer
                and not self._backlog
                and (len(buffer) < self._feed_limit or reader._waiter is not None)  # type: ignore[attr-defined]
            ):
                reader._feed_parts(data, more)
            else:
                # Into the backlog, copied once (a view would pin the whole received chunk
                # it points into). ``read()`` hands these objects out as they are, so the
                # common path copies each byte once, where the stdlib's buffer copies it
                # in and out again.
                backlog = self._backlog
                if backlog is _NO_DEQUE:
                    backlog = self._backlog = deque()
                backlog.append(bytes(data))
                if more:
                    backlog.extend([bytes(part) for part in more])
                self._backlog_size += n
                if reader._waiter is not None:  # type: ignore[attr-defined]
                    reader._wakeup_waiter()  # type: ignore[attr-defined]
            mux = self._mux
            if not mux.engine.has_flow_control and self._unconsumed > mux.config.receive_window:
                self._reader_behind()
            return
        protocol.data_received(bytes(data))  # type: ignore[attr-defined]
        for part in more:
            protocol.data_received(bytes(part))  # type: ignore[attr-defined]
        if self._reading_paused:
            self._held_credit += n
        else:
            self._mux._ack(self._handle, n)

    def _reader_consumed(self, held: int) -> None:
        """The reader consumed everything it had beyond ``held`` unread bytes (its buffer
        plus our backlog)."""
        consumed = self._unconsumed - held
        if consumed > 0:
            self._unconsumed = held
            # Batched: one engine call per loop iteration, not per read (a reader of
            # 64-byte messages reads twice per message, thousands per iteration).
            self._ack_pending += consumed
            if not self._ack_scheduled:
                self._ack_scheduled = True
                self._mux._ack_later(self)
            if self._reading_paused and held <= self._mux.config.receive_window // 2:
                self._set_reading_paused(False)

    def _send_acks(self) -> None:
        self._ack_scheduled = False
        n, self._ack_pending = self._ack_pending, 0
        if n and not self._done:
            self._mux._ack(self._handle, n)

    def _read_backlog(self, n: int) -> bytes:
        """``read(n)`` served from the backlog (the reader's buffer is empty): a received
        part as it is when it fits, small parts joined, a large one split."""
        backlog = self._backlog
        first = backlog[0]
        size = len(first)
        if size > n:
            view = memoryview(first)
            backlog[0] = view[n:]  # a view of our own copy: pins nothing more
            data = bytes(view[:n])
        elif size == n or size >= _COALESCE or len(backlog) == 1:
            data = bytes(backlog.popleft())  # no copy unless it is the rest of a split part
        else:
            parts = []
            size = 0
            while backlog and size + len(backlog[0]) <= n:
                part = backlog.popleft()
                parts.append(part)
                size += len(part)
            data = b"".join(parts)
        self._backlog_size -= len(data)
        return data

    def _top_up(self, limit: int | None) -> bool:
        """Move backlog into the reader while its buffer is below ``limit`` (None: all)."""
        reader = self._reader
        backlog = self._backlog
        if reader is None or not backlog:
            return False
        buffer = reader._buffer
        while backlog and (limit is None or len(buffer) < limit):
            part = backlog.popleft()
            self._backlog_size -= len(part)
            reader.feed_data(part)
        return True

    def _reader_waiting(self) -> bool:
        """The reader needs more than it holds: give it the backlog and credit what it
        holds. Returns True if it got data (it need not wait)."""
        fed = self._top_up(None)
        if self._unconsumed:
            n, self._unconsumed = self._unconsumed, 0
            self._mux._ack(self._handle, n)
        self._set_reading_paused(False)
        return fed

    def _remote_end(self) -> None:
        """The peer finished writing."""
        self._remote_ended = True
        protocol = self._protocol
        if protocol is None or self._done or self._read_closed:
            return
        self._top_up(None)  # all data before the EOF
        keep_open = protocol.eof_received()  # type: ignore[attr-defined]
        if not keep_open:
            self.close()

    # -- ending ------------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing or self._done

    def close(self) -> None:
        """Finish writing (after the buffered data) and stop reading.

        The protocol's ``connection_lost(None)`` follows once our end-of-writing is sent;
        data the peer still sends is discarded (its credit is returned). If the peer does
        not end its side within ``close_timeout`` the channel is reset.
        """
        if self._closing or self._done:
            return
        self._closing = True
        if self._partner is not None:
            self._partner.close()
        self._read_closed = True
        self._backlog.clear()
        self._backlog_size = 0
        if self._unconsumed:
            self._mux._ack(self._handle, self._unconsumed)
            self._unconsumed = 0
        self.write_eof()
        self._close_timer = self._mux.loop.call_later(self._mux.config.close_timeout, self.abort)

    def abort(self) -> None:
        """Terminate the channel at once, discarding buffered data."""
        self.reset(None)

    def reset(self, error: str | BaseException | None = None) -> None:
        """Terminate the channel at once, telling the peer ``error`` where the format
        carries a message (MultiplexingStream v2/v3 send ``"Type: message"`` like the
        reference). Buffered data is discarded."""
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        # A closed channel may still linger in the engine (close() waits for the peer).
        self._mux._reset_channel(self, error)
        self._finish(None)

    def _label(self) -> str:
        return self._label_text

    def _eof_was_sent(self, closed: bool) -> None:
        """The scheduler sent our end-of-writing; ``closed``: the channel is complete."""
        if closed:
            self._finish(None)
        elif self._closing:
            # close(): the protocol is done with the channel; the engine lingers until
            # the peer ends too (its data is discarded meanwhile).
            self._deliver_lost(None)

    def _peer_closed(self, local_done: bool) -> None:
        """The engine closed the channel cleanly (both ends, or the peer terminated)."""
        if not local_done and self._write_error is None:
            self._write_error = ChannelClosedError(
                f"{self._mux.engine.format}: {self._label()} was closed by the peer"
            )
        self._finish(None)

    def _peer_stopped_reading(self) -> None:
        self._write_error = ChannelClosedError(
            f"{self._mux.engine.format}: the peer stopped reading {self._label()}"
        )
        self._buf.clear()
        self._buffered = 0
        self._update_write_pause()
        self.write_eof()

    def _peer_reset(self, message: str | None) -> None:
        self._finish(ChannelReset(self._mux.engine.format, self._label(), message))

    def _fail(self, exc: Exception) -> None:
        """The session ended under this channel. If the peer had already finished
        writing, what it sent stays readable (then EOF); only writing fails."""
        if self._remote_ended:
            self._write_error = self._write_error or exc
            self._finish(None)
        else:
            self._finish(exc)

    def _finish(self, exc: Exception | None) -> None:
        """Final state: nothing more will be sent or received."""
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        if self._overflow_timer is not None:
            self._overflow_timer.cancel()
            self._overflow_timer = None
        if self._write_error is None:
            self._write_error = exc or ChannelClosedError(
                f"{self._mux.engine.format}: {self._label()} is closed"
            )
        self._buf.clear()
        self._buffered = 0
        self._mux._channel_done(self)
        self._deliver_lost(exc)

    def _deliver_lost(self, exc: Exception | None) -> None:
        if self._done:
            return
        self._done = True
        self._closing = True
        self._set_reading_paused(False)
        if not self._read_closed:
            self._top_up(None)  # what arrived is readable before the end (or the error)
        protocol = self._protocol
        if protocol is not None:
            protocol.connection_lost(exc)

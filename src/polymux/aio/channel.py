"""One channel as an ``asyncio.Transport``.

A :class:`ChannelTransport` sits between a channel's protocol (normally the stdlib
``StreamReaderProtocol``) and the session's core (:class:`~polymux.session.SessionCore`),
driven by its :class:`ChannelHost` (the session's :class:`~polymux.aio.session.MuxProtocol`):

* Write side: ``write()`` hands the bytes to the core, which queues them for its
  scheduler (one frame per turn, within the peer's credit). Above the high-water mark
  (or the session's unsent budget) the transport calls ``protocol.pause_writing()``, so
  ``await writer.drain()`` blocks exactly while the peer cannot take more; it resumes
  when the core says so.
* Read side: data is fed to the protocol as it arrives; credit goes back to the peer as
  the application *consumes* it (:class:`~polymux.aio.reader.ChannelStreamReader` reports
  every read), or, for plain protocols, once ``data_received`` returned while reading is
  not paused.
* End: ``write_eof()`` half-closes after the queued data; ``close()`` also stops
  reading; ``abort()`` / :meth:`ChannelTransport.reset` terminates at once. A reset by the
  peer or a lost session reaches the protocol as ``connection_lost(exc)``, so readers and
  ``drain()`` raise it; a clean end is ``connection_lost(None)``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, cast

from polymux._types import BytesLike
from polymux.aio.reader import ChannelStreamReader
from polymux.engine.plane import Inbox
from polymux.exceptions import ChannelClosedError
from polymux.session import SessionCore


logger = logging.getLogger("polymux")


__all__ = ["ChannelHost", "ChannelTransport"]

_DETACHED = asyncio.Protocol()
"""Stands in for a channel's protocol before one is attached: every callback a no-op."""


class ChannelHost(Protocol):
    """What a :class:`ChannelTransport` needs of the session driver that owns it."""

    loop: asyncio.AbstractEventLoop
    core: SessionCore

    @property
    def session(self) -> Any:
        """The public session object (``get_extra_info("session")``)."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The connection's extra info (``peername`` ...)."""

    def process(self) -> None:
        """Act on what the core says after a call into it (events, output, reading)."""

    direct: bool
    """Whether writes may go to the socket at once (``SessionCore.send_now``): no capture,
    a socket transport that takes bytes."""

    def write_now(self, out: list[BytesLike]) -> None:
        """Write ``out`` to the socket now (``SessionCore.send_now``'s bytes)."""

    def want_flush(self) -> None:
        """The core has (or may have) something to send: run the scheduler soon."""

    def now(self) -> float:
        """The core's clock."""


class ChannelTransport(asyncio.Transport):
    """The transport of one channel of a session (see the module docstring)."""

    # Slots: a session may hold 100,000 channels, and past ~30 attributes an instance
    # dict grows to ~800 bytes. "__dict__" keeps other attributes possible (lazily).
    __slots__ = (
        "__dict__",
        "_closing",
        "_core",
        "_done",
        "_eof_requested",
        "_handle",
        "_held_credit",
        "_host",
        "_inbox",
        "_label_text",
        "_local_origin",
        "_name",
        "_partner",
        "_protocol",
        "_protocol_paused",
        "_read_closed",
        "_reader",
        "_reading_paused",
        "_receive_only",
        "_remote_ended",
        "_write_error",
    )

    _extra: dict[str, Any]  # asyncio.BaseTransport's extra-info dict (set by its __init__)

    def __init__(self, host: ChannelHost, handle: int, name: str, *, local: bool) -> None:
        super().__init__()
        self._host = host
        self._core = host.core
        self._handle = handle
        self._name = name
        self._local_origin = local
        # Captured now: the engine forgets a channel before its end reaches us.
        self._label_text = host.core.engine.describe(handle)
        self._protocol: asyncio.BaseProtocol | None = None
        # The same protocol with the callbacks of asyncio.Protocol (a BufferedProtocol lacks
        # data_received: its first data fails and resets only its channel); no-ops until set.
        self._app: asyncio.Protocol = _DETACHED
        self._reader: ChannelStreamReader | None = None  # stream mode when set
        self._protocol_paused = False
        self._eof_requested = False
        self._write_error: BaseException | None = None
        self._closing = False
        self._read_closed = False
        self._done = False  # connection_lost delivered
        self._remote_ended = False
        self._inbox: Inbox | None = None  # stream mode: the reader reads it
        self._reading_paused = False  # plain protocols: pause_reading()
        self._held_credit = 0  # plain protocols: consumed while paused, credit withheld
        self._receive_only: str | None = None  # one-way formats: why writes are refused
        self._partner: ChannelTransport | None = None  # closed with this one (a stream pair)

    def __repr__(self) -> str:
        state = "done" if self._done else "closing" if self._closing else "open"
        return f"<ChannelTransport {self._label_text} {state} buffered={self.get_write_buffer_size()}>"

    # -- wiring ----------------------------------------------------------------------------

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol
        self._app = cast(asyncio.Protocol, protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def attach(self, protocol: asyncio.BaseProtocol, reader: ChannelStreamReader | None = None) -> None:
        """Connect ``protocol``; with ``reader`` (its ChannelStreamReader) data goes
        straight into the reader and credit follows what the application consumes."""
        self._protocol = protocol
        self._app = cast(asyncio.Protocol, protocol)
        self._reader = reader
        if reader is not None:
            self._inbox = inbox = self._core.stream(self._handle, reader)
            reader.bind(self, inbox)
        engine = self._core.engine
        if engine.one_way:
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
            if engine.is_live(self._handle):
                self._extra["metadata"] = engine.metadata(self._handle)  # asyncio's own extra dict
        protocol.connection_made(self)

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    @property
    def handle(self) -> int:
        """The engine's handle for this channel."""
        return self._handle

    @property
    def label(self) -> str:
        """The channel as messages name it (wire id, origin, name)."""
        return self._label_text

    @property
    def partner(self) -> ChannelTransport | None:
        """The other half of a stream pair (closed with this one), if any."""
        return self._partner

    @partner.setter
    def partner(self, other: ChannelTransport | None) -> None:
        self._partner = other

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``channel_name``, ``channel``, ``session``, ``protocol_name``, ``metadata``
        (omnistreams: the stream's creation metadata bytes) and anything the
        session's own transport knows (``peername``, ``sockname``, ``ssl_object`` ...
        but not ``sslcontext``, see below). ``socket`` is ``default``: a channel has no
        socket of its own, and code that sets socket options on what it is given would
        change every channel's; the session's shared socket is ``session_socket``."""
        if name == "channel_name":
            return self._name
        if name == "socket":
            return default
        if name == "session_socket":
            return self._host.get_extra_info("socket", default)
        if name in self._extra:
            return self._extra[name]
        if name == "channel":
            return self._label_text
        if name == "session":
            return self._host.session
        if name == "protocol_name":
            return self._core.format
        if name == "sslcontext":
            # asyncio's StreamReaderProtocol takes a transport with an ``sslcontext`` for one
            # that cannot half-close, and closes it at the peer's end-of-writing. A channel
            # half-closes on any connection: the TLS details stay available as
            # ``ssl_object``, ``peercert`` and ``cipher`` (and on the session).
            return default
        return self._host.get_extra_info(name, default)

    # -- write side --------------------------------------------------------------------------

    def write(self, data: BytesLike) -> None:
        """Queue ``data``; it is sent in frames as credit and the socket allow."""
        if self._receive_only is not None:
            raise ChannelClosedError(self._receive_only)
        if self._write_error is not None:
            raise self._write_error
        if self._eof_requested:
            raise ChannelClosedError(
                f"{self._core.format}: cannot write to {self._label_text} after write_eof() or close()"
            )
        if not data:
            return
        # Keep immutable bytes by reference; copy what the caller could still change.
        if data.__class__ is not bytes and not (
            isinstance(data, memoryview) and data.readonly and isinstance(data.obj, bytes)
        ):
            data = bytes(data)
        core = self._core
        host = self._host
        if host.direct:
            out = core.send_now(self._handle, data)
            if out is not None:
                host.write_now(out)
                return
        if core.write(self._handle, data) and not self._protocol_paused:
            self._protocol_paused = True
            self._app.pause_writing()
        elif self._handle not in core.channels:  # reset: it held more than the format allows
            self._host.process()
            if self._write_error is not None:
                raise self._write_error
        self._host.want_flush()

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
        self._core.write_eof(self._handle)
        self._host.want_flush()

    def get_write_buffer_size(self) -> int:
        channel = self._core.channels.get(self._handle)
        return channel.buffered if channel is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._core.write_limits(self._handle)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        change = self._core.set_write_limits(self._handle, high, low)
        if change is True and not self._protocol_paused:
            self._protocol_paused = True
            self._app.pause_writing()
        self._host.process()

    def resume_writing_now(self) -> None:
        """The core says the writer may go on (its unsent bytes fell)."""
        if self._protocol_paused and not self._done:
            self._protocol_paused = False
            self._app.resume_writing()

    def writing_stopped(self, error: Exception) -> None:
        """The peer reads no more: writes fail with ``error``; reading goes on."""
        self._write_error = error
        self.resume_writing_now()
        self.write_eof()

    # -- read side ---------------------------------------------------------------------------

    def is_reading(self) -> bool:
        if self._reading_paused or self._done:
            return False
        channel = self._core.channels.get(self._handle)
        return channel is None or not channel.slow  # a full reader holds the connection

    def pause_reading(self) -> None:
        """Stop reading. With flow control on the wire this withholds credit from the peer
        (so it stops sending this channel only); without it, the whole connection pauses.

        A channel read through its ``StreamReader`` ignores this: credit already follows
        what the application consumes (and, without flow control, the channel pauses the
        connection itself once ``receive_window`` bytes are unread)."""
        if self._reader is not None or self._reading_paused or self._done:
            return
        self._reading_paused = True
        self._core.reading_paused(self._handle, True)
        self._host.process()

    def resume_reading(self) -> None:
        if self._reader is not None or not self._reading_paused:
            return
        self._reading_paused = False
        self._core.reading_paused(self._handle, False)
        if self._held_credit:
            held, self._held_credit = self._held_credit, 0
            self._core.consumed(self._handle, held, self._host.now())
        self._host.process()

    def data(self, data: BytesLike, more: tuple[BytesLike, ...], n: int) -> None:
        """``n`` bytes arrived from the peer as an event: ``data`` followed by ``more``
        (a plain protocol's data, or a stream's that arrived before its reader did)."""
        protocol = self._protocol
        if self._read_closed or protocol is None or self._done:
            self._core.consumed(self._handle, n)  # dropped, but keep the peer's credit flowing
            return
        inbox = self._inbox
        if inbox is not None:
            inbox.add(data, more, n)  # (counted as unconsumed by the core already)
            reader = self._reader
            if reader is not None:
                reader.wakeup()
            return
        try:
            received = self._app.data_received
            received(bytes(data))
            for part in more:
                received(bytes(part))
        except Exception as exc:  # noqa: BLE001 (logged with its traceback by _protocol_failed)
            self._protocol_failed("data_received", exc)
            return
        if self._reading_paused:
            self._held_credit += n
        else:
            self._core.consumed(self._handle, n)

    # The reader's source (ReaderSource).

    def reader_waiting(self) -> None:
        """The reader waits for more than its buffer holds: credit all of it."""
        self._core.reader_waiting(self._handle)
        self._host.process()

    def _fill_reader(self) -> None:
        """What the inbox holds, into the reader's buffer (before its end)."""
        if self._reader is not None:
            self._reader.fill()

    def remote_end(self) -> None:
        """The peer finished writing."""
        self._remote_ended = True
        protocol = self._protocol
        if protocol is None or self._done or self._read_closed:
            return
        self._fill_reader()  # all data before the EOF
        try:
            keep_open = self._app.eof_received()
        except Exception as exc:  # noqa: BLE001 (logged with its traceback by _protocol_failed)
            self._protocol_failed("eof_received", exc)
            return
        if not keep_open:
            self.close()

    def _protocol_failed(self, callback: str, exc: Exception) -> None:
        """The channel's protocol raised: reset this channel, not the session (the
        exception would otherwise unwind into the session's own ``data_received``)."""
        logger.error("%s: %s of %s raised", self._core.format, callback, self._label_text, exc_info=exc)
        self.reset(exc)

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
        self._read_closed = True  # (the core drops and credits what the inbox holds)
        self._eof_requested = True
        self._core.close_channel(self._handle)
        self._host.process()

    def abort(self) -> None:
        """Terminate the channel at once, discarding buffered data."""
        self.reset(None)

    def reset(self, error: str | BaseException | None = None) -> None:
        """Terminate the channel at once, telling the peer ``error`` where the format
        carries a message (MultiplexingStream v2/v3 send ``"Type: message"`` like the
        reference). Buffered data is discarded."""
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        if self._handle in self._core.channels:
            self._core.reset(self._handle, error)
            self._host.process()
        else:
            self.finished(None, None)

    def finished(
        self,
        error: Exception | None,
        write_error: Exception | None,
        *,
        drop_unread: bool = False,
        lingering: bool = False,
    ) -> None:
        """The core is done with the channel (``lingering``: the application is; the
        engine waits for the peer's end). See :class:`polymux.session.events.Finished`."""
        if lingering:
            self._deliver_lost(None)
            return
        if write_error is not None and self._write_error is None:
            self._write_error = write_error
        if self._write_error is None:
            self._write_error = error or ChannelClosedError(
                f"{self._core.format}: {self._label_text} is closed"
            )
        if drop_unread and self._reader is not None:
            self._reader.drop()  # the data is gone: fail now, not after it
        self._deliver_lost(error)

    def _deliver_lost(self, exc: Exception | None) -> None:
        if self._done:
            return
        self._done = True
        self._closing = True
        if not self._read_closed:
            self._fill_reader()  # what arrived is readable before the end (or the error)
        protocol = self._protocol
        if protocol is not None:
            protocol.connection_lost(exc)

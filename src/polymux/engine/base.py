"""The sans-I/O engine interface every wire format implements (h2's ``H2Connection`` shape).

Call order, as in every sans-I/O protocol library:

1. Feed received bytes to :meth:`Engine.receive_data`; it returns events. A
   :class:`~polymux.exceptions.ProtocolError` means the peer broke the format: stop
   using the engine and end the session.
2. Issue commands (``open_channel``, ``send_data``, ``ack_consumed`` ...).
3. After either, call :meth:`Engine.data_to_send` and write what it returns, in order.

The engine never does I/O, never reads a clock of its own and never buffers channel
data waiting for credit: the I/O layer asks :meth:`Engine.send_credit` how much it may
send and keeps the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from polymux._types import BytesLike
from polymux.engine.channel import ChannelRecord
from polymux.engine.events import DataReceived, Event
from polymux.exceptions import PolymuxError, ProtocolError


__all__ = ["DataRuns", "Engine", "run_size"]


def run_size(data: BytesLike, more: tuple[BytesLike, ...]) -> int:
    """Bytes in ``data`` followed by ``more`` (``send_data``'s parts)."""
    return len(data) + sum(map(len, more)) if more else len(data)


class DataRuns:
    """Collects consecutive data frames of one channel into one ``DataReceived`` (so the
    I/O layer wakes a reader once per read, not once per frame). Shared by every engine.

    Call :meth:`add` per data frame and :meth:`flush` before any other event is appended
    (and at the end), so events keep the wire's order.
    """

    __slots__ = ("chunks", "events", "length", "record")

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.record: ChannelRecord | None = None
        self.chunks: list[BytesLike] = []
        self.length = 0

    def add(self, record: ChannelRecord, payload: BytesLike, n: int) -> None:
        """Append ``n`` bytes of ``record``'s data."""
        if record is self.record:
            self.chunks.append(payload)
            self.length += n
            return
        if self.record is not None:
            self.flush()
        self.record, self.chunks, self.length = record, [payload], n

    def flush(self) -> None:
        """Emit the pending run, if any."""
        record = self.record
        if record is not None:
            chunks = self.chunks
            self.events.append(DataReceived(record.handle, chunks[0], self.length, tuple(chunks[1:])))
            self.record = None


class Engine(ABC):
    """Base class of the per-format state machines."""

    format: str
    """The wire format's name, as in ``protocol=``."""
    max_frame: int
    """Largest payload one data frame carries."""
    has_flow_control: bool
    """True when the peer returns credit on the wire (the reader need not pause the
    connection to bound memory)."""
    now: float = 0.0
    """The current time, set by the I/O layer before it calls in (formats with timers:
    RTT, window tuning); engines never read a clock themselves."""
    needs_acceptance: bool = True
    """True when an opened channel waits for the peer's acceptance before it is usable;
    False when it is open at once (mplex)."""
    open_acknowledged: bool = False
    """True when the peer acknowledges each open that is usable at once (yamux's ACK): the
    session bounds the opens awaiting it (``max_unacked_opens``, ``stream_open_timeout``)."""
    has_ping: bool = False
    """True when the format has pings (:meth:`ping`, a ``PingAcked`` event)."""
    ping_answered: bool = True
    """True when the peer answers :meth:`ping` (yamux, Streamux). False when nothing answers
    the format's keepalive frame (smux's NOP): the next whole frame from the peer
    acknowledges the ping instead, so an idle peer's own keepalive is the answer."""
    one_way: bool = False
    """True when channels carry data from their opener to their acceptor only
    (omnistreams): the opener's reader and the acceptor's writer refuse."""
    has_controls: bool = False
    """True when the format carries session-level control messages (:meth:`send_control`,
    a ``ControlReceived`` event)."""
    message_mode: bool = False
    """True when the engine takes whole messages from a transport that keeps message
    boundaries (omnistreams over WebSocket) instead of a byte stream."""
    rtt: float | None = None
    """The latest round-trip time measured with a ping (formats with pings)."""

    def __init__(self) -> None:
        self._out: list[BytesLike] = []
        self._channels: dict[int, ChannelRecord] = {}
        self._next_handle = 1
        self.closed = False
        """True once the engine raised a protocol error or was closed."""

    # -- outbound bytes ----------------------------------------------------------------------

    def data_to_send(self) -> list[BytesLike]:
        """Return (and forget) the byte chunks to write, in order."""
        out, self._out = self._out, []
        return out

    @property
    def has_output(self) -> bool:
        """Whether :meth:`data_to_send` has anything."""
        return bool(self._out)

    @property
    def queued_frames(self) -> int:
        """Chunks :meth:`data_to_send` would return (while the I/O layer cannot write, these
        are control frames: answers, acknowledgements, resets; it bounds them)."""
        return len(self._out)

    def _new_handle(self) -> int:
        handle = self._next_handle
        self._next_handle += 1
        return handle

    def _record(self, channel: int) -> ChannelRecord:
        try:
            return self._channels[channel]
        except KeyError:
            raise KeyError(f"{self.format}: no live channel with handle {channel}") from None

    def channel_name(self, channel: int) -> str:
        """The name of a live channel."""
        return self._record(channel).name

    def describe(self, channel: int) -> str:
        """A label for a channel in messages (wire id, origin, name)."""
        record = self._channels.get(channel)
        return record.describe() if record else f"channel #{channel}"

    def is_live(self, channel: int) -> bool:
        """Whether the engine still tracks ``channel``."""
        return channel in self._channels

    @property
    def channel_count(self) -> int:
        """Channels the engine tracks (offered, open or closing)."""
        return len(self._channels)

    def _error(self, message: str) -> ProtocolError:
        self.closed = True
        return ProtocolError(self.format, message)

    # -- the interface -----------------------------------------------------------------------

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Whether channels may be opened (the handshake, if any, is done)."""

    @abstractmethod
    def receive_data(self, data: bytes) -> list[Event]:
        """Process bytes from the peer; return the events they caused.

        After calling this, call :meth:`data_to_send` (replies may be queued).
        Raises :class:`~polymux.exceptions.ProtocolError` on malformed or illegal input.
        """

    @abstractmethod
    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Offer (open) a channel; return its handle. ``extra``: more creation metadata,
        where the format carries some (omnistreams); other formats ignore it."""

    @abstractmethod
    def accept_channel(self, channel: int) -> None:
        """Accept a channel the peer offered."""

    @abstractmethod
    def reject_channel(self, channel: int) -> None:
        """Reject a channel the peer offered; the engine forgets it."""

    def send_credit(self, channel: int) -> int:
        """Bytes that may be sent on ``channel`` now (0 when it cannot send)."""
        record = self._channels.get(channel)
        if record is None or not record.accepted or record.local_end or record.remote_stopped_reading:
            return 0
        return record.send.available

    def may_hold(self, channel: int, held: int) -> bool:
        """The I/O layer holds ``held`` bytes for ``channel``, more than it lets pile up
        before it makes someone wait (unsent bytes past the write buffer's high-water mark,
        or unread bytes past the receive window): may it go on without waiting?

        False (the default): no, block the writer (or stop reading the connection) as
        usual. True: the format holds the channel's answer back until something the peer
        finishes only while the application goes on reading and writing (a Streamux
        response waits for the end of its request), so waiting could deadlock; the engine
        bounds the bytes instead and raises :class:`~polymux.exceptions.LimitExceeded`
        beyond its limits (the I/O layer then resets the channel). Called again as
        ``held`` grows.
        """
        return False

    def _writable(self, channel: int) -> ChannelRecord:
        """The record of a channel we may send on; a local bug otherwise."""
        record = self._record(channel)
        if not record.accepted or record.local_end or record.remote_stopped_reading:
            raise RuntimeError(
                f"{self.format}: cannot send on {record.describe()} in state {record.state.value}"
            )
        return record

    def _queue_frames(
        self,
        record: ChannelRecord,
        data: BytesLike,
        more: tuple[BytesLike, ...],
        total: int,
        header: Callable[[int], bytes],
    ) -> None:
        """Queue ``data`` followed by ``more`` (``total`` bytes, see :func:`run_size`) as
        one run of frames of at most :attr:`max_frame` bytes: ``header(size)``, then views
        of the payload (no copy; a frame may span parts). The header of a full frame is
        encoded once per channel (``record.full_header``): only data frames use this."""
        out = self._out
        step = self.max_frame
        if total < step:  # one frame (every turn of a channel among many)
            out.append(header(total))
            out.append(data)
            out.extend(more)
            return
        cached = record.full_header
        if cached is not None and cached[0] == step:
            full = cached[1]
        else:  # first full frame (or the frame size changed: Streamux negotiates it)
            full = header(step)
            record.full_header = (step, full)
        remaining = total
        room = 0  # bytes the current frame still takes
        for part in (data, *more) if more else (data,):
            size = len(part)
            if room >= size:  # the whole part fits in the current frame
                out.append(part)
                room -= size
                continue
            view = memoryview(part)
            pos = 0
            while pos < size:
                if not room:
                    room = min(step, remaining)
                    remaining -= room
                    out.append(full if room == step else header(room))
                k = min(room, size - pos)
                out.append(part if k == size else view[pos : pos + k])
                pos += k
                room -= k

    @abstractmethod
    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue ``data`` (followed by ``more``: one run of bytes in several parts) as data
        frames of at most ``max_frame`` bytes. The total must not exceed
        :meth:`send_credit`; the I/O layer keeps what does not fit. The engine keeps views
        of the parts: do not mutate them before the bytes are written."""

    @abstractmethod
    def end_channel(self, channel: int) -> bool:
        """Half-close: we will write no more. Returns True when this closed the channel
        completely (the peer had ended too) and the engine forgot it."""

    @abstractmethod
    def reset_channel(self, channel: int, message: str | None = None) -> None:
        """Terminate the channel abnormally (carrying ``message`` where the format can);
        the engine forgets it."""

    @abstractmethod
    def ack_consumed(self, channel: int, n: int) -> None:
        """The application consumed ``n`` bytes of ``channel``: return credit as due."""

    def receive_eof(self) -> None:
        """The peer closed its side of the connection. Raises
        :class:`~polymux.exceptions.ProtocolError` if that cut a frame in half."""
        unfinished = self._unfinished_input()
        self.closed = True
        if unfinished is not None:
            pending, what = unfinished
            raise ProtocolError(
                self.format, f"connection ended inside a {what} ({pending} bytes of it received)"
            )

    def _unfinished_input(self) -> tuple[int, str] | None:
        """``(bytes held back, what they start)`` when received input stops mid-frame."""
        return None

    @property
    def can_open(self) -> bool:
        """Whether new channels may be opened (False after a go-away either way)."""
        return True

    def metadata(self, channel: int) -> bytes | None:
        """The channel's creation metadata as sent on the wire (``None``: the format has none)."""
        return None

    def metadata_object(self, channel: int) -> dict[str, Any] | None:
        """The channel's creation metadata as a JSON object (``None``: none, or opaque)."""
        return None

    def send_control(self, data: BytesLike) -> None:
        """Queue a control message (formats with :attr:`has_controls`)."""
        raise PolymuxError(f"{self.format} has no control messages")

    def ping(self) -> int:
        """Send a ping and return its opaque value; a ``PingAcked`` event follows. Formats
        without pings raise ``NotImplementedError``."""
        raise NotImplementedError(f"{self.format} has no ping")

    def close(self) -> None:
        """Say goodbye on the wire, where the format has a way to (MultiplexingStream has
        none). Received data is still processed afterwards: a graceful close waits for
        the peer to finish."""
        return  # nothing to send by default

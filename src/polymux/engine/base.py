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
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from polymux._types import BytesLike
from polymux.engine.channel import IGNORE, ChannelRecord, ChannelState, Input, Transitions
from polymux.engine.events import ChannelClosed, ChannelEnded, Event
from polymux.engine.flow import ReceiveWindow, SendCredit
from polymux.engine.plane import NO_CREDIT_STEP, DataRuns
from polymux.engine.spec import Capabilities
from polymux.exceptions import FlowControlError, PolymuxError, ProtocolError


if TYPE_CHECKING:
    from typing_extensions import TypeVar

    from polymux.engine.plane import Inbox

    R = TypeVar("R", bound=ChannelRecord, default=Any)
else:  # typing.TypeVar takes a default from Python 3.13 on; only the type checker needs it
    from typing import TypeVar

    R = TypeVar("R", bound=ChannelRecord)
"""The record type of an engine's channels: a format's own :class:`ChannelRecord` subclass
(a bare ``Engine``, as the layers above use it, is an engine of any format)."""

__all__ = ["DataRuns", "Engine", "run_size"]  # DataRuns: polymux.engine.plane's, for the formats


def run_size(data: BytesLike, more: tuple[BytesLike, ...]) -> int:
    """Bytes in ``data`` followed by ``more`` (``send_data``'s parts)."""
    return len(data) + sum(map(len, more)) if more else len(data)


class Engine(ABC, Generic[R]):
    """Base class of the per-format state machines, and the skeleton they share.

    The skeleton: :meth:`receive_data` (the closed check, one :class:`DataRuns` per read,
    the protocol error that closes the engine), the channel table and the wire-id table
    (:meth:`_add`, :meth:`_forget`), state changes by the format's transition tables
    (:meth:`_step`), and the commands whose shape every format shares (accept, reject,
    end, reset); a format fills in its frames through the ``_on_*`` / ``_send_*`` hooks.
    """

    format: str
    """The wire format's name, as in ``protocol=``."""
    max_frame: int
    """Largest payload one data frame carries."""
    caps: Capabilities
    """What the format can carry and how its channels behave: the one declaration of the
    format's capabilities (its engine module's); the flags below are read from it."""
    has_flow_control: bool
    """True when the peer returns credit on the wire (the reader need not pause the
    connection to bound memory): ``caps.credit`` is not ``None``."""
    now: float = 0.0
    """The current time, set by the I/O layer before it calls in (formats with timers:
    RTT, window tuning); engines never read a clock themselves."""
    needs_acceptance: bool
    """True when an opened channel waits for the peer's acceptance before it is usable;
    False when it is open at once (mplex): ``caps.acceptance``."""
    open_acknowledged: bool
    """True when the peer acknowledges each open that is usable at once (yamux's ACK): the
    session bounds the opens awaiting it (``max_unacked_opens``, ``stream_open_timeout``):
    ``caps.open_acknowledged``."""
    has_ping: bool
    """True when the format has pings (:meth:`ping`, a ``PingAcked`` event): ``caps.ping``."""
    ping_answered: bool
    """True when the peer answers :meth:`ping` (yamux, Streamux). False when nothing answers
    the format's keepalive frame (smux's NOP): the next whole frame from the peer
    acknowledges the ping instead, so an idle peer's own keepalive is the answer:
    ``caps.ping_answered``."""
    one_way: bool
    """True when channels carry data from their opener to their acceptor only
    (omnistreams): the opener's reader and the acceptor's writer refuse: ``caps.one_way``."""
    has_controls: bool
    """True when the format carries session-level control messages (:meth:`send_control`,
    a ``ControlReceived`` event): ``caps.controls``."""
    credit_estimated: bool = False
    """True when :meth:`credit_step` is an estimate, not a bound (omnistreams counts
    messages): a reader that waits reports what it consumed, so no credit waits for more."""
    message_mode: bool = False
    """True when the engine takes whole messages from a transport that keeps message
    boundaries (omnistreams over WebSocket) instead of a byte stream."""
    rtt: float | None = None
    """The latest round-trip time measured with a ping (formats with pings)."""
    peer_pings: int = 0
    """Pings received from the peer (and answered), in all: on formats without credit, a
    peer that does not read (its backpressure) but pings shows that it is alive."""
    peer_heartbeats: int = 0
    """Heartbeats (:meth:`heartbeat`) received from the peer, in all."""
    _tables: ClassVar[tuple[Transitions, Transitions]]
    """The format's transition tables: ``[False]`` for channels the peer opened, ``[True]``
    for ours (the same table twice where the roles do not differ)."""
    _ids_per_origin: ClassVar[bool] = True
    """True when each side counts its own channel ids (a wire id names a channel only with
    its origin); False when the sides share one id space (yamux, smux: odd and even)."""

    def __init__(self, caps: Capabilities) -> None:
        self.caps = caps
        self.has_flow_control = caps.credit is not None
        self.needs_acceptance = caps.acceptance
        self.open_acknowledged = caps.open_acknowledged
        self.has_ping = caps.ping
        self.ping_answered = caps.ping_answered
        self.one_way = caps.one_way
        self.has_controls = caps.controls
        self._out: list[BytesLike] = []
        self._channels: dict[int, R] = {}
        self._by_wire: dict[Hashable, R] = {}
        """Live channels by wire key (:meth:`_wire_key`)."""
        self._next_handle = 1
        self.closed = False
        """True once the engine raised a protocol error or was closed."""
        self.runs = DataRuns()
        """The receiving half of the data plane (:mod:`polymux.engine.plane`): data frames
        into their channels' inboxes, or into events."""

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

    def _record(self, channel: int) -> R:
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

    def _overrun(self, record: R, n: int) -> FlowControlError:
        """The peer sent ``n`` bytes beyond ``record``'s receive window."""
        recv = record.recv
        assert recv is not None
        self.closed = True
        return FlowControlError(
            self.format,
            f"{record.describe()} overran its receive window: {recv.outstanding} + {n} bytes > "
            f"window {recv.window}",
        )

    # -- channel tables and states -----------------------------------------------------------

    def _wire_key(self, record: R) -> Hashable:
        return (record.local_origin, record.wire_id) if self._ids_per_origin else record.wire_id

    def _initial(self, local: bool) -> ChannelState:
        """The state a channel starts in: opened by us (``local``) or by the peer."""
        state = self._tables[local].moves[(ChannelState.IDLE, Input.OPEN if local else Input.RECV_OPEN)]
        assert isinstance(state, ChannelState)
        return state

    def _create(
        self,
        cls: type[R],
        wire_id: int,
        *,
        local: bool,
        name: str,
        send: SendCredit,
        recv: ReceiveWindow | None = None,
        **fields: Any,
    ) -> R:
        """Create and track the record of a new channel, opened by us (``local``) or by the
        peer, in the state the format's table starts it in; ``fields``: the format's own."""
        record = cls(
            handle=self._new_handle(),
            wire_id=wire_id,
            local_origin=local,
            name=name,
            send=send,
            recv=recv,
            state=self._initial(local),
            **fields,
        )
        self._channels[record.handle] = record
        self._by_wire[self._wire_key(record)] = record
        return record

    def _forget(self, record: R) -> None:
        """Stop tracking ``record`` (done by :meth:`_step` on reaching CLOSED)."""
        record.state = ChannelState.CLOSED
        if self._channels.pop(record.handle, None) is not None:
            self._release(record)
        key = self._wire_key(record)
        if self._by_wire.get(key) is record:  # (the peer may have reused the id already)
            del self._by_wire[key]

    def _release(self, record: R) -> None:
        """Hook: give back what ``record`` held of the session (windows, budgets, ids)."""
        return

    def _step(self, record: R, input_: Input) -> ChannelState | None:
        """Apply ``input_`` to ``record`` by the format's table (rule 1 of
        :mod:`polymux.engine.channel`): return the new state (CLOSED: the record is
        forgotten), or None when the table ignores the input; raise when it refuses it."""
        state = record.state
        outcome = self._tables[record.local_origin].outcome(state, input_)
        if isinstance(outcome, ChannelState):
            if outcome is ChannelState.CLOSED:
                self._forget(record)
            else:
                record.state = outcome
            return outcome
        if outcome is IGNORE:
            return None
        message = outcome.message.format(
            channel=record.describe(), id=record.wire_id, state=state.value, input=input_.label
        )
        if input_.received:
            self.closed = True
            raise outcome.error(self.format, message)
        raise RuntimeError(f"{self.format}: {message}")

    def _recv_end(self, record: R, events: list[Event]) -> ChannelState | None:
        """The peer ended its writing on ``record``: step, report, and say goodbye on the
        wire if that closed the channel. Returns the new state (None: ignored)."""
        state = self._step(record, Input.RECV_END)
        if state is not None:
            events.append(ChannelEnded(record.handle))
            if state is ChannelState.CLOSED:
                self._on_closed(record)
                events.append(ChannelClosed(record.handle))
        return state

    def _on_closed(self, record: R) -> None:
        """Hook: both sides ended ``record`` (the format's last word, if it has one)."""
        return

    # -- the interface -----------------------------------------------------------------------

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Whether channels may be opened (the handshake, if any, is done)."""

    def receive_data(self, data: bytes) -> list[Event]:
        """Process bytes from the peer; return the events they caused.

        After calling this, call :meth:`data_to_send` (replies may be queued).
        Raises :class:`~polymux.exceptions.ProtocolError` on malformed or illegal input.
        """
        if self.closed:
            raise self._error("received data after the session ended")
        runs = self.runs
        try:
            self._receive(data, runs)
        except ProtocolError as exc:
            self.closed = True
            failure = self._failed(exc)
            if failure is exc:
                raise
            raise failure from None
        return runs.take_events()

    @abstractmethod
    def _receive(self, data: bytes, runs: DataRuns) -> None:
        """Process bytes from the peer: data into ``runs``, other events into ``runs.events``
        (flushing ``runs`` first)."""

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """Where the first ``most`` frames of ``data`` from ``start`` would end, read from
        their headers only (nothing is decoded or changed): a driver that processes a read a
        part at a time cuts it there, so no frame is split by the cut. ``start`` where the
        format cannot tell (mid-frame, during a handshake, or a format without a walk): the
        driver then cuts by bytes. A frame that runs past ``data`` ends it at ``len(data)``.
        """
        return start

    def _failed(self, exc: ProtocolError) -> ProtocolError:
        """Hook: the peer broke the format (the engine is closed now); return the error to
        raise (``exc`` itself by default)."""
        return exc

    @abstractmethod
    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Offer (open) a channel; return its handle. ``extra``: more creation metadata,
        where the format carries some (omnistreams); other formats ignore it."""

    def accept_channel(self, channel: int) -> None:
        """Accept a channel the peer offered."""
        record = self._record(channel)
        self._step(record, Input.ACCEPT)
        self._on_accept(record)

    def _on_accept(self, record: R) -> None:
        """Hook: the wire side of accepting ``record`` (nothing by default)."""
        return

    def reject_channel(self, channel: int) -> None:
        """Reject a channel the peer offered; the engine forgets it."""
        record = self._record(channel)
        previous = record.state
        self._step(record, Input.REJECT)
        self._on_reject(record, previous)

    @abstractmethod
    def _on_reject(self, record: R, previous: ChannelState) -> None:
        """The wire side of rejecting ``record`` (which was in ``previous``)."""

    def send_credit(self, channel: int) -> int:
        """Bytes that may be sent on ``channel`` now (0 when it cannot send)."""
        record = self._channels.get(channel)
        if record is None or record.state not in self._tables[record.local_origin].sending:
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

    def _writable(self, channel: int) -> R:
        """The record of a channel we may send on; a local bug otherwise."""
        record = self._channels.get(channel)
        if record is None:
            record = self._record(channel)  # raises, naming the channel
        if record.state not in self._tables[record.local_origin].sending:
            self._step(record, Input.SEND)  # raises the table's refusal
        return record

    def _queue_frames(
        self,
        record: R,
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

    def end_channel(self, channel: int) -> bool:
        """Half-close: we will write no more. Returns True when this closed the channel
        completely (the peer had ended too) and the engine forgot it."""
        record = self._record(channel)
        state = self._step(record, Input.END)
        if state is None:
            return False  # ended already
        self._send_end(record)
        if state is ChannelState.CLOSED:
            self._on_closed(record)
            return True
        return False

    @abstractmethod
    def _send_end(self, record: R) -> None:
        """The wire side of ending our writing on ``record``."""

    def reset_channel(self, channel: int, message: str | None = None) -> None:
        """Terminate the channel abnormally (carrying ``message`` where the format can);
        the engine forgets it."""
        record = self._channels.get(channel)
        if record is not None:
            previous = record.state
            self._step(record, Input.RESET)
            self._send_reset(record, previous, message)

    @abstractmethod
    def _send_reset(self, record: R, previous: ChannelState, message: str | None) -> None:
        """The wire side of resetting ``record`` (which was in ``previous``)."""

    @abstractmethod
    def ack_consumed(self, channel: int, n: int) -> None:
        """The application consumed ``n`` bytes of ``channel``: return credit as due."""

    def _credit_due(self, channel: int, n: int) -> tuple[R, int] | None:
        """``n`` bytes of ``channel`` were consumed: its record and the credit now due to
        the peer, or None when none is (not yet, or the channel has no receive window, is
        gone, or the peer ended it: after its end no more data comes, credit is moot)."""
        record = self._channels.get(channel)
        if record is None or record.recv is None or record.remote_end:
            return None
        credit = record.recv.consumed(n)
        return (record, credit) if credit else None

    def attach_inbox(self, channel: int, inbox: Inbox | None) -> bool:
        """Deliver ``channel``'s data frames straight into ``inbox`` (None: as events
        again). False when the engine no longer tracks the channel."""
        record = self._channels.get(channel)
        if record is None:
            return False
        record.inbox = inbox
        return True

    def credit_step(self, channel: int) -> int:
        """Bytes the application may consume on ``channel`` before credit is due to the
        peer (an inbox reports its consumption then: :mod:`polymux.engine.plane`); at
        least 1. Formats without credit: :data:`~polymux.engine.plane.NO_CREDIT_STEP`."""
        record = self._channels.get(channel)
        if record is None:
            return 1
        recv = record.recv
        if recv is None:
            return NO_CREDIT_STEP
        return max(1, recv.threshold - recv.pending)

    def receive_eof(self) -> None:
        """The peer closed its side of the connection. Raises
        :class:`~polymux.exceptions.ProtocolError` if that cut a frame in half."""
        pending, what = self._unfinished_input()
        self.closed = True
        if pending:
            raise ProtocolError(
                self.format, f"connection ended inside a {what} ({pending} bytes of it received)"
            )

    @abstractmethod
    def _unfinished_input(self) -> tuple[int, str]:
        """``(bytes held back, what they start)``: received input that stops mid-frame."""

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

    def heartbeat(self) -> bool:
        """Formats without pings: queue a heartbeat, a frame of the format that every
        reader ignores and a polymux peer counts (:attr:`peer_heartbeats`) as a sign of
        life. False where the format has none to send."""
        return False

    def close(self) -> None:
        """Say goodbye on the wire, where the format has a way to (MultiplexingStream has
        none). Received data is still processed afterwards: a graceful close waits for
        the peer to finish."""
        return  # nothing to send by default

"""The session core's channel table: what the core knows of each channel, and the two state
tables a channel's life follows.

Rules (the shape of h2's ``stream.py`` and h11's ``_state.py``, as in
``polymux.engine.channel`` one layer down):

* Rule 1: a channel's life changes only through :meth:`CoreChannel.step`, which applies
  :data:`SENDING` (our half: what the application writes) or :data:`RECEIVING` (the peer's
  half, as the application takes it). A step not in its table is a bug in the core
  (``RuntimeError``), never something a peer can cause: the engine has checked the peer's
  frames against the format's own tables first.
* Rule 2: a finished channel has no state: it leaves the table (:meth:`ChannelTable.pop`).
* Rule 3: a channel's other fields are not its life but one job's bookkeeping each (the
  scheduler's queue, the writer's marks and pause, the memory budget, the slow-reader
  policy); each says whose it is.

The table also keeps what the session counts over its channels (the peer's live channels,
those not yet taken by the application, running handlers) and the per-channel deadlines.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from enum import Enum, IntEnum
from typing import Self

from polymux._types import BytesLike
from polymux.engine.plane import Inbox, Plane


__all__ = ["RECEIVING", "SENDING", "ChannelTable", "CoreChannel", "Receiving", "Sending", "Step", "Timer"]


class Sending(Enum):
    """Our half of a channel: what the application writes, and our end of writing."""

    OFFERED = "offered", False, False, False
    """Our open awaits the peer's acceptance: writes queue, nothing goes out."""
    OFFERED_ENDING = "offered-ending", False, True, False
    """Offered, and the application already ended its writing (``write_eof()``/``close()``)."""
    OPEN = "open", True, False, False
    """Data goes out as the peer's credit allows."""
    ENDING = "ending", True, True, False
    """``write_eof()`` or ``close()``: our end goes out after the queued data."""
    ENDED = "ended", True, True, True
    """Our end went out (half-closed local); the peer may still write."""
    LINGERING = "lingering", True, True, True
    """``close()``, then our end went out: over for the application; the engine keeps the
    channel until the peer ends too (what it sends meanwhile is dropped)."""

    accepted: bool
    """Past the offer: data may go out."""
    end_wanted: bool
    """The application ended its writing."""
    end_sent: bool
    """Our end went out."""

    def __new__(cls, value: str, accepted: bool, end_wanted: bool, end_sent: bool) -> Self:
        state = object.__new__(cls)
        state._value_ = value
        state.accepted = accepted
        state.end_wanted = end_wanted
        state.end_sent = end_sent
        return state

    __hash__ = object.__hash__  # identity (Enum's own hashes the name, in Python): keys the table


class Receiving(Enum):
    """The peer's half of a channel: what it writes, as the application takes it."""

    OPEN = "open", False, False
    """What arrives goes to the channel's reader (a :class:`~polymux.session.events.Data`)."""
    ENDED = "ended", False, True
    """The peer's end arrived; what came before stays readable."""
    ANSWER = "answer", False, False
    """A request's answer: the core collects what arrives (:mod:`polymux.session.requests`)."""
    CLOSED = "closed", True, False
    """``close()``: what arrives is dropped (its credit returned)."""
    CLOSED_ENDED = "closed-ended", True, True
    """Closed, and the peer's end arrived."""

    closed: bool
    """The application stopped reading (``close()``)."""
    ended: bool
    """The peer's end arrived."""

    def __new__(cls, value: str, closed: bool, ended: bool) -> Self:
        state = object.__new__(cls)
        state._value_ = value
        state.closed = closed
        state.ended = ended
        return state

    __hash__ = object.__hash__


class Step(Enum):
    """What moves a channel along one of its two tables."""

    ACCEPT = "accept", True
    """The peer accepted our offer."""
    END = "end", True
    """The application ended its writing (``write_eof()``, or ``close()``)."""
    SEND_END = "send the end", True
    """The scheduler sent our end."""
    SEND_END_CLOSED = "send the end after close()", True
    """The scheduler sent our end, and the application had closed the channel."""
    PEER_END = "the peer's end", False
    """The peer ended its writing."""
    CLOSE = "close", False
    """``close()``: the application reads no more."""
    ANSWER = "collect an answer", False
    """The channel carries a request: the core collects what arrives."""

    sending: bool
    """A step of :data:`SENDING` (else of :data:`RECEIVING`)."""

    def __new__(cls, value: str, sending: bool) -> Self:
        step = object.__new__(cls)
        step._value_ = value
        step.sending = sending
        return step

    __hash__ = object.__hash__


SENDING: dict[tuple[Sending, Step], Sending] = {
    (Sending.OFFERED, Step.ACCEPT): Sending.OPEN,
    (Sending.OFFERED, Step.END): Sending.OFFERED_ENDING,
    (Sending.OFFERED_ENDING, Step.ACCEPT): Sending.ENDING,
    (Sending.OPEN, Step.END): Sending.ENDING,
    (Sending.ENDING, Step.SEND_END): Sending.ENDED,
    (Sending.ENDING, Step.SEND_END_CLOSED): Sending.LINGERING,
}
"""Our half: ``(state, step) -> new state``. Channels the peer opened, and ours on formats
whose opens are usable at once, start :attr:`Sending.OPEN`; ours that await acceptance,
:attr:`Sending.OFFERED`. Finishing (a reset, both ends done, the session lost) is leaving
the table, from any state."""

RECEIVING: dict[tuple[Receiving, Step], Receiving] = {
    (Receiving.OPEN, Step.PEER_END): Receiving.ENDED,
    (Receiving.OPEN, Step.CLOSE): Receiving.CLOSED,
    (Receiving.OPEN, Step.ANSWER): Receiving.ANSWER,
    (Receiving.ANSWER, Step.PEER_END): Receiving.ENDED,
    (Receiving.ANSWER, Step.CLOSE): Receiving.CLOSED,
    (Receiving.ENDED, Step.CLOSE): Receiving.CLOSED_ENDED,
    (Receiving.CLOSED, Step.PEER_END): Receiving.CLOSED_ENDED,
}
"""The peer's half: ``(state, step) -> new state``. Every channel starts
:attr:`Receiving.OPEN`."""


class Timer(IntEnum):
    """Per-channel deadlines (entries of :attr:`ChannelTable.timers`)."""

    OPEN = 0
    """``stream_open_timeout``: the peer never acknowledged our open."""
    CLOSE = 1
    """``close_timeout``: a ``close()``\\ d channel whose peer never ended it."""
    OVERFLOW = 2
    """``slow_reader_timeout``: a full channel held the connection too long."""


NO_QUEUE: deque[BytesLike] = deque()
"""Shared, always empty: a channel's write queue until it first needs one (an empty deque
costs ~600 bytes, and a session may hold 100,000 idle channels)."""


_NO_PLANE = Plane()
"""The plane of channels made without a session's (tests of the tables alone)."""


class CoreChannel:
    """What the core knows about one channel (the driver keeps the reader side)."""

    __slots__ = (
        "buf",
        "buffered",
        "handle",
        "held",
        "high",
        "holding",
        "inbox",
        "label",
        "local",
        "low",
        "name",
        "paused",
        "progress",
        "queued",
        "reading_paused",
        "receiving",
        "sending",
        "slow",
        "slow_since",
        "streamed",
    )

    def __init__(
        self,
        handle: int,
        name: str,
        label: str,
        local: bool,
        high: int,
        low: int,
        *,
        accepted: bool,
        inbox: Inbox | None = None,
    ) -> None:
        self.handle = handle
        self.name = name
        self.label = label
        self.local = local
        # Its life (rule 1).
        self.sending = Sending.OPEN if accepted else Sending.OFFERED
        self.receiving = Receiving.OPEN
        # The writer (the scheduler's queue, the writer's marks and pause).
        self.buf: deque[BytesLike] = NO_QUEUE
        self.buffered = 0  # written by the application, not yet handed to the engine
        self.queued = False  # in the scheduler's ready queue
        self.progress = 0  # bytes handed to the engine since the close timer was last armed
        self.high = high  # the writer's high-water mark (drain() blocks above it) ...
        self.low = low  # ... and its low-water mark (drain() resumes at it)
        self.paused = False  # the writer's drain() blocks
        self.held = False  # paused by the session's unsent budget (Budget.held_writers)
        # The memory budget.
        self.holding = False  # the format holds its unsent bytes back (Engine.may_hold)
        # What arrived for the application (received, not yet consumed: inbox.unconsumed).
        self.inbox = inbox if inbox is not None else Inbox(_NO_PLANE, handle)
        self.streamed = False  # its data goes straight into the inbox (a stream reader)
        # Reading (the slow-reader policy, plain protocols' pause_reading()).
        self.reading_paused = False
        self.slow = False  # holding the connection (slow-reader policy)
        self.slow_since = 0.0

    def __repr__(self) -> str:
        return f"<CoreChannel {self.label} {self.sending.value}/{self.receiving.value}>"

    @property
    def unconsumed(self) -> int:
        """Bytes received for the application and not yet consumed (its inbox's count)."""
        return self.inbox.unconsumed

    def step(self, step: Step) -> None:
        """Move the channel along its tables (rule 1)."""
        if step.sending:
            new = SENDING.get((self.sending, step))
            if new is None:
                raise RuntimeError(f"{self.label}: cannot {step.value} while {self.sending.value}")
            self.sending = new
        else:
            got = RECEIVING.get((self.receiving, step))
            if got is None:
                raise RuntimeError(f"{self.label}: cannot {step.value} while {self.receiving.value}")
            self.receiving = got

    # Views of its life (for the drivers, the tests and the messages).

    @property
    def accepted(self) -> bool:
        """Past the offer: data may go out."""
        return self.sending.accepted

    @property
    def eof_requested(self) -> bool:
        """The application ended its writing (``write_eof()`` or ``close()``)."""
        return self.sending.end_wanted

    @property
    def eof_sent(self) -> bool:
        """Our end went out."""
        return self.sending.end_sent

    @property
    def lingering(self) -> bool:
        """Over for the application; the engine waits for the peer's end."""
        return self.sending is Sending.LINGERING

    @property
    def closing(self) -> bool:
        """``close()`` was called: what still arrives is dropped."""
        return self.receiving.closed

    @property
    def remote_ended(self) -> bool:
        """The peer's end arrived."""
        return self.receiving.ended


class ChannelTable:
    """The session's live channels, what it counts over them, and their deadlines."""

    __slots__ = ("channels", "handlers", "inbound", "timers", "untaken")

    def __init__(self) -> None:
        self.channels: dict[int, CoreChannel] = {}
        """Live channels by the engine's handle."""
        self.inbound = 0
        """Live channels the peer opened."""
        self.untaken = 0
        """Incoming channels not yet taken by the application (no handler)."""
        self.handlers = 0
        """Channel handlers still running (a reset channel's too: Rapid Reset)."""
        self.timers: list[tuple[float, Timer, int]] = []
        """A heap of ``(when, kind, handle)``, checked lazily: entries of channels that are
        gone stay until due (or until they are most of it)."""

    def add(self, channel: CoreChannel) -> None:
        """A new channel (ours, or the peer's once accepted)."""
        self.channels[channel.handle] = channel
        if not channel.local:
            self.inbound += 1

    def pop(self, handle: int) -> CoreChannel | None:
        """Forget a finished channel (rule 2); None if it was gone already."""
        channel = self.channels.pop(handle, None)
        if channel is not None and not channel.local:
            self.inbound -= 1
        return channel

    def add_timer(self, when: float, kind: Timer, handle: int) -> None:
        """Call :meth:`due` for ``handle`` at ``when``."""
        timers = self.timers
        if len(timers) > 2 * len(self.channels) + 64:
            # Entries of channels that are gone wait in the heap until due (a churn of
            # 10,000 channels would keep 10,000): drop them once they are most of it.
            live = self.channels
            timers[:] = [t for t in timers if t[2] in live]
            heapq.heapify(timers)
        heapq.heappush(timers, (when, kind, handle))

    def due(self, now: float) -> Iterator[tuple[Timer, CoreChannel]]:
        """The deadlines due at ``now`` of channels still live, in order; lazily, so that
        what acting on one does (a channel finished, a deadline added) counts for the next."""
        timers = self.timers
        while timers and timers[0][0] <= now:
            _when, kind, handle = heapq.heappop(timers)
            channel = self.channels.get(handle)
            if channel is not None:
                yield kind, channel

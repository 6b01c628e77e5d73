"""Window and credit arithmetic, shared by every wire format.

This is the only module that does flow-control arithmetic (h2's ``windows.py`` shape).
A format engine keeps one :class:`SendCredit` (what the peer lets us send) and one
:class:`ReceiveWindow` (what we let the peer send) per channel and calls them; it does
no window arithmetic of its own.

Byte windows (MultiplexingStream v2/v3, yamux) and message credits (omnistreams) use the
same classes: the unit is whatever the format counts.
"""

from __future__ import annotations

from collections import deque


__all__ = [
    "MIN_BUDGET_WINDOW",
    "UNLIMITED",
    "MessageCredit",
    "MessageWindow",
    "ReceiveWindow",
    "SendCredit",
    "SharedSendLimit",
    "budget_window",
    "default_ack_threshold",
    "split_count",
]

UNLIMITED = 1 << 62
"""Credit reported for a direction without flow control (e.g. MultiplexingStream v1)."""

MIN_BUDGET_WINDOW = 64 * 1024
"""The smallest receive window :func:`budget_window` gives a new channel."""


def budget_window(configured: int, budget: int, granted: int, floor: int = MIN_BUDGET_WINDOW) -> int:
    """The receive window for a new channel: ``configured`` while the windows already
    granted on the session (``granted``) leave room in its memory ``budget``, shrinking
    toward ``floor`` as they fill it (a quarter of the room left), so that many channels
    together stay near the budget while few channels get full windows."""
    room = budget - granted
    return max(min(configured, floor), min(configured, room // 4))


MAX_MESSAGE_CREDIT = 1024
"""The most messages a message credit (omnistreams) grants a stream at once. A window is
granted as ``bytes // chunk`` messages, and the peer picks the chunk: a chunk of 1 byte
would have a 1 MiB window granted as 1,048,576 messages, 4,112 REQUEST_DATA messages
answering one 30-byte CREATE. Capped, the grant is at most 5 messages of a few bytes;
a peer that picks chunks of under ``window / 1024`` bytes gets less than the window."""


def message_window(window: int, chunk: int) -> int:
    """Messages of at most ``chunk`` bytes to grant for a byte ``window`` (at least one, at
    most :data:`MAX_MESSAGE_CREDIT`)."""
    return max(1, min(window // chunk, MAX_MESSAGE_CREDIT))


def default_ack_threshold(window: int, minimum: int) -> int:
    """Consumed bytes to collect before returning credit: ``max(minimum, window / 8)``.

    This is the reference MultiplexingStream's pacing (``AckThreshold``); it is capped at
    the window so that a small window can never deadlock.
    """
    return min(window, max(minimum, window // 8))


class SendCredit:
    """How much we may still send on one channel.

    ``window`` is the peer's advertised receive window (``None``: no flow control);
    ``in_flight`` counts units sent and not yet acknowledged by the peer.
    """

    __slots__ = ("in_flight", "window")

    def __init__(self, window: int | None) -> None:
        self.window = window
        self.in_flight = 0

    @property
    def available(self) -> int:
        """Units that may be sent now without exceeding the peer's window."""
        if self.window is None:
            return UNLIMITED
        return max(0, self.window - self.in_flight)

    @property
    def left(self) -> int:
        """The window minus what is in flight: negative when a sender overran it (a trace
        of someone else's traffic shows that; our own sends never do)."""
        return (self.window or 0) - self.in_flight

    def consume(self, n: int) -> None:
        """Account for ``n`` units being sent. Sending past the window is a local bug."""
        if n > self.available:
            raise ValueError(f"sending {n} units exceeds the available credit of {self.available}")
        self.in_flight += n

    def release(self, n: int) -> bool:
        """The peer acknowledged ``n`` units (a delta). Returns False if it acknowledged
        more than was in flight, which the caller reports as a protocol error."""
        if n < 0 or n > self.in_flight:
            return False
        self.in_flight -= n
        return True

    def grow(self, n: int) -> None:
        """The peer enlarged its window by ``n`` (yamux-style increment)."""
        if self.window is not None:
            self.window += n

    def set_window(self, window: int) -> bool:
        """The peer set an absolute window. Windows only grow; returns whether it grew."""
        if self.window is None or window <= self.window:
            return False
        self.window = window
        return True


class SharedSendLimit:
    """Units in flight over every channel of a session, within ``limit``.

    For a peer that also bounds what it holds for all its channels together and stops
    reading its connection when that is full (xtaci/smux's session receive buffer): a
    channel waiting there for our credit could then never read the credit we send it.
    ``floor(channel_in_flight, half_window)`` lets each channel reach half its own window
    whatever the others hold: a receiver that acknowledges once half a window is read
    then always has enough to acknowledge, so the limit can delay a channel, never stall it.
    """

    __slots__ = ("in_flight", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def allows(self, credit: int, channel_in_flight: int, half_window: int) -> int:
        """How much of a channel's ``credit`` may be sent now."""
        room = max(self.limit - self.in_flight, half_window - channel_in_flight)
        return max(0, min(credit, room))

    def consume(self, n: int) -> None:
        self.in_flight += n

    def release(self, n: int) -> None:
        self.in_flight -= n


class ReceiveWindow:
    """What the peer may still send us on one channel, and when to give credit back.

    ``outstanding`` counts units received and not yet acknowledged; the peer may
    never push it past ``window``. Units the application has consumed but we have
    not yet acknowledged collect in ``pending`` until they reach ``threshold``,
    so acknowledgements are batched.
    """

    __slots__ = ("outstanding", "pending", "threshold", "window")

    def __init__(self, window: int, threshold: int) -> None:
        if window <= 0:
            raise ValueError(f"receive window must be positive, got {window}")
        if not 0 < threshold <= window:
            raise ValueError(f"ack threshold must be in 1..{window}, got {threshold}")
        self.window = window
        self.threshold = threshold
        self.outstanding = 0
        self.pending = 0

    def received(self, n: int) -> bool:
        """Account for ``n`` units arriving. Returns False when they overrun the window."""
        if self.outstanding + n > self.window:
            return False
        self.outstanding += n
        return True

    def consumed(self, n: int) -> int:
        """The application consumed ``n`` units. Returns the credit to send now (0: none yet)."""
        if n <= 0:
            return 0
        self.pending = min(self.pending + n, self.outstanding)
        if self.pending >= self.threshold:
            return self.flush()
        return 0

    def grow(self, n: int, threshold: int | None = None) -> None:
        """Enlarge the window by ``n`` (the caller tells the peer), optionally with a new
        acknowledgement threshold."""
        if n < 0:
            raise ValueError(f"a window only grows, got {n}")
        self.window += n
        if threshold is not None:
            self.threshold = max(1, min(threshold, self.window))

    def flush(self) -> int:
        """Return (and account for) all consumed, unacknowledged units."""
        n = self.pending
        self.pending = 0
        self.outstanding -= n
        return n


# -- message credit (omnistreams) ---------------------------------------------------------------


def split_count(n: int, most: int = 255) -> list[int]:
    """``n`` as parts of at most ``most`` (omnistreams requests at most 255 per message)."""
    if n < 0:
        raise ValueError(f"count must be >= 0, got {n}")
    parts = [most] * (n // most)
    if n % most:
        parts.append(n % most)
    return parts


class MessageCredit(SendCredit):
    """Send side of a credit counted in **messages** of at most ``chunk`` bytes each
    (omnistreams): ``window`` is the total the peer requested, ``in_flight`` what we sent."""

    __slots__ = ("chunk",)

    def __init__(self, chunk: int) -> None:
        if chunk <= 0:
            raise ValueError(f"chunk size must be positive, got {chunk}")
        super().__init__(0)
        self.chunk = chunk

    @property
    def available_bytes(self) -> int:
        """Bytes that fit in the messages the peer still allows."""
        return self.available * self.chunk

    def messages_for(self, n: int) -> int:
        """Messages that ``n`` bytes take (at least one: an empty write is one message)."""
        return max(1, -(-n // self.chunk))

    def consume_bytes(self, n: int) -> int:
        """Account for sending ``n`` bytes; return the number of messages they take."""
        messages = self.messages_for(n)
        self.consume(messages)
        return messages


class MessageWindow(ReceiveWindow):
    """Receive side of a message credit: at most ``window`` unacknowledged messages; the
    application consumes *bytes*, and a message counts as consumed once all its bytes are.
    Credit goes back in batches of ``threshold`` messages."""

    __slots__ = ("_last", "_sizes", "_spare")

    def __init__(self, window: int, threshold: int) -> None:
        super().__init__(window, threshold)
        self._sizes: deque[int] = deque()
        self._spare = 0  # consumed bytes of the oldest, partly consumed message
        self._last = 1  # the size of the latest non-empty message

    def received_message(self, size: int) -> bool:
        """A message of ``size`` payload bytes arrived. Returns False when it overruns the
        window. An empty message counts as consumed at once."""
        if not self.received(1):
            return False
        if size == 0:
            self.pending += 1
        else:
            self._sizes.append(size)
            self._last = size
        return True

    def bytes_until_due(self) -> int:
        """About how many bytes to consume before :meth:`consumed_bytes` returns credit (at
        least 1): those of the oldest messages held that complete the batch, and for the
        messages not here yet, the size of the latest one each (messages of one stream are
        mostly of one size). An estimate: a reader that stops short of it reports what it
        consumed when it waits (``Engine.credit_estimated``)."""
        need = self.threshold - self.pending
        total = -self._spare
        for size in self._sizes:
            if need <= 0:
                break
            total += size
            need -= 1
        return max(1, total + max(0, need) * self._last)

    def consumed_bytes(self, n: int) -> int:
        """The application consumed ``n`` bytes. Returns the messages to credit now (0: none yet)."""
        spare = self._spare + n
        sizes = self._sizes
        done = 0
        while sizes and spare >= sizes[0]:
            spare -= sizes.popleft()
            done += 1
        self._spare = spare if sizes else 0
        self.pending += done
        if self.pending >= self.threshold:
            return self.flush()
        return 0

"""The session's bounds on memory, and when it stops reading from the peer.

Two pieces, both owned by :class:`~polymux.session.core.SessionCore`:

* :class:`Pressure`: the connection's two directions as the core sees them: whether it reads
  from the peer (and every reason it does not, as bits: reading resumes only once every
  reason is gone), and whether the socket takes our bytes (``pause_writing``).
* :class:`Budget`: ``max_session_memory`` (bytes received and not yet consumed by the
  application, plus bytes written and not yet sent while the socket takes nothing: over
  it, reading pauses), the session's unsent bytes (over half the budget, every writer's
  ``drain()`` blocks), each writer's high- and low-water marks, and the bytes a format
  holds back itself (Streamux responses, ``Engine.may_hold``).

Only what the application (reading) or the peer (taking our bytes) can bring down counts
towards the budget, so that reading, once paused, always resumes: bytes waiting for the
peer's credit do not count (reading is what brings the credit), nor bytes the format holds
until the peer ends a request (Streamux: reading is what ends it; the format bounds them
itself with ``streamux_response_hold`` and ``streamux_hold_budget``).

A third piece is shared: :class:`MemoryAccount`, one budget for every session of a server
(``max_memory``). Each session's :class:`Budget` reports what it holds into it; while the
sum is over the limit, every session that holds more than its share stops reading from its
peer (:data:`SHARED`); sessions that hold little (a new client) go on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from polymux.config import SessionConfig
from polymux.engine import Engine
from polymux.exceptions import LimitExceeded
from polymux.session import events as ce
from polymux.session.channels import CoreChannel


__all__ = [
    "BACKLOG",
    "BUDGET",
    "CONTROLS",
    "SHARED",
    "SLOW_READER",
    "STALLED",
    "Budget",
    "MemoryAccount",
    "Pressure",
]

# Why reading from the peer is paused (bits of Pressure.bits).
SLOW_READER = 1
"""A channel's reader is full and the format has no credit to withhold (``slow_reader``)."""
CONTROLS = 2
"""Too many control messages (omnistreams) unread by the application."""
BACKLOG = 4
"""Replies cannot be written (the peer does not read): ``max_queued_control``."""
BUDGET = 8
"""The session holds ``max_session_memory`` (see the module docstring)."""
SHARED = 16
"""The server's sessions together hold its ``max_memory``, and this one more than its share
(:class:`MemoryAccount`)."""
STALLED = BACKLOG | BUDGET
"""Reasons that are the peer's doing while it takes none of our bytes: ``send_timeout``."""

RECHECK = 0.1
"""Seconds between two looks at the :class:`MemoryAccount` of a session it paused (the
others' reading brings the sum down without telling it)."""


class MemoryAccount:
    """One memory budget shared by many sessions (a server's ``max_memory``): what each
    session's :class:`Budget` holds (received and unread, plus unsent while its socket
    takes nothing), summed. While the sum is over :attr:`limit`, a session holding at least
    its share (the limit over the sessions) stops reading from its peer; it reads again once
    the sum is down to three quarters of the limit, or its own holding to three quarters of
    its share. So the sessions holding the most wait, and the sum stays near the limit
    (each session may read one more time before it finds out: a read of at most 256 KiB);
    a session that holds little, a new client's, is read all along."""

    __slots__ = ("held", "limit", "members", "paused", "pauses")

    def __init__(self, limit: int) -> None:
        if not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"max_memory must be a positive int, got {limit!r}")
        self.limit = limit
        """Bytes all the sessions may hold together."""
        self.held = 0
        """Bytes they hold now."""
        self.members = 0
        """Sessions reporting into it."""
        self.paused = 0
        """Sessions it holds back now."""
        self.pauses = 0
        """Times it held one back, in all."""

    def share(self) -> float:
        """A session's share: the limit over the sessions."""
        return self.limit / max(1, self.members)

    def must_pause(self, held: int, paused: bool) -> bool:
        """Whether a session holding ``held`` bytes (``paused``: held back now) is held
        back: see the class docstring."""
        if paused:
            return self.held > self.limit * 3 // 4 and held > self.share() * 3 / 4
        return self.held > self.limit and held >= self.share()


class PressureListener(Protocol):
    """Who hears when reading stops (the liveness checks: :mod:`polymux.session.liveness`)."""

    def reading_stopped(self) -> None:
        """Reading from the peer stopped (it was going on)."""

    def stalled(self) -> None:
        """Reading stopped for a reason of :data:`STALLED`."""


class Pressure:
    """Whether the core reads from the peer, and whether the socket takes our bytes."""

    __slots__ = ("bits", "listener", "on_change", "pausers", "recheck", "socket_unsent", "write_paused")

    def __init__(self) -> None:
        self.recheck: Callable[[], None] | None = None
        """While :data:`SHARED` holds reading back: look at the :class:`MemoryAccount` again
        (the liveness timer calls it every :data:`RECHECK` seconds)."""
        self.bits = 0
        """Why reading is paused (:data:`SLOW_READER` ... :data:`BUDGET`); 0: reading."""
        self.pausers = 0
        """Channels that hold the connection (slow readers, paused plain protocols)."""
        self.write_paused = False
        """The socket takes none of our bytes (the driver's ``pause_writing``)."""
        self.socket_unsent = 0
        """What the driver last told of the socket's unsent bytes."""
        self.listener: PressureListener | None = None
        self.on_change: Callable[[bool], None] | None = None
        """Called with True when reading pauses (for any reason), False when it resumes."""

    def block(self, reason: int, on: bool) -> None:
        """Pause reading for ``reason`` (``on``), or lift that reason."""
        before = self.bits
        after = before | reason if on else before & ~reason
        if after == before:
            return
        self.bits = after
        listener = self.listener
        assert listener is not None
        if (not after or not before) and self.on_change is not None:
            self.on_change(bool(after))
        if after and not before:
            listener.reading_stopped()
        if on and reason & STALLED:
            listener.stalled()

    def pause_for(self, paused: bool) -> None:
        """A channel holds the connection (or lets it go). Without credit on the wire, the
        only way to stop the peer is to stop reading the whole connection (head-of-line
        blocking, as MultiplexingStream v1 does)."""
        self.pausers += 1 if paused else -1
        self.block(SLOW_READER, self.pausers > 0)


class BudgetHost(Protocol):
    """What the budget needs of the core that owns it."""

    def emit(self, event: ce.CoreEvent) -> None:
        """Tell the driver."""

    def reset_held(self, channel: CoreChannel, problem: str) -> None:
        """Reset ``channel``: it held more than the format allows (``problem``)."""


class Budget:
    """``max_session_memory``, the session's unsent bytes and the writers' marks (see the
    module docstring). Counts are in bytes."""

    __slots__ = (
        "account",
        "channels",
        "engine",
        "format",
        "held",
        "held_writers",
        "high",
        "hold_limit",
        "hold_resume",
        "holding",
        "host",
        "low",
        "pressure",
        "reported",
        "unread",
        "unsent",
        "unsent_cap",
        "unsent_counted",
        "unsent_limit",
        "unsent_resume",
    )

    def __init__(
        self,
        engine: Engine,
        config: SessionConfig,
        pressure: Pressure,
        channels: dict[int, CoreChannel],
        host: BudgetHost,
    ) -> None:
        self.engine = engine
        self.channels = channels  # the core's live channels
        self.format = engine.format
        self.pressure = pressure
        self.host = host
        budget = config.max_session_memory
        self.held = 0
        """What counts now: unread, plus unsent while the socket is paused."""
        self.unread = 0
        """Received, not yet consumed by the application."""
        self.unsent_counted = 0
        """Unsent, counted per channel up to twice its high-water mark (an application
        that ignores ``drain()`` owns the rest)."""
        self.holding = 0
        """Unsent bytes the format holds back (``Engine.may_hold``): never in :attr:`held`."""
        self.hold_limit, self.hold_resume = budget, budget * 3 // 4
        self.unsent = 0
        """Every unsent byte of every channel."""
        self.unsent_limit, self.unsent_resume = budget // 2, budget // 4
        self.unsent_cap = 2 * config.write_buffer_high
        self.high = config.write_buffer_high
        self.low = config.low_water
        self.held_writers: set[CoreChannel] = set()
        """Writers paused by the session's unsent bytes, not by their own marks."""
        self.account: MemoryAccount | None = None
        """The server's shared budget this session reports into (:meth:`join`)."""
        self.reported = 0

    # -- the server's shared budget ----------------------------------------------------------

    def join(self, account: MemoryAccount) -> None:
        """Report into ``account`` from now on (a server's ``max_memory``)."""
        self.account = account
        account.members += 1
        self.pressure.recheck = self._shared
        self.check()

    def leave(self) -> None:
        """The session is over: its bytes stop counting in the account."""
        account = self.account
        if account is None:
            return
        self.account = None
        account.held -= self.reported
        account.members -= 1
        self.reported = 0
        if self.pressure.bits & SHARED:
            account.paused -= 1
            self.pressure.block(SHARED, False)

    def _shared(self) -> None:
        """Follow the account: hold reading back, or let it go (see :class:`MemoryAccount`)."""
        account = self.account
        if account is None:
            return
        pressure = self.pressure
        paused = bool(pressure.bits & SHARED)
        if account.must_pause(self.held, paused) != paused:
            account.paused += -1 if paused else 1
            account.pauses += 0 if paused else 1
            pressure.block(SHARED, not paused)

    # -- this session's own budget -------------------------------------------------------------

    def check(self) -> None:
        """Pause reading while the session holds more than ``max_session_memory``; resume
        at three quarters of it (and report into the server's account, if any)."""
        pressure = self.pressure
        held = self.unread + (self.unsent_counted if pressure.write_paused else 0)
        self.held = held
        account = self.account
        if account is not None:
            account.held += held - self.reported
            self.reported = held
            self._shared()
        if held > self.hold_limit:
            if not pressure.bits & BUDGET:
                pressure.block(BUDGET, True)
        elif pressure.bits & BUDGET and held <= self.hold_resume:
            pressure.block(BUDGET, False)

    # -- received bytes ----------------------------------------------------------------------

    def received(self, n: int) -> None:
        """``n`` bytes arrived for the application."""
        self.unread += n
        self.check()

    def consumed(self, n: int) -> None:
        """``n`` received bytes were consumed (or dropped)."""
        self.unread -= n
        self.check()

    # -- unsent bytes and the writers --------------------------------------------------------

    def wrote(self, channel: CoreChannel, n: int, old: int, new: int) -> bool:
        """``channel`` queued ``n`` more bytes (``old`` -> ``new`` unsent). True: the format
        holds them back (no pause, nothing to schedule)."""
        self.unsent += n
        if channel.holding:
            self.holding += n
            self.check()
            if self.may_hold(channel):  # within the format's limits (else it was reset)
                return True
        elif old < self.unsent_cap:
            self.unsent_counted += min(new, self.unsent_cap) - old
            self.check()
        return False

    def pause(self, channel: CoreChannel, new: int) -> bool:
        """The writer passed its high-water mark, or the session holds half its budget in
        unsent bytes (held responses apart: the format bounds those): pause it (True),
        unless the format holds its bytes back."""
        if self.may_hold(channel):
            return False
        channel.paused = True
        if new <= channel.high:
            channel.held = True
            self.held_writers.add(channel)
        return True

    def taken(self, channel: CoreChannel, old: int, new: int) -> None:
        """The scheduler took ``old - new`` of ``channel``'s unsent bytes for the engine."""
        self.sent(old - new)
        cap = self.unsent_cap
        if channel.holding:
            # The format lets it go now (a Streamux request ended): counted as any unsent.
            channel.holding = False
            self.holding -= old
            self.check()
            self.unsent_counted += min(new, cap)
            self.check()
        elif new < cap:
            self.unsent_counted -= min(old, cap) - new
            self.check()
        if channel.paused and new <= channel.low:
            self.update_pause(channel)

    def dropped(self, channel: CoreChannel) -> None:
        """``channel``'s unsent bytes are gone (a reset, the peer stopped reading)."""
        channel.buf.clear()
        if channel.buffered:
            n, channel.buffered = channel.buffered, 0
            if channel.holding:
                channel.holding = False
                self.holding -= n
            else:
                self.unsent_counted -= min(n, self.unsent_cap)
            self.check()
            self.sent(n)

    def sent(self, n: int) -> None:
        """``n`` unsent bytes left the session: held writers may resume."""
        self.unsent -= n
        if self.held_writers and self.unsent - self.holding <= self.unsent_resume:
            held, self.held_writers = self.held_writers, set()
            channels = self.channels
            for channel in held:
                channel.held = False
                if channel.handle in channels:
                    self.update_pause(channel)

    def update_pause(self, channel: CoreChannel) -> bool | None:
        """Pause or resume a writer by its marks (and the session's unsent bytes); returns
        the new state when it changed (a resume is also a
        :class:`~polymux.session.events.WriteResumed` event)."""
        if channel.paused and channel.buffered <= channel.low:
            if self.unsent - self.holding > self.unsent_limit:
                channel.held = True  # resumes once the session's unsent bytes fall
                self.held_writers.add(channel)
                return None
            if channel.held:  # resumed by its own marks before the session's bytes fell
                channel.held = False
                self.held_writers.discard(channel)
            channel.paused = False
            self.host.emit(ce.WriteResumed(channel.handle))
            return False
        if not channel.paused and channel.buffered > channel.high and not self.may_hold(channel):
            channel.paused = True
            return True
        return None

    def may_hold(self, channel: CoreChannel) -> bool:
        """Whether the writer goes on past its high-water mark because the format holds
        the channel's bytes back itself until the peer finishes something that needs the
        application to go on (a Streamux response waits for the end of its request:
        ``Engine.may_hold``). Past the format's bound for that, the channel is reset (and
        True: nothing to pause)."""
        try:
            hold = self.engine.may_hold(channel.handle, channel.buffered)
        except LimitExceeded as exc:
            self.host.reset_held(channel, str(exc).removeprefix(f"{self.format}: "))
            return True
        if hold and not channel.holding:
            # Held back, it counts in full towards the format's limits, not towards
            # max_session_memory: past the budget, reading paused would hold back the very
            # request it waits for (the format resets the largest such channel instead).
            channel.holding = True
            self.unsent_counted -= min(channel.buffered, self.unsent_cap)
            self.check()
            self.holding += channel.buffered
            self.check()
        return hold

    def finished(self, channel: CoreChannel) -> None:
        """``channel`` left the table: its bytes stop counting."""
        self.dropped(channel)
        inbox = channel.inbox
        n = inbox.unconsumed + inbox.pending
        if n:
            # What the reader still holds stays readable, no longer counted (nor credited:
            # the channel is over).
            inbox.unconsumed = inbox.pending = 0
            self.consumed(n)
        if channel.held:
            self.held_writers.discard(channel)

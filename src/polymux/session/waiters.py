"""What the application's tasks wait for, written once for every driver: our opens awaiting
acceptance, room to open (``max_unacked_opens``), pings, stream pairs, requests' answers,
control messages and incoming channels.

A driver (:mod:`polymux.aio`, :mod:`polymux.anyio`) gives each waiter a :class:`Signal`
(asyncio: a future; anyio: an event), awaits it, then calls :meth:`Waiter.result`; a task
that stops waiting (cancelled, timed out) calls :meth:`Waiter.leave`. Everything else is
here, so the drivers cannot drift: which waiter an event settles; who gets a turn, in which
order (first come, first served); what a woken task gets (a value, or the error it raises);
what becomes of a turn or a value given to a task that left before taking it (passed on,
put back, or its channel reset); and the end: once the connection is lost
(:meth:`Waiters.lost`) every waiter, and every wait begun later, fails with the same
:class:`~polymux.exceptions.SessionClosed`.

Three shapes:

* :class:`Keyed`: one waiter per key (a channel handle, a ping's opaque), given its value
  or its error by the core's event for that key.
* :class:`Line`: tasks waiting, in order, for something the core counts (room to open,
  the peer's control messages): as many as there are of it get a *turn*, and try again.
* :class:`Backlog`: incoming channels nobody has taken yet, and the tasks waiting for one
  (optionally by name).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from polymux.exceptions import SessionClosed
from polymux.session.offers import NoRoomToOpen


if TYPE_CHECKING:
    from polymux.session.core import SessionCore


__all__ = ["Backlog", "Keyed", "Line", "Signal", "Waiter", "Waiters"]


class Signal(Protocol):
    """The driver's side of one waiter: what its task awaits (asyncio: a future; anyio:
    an event)."""

    def set(self) -> None:
        """Wake the task (it may be called again: a second call does nothing)."""


S = TypeVar("S", bound=Signal)
T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P")
I = TypeVar("I")

# A waiter's states.
WAITING = 0
GIVEN = 1  # a value, an error or a turn was given; the task has not taken it yet
TAKEN = 2
LEFT = 3


class _Kind(Generic[S, T]):
    """What a waiter belongs to: told when its task takes what it was given, or leaves."""

    __slots__ = ("waiters",)

    def __init__(self, waiters: Waiters[S, Any, Any]) -> None:
        self.waiters = waiters

    def taken(self, waiter: Waiter[S, T]) -> None:
        """The task took what it was given."""

    def left(self, waiter: Waiter[S, T]) -> None:
        """The task stopped waiting before anything was given to it."""

    def unclaimed(self, waiter: Waiter[S, T]) -> None:
        """The task left with a value or a turn it had been given and never took."""


class Waiter(Generic[S, T]):
    """One task waiting: the driver awaits :attr:`signal`, then calls :meth:`result`."""

    __slots__ = ("error", "handle", "key", "kind", "signal", "state", "value")

    def __init__(self, kind: _Kind[S, T], signal: S, key: object = None) -> None:
        self.kind = kind
        self.signal = signal
        """The driver's primitive, set once something is given."""
        self.key = key
        """Its key (:class:`Keyed`), or the name it wants (:class:`Backlog`)."""
        self.state = WAITING
        self.value: T | None = None
        self.error: BaseException | None = None
        self.handle: int | None = None
        """A channel given with the value: reset if the task leaves without taking it."""

    def give(self, value: T) -> None:
        """Wake the task with ``value``."""
        self.value = value
        self.state = GIVEN
        self.signal.set()

    def fail(self, error: BaseException) -> None:
        """Wake the task with ``error`` (also one given a turn it has not taken yet)."""
        self.value = None
        self.error = error
        self.state = GIVEN
        self.signal.set()

    def result(self) -> T:
        """What the task was given; raises the error it was given instead. Call it once
        the signal is set."""
        self.state = TAKEN
        self.kind.taken(self)
        if self.error is not None:
            raise self.error
        return cast(T, self.value)

    def leave(self) -> None:
        """The task stops waiting (cancelled, timed out): its place goes, and what it was
        given but did not take is passed on (a turn), put back (an incoming channel) or
        reset (a stream pair's half). Calling it again does nothing."""
        state = self.state
        self.state = LEFT if state != TAKEN else TAKEN
        if state == WAITING:
            self.kind.left(self)
        elif state == GIVEN and self.error is None:
            self.kind.unclaimed(self)


class Keyed(_Kind[S, T]):
    """One waiter per key, settled by the core's event for that key. ``forget``: called
    with the key when its task leaves before the event (the core stops the work: a ping
    forgotten, a request cancelled on the wire)."""

    __slots__ = ("forget", "waiting")

    def __init__(self, waiters: Waiters[S, Any, Any], forget: Callable[[int], None] | None = None) -> None:
        super().__init__(waiters)
        self.forget = forget
        self.waiting: dict[int, Waiter[S, T]] = {}

    def __contains__(self, key: int) -> bool:
        return key in self.waiting

    def wait(self, key: int) -> Waiter[S, T]:
        """A waiter for ``key`` (raises once the session has ended)."""
        waiters = self.waiters
        waiters.check()
        waiter: Waiter[S, T] = Waiter(self, waiters.make_signal(), key)
        self.waiting[key] = waiter
        return waiter

    def settle(self, key: int, value: T, handle: int | None = None) -> None:
        """Give ``value`` to the waiter of ``key``. ``handle``: a channel that comes with it
        (the peer's half of a stream pair), reset at once if nobody waits, or later if the
        task leaves without taking it."""
        waiter = self.waiting.pop(key, None)
        if waiter is None:
            if handle is not None:
                self.waiters.core.reset(handle)  # an answer nobody waits for any more
            return
        waiter.handle = handle
        waiter.give(value)

    def fail(self, key: int, error: BaseException) -> None:
        """Fail the waiter of ``key``, if there is one."""
        waiter = self.waiting.pop(key, None)
        if waiter is not None:
            waiter.fail(error)

    def left(self, waiter: Waiter[S, T]) -> None:
        key = cast(int, waiter.key)
        del self.waiting[key]
        if self.forget is not None:
            self.forget(key)

    def unclaimed(self, waiter: Waiter[S, T]) -> None:
        if waiter.handle is not None:
            self.waiters.core.reset(waiter.handle)

    def end(self) -> None:
        """The session ended: every waiter fails."""
        waiting = list(self.waiting.values())
        self.waiting.clear()
        for waiter in waiting:
            waiter.fail(self.waiters.closed_error())


class Line(_Kind[S, None]):
    """Tasks waiting, first come first served, for something the core counts
    (``available``): a task that arrives while others wait (or hold a turn not yet used)
    goes behind them; as many as there are of it get a turn; one that finds none after
    its turn goes back to the front; one that leaves (or fails) with its turn passes it
    on. ``busy``: what the task's attempt raises when there is none (else it returns
    None). ``turns_end``: at the end of the session, turns given and not yet used fail
    too (room to open: nothing can be opened; a control message is still there)."""

    __slots__ = ("available", "busy", "granted", "turns_end", "waiting")

    def __init__(
        self,
        waiters: Waiters[S, Any, Any],
        available: Callable[[], int],
        *,
        busy: tuple[type[BaseException], ...] = (),
        turns_end: bool = False,
    ) -> None:
        super().__init__(waiters)
        self.available = available
        self.busy = busy
        self.turns_end = turns_end
        self.waiting: deque[Waiter[S, None]] = deque()
        self.granted: list[Waiter[S, None]] = []
        """Turns given whose tasks have not used them yet (they hold what is available)."""

    def attempt(self, take: Callable[[], R | None], turn: bool = False) -> R | Waiter[S, None]:
        """Call ``take`` if it is the task's turn (``turn``: it waited for it); return what
        it took, or a waiter to await before attempting again with ``turn=True``."""
        if not turn and (self.waiting or self.granted):
            return self._join(front=False)  # behind those who came first
        try:
            got = take()
        except self.busy:
            got = None
        except BaseException:
            if turn:
                self.serve()  # what we were given is still there: pass it on
            raise
        if got is None:
            return self._join(front=turn)
        return got

    def _join(self, *, front: bool) -> Waiter[S, None]:
        waiters = self.waiters
        waiters.check()
        waiter: Waiter[S, None] = Waiter(self, waiters.make_signal())
        if front:
            self.waiting.appendleft(waiter)
        else:
            self.waiting.append(waiter)
        self.serve()  # there may be something for it already (held by no turn)
        return waiter

    def serve(self, everyone: bool = False) -> None:
        """Give turns to as many waiting tasks as there is something for (``everyone``: to
        all of them, to find that there is nothing any more)."""
        n = len(self.waiting) if everyone else self.available() - len(self.granted)
        waiting = self.waiting
        while n > 0 and waiting:
            waiter = waiting.popleft()
            self.granted.append(waiter)
            waiter.give(None)
            n -= 1

    def fail_first(self, error: BaseException) -> None:
        """The first waiting task fails with ``error`` (not the turns already given)."""
        if self.waiting:
            self.waiting.popleft().fail(error)

    def taken(self, waiter: Waiter[S, None]) -> None:
        if waiter in self.granted:
            self.granted.remove(waiter)

    def left(self, waiter: Waiter[S, None]) -> None:
        self.waiting.remove(waiter)

    def unclaimed(self, waiter: Waiter[S, None]) -> None:
        self.granted.remove(waiter)
        self.serve()

    def end(self) -> None:
        """The session ended: every waiting task fails (and, ``turns_end``, every turn not
        yet used)."""
        failing = list(self.waiting)
        self.waiting.clear()
        if self.turns_end:
            failing += self.granted
            self.granted.clear()
        for waiter in failing:
            waiter.fail(self.waiters.closed_error())


class Backlog(_Kind[S, T]):
    """Incoming channels nobody has taken yet (``(name, handle, item)``, in order), and the
    tasks waiting for one, in order (each for any channel, or for one named as it asks).
    The core counts the backlog (``SessionCore.taken`` once a task takes one) and bounds
    it (``accept_backlog``)."""

    __slots__ = ("given", "items", "waiting")

    def __init__(self, waiters: Waiters[S, Any, Any]) -> None:
        super().__init__(waiters)
        self.items: deque[tuple[str, int, T]] = deque()
        self.waiting: deque[Waiter[S, T]] = deque()
        self.given: dict[Waiter[S, T], tuple[str, int, T]] = {}
        """What waiting tasks were given and have not taken yet."""

    def add(self, name: str, handle: int, item: T) -> None:
        """An incoming channel: to the first task waiting for it, or into the backlog."""
        entry = (name, handle, item)
        if not self._hand(entry):
            self.items.append(entry)

    def _hand(self, entry: tuple[str, int, T]) -> bool:
        """Give ``entry`` to the first task waiting for it, if any."""
        name = entry[0]
        for waiter in self.waiting:
            if waiter.key is None or waiter.key == name:
                self.waiting.remove(waiter)
                self.given[waiter] = entry
                waiter.give(entry[2])
                return True
        return False

    def take(self, name: str | None = None) -> T | Waiter[S, T]:
        """The oldest incoming channel (named ``name``, if given), or a waiter to await for
        one until the session ends. (Not only until the peer's go-away: a server that
        stopped taking channels then would close while the peer still finishes its own
        close, and the peer would see a reset.)"""
        for entry in self.items:
            if name is None or entry[0] == name:
                self.items.remove(entry)
                self.waiters.core.taken(entry[1])
                return entry[2]
        waiters = self.waiters
        waiters.check()
        waiter: Waiter[S, T] = Waiter(self, waiters.make_signal(), name)
        self.waiting.append(waiter)
        return waiter

    def taken(self, waiter: Waiter[S, T]) -> None:
        entry = self.given.pop(waiter, None)
        if entry is not None:
            self.waiters.core.taken(entry[1])

    def left(self, waiter: Waiter[S, T]) -> None:
        self.waiting.remove(waiter)

    def unclaimed(self, waiter: Waiter[S, T]) -> None:
        # To the next task that wants it, or back where it was (before what came later).
        entry = self.given.pop(waiter)
        if not self._hand(entry):
            self.items.appendleft(entry)

    def end(self) -> None:
        """The session ended: the waiting tasks fail (what is in the backlog stays takeable:
        what arrived on those channels before the end is readable)."""
        waiting = list(self.waiting)
        self.waiting.clear()
        for waiter in waiting:
            waiter.fail(self.waiters.closed_error())


class Waiters(Generic[S, P, I]):
    """Every waiter of one session (see the module docstring). ``make_signal``: the
    driver's primitive; ``P``: what a completed stream pair gives its task, ``I``: an
    incoming channel, in the driver's terms."""

    __slots__ = (
        "control",
        "core",
        "ended",
        "incoming",
        "make_signal",
        "opens",
        "pairs",
        "pings",
        "requests",
        "room",
    )

    def __init__(self, core: SessionCore, make_signal: Callable[[], S]) -> None:
        self.core = core
        self.make_signal = make_signal
        self.ended = False
        """The connection is lost: every wait fails."""
        me: Waiters[S, Any, Any] = self
        self.opens: Keyed[S, None] = Keyed(me)
        """Our opens awaiting the peer's acceptance, by handle."""
        self.room: Line[S] = Line(me, lambda: core.room_to_open, busy=(NoRoomToOpen,), turns_end=True)
        """Opens waiting for room under ``max_unacked_opens`` (yamux)."""
        self.pings: Keyed[S, float] = Keyed(me, core.forget_ping)
        """Our pings, by opaque: the round-trip time."""
        self.requests: Keyed[S, list[bytes]] = Keyed(me, core.cancel_request)
        """Requests, by handle: the answer's parts (a task that leaves cancels its request)."""
        self.pairs: Keyed[S, P] = Keyed(me)
        """Our stream pairs, by their first half's handle."""
        self.control: Line[S] = Line(me, lambda: len(core.controls.queue))
        """Tasks waiting for the peer's control messages."""
        self.incoming: Backlog[S, I] = Backlog(me)
        """Incoming channels not yet taken, and ``accept_channel`` calls."""

    def closed_error(self) -> SessionClosed:
        """The error of every wait once the session has ended (a new one each time: each
        task raises its own)."""
        core = self.core
        error = SessionClosed(f"{core.format}: session ended: {core.error}")
        error.__cause__ = core.error
        return error

    def check(self) -> None:
        """Raise :meth:`closed_error` once the session has ended."""
        if self.ended:
            raise self.closed_error()

    def ping_timed_out(self) -> SessionClosed:
        """The error of a ping not answered within ``keepalive_timeout`` (the driver's timer)."""
        timeout = self.core.config.keepalive_timeout
        return SessionClosed(f"{self.core.format}: no answer to a ping within {timeout:g} s")

    def room_to_open(self, error: BaseException | None, everyone: bool) -> None:
        """Opens waiting for room may try again (see
        :class:`~polymux.session.events.RoomToOpen`): ``error``, the first fails with it."""
        if error is not None:
            self.room.fail_first(error)
        self.room.serve(everyone)

    def lost(self) -> None:
        """The connection is gone (after ``SessionCore.connection_lost`` and its events):
        every waiter fails, and so does every wait begun from now on."""
        if self.ended:
            return
        self.ended = True
        self.opens.end()
        self.room.end()
        self.pings.end()
        self.requests.end()
        self.pairs.end()
        self.control.end()
        self.incoming.end()

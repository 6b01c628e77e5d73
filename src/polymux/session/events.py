"""What a :class:`~polymux.session.core.SessionCore` tells its driver.

The driver (asyncio or anyio) takes these from :meth:`SessionCore.events` after every call
into the core and acts on them: it owns the channels' readers, writers and futures; the
core owns every decision. Channels are named by the engine's ``handle``.
"""

from __future__ import annotations

from dataclasses import dataclass

from polymux._types import BytesLike


__all__ = [
    "Accepted",
    "Answered",
    "ControlArrived",
    "CoreEvent",
    "Data",
    "Ended",
    "Failed",
    "Finished",
    "Incoming",
    "IncomingPair",
    "OpenFailed",
    "PairAnswered",
    "PairFailed",
    "PingAnswered",
    "Ready",
    "RoomToOpen",
    "WriteResumed",
    "WritingStopped",
]


class CoreEvent:
    """Base class of the core's events."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Ready(CoreEvent):
    """The handshake is done: channels may be opened."""


@dataclass(frozen=True, slots=True)
class Incoming(CoreEvent):
    """The peer opened a channel and the core accepted it (limits, filter, rate)."""

    handle: int
    name: str


@dataclass(frozen=True, slots=True)
class Accepted(CoreEvent):
    """The peer accepted a channel we opened."""

    handle: int


@dataclass(frozen=True, slots=True)
class OpenFailed(CoreEvent):
    """A channel we opened ended before the peer accepted it (rejected, reset, timed out);
    a :class:`Finished` for it follows."""

    handle: int
    error: Exception


@dataclass(frozen=True, slots=True)
class Data(CoreEvent):
    """Bytes for a channel's reader: ``data`` then the parts in ``more`` (``n`` in all).
    They may be views of the received chunk: copy what must outlive the call."""

    handle: int
    data: BytesLike
    more: tuple[BytesLike, ...]
    n: int


@dataclass(frozen=True, slots=True)
class Ended(CoreEvent):
    """The peer finished writing on the channel (no more data will come)."""

    handle: int


@dataclass(frozen=True, slots=True)
class Finished(CoreEvent):
    """The channel is over. ``error``: why, for its reader (``None``: a clean end);
    ``write_error``: what a later write raises; ``drop_unread``: what its reader holds is
    gone too (the slow-reader reset). ``lingering``: over for the application only (a
    channel closed with ``close()`` whose peer has not ended yet; the core still tracks it, and a
    plain :class:`Finished` follows when it is gone)."""

    handle: int
    error: Exception | None = None
    write_error: Exception | None = None
    drop_unread: bool = False
    lingering: bool = False


@dataclass(frozen=True, slots=True)
class WritingStopped(CoreEvent):
    """The peer will read no more of the channel: writes fail with ``error`` (what was
    queued is dropped); reading goes on."""

    handle: int
    error: Exception


@dataclass(frozen=True, slots=True)
class WriteResumed(CoreEvent):
    """The channel's writer may go on (``drain()`` returns): its unsent bytes, and the
    session's, fell below their low-water marks."""

    handle: int


@dataclass(frozen=True, slots=True)
class PingAnswered(CoreEvent):
    """A ping was answered after ``rtt`` seconds."""

    opaque: int
    rtt: float


@dataclass(frozen=True, slots=True)
class ControlArrived(CoreEvent):
    """A control message (omnistreams) is waiting: :meth:`SessionCore.take_control`."""


@dataclass(frozen=True, slots=True)
class IncomingPair(CoreEvent):
    """The peer opened the first half of a stream pair (one-way formats: omnistreams), and
    the core opened the other half back: read ``handle``, write ``reply`` (an
    :class:`Incoming` of its own, for the handler or the accept backlog)."""

    handle: int
    reply: int
    name: str


@dataclass(frozen=True, slots=True)
class PairAnswered(CoreEvent):
    """Our stream pair (``SessionCore.open_pair``: its first half ``handle``) is complete:
    the peer's half is ``inbound``; or it failed (``error``, ``inbound`` None)."""

    handle: int
    inbound: int | None
    error: Exception | None


@dataclass(frozen=True, slots=True)
class PairFailed(CoreEvent):
    """The peer opened the first half of a stream pair named ``name`` and the core could
    not open the other half back (``error``): the peer's half was reset. For the log."""

    name: str
    error: Exception


@dataclass(frozen=True, slots=True)
class Answered(CoreEvent):
    """A request (``SessionCore.request``, on channel ``handle``) is over: ``parts`` is
    everything the peer sent back, in order (join them: the driver does it in the task
    that waits, not in the read that completed the answer), or ``error`` says why there
    is none."""

    handle: int
    parts: list[bytes] | None
    error: Exception | None


@dataclass(frozen=True, slots=True)
class RoomToOpen(CoreEvent):
    """Waiting opens may try again: fewer of our opens await acknowledgement than
    ``max_unacked_opens``. ``error``: an open timed out without acknowledgement, so the
    first waiting open fails with it instead. ``everyone``: no new channels at all (the
    session ended, or the peer is going away): every waiting open tries, and fails."""

    error: Exception | None = None
    everyone: bool = False


@dataclass(frozen=True, slots=True)
class Failed(CoreEvent):
    """The session is over (``error`` says why: a protocol violation, a dead peer, a
    timeout, the peer's go-away with an error): write :meth:`SessionCore.data_to_send` if
    the socket takes it at once, then abort the connection."""

    error: BaseException

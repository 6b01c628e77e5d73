"""Events that a sans-I/O engine returns from ``receive_data``.

Channels are named by ``channel``, an ``int`` handle the engine assigns; it is unique
within one engine for the engine's lifetime, whatever ids the wire format uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from polymux._types import BytesLike


__all__ = [
    "ChannelAccepted",
    "ChannelClosed",
    "ChannelEnded",
    "ChannelOpened",
    "ChannelRejected",
    "ChannelReset",
    "ControlReceived",
    "CreditAvailable",
    "DataReceived",
    "Event",
    "PingAcked",
    "ReadingStopped",
    "SessionClosed",
    "SessionReady",
]


class Event:
    """Base class of engine events."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class SessionReady(Event):
    """The handshake (if the format has one) completed; channels may be opened."""


@dataclass(frozen=True, slots=True)
class ChannelOpened(Event):
    """The peer offered (opened) a channel."""

    channel: int
    name: str
    """The channel's name ("" when the format or the peer gives none)."""


@dataclass(frozen=True, slots=True)
class ChannelAccepted(Event):
    """The peer accepted a channel we offered."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelRejected(Event):
    """The peer rejected a channel we offered; the engine has forgotten it."""

    channel: int


@dataclass(frozen=True, slots=True)
class DataReceived(Event):
    """Channel data arrived: ``data`` followed by the parts in ``more``.

    ``data`` may be a view into the bytes given to ``receive_data``: copy it if it must
    outlive the call. Credit for it goes back only through ``ack_consumed``.
    """

    channel: int
    data: BytesLike
    """The data, or its first part when ``more`` is not empty."""
    flow_controlled_length: int
    """Units charged to the receive window for this data (all parts)."""
    more: tuple[BytesLike, ...] = ()
    """Further parts, in order: consecutive frames of one channel in one read arrive as
    one event, so the I/O layer wakes the reader once."""


@dataclass(frozen=True, slots=True)
class ChannelEnded(Event):
    """The peer finished writing (half-close); no more data will arrive."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelReset(Event):
    """The peer terminated the channel abnormally; the engine has forgotten it."""

    channel: int
    message: str | None = None
    """The peer's error text, where the format carries one."""


@dataclass(frozen=True, slots=True)
class ChannelClosed(Event):
    """The channel ended cleanly and the engine has forgotten it.

    ``local_done`` tells whether we had finished writing; when not, further writes fail.
    """

    channel: int
    local_done: bool = True


@dataclass(frozen=True, slots=True)
class ReadingStopped(Event):
    """The peer will read no more from this channel; writing to it is pointless."""

    channel: int


@dataclass(frozen=True, slots=True)
class CreditAvailable(Event):
    """The peer returned credit: data queued for this channel may be sent."""

    channel: int


@dataclass(frozen=True, slots=True)
class PingAcked(Event):
    """A ping we sent was answered."""

    opaque: int


@dataclass(frozen=True, slots=True)
class ControlReceived(Event):
    """The peer sent a control message: session-level bytes (omnistreams)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class SessionClosed(Event):
    """The peer ended the session (e.g. a go-away)."""

    code: int = 0
    message: str | None = None

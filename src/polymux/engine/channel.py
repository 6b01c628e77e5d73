"""Channel records and states, shared by every format engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from polymux.engine.flow import ReceiveWindow, SendCredit


__all__ = ["ChannelRecord", "ChannelState"]


class ChannelState(Enum):
    """Where a channel is in its life.

    ``OFFERED_*`` channels wait for acceptance; ``OPEN`` ones carry data both ways;
    ``HALF_CLOSED_LOCAL`` means we finished writing, ``HALF_CLOSED_REMOTE`` that the peer
    did. Closed and reset channels are forgotten by the engine, so they have no state here.
    """

    OFFERED_LOCAL = "offered-local"
    OFFERED_REMOTE = "offered-remote"
    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed-local"
    HALF_CLOSED_REMOTE = "half-closed-remote"
    CLOSING = "closing"


@dataclass(slots=True, eq=False)
class ChannelRecord:
    """What an engine knows about one live channel."""

    handle: int
    """The engine-assigned handle events use."""
    wire_id: int
    """The id on the wire."""
    local_origin: bool
    """True when we opened (offered) the channel."""
    name: str
    send: SendCredit
    recv: ReceiveWindow | None
    """``None`` when the format has no receive flow control."""
    accepted: bool = False
    local_end: bool = False
    """We sent our end-of-writing."""
    remote_end: bool = False
    """The peer sent its end-of-writing."""
    remote_stopped_reading: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    full_header: tuple[int, bytes] | None = None
    """``(size, header)`` of a data frame of the engine's full frame size on this channel
    (bulk writes send it again and again: encoded once, kept by ``Engine._queue_frames``)."""

    @property
    def state(self) -> ChannelState:
        """The state, derived from the flags (one source of truth)."""
        if not self.accepted:
            return ChannelState.OFFERED_LOCAL if self.local_origin else ChannelState.OFFERED_REMOTE
        if self.local_end and self.remote_end:
            return ChannelState.CLOSING
        if self.local_end:
            return ChannelState.HALF_CLOSED_LOCAL
        if self.remote_end:
            return ChannelState.HALF_CLOSED_REMOTE
        return ChannelState.OPEN

    def describe(self) -> str:
        """A short label for messages: ``channel 3 (local, 'name')``."""
        origin = "local" if self.local_origin else "remote"
        return f"channel {self.wire_id} ({origin}, {self.name!r})"

"""Control messages: session-level bytes beside the channels (omnistreams).

The peer's messages wait in a queue until the application takes them
(``SessionCore.take_control``); a :class:`~polymux.session.events.ControlArrived` event says
one is there. Past :data:`MAX_UNREAD` unread messages the session stops reading from the
peer (bounded memory) until the application has taken half of them.
"""

from __future__ import annotations

from collections import deque

from polymux.session.budget import CONTROLS, Pressure


__all__ = ["MAX_UNREAD", "Controls"]

MAX_UNREAD = 1024
"""Control messages held unread before the session stops reading."""


class Controls:
    """The peer's control messages not yet taken by the application."""

    __slots__ = ("pressure", "queue")

    def __init__(self, pressure: Pressure) -> None:
        self.pressure = pressure
        self.queue: deque[bytes] = deque()

    def arrived(self, data: bytes) -> None:
        """A control message from the peer."""
        self.queue.append(data)
        if len(self.queue) >= MAX_UNREAD:
            self.pressure.block(CONTROLS, True)  # bounded memory: wait for the application

    def take(self) -> bytes | None:
        """The oldest message not yet taken, or ``None``."""
        if not self.queue:
            return None
        data = self.queue.popleft()
        if self.pressure.bits & CONTROLS and len(self.queue) <= MAX_UNREAD // 2:
            self.pressure.block(CONTROLS, False)
        return data

"""The session's send scheduler: what goes out, in which order.

The engine's control frames go first (credit, pings, acknowledgements, resets, a
Streamux OOB), then channel data round robin among the channels that have data and credit,
up to a quantum per turn while others wait (at least one frame), until the batch holds
``batch_bytes``: one bulk channel cannot starve the others. A channel's end goes out once
its queued data has. Writes are taken as they are (large ones as views, runs of small ones
joined), so frames are full however the application cut its writes.

Owned by :class:`~polymux.session.core.SessionCore`, which queues what the application
writes (:meth:`Scheduler.wake` puts a channel in the round) and calls :meth:`Scheduler.batch`
from ``data_to_send``.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from polymux._types import BytesLike
from polymux.engine import Engine
from polymux.session.budget import Budget
from polymux.session.channels import CoreChannel, Sending, Step


__all__ = ["COALESCE", "QUANTUM", "Scheduler"]

COALESCE = 64 * 1024
"""Writes smaller than this are joined into one chunk when sent; larger ones go as views."""

QUANTUM = 64 * 1024
"""Bytes a channel may send per scheduler turn while others wait (at least one frame):
fair at that grain, and consecutive frames of one channel merge on receive."""

_LINGERING = Sending.LINGERING
_ENDING = Sending.ENDING


class SchedulerHost(Protocol):
    """What the scheduler needs of the core that owns it."""

    def end_sent(self, channel: CoreChannel, done: bool) -> None:
        """``channel``'s end went out; ``done``: the engine is done with the channel."""


class Scheduler:
    """The round of channels with something to send (see the module docstring)."""

    __slots__ = ("batch_limit", "budget", "channels", "engine", "host", "ready")

    def __init__(
        self,
        engine: Engine,
        batch_bytes: int,
        budget: Budget,
        channels: dict[int, CoreChannel],
        host: SchedulerHost,
    ) -> None:
        self.engine = engine
        self.channels = channels  # the core's live channels
        self.batch_limit = batch_bytes
        self.budget = budget
        self.host = host
        self.ready: deque[CoreChannel] = deque()
        """Channels in the round (each at most once: ``CoreChannel.queued``)."""

    def wake(self, channel: CoreChannel) -> None:
        """Put ``channel`` in the round, if it is not and its data may go out."""
        if not channel.queued and channel.sending.accepted:
            channel.queued = True
            self.ready.append(channel)

    def batch(self) -> list[BytesLike]:
        """One batch of channel data (and ends), as the engine framed it."""
        engine = self.engine
        ready = self.ready
        turn = max(engine.max_frame, QUANTUM)
        batch_limit = self.batch_limit
        size = 0
        while ready and size < batch_limit:
            channel = ready.popleft()
            channel.queued = False
            # Round robin, up to a quantum per turn while others wait (a run of frames of
            # one channel: the receiver takes it as one event and one wake-up); a channel
            # alone may fill the batch.
            quantum = turn if ready else batch_limit - size
            size += self._turn(channel, quantum)
            if self._wants_send(channel):
                channel.queued = True
                ready.append(channel)
        return engine.data_to_send()

    def _wants_send(self, channel: CoreChannel) -> bool:
        """Whether a turn would do anything now (exactly what :meth:`_turn` acts on: a
        channel that says yes and then does nothing would spin the scheduler)."""
        sending = channel.sending
        if not sending.accepted or sending is _LINGERING or self.channels.get(channel.handle) is not channel:
            return False
        if channel.buffered:
            return self.engine.send_credit(channel.handle) > 0
        return sending is _ENDING and self.engine.is_live(channel.handle)

    def _turn(self, channel: CoreChannel, quantum: int) -> int:
        """One channel's turn: at most ``quantum`` bytes (within its credit), or its end."""
        if not channel.sending.accepted or self.channels.get(channel.handle) is not channel:
            return 0
        engine = self.engine
        handle = channel.handle
        if channel.buffered:
            credit = engine.send_credit(handle)
            if credit <= 0:
                return 0
            n = min(quantum, credit, channel.buffered)
            engine.send_data(handle, *self.take(channel, n))
            return n
        if channel.sending is _ENDING and engine.is_live(handle):
            channel.step(Step.SEND_END_CLOSED if channel.receiving.closed else Step.SEND_END)
            self.host.end_sent(channel, engine.end_channel(handle))
        return 0

    def take(self, channel: CoreChannel, n: int) -> list[BytesLike]:
        """Remove and return up to ``n`` queued bytes as parts, in order: large writes as
        they are or as views (no copy), runs of small writes joined (one copy of at most
        :data:`COALESCE` bytes). The engine frames the parts as one run, so frames are full
        however the application cut its writes."""
        buf = channel.buf
        parts: list[BytesLike] = []
        size = 0
        while buf and size < n:
            head = buf[0]
            room = n - size
            if len(head) >= COALESCE or len(buf) == 1:
                if len(head) > room:
                    view = memoryview(head)
                    buf[0] = view[room:]
                    parts.append(view[:room])
                    size += room
                else:
                    parts.append(buf.popleft())
                    size += len(head)
                continue
            # A run of small writes, joined.
            limit = min(room, COALESCE)
            run: list[BytesLike] = []
            got = 0
            while buf and got < limit:
                part = buf[0]
                size_ = len(part)
                if size_ >= COALESCE:
                    break
                left = limit - got
                if size_ > left:
                    view = memoryview(part)
                    run.append(view[:left])
                    buf[0] = view[left:]
                    got = limit
                    break
                run.append(buf.popleft())
                got += size_
            parts.append(run[0] if len(run) == 1 else b"".join(run))
            size += got
        old = channel.buffered
        channel.buffered = new = old - size
        channel.progress += size
        self.budget.taken(channel, old, new)
        return parts

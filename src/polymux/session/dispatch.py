"""The core's events, turned into calls on a driver: one dispatch for every driver.

A driver (:mod:`polymux.aio`, :mod:`polymux.anyio`) keeps one object per channel (a
:class:`DriverChannel`: its transport, its stream) and implements :class:`Driver`'s hooks
for what needs its objects (new channels, the end). What the application's tasks wait for
(opens, room to open, pings, pairs, requests, control messages) is settled here, in the
session's :class:`~polymux.session.waiters.Waiters`. :meth:`Dispatcher.run` takes the
core's events, in order, and acts on them; the driver then follows the core's reading
state, output and deadline, which is I/O.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from polymux._types import BytesLike
from polymux.exceptions import SessionClosed
from polymux.session import events as ce
from polymux.session.core import SessionCore
from polymux.session.waiters import Waiters


__all__ = ["Dispatcher", "Driver", "DriverChannel"]


class DriverChannel(Protocol):
    """A driver's side of one channel."""

    def data(self, data: BytesLike, more: tuple[BytesLike, ...], n: int) -> None:
        """``n`` bytes arrived: ``data``, then the parts of ``more`` (views: copy to keep)."""

    def remote_end(self) -> None:
        """The peer finished writing."""

    def finished(
        self,
        error: Exception | None,
        write_error: Exception | None,
        *,
        drop_unread: bool = False,
        lingering: bool = False,
    ) -> None:
        """The channel is over (see :class:`~polymux.session.events.Finished`)."""

    def resume_writing_now(self) -> None:
        """The writer may go on."""

    def writing_stopped(self, error: Exception) -> None:
        """The peer reads no more: writes fail with ``error``."""


class Driver(Protocol):
    """A driver's hooks for the session's events."""

    def on_incoming(self, handle: int, name: str) -> None:
        """The peer opened channel ``handle``: make its driver channel (synchronously:
        its data may follow in the same read)."""

    def on_incoming_pair(self, handle: int, reply: int, name: str) -> None:
        """The peer opened a stream pair: read ``handle``, write ``reply``."""

    def on_pair_answered(self, handle: int, inbound: int) -> object:
        """Our stream pair (first half ``handle``) got its second half ``inbound``: make its
        driver channel (synchronously: its data may follow in the same read) and return
        what the pair's task gets (``Waiters.pairs``)."""

    def on_pair_failed(self, name: str, error: Exception) -> None:
        """The peer's stream pair could not be answered (for the log)."""

    def on_ready(self) -> None:
        """The handshake is done."""

    def on_failed(self, error: BaseException) -> None:
        """The session failed: send the core's last words if the socket takes them, and
        abort the connection."""


C = TypeVar("C", bound=DriverChannel)


class Dispatcher(Generic[C]):
    """Calls a driver's hooks for the core's events (see the module docstring).

    Args:
        core: the session's core.
        driver: its hooks.
        channels: the driver's channel objects by handle (a finished one is removed here).
        waiters: the session's waiters (settled here).
    """

    __slots__ = ("busy", "channels", "core", "driver", "waiters")

    def __init__(
        self,
        core: SessionCore,
        driver: Driver,
        channels: dict[int, C],
        waiters: Waiters[Any, Any, Any],
    ) -> None:
        self.core = core
        self.driver = driver
        self.channels = channels
        self.waiters = waiters
        self.busy = False

    def run(self) -> bool:
        """Act on every event the core has, new ones too. Re-entered from a hook it does
        nothing and returns False: the outer call takes the new events."""
        if self.busy:
            return False
        self.busy = True
        core = self.core
        driver = self.driver
        channels = self.channels
        waiters = self.waiters
        pending = core.pending
        try:
            # In place: what a hook makes the core say is appended, and taken in turn.
            for event in pending:
                if isinstance(event, ce.Data):
                    channel = channels.get(event.handle)
                    if channel is not None:
                        channel.data(event.data, event.more, event.n)
                    else:
                        core.consumed(event.handle, event.n)  # keep the peer's credit flowing
                elif isinstance(event, ce.Finished):
                    handle = event.handle
                    channel = channels.get(handle) if event.lingering else channels.pop(handle, None)
                    if channel is not None:
                        channel.finished(
                            event.error,
                            event.write_error,
                            drop_unread=event.drop_unread,
                            lingering=event.lingering,
                        )
                    if handle in waiters.opens:
                        error = event.error or SessionClosed(f"{core.format}: the channel ended")
                        waiters.opens.fail(handle, error)
                elif isinstance(event, ce.Ended):
                    channel = channels.get(event.handle)
                    if channel is not None:
                        channel.remote_end()
                elif isinstance(event, ce.WriteResumed):
                    channel = channels.get(event.handle)
                    if channel is not None:
                        channel.resume_writing_now()
                elif isinstance(event, ce.Incoming):
                    driver.on_incoming(event.handle, event.name)
                elif isinstance(event, ce.Accepted):
                    waiters.opens.settle(event.handle, None)
                elif isinstance(event, ce.OpenFailed):
                    waiters.opens.fail(event.handle, event.error)
                elif isinstance(event, ce.WritingStopped):
                    channel = channels.get(event.handle)
                    if channel is not None:
                        channel.writing_stopped(event.error)
                elif isinstance(event, ce.PingAnswered):
                    waiters.pings.settle(event.opaque, event.rtt)
                elif isinstance(event, ce.ControlArrived):
                    waiters.control.serve()
                elif isinstance(event, ce.RoomToOpen):
                    waiters.room_to_open(event.error, event.everyone)
                elif isinstance(event, ce.Answered):
                    if event.error is None:
                        waiters.requests.settle(event.handle, event.parts or [])
                    else:
                        waiters.requests.fail(event.handle, event.error)
                elif isinstance(event, ce.IncomingPair):
                    driver.on_incoming_pair(event.handle, event.reply, event.name)
                elif isinstance(event, ce.PairAnswered):
                    inbound = event.inbound
                    if inbound is None:
                        error = event.error or SessionClosed(f"{core.format}: the stream pair failed")
                        waiters.pairs.fail(event.handle, error)
                    else:
                        pair = driver.on_pair_answered(event.handle, inbound)
                        waiters.pairs.settle(event.handle, pair, inbound)
                elif isinstance(event, ce.PairFailed):
                    driver.on_pair_failed(event.name, event.error)
                elif isinstance(event, ce.Ready):
                    driver.on_ready()
                elif isinstance(event, ce.Failed):  # pragma: no branch (the last event type)
                    driver.on_failed(event.error)
        finally:
            pending.clear()
            self.busy = False
        return True

"""How channels end: finishing one (every job's bookkeeping let go, then a
:class:`~polymux.session.events.Finished` event), resets the core decides, the per-channel
deadlines (stream-open, close, slow-reader), and the slow-reader policy of formats without
credit (a full reader holds the whole connection, or is reset after
``slow_reader_timeout``).

:class:`Lifecycle` belongs to the core, whose calls (``reset``, ``close_channel``, the
scheduler's end of a channel, the peer's resets) all end a channel here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from polymux.exceptions import ChannelOverflow, ChannelReset
from polymux.session import events as ce
from polymux.session.channels import CoreChannel, Sending, Timer


if TYPE_CHECKING:  # typing only: the core imports this module, not the other way
    from polymux.session.core import SessionCore


__all__ = ["Lifecycle"]

_LINGERING = Sending.LINGERING


class Lifecycle:
    """The end of the core's channels (see the module docstring)."""

    __slots__ = ("config", "core", "credit", "emit", "engine", "format")

    def __init__(self, core: SessionCore, emit: Callable[[ce.CoreEvent], None]) -> None:
        self.core = core
        self.emit = emit
        self.engine = core.engine
        self.config = core.config
        self.format = core.format
        self.credit = core.engine.has_flow_control

    def end_sent(self, channel: CoreChannel, done: bool) -> None:
        """The scheduler sent ``channel``'s end (``done``: the engine is done with it)."""
        if done:
            self.finish(channel, None)
        elif channel.sending is _LINGERING:
            # close(): the application is done with the channel; the engine lingers until
            # the peer ends too (its data is dropped meanwhile).
            self.emit(ce.Finished(channel.handle, lingering=True))

    def reset_held(self, channel: CoreChannel, problem: str) -> None:
        """The format holds more of ``channel``'s bytes than it allows: reset it."""
        self.engine_reset(channel, problem)
        self.finish(channel, ChannelOverflow(f"{self.format}: {channel.label} was reset: {problem}"))

    # -- the slow-reader policy (formats without credit) ------------------------------------

    def set_slow(self, channel: CoreChannel, slow: bool) -> None:
        """Whether ``channel`` holds the connection (its reader is full)."""
        if channel.slow == slow:
            return
        channel.slow = slow
        self.core.pressure.pause_for(slow)

    def reader_behind(self, channel: CoreChannel) -> None:
        """The reader holds ``receive_window`` unread bytes and the format cannot slow the
        peer down: apply ``slow_reader``."""
        config = self.config
        if config.slow_reader == "reset" and config.slow_reader_timeout == 0:
            self._overflow(channel)
            return
        if channel.slow:
            return
        self.set_slow(channel, True)  # blocks the whole connection
        channel.slow_since = now = self.core.now
        if config.slow_reader == "reset":
            self.core.table.add_timer(now + config.slow_reader_timeout, Timer.OVERFLOW, channel.handle)

    def _overflow(self, channel: CoreChannel) -> None:
        """slow_reader="reset": drop this channel so the others can go on."""
        config = self.config
        message = (
            f"reader fell behind: {channel.inbox.unconsumed} bytes unread"
            + (f" for {config.slow_reader_timeout:g} s" if config.slow_reader_timeout else "")
            + f" (receive_window={config.receive_window}, slow_reader='reset')"
        )
        self.engine_reset(channel, message)
        self.finish(
            channel, ChannelOverflow(f"{self.format}: {channel.label} was reset: {message}"), drop_unread=True
        )

    # -- per-channel deadlines ---------------------------------------------------------------

    def timer(self, kind: Timer, channel: CoreChannel) -> None:
        """A deadline of ``channel`` is due (see :class:`~polymux.session.channels.Timer`)."""
        core = self.core
        config = self.config
        if kind == Timer.OPEN:
            if channel.handle not in core.offers.pending:
                return  # acknowledged meanwhile
            core.settle_open(channel.handle, timed_out=True)
            self.engine_reset(channel, None)
            error = ChannelReset(
                self.format,
                channel.label,
                f"not acknowledged within stream_open_timeout={config.stream_open_timeout:g} s",
                by_peer=False,
            )
            self.finish(channel, error)
        elif kind == Timer.CLOSE:
            if channel.progress and (channel.buffered or not channel.sending.end_sent):
                # Still sending what was written before close(), and the peer takes it: the
                # deadline moves on (a reset would drop data the peer is reading; Streamux
                # shows a reset as a clean end).
                channel.progress = 0
                core.table.add_timer(core.now + config.close_timeout, Timer.CLOSE, channel.handle)
                return
            core.reset(channel.handle)  # the peer never ended its side, or takes nothing
        elif channel.slow and core.now - channel.slow_since >= config.slow_reader_timeout:
            self._overflow(channel)  # OVERFLOW: still full since its timer was set

    def engine_reset(self, channel: CoreChannel, message: str | None) -> None:
        """Reset ``channel`` on the wire, if the engine still has it."""
        engine = self.engine
        if engine.is_live(channel.handle) and not engine.closed:
            engine.reset_channel(channel.handle, message)

    def finish(
        self,
        channel: CoreChannel,
        error: Exception | None,
        *,
        write_error: Exception | None = None,
        drop_unread: bool = False,
    ) -> None:
        """Final state: the core forgets the channel (its reader keeps what arrived)."""
        core = self.core
        handle = channel.handle
        if core.table.pop(handle) is None:
            # Every caller finds the channel live first; a second finish stays harmless.
            return  # pragma: no cover
        core.settle_open(handle)
        core.budget.finished(channel)
        self.set_slow(channel, False)
        if channel.reading_paused and not self.credit:
            channel.reading_paused = False
            core.pressure.pause_for(False)
        if not core.channels:
            core.liveness.last_activity = core.now
        if core.requests.answers:
            answered = core.requests.finished(handle, error)
            if answered is not None:
                self.emit(answered)
        if core.pairs.tokens:
            paired = core.pairs.finished(handle, error)
            if paired is not None:
                self.emit(paired)
        self.emit(ce.Finished(handle, error, write_error, drop_unread))

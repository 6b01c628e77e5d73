"""What the peer's frames do: the engine's events, turned into channel state and the
core's events (:mod:`polymux.session.events`).

:class:`PeerEvents` is the core's reading of the peer: data for a channel's reader (or a
request's answer; or dropped, its credit returned, once the application closed the
channel), acceptances, ends, resets and refusals, the peer's offers (charged to the open
rate, refused by the limits and the filter, answered at once when they are half of a
stream pair), its handshake, go-away, ping answers and control messages. It changes
channels only through their state tables (:mod:`polymux.session.channels`) and the
core's own calls (``finish``, ``reset``, ``close_channel`` ...).

A violation in the peer's very first bytes is most likely a peer of another protocol:
:func:`mismatch` turns it into a :class:`~polymux.exceptions.FormatMismatch` naming what
the peer sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from polymux.engine import events as ev
from polymux.exceptions import (
    ChannelClosedError,
    ChannelRejected,
    ChannelReset,
    FormatMismatch,
    PolymuxError,
    ProtocolError,
    SessionClosed,
)
from polymux.session import events as ce
from polymux.session.channels import CoreChannel, Receiving, Step
from polymux.session.diagnosis import name_the_peer
from polymux.session.pairs import REPLY, pair_role
from polymux.sniff import identify, show


if TYPE_CHECKING:  # typing only: the core imports this module, not the other way
    from polymux.session.core import SessionCore


__all__ = ["EARLY", "FIRST_BYTES", "PeerEvents", "mismatch"]

EARLY = 4096
"""A violation in a read that starts within the peer's first this many bytes means that the
peer probably speaks another protocol: :class:`FormatMismatch`."""
FIRST_BYTES = 64
"""The peer's first bytes kept for that diagnosis."""


def mismatch(fmt: str, error: ProtocolError, first: bytes, is_client: bool | None = None) -> ProtocolError:
    """``error`` (a violation in the peer's first bytes ``first``) as the diagnosis it is:
    a :class:`FormatMismatch` saying what the peer sent and, where the bytes tell, what it
    is: HTTP, TLS, SSH, or another multiplexing format (named at
    :data:`~polymux.session.diagnosis.NAME_CONFIDENCE` or above; ``is_client``: we are the
    client, so the bytes are a server's). A more precise error (a flow-control overrun, a
    failed negotiation: each needs bytes of the format) stays what it is."""
    if type(error) is not ProtocolError:
        return error
    foreign = identify(first)
    named = None if foreign is not None else name_the_peer(fmt, first, peer_role=_ROLES[is_client])
    if foreign is not None:
        detail = (
            f"the peer speaks {foreign.name}, not {fmt}: it sent {foreign.what}, so it is "
            f"{foreign.peer} (as {fmt}: {error.detail})"
        )
    elif named is not None:
        detail = f"{named} (it sent {show(first)}; as {fmt}: {error.detail})"
    else:
        detail = (
            f"the peer's first bytes are not {fmt}: it probably speaks another protocol or "
            f"another multiplexing format (it sent {show(first)}; as {fmt}: {error.detail})"
        )
    found = FormatMismatch(fmt, detail, first, foreign.name if foreign else None)
    found.__cause__ = error
    return found


_ROLES = {None: "peer", True: "server", False: "client"}
"""The peer's role in the diagnosis, by whether we are the client."""

_READING = Receiving.OPEN
_ANSWER = Receiving.ANSWER


class PeerEvents:
    """The engine's events, for one core (see the module docstring).

    Args:
        core: the core.
        emit: appends an event for the driver (the core's own list: the hot path of data
            calls it once per run of frames).
        has_handler: the driver runs a handler per incoming channel (no accept backlog).
    """

    __slots__ = ("channels", "core", "credit", "emit", "format", "has_handler", "receive_window")

    def __init__(self, core: SessionCore, emit: Callable[[ce.CoreEvent], None], *, has_handler: bool) -> None:
        self.core = core
        self.emit = emit
        self.channels = core.channels
        self.format = core.format
        self.credit = core.engine.has_flow_control
        self.receive_window = core.config.receive_window
        self.has_handler = has_handler

    def on_event(self, event: ev.Event) -> None:
        """Act on one of the engine's events (in order, as ``receive_data`` returned them)."""
        core = self.core
        channels = self.channels
        if isinstance(event, ev.DataReceived):
            channel = channels.get(event.channel)
            n = event.flow_controlled_length
            if channel is None or channel.receiving is not _READING:
                if channel is None or channel.receiving.closed:
                    core.ack(event.channel, n)  # dropped: keep the peer's credit flowing
                    return
                # pragma below: the engines refuse data after the peer's end, so only a
                # request's answer is left here (data on an ENDED channel would be delivered).
                if channel.receiving is _ANSWER:  # pragma: no branch
                    core.ack(event.channel, n)
                    failed = core.requests.data(event.channel, event.data, event.more)
                    if failed is not None:
                        self.emit(failed)
                        core.reset(event.channel)  # the answer passed its limit
                    return
            inbox = channel.inbox
            if channel.streamed:  # into its inbox, as the engine's data frames go
                core.runs.put(inbox, event.data, event.more, n)
                return
            inbox.unconsumed += n
            core.budget.received(n)
            self.emit(ce.Data(event.channel, event.data, event.more, n))
            if not self.credit and inbox.unconsumed > self.receive_window:
                core.lifecycle.reader_behind(channel)
        elif isinstance(event, ev.CreditAvailable):
            channel = channels.get(event.channel)
            if channel is not None and not channel.queued and channel.sending.accepted:
                channel.queued = True
                core.scheduler.ready.append(channel)
        elif isinstance(event, ev.ChannelOpened):
            self._offer(event.channel, event.name)
        elif isinstance(event, ev.ChannelAccepted):
            core.settle_open(event.channel)
            channel = channels.get(event.channel)
            # pragma below: the engine reports acceptance only of an offer it still tracks,
            # and it tracks ours exactly as long as the core does (the None test is a guard).
            if channel is not None:  # pragma: no branch
                if not channel.sending.accepted:
                    channel.step(Step.ACCEPT)
                    if channel.buffered or channel.sending.end_wanted:
                        core.scheduler.wake(channel)
                self.emit(ce.Accepted(event.channel))
        elif isinstance(event, ev.ChannelEnded):
            channel = channels.get(event.channel)
            if channel is not None:
                answer = channel.receiving is _ANSWER
                channel.step(Step.PEER_END)
                if answer:
                    self.emit(core.requests.ended(event.channel))
                    core.close_channel(event.channel)
                elif not channel.receiving.closed:
                    self.emit(ce.Ended(event.channel))
        elif isinstance(event, ev.ChannelClosed):
            channel = channels.get(event.channel)
            if channel is not None:
                write_error = (
                    None
                    if event.local_done
                    else ChannelClosedError(f"{self.format}: {channel.label} was closed by the peer")
                )
                core.lifecycle.finish(channel, None, write_error=write_error)
        elif isinstance(event, ev.ChannelReset):
            channel = channels.get(event.channel)
            if channel is not None:
                error = ChannelReset(self.format, channel.label, event.message)
                if not channel.sending.accepted:
                    # No engine resets an offer it has not seen accepted (MultiplexingStream
                    # reports ChannelRejected); kept for one that would.
                    core.open_failed(event.channel, error)  # pragma: no cover
                core.lifecycle.finish(channel, error)
        elif isinstance(event, ev.ChannelRejected):
            channel = channels.get(event.channel)
            # pragma below: only a pending offer of ours is rejected, and nothing else in
            # the same read can have ended it (the None test is a guard).
            if channel is not None:  # pragma: no branch
                core.open_failed(event.channel, ChannelRejected(self.format, channel.label, channel.name))
                core.lifecycle.finish(channel, None)
        elif isinstance(event, ev.ReadingStopped):
            channel = channels.get(event.channel)
            if channel is not None:
                core.budget.dropped(channel)
                stopped = ChannelClosedError(f"{self.format}: the peer stopped reading {channel.label}")
                self.emit(ce.WritingStopped(event.channel, stopped))
                core.write_eof(event.channel)
        elif isinstance(event, ev.SessionReady):
            # pragma below: engines report SessionReady once, and only when they were not
            # ready at the start (the test is a guard).
            if not core.liveness.ready:  # pragma: no branch
                self.ready(core.now)
        elif isinstance(event, ev.SessionClosed):
            # The peer's go-away: no new channels; open ones may finish. One that reports an
            # error ends the session (as hashicorp's handleGoAway does).
            core.peer_goaway = f"the peer is going away ({event.message})"
            self.emit(ce.RoomToOpen(everyone=True))  # waiting opens fail: no new channels
            if event.code:
                core.fail(
                    SessionClosed(
                        f"{self.format}: the peer went away with {event.message}", ending=SessionClosed.CLOSED
                    )
                )
        elif isinstance(event, ev.PingAcked):
            rtt = core.liveness.ping_acked(event.opaque, core.now)
            if rtt is not None:
                self.emit(ce.PingAnswered(event.opaque, rtt))
        elif isinstance(event, ev.ControlReceived):  # pragma: no branch (the last event type)
            core.controls.arrived(event.data)
            self.emit(ce.ControlArrived())

    def ready(self, now: float) -> None:
        """The handshake is done (or, without one, the connection is up)."""
        self.emit(ce.Ready())
        self.core.liveness.on_ready(now)

    def _offer(self, handle: int, name: str) -> None:
        core = self.core
        offers = core.offers
        too_fast = offers.charge(core.now)
        if too_fast is not None:
            core.fail(too_fast)
            return
        engine = core.engine
        if not engine.is_live(handle):
            return  # opened and reset (or cancelled) within the same read: nothing to take
        if offers.refuse(name, core.closing):
            engine.reject_channel(handle)
            return
        engine.accept_channel(handle)
        budget = core.budget
        channel = CoreChannel(
            handle,
            name,
            engine.describe(handle),
            False,
            budget.high,
            budget.low,
            accepted=True,
            inbox=core.new_inbox(handle),
        )
        core.table.add(channel)
        role = pair_role(engine.metadata_object(handle)) if engine.one_way else None
        if role is None:
            self._incoming(ce.Incoming(handle, name))
        elif role[0] == REPLY:
            answered = core.pairs.answer(role[1], handle)
            if answered is None:
                core.reset(handle)  # an answer nobody waits for
            else:
                self.emit(answered)
        else:  # the first half of the peer's pair: open the other half back
            try:
                reply = core.open_channel(name, {REPLY: role[1]})
            except PolymuxError as exc:
                core.reset(handle)
                self.emit(ce.PairFailed(name, exc))
                return
            self._incoming(ce.IncomingPair(handle, reply, name))

    def _incoming(self, event: ce.Incoming | ce.IncomingPair) -> None:
        if not self.has_handler:
            self.core.table.untaken += 1
        self.emit(event)

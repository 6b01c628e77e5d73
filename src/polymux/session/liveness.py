"""Whether the peer is alive and keeps up: the session-wide deadlines of the core.

* ``handshake_timeout``: the peer's handshake is due (formats with one) or, on a server's
  accepted connection of a format without one, its first whole frame.
* ``idle_timeout``: a session with no channels that received no whole frame for that long.
* keepalive (``keepalive_interval``, ``keepalive_timeout``, ``stall_timeout``): a ping
  every interval, judged only on what the peer could have answered (see
  :meth:`Liveness._check_keepalive`); while we do not read, formats without credit send
  heartbeats (pings whose answers are not awaited) so that the peer sees us alive.
* silence: on formats without pings (MultiplexingStream, mplex, omnistreams) and smux, a
  heartbeat (``Engine.heartbeat``: a frame every peer ignores; smux's is a NOP) once we have
  sent a frame and heard one, then every interval, at least every :data:`HEARTBEAT_PERIOD`. From the
  peer's first heartbeat on (or once the time between two of its pings was measured), a
  peer from which no byte has come for its interval (at least ``keepalive_interval``) plus
  ``keepalive_timeout`` while we read is gone (see :meth:`Liveness._check_silence`). A peer
  that sends neither (a foreign implementation of a format without pings) is never judged
  so.
* the server's memory account (``max_memory``): while it holds reading back, a look at it
  every :data:`~polymux.session.budget.RECHECK` seconds.
* ``send_timeout``: reading held back (by the budget or queued replies) while the socket
  takes none of our bytes.

Pings are here too, the application's and the keepalive's: :meth:`Liveness.ping` sends one,
:meth:`Liveness.ping_acked` matches its answer. Owned by
:class:`~polymux.session.core.SessionCore`; time is always passed in.
"""

from __future__ import annotations

from typing import Protocol

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine import Engine
from polymux.exceptions import PolymuxError, SessionClosed
from polymux.session.budget import RECHECK, SHARED, STALLED, Pressure


__all__ = ["BUSY_READ", "HEARTBEAT_PERIOD", "STALL_TIMEOUT_WITHOUT_CREDIT", "Liveness"]

BUSY_READ = 64 * 1024
"""A socket read at least this large means the peer had more queued: it is busy, not dead
(keepalive waits longer for an answer that sits behind what it sent)."""

HEARTBEAT_PERIOD = 15.0
"""The longest time between two heartbeats (formats without pings): every
``keepalive_interval``, but at least this often whatever the setting, so that a peer judges
us by it from our first heartbeat on, without waiting to measure our interval."""

STALL_TIMEOUT_WITHOUT_CREDIT = 120.0
"""The default ``stall_timeout`` of formats without credit on the wire (mstream-v1, mplex,
multiplex, Streamux, smux version 1): there a peer stops reading to slow us down, so a
peer that takes none of our bytes for a while is applying backpressure, not dead."""


class LivenessHost(Protocol):
    """What the liveness checks need of the core that owns them."""

    now: float
    closing: bool
    failed: bool
    lost: bool

    def fail(self, error: BaseException) -> None:
        """End the session because of ``error``."""


class Liveness:
    """The session-wide deadlines and pings (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        config: SessionConfig,
        now: float,
        pressure: Pressure,
        host: LivenessHost,
        *,
        first_frame_deadline: bool,
    ) -> None:
        self.engine = engine
        self.config = config
        self.format = engine.format
        self.pressure = pressure
        self.host = host
        self.ready = engine.ready
        """The handshake is done (formats without one: from the start)."""
        self.first_frame_due = first_frame_deadline and self.ready
        """A server's connection of a format without a handshake: the peer's first whole
        frame is due within ``handshake_timeout``."""
        self.heard = False
        """A whole frame came from the peer."""
        self.handshake_at: float | None = (
            now + config.handshake_timeout if not self.ready or self.first_frame_due else None
        )
        self.last_activity = now
        """The last whole frame received, or the last channel gone."""
        self.last_busy = -1e9
        """The last full socket read (:data:`BUSY_READ`)."""
        # send_timeout.
        self.stall_at: float | None = None
        self.stall_mark = 0
        # Pings: ours and the keepalive's. opaque -> time sent.
        self.pings: dict[int, float] = {}
        self.keepalive = engine.has_ping and config.keepalive_interval is not None
        self.ping_due: float | None = None
        self.ka_opaque: int | None = None
        self.ka_deadline = 0.0
        # Liveness judges the peer only on what it has had a chance to answer: our ping
        # must have left our buffers (ka_offset: where it ends in what we wrote; taken once
        # bytes_out - unsent reaches it), and we must be reading (ka_unread: reading was
        # paused since the last check).
        self.bytes_out = 0
        """Bytes ``data_to_send()`` returned, in all."""
        self.ka_offset: int | None = None
        self.ka_taken_at: float | None = None  # when the ping was seen out of our buffers
        self.ka_mark = 0  # bytes the peer had taken at the last sign of progress ...
        self.ka_progress_at = 0.0  # ... and when
        self.ka_unread = False
        self.ka_writable = False  # the socket took bytes from the keepalive ping on
        self.ka_peer_pings = 0  # the peer's pings when ours went out (formats without credit)
        self.credit = engine.has_flow_control
        self.heartbeat_at: float | None = None
        # Silence: heartbeats (formats without pings) and the peer's own pings.
        self.beats = config.keepalive_interval is not None
        """We judge a peer that sends heartbeats or pings regularly by its silence."""
        self.beating = self.beats and not (engine.has_ping and engine.ping_answered)
        """We send heartbeats: formats without pings, and smux, whose NOP nothing answers
        (each side's keepalive NOP waits for the other's: alone they come every other
        interval)."""
        self.beat_due: float | None = None
        self.rx_at = now
        """When bytes (any) last came from the peer (the core sets it on every read)."""
        self.beats_seen = 0
        """The peer's heartbeats and pings counted so far (``Engine.peer_heartbeats`` +
        ``Engine.peer_pings``)."""
        self.beat_at: float | None = None
        self.beat_gap = 0.0
        """The longest time measured between two of the peer's heartbeats or pings while we
        read, :data:`HEARTBEAT_PERIOD` from its first heartbeat until measured (0: the peer
        is not judged)."""
        self.beat_clean = False  # reading went on since the peer's last heartbeat
        self.beat_first = False  # our first heartbeat waits for our first frame
        self.beat_unread = False  # reading was paused since the last silence check

    # -- the core's calls --------------------------------------------------------------------

    def connection_made(self, now: float) -> None:
        """The connection is up: the handshake (or first-frame) clock starts."""
        self.last_activity = self.rx_at = now
        if not self.ready or self.first_frame_due:
            self.handshake_at = now + self.config.handshake_timeout

    def on_ready(self, now: float) -> None:
        """The handshake is done: a first ping at once (the RTT drives window tuning), and
        the keepalive's clock starts."""
        self.ready = True
        self.handshake_at = None
        if self.beating and not self.first_frame_due:  # (a server: once its client spoke)
            self._first_beat(now)
        if self.engine.has_ping:
            self.ping(now, by_application=False)
            if self.keepalive:
                self.ping_due = now + (self.config.keepalive_interval or 0.0)

    def lift_first_frame(self) -> None:
        """The peer's first frame arrived, or the application opened a channel (the peer
        may then only listen): no first-frame deadline, and our first heartbeat."""
        self.first_frame_due = False
        self.handshake_at = None
        if self.beating and self.ready and self.beat_due is None:
            self._first_beat(self.host.now)

    def ping(self, now: float, *, by_application: bool = True) -> int:
        """Send a ping (see ``SessionCore.ping``)."""
        engine = self.engine
        if not engine.has_ping or (by_application and not engine.ping_answered):
            raise PolymuxError(f"{self.format} has no ping (nothing answers its keepalive)")
        engine.now = now
        opaque = engine.ping()
        self.pings[opaque] = now
        return opaque

    def ping_acked(self, opaque: int, now: float) -> float | None:
        """The peer answered ``opaque``: the round-trip time if someone waits for it."""
        sent = self.pings.pop(opaque, None)
        if opaque == self.ka_opaque:
            self.ka_opaque = None
            self.ping_due = now + (self.config.keepalive_interval or 0.0)
        return None if sent is None else max(0.0, now - sent)

    def ping_leaves(self, out: list[BytesLike], now: float) -> None:
        """The keepalive ping goes out in ``out`` (control frames come first): it is taken
        once everything up to here has left our buffers."""
        self.ka_offset = self.bytes_out + sum(map(len, out))
        if self.ka_writable:
            self.ka_taken_at = now  # provisional: the timer checks the socket

    def socket_paused(self, paused: bool, unsent: int) -> None:
        """The socket stopped (or resumed) taking our bytes (after the budget saw it)."""
        if paused:
            self.ka_writable = False
            self.arm_stall(unsent)

    def lost(self) -> None:
        """The connection is gone: no more deadlines."""
        self.pings.clear()
        self.stall_at = self.handshake_at = self.ping_due = self.heartbeat_at = self.beat_due = None
        self.ka_opaque = None
        self.beat_gap = 0.0

    # -- reading stopped (the Pressure's listener) -------------------------------------------

    def reading_stopped(self) -> None:
        """Reading from the peer stopped: the keepalive does not judge what we did not read;
        without credit, heartbeats tell the peer we are alive."""
        self.ka_unread = True
        self.beat_unread = True
        self.beat_clean = False
        if self.keepalive and not self.credit and self.heartbeat_at is None:
            self.heartbeat_at = self.host.now + self._heartbeat_period()

    def stalled(self) -> None:
        """Reading stopped because the peer does not take our bytes: ``send_timeout``."""
        if self.pressure.write_paused:
            self.arm_stall(self.pressure.socket_unsent)

    # -- deadlines ---------------------------------------------------------------------------

    def next_deadline(self, quiet: bool) -> float | None:
        """The first of our deadlines (``quiet``: no channels and no error, so
        ``idle_timeout`` runs). The drivers ask after every change, before they write: when
        our first frame waits to be written, our first heartbeat is queued behind it here,
        to go in the same write (:meth:`_first_beat`)."""
        if self.host.failed:
            return None  # over: the driver closes the connection
        timeout = self.config.idle_timeout
        idle = self.last_activity + timeout if timeout is not None and quiet else None
        keepalive = self.ka_deadline if self.ka_opaque is not None else None
        silence = self.rx_at + self.silence_bound() if self.beat_gap else None
        # Held back by the server's memory: look again soon (MemoryAccount).
        recheck = self.host.now + RECHECK if self.pressure.bits & SHARED else None
        due = self.beat_due  # (no list, no call: the drivers ask after every read)
        if self.beat_first:
            if not self.bytes_out and self.engine.has_output:
                self._ride()  # our first frame waits to be written: the heartbeat goes with it
            elif self.bytes_out and self.heard:
                due = self.host.now  # both sides spoke the format: our first heartbeat now
        for when in (
            self.handshake_at,
            self.stall_at,
            self.ping_due,
            self.heartbeat_at,
            keepalive,
            idle,
            silence,
            recheck,
        ):
            if when is not None and (due is None or when < due):
                due = when
        return due

    def on_timer(self, now: float, unsent: int) -> None:
        """Act on the deadlines due at ``now`` (``unsent``: the socket's unsent bytes); a
        failure ends the session through the host."""
        host = self.host
        pressure = self.pressure
        if pressure.bits & SHARED and pressure.recheck is not None:
            pressure.recheck()
        if self.handshake_at is not None and now >= self.handshake_at:
            self.handshake_at = None
            what = "not one whole frame" if self.first_frame_due else "no handshake"
            host.fail(
                SessionClosed(
                    f"{self.format}: {what} from the peer within "
                    f"{self.config.handshake_timeout:g} s (handshake_timeout)",
                    ending=SessionClosed.VANISHED,
                )
            )
            return
        if self.stall_at is not None and now >= self.stall_at:
            self._check_stall(now, unsent)
            if host.failed:
                return
        if self.ka_opaque is not None and now >= self.ka_deadline:
            self._check_keepalive(now, unsent)
            if host.failed:
                return
        if self.ping_due is not None and now >= self.ping_due and self.ka_opaque is None:
            self.ping_due = None
            if self.ready and not host.closing:
                self._keepalive_ping(now, unsent)
        if self.heartbeat_at is not None and now >= self.heartbeat_at:
            self._heartbeat(now)
        if self.beat_due is not None and (
            now >= self.beat_due or (self.beat_first and self.bytes_out and self.heard)
        ):
            self._beat(now)
        if self.beat_gap and now >= self.rx_at + self.silence_bound():
            self._check_silence(now)

    def idle_check(self, now: float, quiet: bool) -> SessionClosed | None:
        """``idle_timeout``: the error that ends a ``quiet`` session idle too long, if due."""
        if self.pressure.bits:
            # Not reading: nothing the peer sent can be seen; idleness counts from when we read.
            self.last_activity = max(self.last_activity, now)
        timeout = self.config.idle_timeout
        if timeout is not None and quiet and now - self.last_activity >= timeout:
            return SessionClosed(
                f"{self.format}: closed after {timeout:g} s with no channels and no frame received "
                "(idle_timeout)",
                ending=SessionClosed.LOCAL,
            )
        return None

    # -- send_timeout ------------------------------------------------------------------------

    def arm_stall(self, unsent: int) -> None:
        """Start the ``send_timeout`` clock when reading is held back because the peer does
        not read what we must send it."""
        timeout = self.config.send_timeout
        if timeout is None or self.stall_at is not None or self.host.lost:
            return
        if self.pressure.write_paused and self.pressure.bits & STALLED:
            self.stall_mark = unsent
            self.stall_at = self.host.now + timeout

    def _check_stall(self, now: float, unsent: int) -> None:
        self.stall_at = None
        if not (self.pressure.write_paused and self.pressure.bits & STALLED):
            return
        if unsent < self.stall_mark:  # the peer read some: a slow reader, not a stalled one
            self.arm_stall(unsent)
            return
        timeout = self.config.send_timeout
        self.host.fail(
            SessionClosed(
                f"{self.format}: the peer sends but is not reading: {unsent} bytes unsent and "
                f"no progress for {timeout:g} s (send_timeout)",
                ending=SessionClosed.VANISHED,
            )
        )

    # -- keepalive ---------------------------------------------------------------------------

    def _ka_timeout(self) -> float:
        """How long the keepalive waits for its answer. Nothing answers a ping of some
        formats (smux's NOP): the peer's next frame does, and an idle peer sends one only
        every ITS keepalive interval (xtaci/smux: 10 s), so one interval of ours more."""
        timeout = self.config.keepalive_timeout
        if not self.engine.ping_answered:
            timeout += self.config.keepalive_interval or 0.0
        return timeout

    def _stall_timeout(self) -> float:
        """How long the peer may take none of our bytes while our ping waits behind them
        (``stall_timeout``; by default ``keepalive_timeout`` where the format has credit, and
        :data:`STALL_TIMEOUT_WITHOUT_CREDIT` where stopping to read is its backpressure)."""
        stall = self.config.stall_timeout
        if stall is not None:
            return stall
        return self.config.keepalive_timeout if self.credit else STALL_TIMEOUT_WITHOUT_CREDIT

    def _keepalive_ping(self, now: float, unsent: int) -> None:
        try:
            self.ka_opaque = self.ping(now, by_application=False)
        except RuntimeError:  # every request id in flight (Streamux): try again later
            self.ping_due = now + (self.config.keepalive_interval or 0.0)
            return
        self.ka_deadline = now + self._ka_timeout()
        self.ka_offset = self.ka_taken_at = None
        # Out at once if the socket takes bytes now (data_to_send confirms it).
        self.ka_writable = not self.pressure.write_paused
        self.ka_mark = self.bytes_out - unsent
        self.ka_progress_at = now
        self.ka_unread = bool(self.pressure.bits)
        self.ka_peer_pings = self.engine.peer_pings

    def _heartbeat_period(self) -> float:
        """While we do not read, a format without credit pings this often: the peer's
        answers wait unread, but our pings tell the peer that we are alive and applying
        backpressure (it counts them, as we count its own: :meth:`_check_keepalive`)."""
        return min(self.config.keepalive_interval or 0.0, self.config.keepalive_timeout / 2)

    def _heartbeat(self, now: float) -> None:
        if not self.pressure.bits or self.host.closing or not self.ready:
            self.heartbeat_at = None
            return
        self.engine.now = now
        try:
            self.engine.ping()  # its answer is not awaited (nor read, for now)
        except RuntimeError:  # every request id in flight (Streamux): the next one, then
            pass
        self.heartbeat_at = now + self._heartbeat_period()

    def _check_keepalive(self, now: float, unsent: int) -> None:
        """The keepalive ping's deadline passed. Liveness judges the peer only on what it
        could have answered:

        * while we do not read (our own limits: budget, a slow application), its answer may
          sit unread in our socket: no verdict, and the clock starts again once we read;
        * while our ping has not left our buffers (``unsent``: the socket's unsent bytes),
          the peer has not had it: a peer that takes our bytes slowly is applying
          backpressure, and only one that takes none for ``stall_timeout`` is stalled;
        * once it has, an answer is due within the timeout. On formats without credit the
          peer's own ping counts too (a polymux peer that applies backpressure by not
          reading pings while it does not read). A busy peer (full socket reads: the
          answer sits behind what it sends) gets more time, never past 4 x the timeout.
        """
        timeout = self._ka_timeout()
        reading_paused = self.pressure.bits
        if reading_paused or self.ka_unread:
            self.ka_unread = bool(reading_paused)
            self.ka_taken_at = None
            self.ka_deadline = now + (timeout if self.credit else self._heartbeat_period())
            return
        taken = self.bytes_out - unsent
        if self.ka_offset is None or taken < self.ka_offset:
            self.ka_taken_at = None
            if taken != self.ka_mark:
                self.ka_mark, self.ka_progress_at = taken, now
            stall = self._stall_timeout()
            idle = now - self.ka_progress_at
            if idle < stall:
                self.ka_deadline = now + min(timeout, stall - idle)
                return
            self._keepalive_failed(
                f"keepalive failed: the peer has taken none of our bytes (our ping among them) for "
                f"{idle:.3g} s (stall_timeout={stall:g}): it stopped reading"
            )
            return
        if self.ka_taken_at is None:
            self.ka_taken_at = now  # out of our buffers since the last check at most
            self.ka_deadline = now + timeout
            return
        waited = now - self.ka_taken_at
        if not self.credit and self.engine.peer_pings != self.ka_peer_pings:
            # The peer pinged us since: alive, and not reading for now (its answer waits).
            self.pings.pop(self.ka_opaque or 0, None)
            self.ka_opaque = None
            self.ping_due = now + (self.config.keepalive_interval or 0.0)
            return
        if waited < 4 * timeout and now - self.last_busy < timeout:
            self.ka_deadline = now + timeout
            return
        self._keepalive_failed(
            f"keepalive failed: no answer to a ping within {waited:.3g} s "
            f"(keepalive_timeout={self.config.keepalive_timeout:g})"
        )

    # -- heartbeats and silence ----------------------------------------------------------------

    def _first_beat(self, now: float) -> None:
        """Our first heartbeat goes in the same write as our first frame (never before it:
        the first bytes of each direction stay the format's own, for the peer's and a
        tracer's detection of the format; and in the same write, so that a peer of another
        format that reads our frame and closes does not find bytes of ours still coming,
        which would turn its close into a reset). If our first frame left without it, as
        soon as both sides have spoken the format; else one period from now."""
        self.beat_first = True
        self.beat_due = now + min(self.config.keepalive_interval or 0.0, HEARTBEAT_PERIOD)

    def _ride(self) -> None:
        """Queue our first heartbeat behind our first frame (see :meth:`_first_beat`)."""
        self.beat_first = False
        self.engine.now = self.host.now
        if not self.engine.heartbeat():
            self.beating = False
            self.beat_due = None

    def _beat(self, now: float) -> None:
        """Send a heartbeat (and the next in ``keepalive_interval``, at most
        :data:`HEARTBEAT_PERIOD`); not while frames of ours still wait to go out (the peer
        gets those: while it does not read, heartbeats do not pile up), nor once we close."""
        interval = min(self.config.keepalive_interval or 0.0, HEARTBEAT_PERIOD)
        self.beat_due = now + interval
        self.beat_first = False
        if self.engine.has_output or self.host.closing:
            return
        self.engine.now = now
        if not self.engine.heartbeat():  # the format has none (omnistreams over WebSocket)
            self.beating = False
            self.beat_due = None

    def beat_heard(self, now: float) -> None:
        """The peer's count of heartbeats and pings changed in the read just processed (the
        core calls this). A heartbeat shows that the peer sends one at least every
        :data:`HEARTBEAT_PERIOD`: it is judged from then on; a peer's pings, only once the
        time between two of them was measured. That time, when we read all along, is its
        interval."""
        engine = self.engine
        count = engine.peer_heartbeats + engine.peer_pings
        if not self.beats:
            self.beats_seen = count
            return
        if self.beat_at is not None and self.beat_clean:
            self.beat_gap = max(self.beat_gap, now - self.beat_at)
        elif engine.peer_heartbeats and not self.beat_gap:
            self.beat_gap = HEARTBEAT_PERIOD  # (until measured)
        self.beats_seen = count
        self.beat_at = now
        self.beat_clean = not self.pressure.bits

    def silence_bound(self) -> float:
        """How long a peer that sends heartbeats or pings may send nothing while we read:
        its interval as measured (at least ours) plus ``keepalive_timeout``."""
        config = self.config
        return max(self.beat_gap, config.keepalive_interval or 0.0) + config.keepalive_timeout

    def _check_silence(self, now: float) -> None:
        """Nothing from a peer that sends heartbeats or pings for :meth:`silence_bound`:
        gone. Not judged while we do not read, nor just after (what it sent may wait in our
        socket): the clock starts again."""
        if self.pressure.bits or self.beat_unread:
            self.beat_unread = bool(self.pressure.bits)
            self.rx_at = now
            return
        timeout = self.config.keepalive_timeout
        self.host.fail(
            SessionClosed(
                f"{self.format}: keepalive failed: nothing from the peer for {now - self.rx_at:.3g} s "
                f"(it sends a heartbeat or a ping at least every {self.silence_bound() - timeout:.3g} s; "
                f"keepalive_timeout={timeout:g}): the connection is gone",
                ending=SessionClosed.VANISHED,
            )
        )

    def _keepalive_failed(self, problem: str) -> None:
        # pragma below: on_timer calls this only while a keepalive ping is out.
        if self.ka_opaque is not None:  # pragma: no branch
            self.pings.pop(self.ka_opaque, None)
        self.ka_opaque = None
        self.host.fail(SessionClosed(f"{self.format}: {problem}", ending=SessionClosed.VANISHED))

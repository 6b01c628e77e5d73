"""A silent peer, driven with explicit times.

Heartbeats on the formats without pings: the first once we have sent a frame and heard
one (never before our first frame, never to a peer that has not spoken the format), or one
period after ready; then every ``keepalive_interval``, at most ``HEARTBEAT_PERIOD``; none while
frames of ours wait unsent or once we close; none over WebSocket.

The silence rule: from the peer's first heartbeat (or once the time between two of its
pings was measured), nothing from it for its interval (at least ours) plus
``keepalive_timeout`` ends the session, except while we do not read or just after (what
it sent may wait unread). A peer that sends neither is never judged so.
"""

from __future__ import annotations

from typing import Any

from polymux.config import SessionConfig
from polymux.exceptions import SessionClosed
from polymux.formats import make_engine
from polymux.session import SessionCore, events as ce
from polymux.session.budget import BUDGET
from polymux.session.liveness import HEARTBEAT_PERIOD

from .corekit import core, drain, one, pair, pump


KEEPALIVE = {"keepalive_interval": 15.0, "keepalive_timeout": 10.0}


def talking(
    fmt: str, client: dict[str, Any] | None = None, server: dict[str, Any] | None = None, **both: Any
) -> tuple[SessionCore, SessionCore]:
    """A client and a server that have each opened a channel at time 0, and so sent their
    first heartbeat right after it."""
    a, b = pair(fmt, client, server, **both)
    a.open_channel("a")
    b.open_channel("b")
    pump(a, b)
    for c in (a, b):
        c.handle_timer(0.0)  # (the drivers ask next_deadline() after every write: now)
    pump(a, b)
    a.events()
    b.events()
    return a, b


def heartbeat(fmt: str) -> bytes:
    engine = make_engine(fmt)
    engine.data_to_send()
    engine.heartbeat()
    return b"".join(bytes(c) for c in engine.data_to_send())


def beat(a: SessionCore, b: SessionCore, now: float) -> None:
    """``a``'s timer at ``now`` (its heartbeat), and what it sent read by ``b`` at once."""
    a.handle_timer(now)
    b.receive_data(drain(a), now)


def test_the_first_heartbeat_follows_our_first_frame_and_the_peers_then_every_interval() -> None:
    a, b = pair("mplex", **KEEPALIVE)
    assert a.next_deadline() == 15.0 and not a.has_output  # nothing sent yet: no heartbeat first
    a.open_channel("x")
    sent = drain(a)
    assert not sent.startswith(heartbeat("mplex"))  # the format's own frame first
    assert a.next_deadline() == 15.0  # not to a peer that has not spoken the format yet
    b.receive_data(sent, 1.0)
    b.open_channel("y")
    a.receive_data(drain(b), 2.0)
    assert a.next_deadline() == 2.0  # both have spoken it: at once
    a.handle_timer(2.0)
    assert drain(a) == heartbeat("mplex")
    assert a.next_deadline() == 17.0
    a.handle_timer(16.0)
    assert not a.has_output
    a.handle_timer(17.0)
    assert drain(a) == heartbeat("mplex") and a.liveness.beat_due == 32.0
    assert not a.failed and not b.failed


def test_the_first_heartbeat_rides_with_our_first_frame() -> None:
    """The drivers ask next_deadline() before they write: our first frame waiting, the
    heartbeat is queued behind it, to go in the same write (a peer of another format that
    reads the frame and closes finds nothing of ours still coming)."""
    a, _b = pair("mplex", **KEEPALIVE)
    a.open_channel("x")
    assert a.next_deadline() == 15.0
    sent = drain(a)
    assert sent.endswith(heartbeat("mplex")) and not sent.startswith(heartbeat("mplex"))
    assert not a.liveness.beat_first


def test_a_session_that_sends_nothing_heartbeats_after_a_period() -> None:
    a, _b = pair("mplex", **KEEPALIVE)
    a.handle_timer(15.0)
    assert drain(a) == heartbeat("mplex")


def test_a_server_speaks_only_once_its_client_has() -> None:
    """A server's connection of a format without a handshake: no heartbeat before the
    client's first whole frame (a client of another format sees a server that says
    nothing); then one period later, or right after its own first frame."""
    c = core("mplex", client=False, first_frame_deadline=True, **KEEPALIVE)
    assert c.next_deadline() == 10.0  # the first-frame deadline only
    c.handle_timer(10.0)
    assert c.failed and heartbeat("mplex") not in drain(c)
    c = core("mplex", client=False, first_frame_deadline=True, **KEEPALIVE)
    peer = core("mplex", **KEEPALIVE)
    peer.open_channel("x")
    c.receive_data(drain(peer), 1.0)
    assert not c.has_output and c.next_deadline() == 16.0
    c.handle_timer(16.0)
    assert drain(c) == heartbeat("mplex")


def test_at_most_every_heartbeat_period_whatever_the_interval() -> None:
    """A longer keepalive_interval makes the judging slower, not the heartbeats: a peer
    judges us from our first heartbeat on, expecting one every HEARTBEAT_PERIOD."""
    a, b = talking("mplex", client={"keepalive_interval": 40.0}, server=KEEPALIVE)
    assert HEARTBEAT_PERIOD == 15.0
    assert a.liveness.beat_due == 15.0
    assert a.liveness.silence_bound() == 50.0  # its own judging: interval + timeout
    assert b.liveness.silence_bound() == 25.0


def test_a_peer_that_heartbeats_then_goes_silent_is_gone_after_interval_plus_timeout() -> None:
    _a, b = talking("mstream-v3", **KEEPALIVE)
    assert b.liveness.beat_gap == 15.0  # one heartbeat: judged at once (HEARTBEAT_PERIOD)
    b.handle_timer(15.0)  # its own heartbeat
    drain(b)
    assert b.next_deadline() == 25.0  # 0 + 15 + 10: the silence deadline
    b.handle_timer(24.9)
    assert not b.failed
    b.handle_timer(25.0)
    failed = one(b.events(), ce.Failed)
    assert isinstance(failed.error, SessionClosed)
    assert str(failed.error) == (
        "mstream-v3: keepalive failed: nothing from the peer for 25 s (it sends a heartbeat or a ping "
        "at least every 15 s; keepalive_timeout=10): the connection is gone"
    )
    assert b.next_deadline() is None  # over: the driver closes the connection


def test_any_byte_from_the_peer_restarts_the_clock() -> None:
    a, b = talking("mplex", **KEEPALIVE)
    ch = a.open_channel("x")
    a.write(ch, b"x")
    b.receive_data(drain(a), 14.0)
    b.events()
    b.handle_timer(15.0)
    drain(b)
    assert b.next_deadline() == 30.0  # its own heartbeat ...
    b.handle_timer(30.0)
    drain(b)
    assert b.next_deadline() == 39.0  # ... then 14 + 25


def test_a_longer_time_between_heartbeats_is_measured() -> None:
    a, b = talking("omnistreams", **KEEPALIVE)
    beat(a, b, 22.0)  # late (a loaded peer): 22 s after the first
    assert b.liveness.beat_gap == 22.0
    assert b.liveness.silence_bound() == 32.0
    for t in (15.0, 30.0, 45.0):
        b.handle_timer(t)
        drain(b)
    b.handle_timer(53.9)
    assert not b.failed
    b.handle_timer(54.0)
    assert "nothing from the peer for 32 s" in str(one(b.events(), ce.Failed).error)


def test_a_peer_that_sends_no_heartbeats_is_never_judged_silent() -> None:
    a, b = talking("mplex", client={"keepalive_interval": None}, server=KEEPALIVE)
    for t in (15.0, 30.0, 300.0, 3000.0):
        b.handle_timer(t)
        drain(b)
    assert not b.failed and b.liveness.beat_gap == 0.0
    assert not a.has_output


def test_no_verdict_while_we_do_not_read_nor_just_after() -> None:
    """Reading paused (our budget): the peer's bytes wait in our socket, so its silence
    proves nothing; the clock starts again at the check, and once more after reading
    resumes."""
    _a, b = talking("mplex", **KEEPALIVE)
    b.pressure.block(BUDGET, True)
    b.handle_timer(25.0)
    assert not b.failed
    assert b.liveness.rx_at == 25.0
    b.pressure.block(BUDGET, False)
    b.handle_timer(50.0)  # paused since the last check: again no verdict
    assert not b.failed and b.liveness.rx_at == 50.0
    b.handle_timer(75.0)
    assert "nothing from the peer for 25 s" in str(one(b.events(), ce.Failed).error)


def test_a_gap_across_a_pause_is_not_measured() -> None:
    _a, b = talking("mplex", **KEEPALIVE)
    beat_bytes = heartbeat("mplex")
    b.pressure.block(BUDGET, True)
    b.receive_data(beat_bytes, 15.0)  # arrived while we did not read (as a slice would)
    b.pressure.block(BUDGET, False)
    b.receive_data(beat_bytes, 40.0)
    assert b.liveness.beat_gap == 15.0  # since one that came during the pause: not measured
    b.receive_data(beat_bytes * 2, 70.0)  # late, two at once: the time since the last read
    assert b.liveness.beat_gap == 30.0 and b.liveness.beats_seen == 5


def test_no_heartbeat_while_frames_of_ours_wait_or_once_closing() -> None:
    a, _b = talking("mplex", client=KEEPALIVE, server={"keepalive_interval": None})
    a.socket_paused(True, 4096)
    a.handle_timer(15.0)
    a.handle_timer(30.0)  # the first still waits: no second one
    assert drain(a) == heartbeat("mplex") and a.next_deadline() == 45.0
    a.close()
    a.handle_timer(45.0)
    assert not drain(a)


def test_yamux_peers_pings_are_measured_before_it_is_judged() -> None:
    a, b = pair("yamux", **KEEPALIVE)
    assert b.liveness.beats_seen == 1  # a's first ping (on ready: it measures the RTT) ...
    assert b.liveness.beat_gap == 0.0  # ... which says nothing of when the next comes
    a.handle_timer(15.0)  # its keepalive ping
    b.receive_data(drain(a), 15.0)
    assert b.liveness.beat_gap == 15.0
    assert not b.liveness.beating  # yamux pings: no heartbeats of ours


def test_omnistreams_over_websocket_sends_no_heartbeat() -> None:
    cfg = SessionConfig(**KEEPALIVE)
    c = SessionCore(make_engine("omnistreams", cfg, is_client=True, message_mode=True), cfg, 0.0)
    c.connection_made(0.0)
    c.handle_timer(15.0)  # the engine has none to send: no more tries
    assert not c.liveness.beating and c.liveness.beat_due is None
    assert not c.has_output
    d = SessionCore(make_engine("omnistreams", cfg, is_client=True, message_mode=True), cfg, 0.0)
    d.connection_made(0.0)
    d.open_channel("x")
    d.next_deadline()  # (its first frame waits: no heartbeat to go with it)
    assert not d.liveness.beating and len(d.data_to_send()) == 1


def test_without_keepalive_nothing_is_sent_nor_judged() -> None:
    a, b = pair("mplex", keepalive_interval=None)
    assert a.next_deadline() is None and b.engine.peer_heartbeats == 0
    b.engine.peer_heartbeats = 5  # (a foreign peer's, say: counted, never measured)
    b.receive_data(b"", 1.0)
    assert b.liveness.beats_seen == 5 and b.liveness.beat_gap == 0.0


def test_connection_lost_ends_the_heartbeats_and_the_judging() -> None:
    _a, b = talking("mplex", **KEEPALIVE)
    b.connection_lost(None)
    assert b.liveness.beat_due is None and b.liveness.beat_gap == 0.0
    assert b.next_deadline() is None

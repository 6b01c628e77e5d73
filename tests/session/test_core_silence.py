"""A silent peer, driven with explicit times: heartbeats on the formats without pings (at
ready, then every ``keepalive_interval``; none while the socket takes none of our bytes or
once we close; none over WebSocket), and the silence rule: once the peer has shown that it
sends heartbeats or pings at regular times, nothing from it for its interval (at least
ours) + ``keepalive_timeout`` ends the session, except while we do not read or just after
(what it sent may wait unread). A peer that sends neither is never judged so."""

from __future__ import annotations

from polymux.config import SessionConfig
from polymux.exceptions import SessionClosed
from polymux.formats import make_engine
from polymux.session import SessionCore, events as ce
from polymux.session.budget import BUDGET

from .corekit import drain, one, pair


KEEPALIVE = {"keepalive_interval": 15.0, "keepalive_timeout": 10.0}


def beat(a: SessionCore, b: SessionCore, now: float) -> None:
    """``a``'s timer at ``now`` (its heartbeat), and what it sent read by ``b`` at once."""
    a.handle_timer(now)
    b.receive_data(drain(a), now)


def test_a_heartbeat_goes_at_ready_and_every_interval() -> None:
    a, b = pair("mplex", **KEEPALIVE)
    assert b.engine.peer_heartbeats == 1  # the one sent at ready (pair() moved it)
    assert a.next_deadline() == 15.0
    a.handle_timer(14.0)
    assert not a.has_output
    a.handle_timer(15.0)
    assert drain(a) and a.next_deadline() == 30.0
    assert not a.events() and not a.failed


def test_a_peer_that_heartbeats_then_goes_silent_is_gone_after_interval_plus_timeout() -> None:
    a, b = pair("mstream-v3", **KEEPALIVE)
    assert b.liveness.beat_gap == 0.0  # one heartbeat: not judged yet
    beat(a, b, 15.0)
    assert b.liveness.beat_gap == 15.0
    assert b.next_deadline() == 15.0  # its own heartbeat first
    b.handle_timer(15.0)
    drain(b)
    assert b.next_deadline() == 30.0
    b.handle_timer(30.0)
    drain(b)
    assert b.next_deadline() == 40.0  # 15 + 15 + 10: the silence deadline
    b.handle_timer(39.9)
    assert not b.failed
    b.handle_timer(40.0)
    failed = one(b.events(), ce.Failed)
    assert isinstance(failed.error, SessionClosed)
    assert str(failed.error) == (
        "mstream-v3: keepalive failed: nothing from the peer for 25 s (its heartbeats or pings came "
        "every 15 s; keepalive_timeout=10): the connection is gone"
    )


def test_any_byte_from_the_peer_restarts_the_clock() -> None:
    a, b = pair("mplex", **KEEPALIVE)
    beat(a, b, 15.0)
    ch = a.open_channel("x")
    a.write(ch, b"x")
    b.receive_data(drain(a), 38.0)
    b.events()
    b.handle_timer(40.0)
    assert not b.failed
    drain(b)
    assert b.next_deadline() == 55.0  # its own heartbeat (late: the timer ran at 40) ...
    b.handle_timer(55.0)
    drain(b)
    assert b.next_deadline() == 63.0  # ... then 38 + 25


def test_the_peers_own_longer_interval_is_measured() -> None:
    a, b = pair("omnistreams", client={"keepalive_interval": 40.0}, server=KEEPALIVE)
    beat(a, b, 40.0)
    assert b.liveness.beat_gap == 40.0
    assert b.liveness.silence_bound() == 50.0
    b.handle_timer(89.9)
    assert not b.failed
    b.handle_timer(90.0)
    assert "nothing from the peer for 50 s" in str(one(b.events(), ce.Failed).error)


def test_a_peer_that_sends_no_heartbeats_is_never_judged_silent() -> None:
    a, b = pair("mplex", client={"keepalive_interval": None}, server=KEEPALIVE)
    for t in (15.0, 30.0, 300.0, 3000.0):
        b.handle_timer(t)
        drain(b)
    assert not b.failed and b.liveness.beat_gap == 0.0
    assert not a.has_output


def test_no_verdict_while_we_do_not_read_nor_just_after() -> None:
    """Reading paused (our budget): the peer's bytes wait in our socket, so its silence
    proves nothing; the clock starts again at the check, and once more after reading
    resumes."""
    a, b = pair("mplex", **KEEPALIVE)
    beat(a, b, 15.0)
    b.pressure.block(BUDGET, True)
    b.handle_timer(40.0)
    assert not b.failed
    assert b.liveness.rx_at == 40.0
    b.pressure.block(BUDGET, False)
    b.handle_timer(65.0)  # paused since the last check: again no verdict
    assert not b.failed and b.liveness.rx_at == 65.0
    b.handle_timer(90.0)
    assert "nothing from the peer for 25 s" in str(one(b.events(), ce.Failed).error)


def test_a_gap_across_a_pause_is_not_measured() -> None:
    a, b = pair("mplex", **KEEPALIVE)
    b.pressure.block(BUDGET, True)
    beat(a, b, 15.0)  # arrived while we did not read (here: read anyway, as a slice would)
    b.pressure.block(BUDGET, False)
    beat(a, b, 30.0)
    assert b.liveness.beat_gap == 0.0  # since one that came during the pause: not measured
    a.handle_timer(45.0)
    a.handle_timer(60.0)  # none: the one of 45 still waits unsent
    b.receive_data(drain(a), 60.0)  # late: the time since the last one read counts
    assert b.liveness.beat_gap == 30.0 and b.liveness.beats_seen == 4


def test_no_heartbeat_while_frames_of_ours_wait_or_once_closing() -> None:
    a, _b = pair("mplex", **KEEPALIVE)
    a.socket_paused(True, 4096)
    a.handle_timer(15.0)
    a.handle_timer(30.0)  # the first still waits: no second one
    assert drain(a) == _b_heartbeat("mplex") and a.next_deadline() == 45.0
    a.close()
    a.handle_timer(45.0)
    assert not drain(a)


def _b_heartbeat(fmt: str) -> bytes:
    engine = make_engine(fmt)
    engine.heartbeat()
    return b"".join(bytes(c) for c in engine.data_to_send())


def test_yamux_peers_pings_are_measured_as_its_heartbeats() -> None:
    a, b = pair("yamux", **KEEPALIVE)
    assert b.liveness.beats_seen == 1  # a's first ping (on ready)
    a.handle_timer(15.0)  # its keepalive ping
    b.receive_data(drain(a), 15.0)
    assert b.liveness.beat_gap == 15.0
    assert not b.liveness.beating  # yamux pings: no heartbeats of ours


def test_omnistreams_over_websocket_sends_no_heartbeat() -> None:
    cfg = SessionConfig(**KEEPALIVE)
    c = SessionCore(make_engine("omnistreams", cfg, is_client=True, message_mode=True), cfg, 0.0)
    c.connection_made(0.0)
    assert not c.liveness.beating and c.liveness.beat_due is None
    assert c.next_deadline() is None or c.next_deadline() >= 300.0  # idle_timeout at most


def test_without_keepalive_nothing_is_sent_nor_judged() -> None:
    a, b = pair("mplex", keepalive_interval=None)
    assert a.next_deadline() is None and b.engine.peer_heartbeats == 0
    b.engine.peer_heartbeats = 5  # (a foreign peer's, say: counted, never measured)
    b.receive_data(b"", 1.0)
    assert b.liveness.beats_seen == 5 and b.liveness.beat_gap == 0.0


def test_connection_lost_ends_the_heartbeats_and_the_judging() -> None:
    a, b = pair("mplex", **KEEPALIVE)
    beat(a, b, 15.0)
    b.connection_lost(None)
    assert b.liveness.beat_due is None and b.liveness.beat_gap == 0.0
    assert b.next_deadline() is None
